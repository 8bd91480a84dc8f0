"""scripts/to_tensorboard.py and scripts/to_csv.py on logs written per docs/FORMATS.md: the events read
back with TensorBoard's own reader, the CSV with the csv module; finished runs, a sweep, and a log that
another process is still writing (SWMR)."""
import csv
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from test_h5tools import (POINTS, RUNNING, SCRIPTS, config_yaml, finished_sweep, losses,  # noqa: F401
                          run_script, running_sweep)

pytest.importorskip("tensorboard", reason="SKIP: tensorboard not installed (scripts/requirements.txt)")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    SCALARS, TENSORS, EventAccumulator)
from tensorboard.util import tensor_util  # noqa: E402


def events(folder):
    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def text(acc, tag):
    return [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)]


def test_a_run_becomes_scalars_and_text(finished_sweep, tmp_path):
    p = POINTS[0]
    r = run_script("to_tensorboard.py", finished_sweep / "p000", "-o", tmp_path / "tb")
    assert r.returncode == 0, r.stderr
    assert "tensorboard --logdir" in r.stdout
    acc = events(tmp_path / "tb")
    tags = acc.Tags()
    assert {"train/loss", "train/lr", "train/grad_norm", "train/step_ms", "train/tokens_per_s",
            "train/mfu", "eval/val_loss"} <= set(tags["scalars"])
    assert "eval/hellaswag_acc" not in tags["scalars"]  # never measured (NaN): no points
    loss = scalars(acc, "train/loss")
    assert [s for s, _ in loss] == list(range(len(p["step_ms"])))
    assert [v for _, v in loss] == pytest.approx(losses(p), rel=1e-6)  # float32 in the event file
    assert scalars(acc, "train/step_ms") == [(i, pytest.approx(ms)) for i, ms in enumerate(p["step_ms"])]
    assert scalars(acc, "eval/val_loss") == [(s, pytest.approx(v)) for s, v in p["evals"]]
    config, = text(acc, "config")
    assert config_yaml(p) in config
    run, = text(acc, "run")
    assert "| world_size | 1 |" in run and "| device | cuda |" in run
    outcome, = text(acc, "outcome")
    assert "| status | ok |" in outcome


def test_a_sweep_is_one_tensorboard_run_per_point(finished_sweep, tmp_path):
    r = run_script("to_tensorboard.py", finished_sweep)
    assert r.returncode == 0, r.stderr
    out = finished_sweep / "tensorboard"
    runs = sorted(d.name for d in out.iterdir())
    # folder names a shell and TensorBoard take as they are: no spaces, no '='
    assert runs == ["p000_zero_stage-0_micro_batch-8", "p001_zero_stage-1_micro_batch-8",
                    "p002_zero_stage-2_micro_batch-16", "p003_zero_stage-3_micro_batch-8"]
    oom = events(out / runs[2])
    assert oom.Tags()["scalars"] == []  # no step ran
    assert "out of memory" in text(oom, "outcome")[0]
    failed = events(out / runs[3])
    # the NaN loss of the failing step is left out, the steps before it are there
    assert [s for s, _ in scalars(failed, "train/loss")] == [0, 1]
    assert [s for s, _ in scalars(failed, "train/step_ms")] == [0, 1, 2]

    # converting again replaces this tool's event files (no step twice) and leaves others alone
    (out / runs[0] / "notes.txt").write_text("mine")
    r = run_script("to_tensorboard.py", finished_sweep)
    assert r.returncode == 0, r.stderr
    again = events(out / runs[0])
    assert [s for s, _ in scalars(again, "train/loss")] == list(range(len(POINTS[0]["step_ms"])))
    assert (out / runs[0] / "notes.txt").read_text() == "mine"
    assert len(list((out / runs[0]).glob("events.out.tfevents.*"))) == 1


def test_follow_adds_the_steps_of_a_run_still_going(running_sweep, tmp_path):
    sweep, writer = running_sweep
    out = tmp_path / "live"
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "to_tensorboard.py"), sweep / "p004", "-o", out,
                             "--follow", "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        def steps_seen(n):
            deadline = time.time() + 60
            while time.time() < deadline:
                if out.is_dir() and any(out.glob("events.out.tfevents.*")):
                    acc = events(out)
                    if "train/loss" in acc.Tags()["scalars"] and len(acc.Scalars("train/loss")) >= n:
                        return [s for s, _ in scalars(acc, "train/loss")]
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
            raise AssertionError(f"to_tensorboard --follow did not write {n} steps in 60 s")

        assert steps_seen(1) == [0]
        writer.append(2)
        assert steps_seen(3) == [0, 1, 2]  # each step once, in order
        assert proc.poll() is None  # the run still says running: --follow goes on
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    acc = events(out)
    assert [v for _, v in scalars(acc, "train/loss")] == pytest.approx(losses(RUNNING)[:3], rel=1e-6)


def test_to_tensorboard_errors_name_the_path(finished_sweep, tmp_path):
    r = run_script("to_tensorboard.py", tmp_path / "nothing")
    assert r.returncode == 1 and "nothing" in r.stderr
    r = run_script("to_tensorboard.py", tmp_path, tmp_path)
    assert r.returncode == 2 and "-o" in r.stderr
    # -o naming a file: a message, not a traceback
    (tmp_path / "afile").write_text("mine")
    r = run_script("to_tensorboard.py", finished_sweep / "p000", "-o", tmp_path / "afile")
    assert r.returncode == 1 and r.stderr.startswith(f"to_tensorboard: error: -o {tmp_path / 'afile'} is a file")
    assert (tmp_path / "afile").read_text() == "mine"
    # a log that is not HDF5: exit 1 naming it, and no event file
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "log.h5").write_bytes(b"not hdf5" * 100)
    r = run_script("to_tensorboard.py", bad, "-o", tmp_path / "tb")
    assert r.returncode == 1 and r.stderr.startswith(f"to_tensorboard: error: {bad / 'log.h5'}: damaged"), r.stderr
    assert not list(tmp_path.glob("tb/**/events.out.tfevents.*"))


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_of_a_run_round_trips(finished_sweep, tmp_path):
    r = run_script("to_csv.py", finished_sweep / "p003", "-o", tmp_path)
    assert r.returncode == 0, r.stderr
    p = POINTS[3]
    rows = read_csv(tmp_path / "train.csv")
    assert list(rows[0])[:2] == ["step", "loss"]
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert [float(r["step_ms"]) for r in rows] == p["step_ms"]  # exact: shortest round-trip text
    assert [float(r["loss"]) for r in rows[:2]] == losses(p)[:2] and rows[2]["loss"] == ""  # NaN: empty
    assert read_csv(tmp_path / "eval.csv") == []
    with open(tmp_path / "eval.csv") as f:
        assert f.readline().strip() == "step,val_loss,hellaswag_acc,hellaswag_acc_norm,sample"


def test_csv_of_a_sweep_has_the_point_values(running_sweep, tmp_path):
    sweep, writer = running_sweep
    writer.append(1)
    r = run_script("to_csv.py", sweep)
    assert r.returncode == 0, r.stderr
    rows = read_csv(sweep / "train.csv")
    assert list(rows[0])[:4] == ["point", "training.zero_stage", "training.micro_batch", "step"]
    by_point = {}
    for row in rows:
        by_point.setdefault(row["point"], []).append(row)
    # p002 (oom) has no rows, p004 is read as far as its writer has flushed, p005 has no log yet
    assert sorted(by_point) == ["p000", "p001", "p003", "p004"]
    assert [float(r["step_ms"]) for r in by_point["p004"]] == RUNNING["step_ms"][:2]
    assert {r["training.micro_batch"] for r in by_point["p004"]} == {"4"}
    evals = read_csv(sweep / "eval.csv")
    assert [(e["point"], int(e["step"]), float(e["val_loss"])) for e in evals if e["point"] == "p000"] == \
        [("p000", s, v) for s, v in POINTS[0]["evals"]]
    assert all(math.isfinite(float(r["loss"])) for r in by_point["p000"])
    assert np.all(np.diff([int(r["step"]) for r in by_point["p000"]]) == 1)
