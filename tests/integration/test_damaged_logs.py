"""Damaged run logs (a flipped byte, a file cut short; of a finished run or of a writer killed mid-run): every
reader gives up within seconds naming the file, and the sweep summary lists the point as damaged."""
import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY_SYNTH, flip_bit, run_train, write_yaml

SCRIPTS = ROOT / "scripts"
LIMIT = 60  # seconds: a reader still going then is hanging (HDF5's SWMR retries never ended before)
SWEEP = "sweep:\n  grid:\n    training.lr: [0.01, 0.02]\n"


def sweep_yaml(root):
    text = TINY_SYNTH.format(name="sw", out_dir=root / "runs", steps=4, B=4, stage=0, accum=1, ckpt_every=0)
    return write_yaml(root / "sw.yaml", text + SWEEP)


def killed_log(root, train_bin):
    """The log.h5 a writer killed -9 after step 3 leaves: still flagged as open for SWMR writing, so only a
    SWMR reader opens it."""
    y = write_yaml(root / "k.yaml", TINY_SYNTH.format(name="k", out_dir=root / "runs", steps=100000, B=4, stage=0,
                                                       accum=1, ckpt_every=0))
    proc = subprocess.Popen([str(train_bin), "--yaml", str(y)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + LIMIT
    try:
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line or (line.startswith("step") and line.split()[1].split("/")[0] == "3"):
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    return root / "runs/k/log.h5"


@pytest.fixture(scope="module")
def logs(tmp_path_factory, train_bin):
    root = tmp_path_factory.mktemp("damaged")
    run_train(["--yaml", sweep_yaml(root)], check=True)
    return {"sweep": root / "runs/sw", "finished": root / "runs/sw/p001/log.h5",
            "killed": killed_log(root, train_bin)}


def damage(path, how):
    if how == "flip":
        flip_bit(path, 300, 0xff)
    else:
        os.truncate(path, 5000)


def damaged_sweep(logs, tmp_path, writer, how):
    """A copy of the 2-point sweep whose p001/log.h5 is the writer's log, damaged; returns (yaml, sweep dir)."""
    sweep = tmp_path / "runs/sw"
    shutil.copytree(logs["sweep"], sweep)
    shutil.copyfile(logs[writer], sweep / "p001/log.h5")
    damage(sweep / "p001/log.h5", how)
    return sweep_yaml(tmp_path), sweep


def script(name, *args):
    return subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], capture_output=True, text=True,
                          timeout=LIMIT)


@pytest.mark.parametrize("how", ["flip", "cut"])
@pytest.mark.parametrize("writer", ["finished", "killed"])
def test_summary_lists_a_damaged_point_and_goes_on(logs, tmp_path, writer, how):
    y, sweep = damaged_sweep(logs, tmp_path, writer, how)
    log = sweep / "p001/log.h5"
    p = run_train(["--yaml", y, "--summarize"], timeout=LIMIT)
    assert p.returncode == 0, p.stderr
    assert f"run log '{log}' is damaged" in p.stderr
    assert f"summary of 2 point(s) (1 with a damaged log): {sweep}/summary.csv, {sweep}/summary.h5" in p.stdout
    with open(sweep / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "damaged"]
    assert str(log) in rows[1]["message"] and rows[0]["final_train_loss"]


@pytest.mark.parametrize("how", ["flip", "cut"])
@pytest.mark.parametrize("writer", ["finished", "killed"])
def test_scripts_name_a_damaged_log_and_end(logs, tmp_path, writer, how):
    _, sweep = damaged_sweep(logs, tmp_path, writer, how)
    log = sweep / "p001/log.h5"
    for tool in ("to_csv.py", "to_tensorboard.py", "plot_runs.py"):
        extra = ["-o", tmp_path / "loss.png"] if tool == "plot_runs.py" else []
        p = script(tool, sweep / "p001", *extra)
        assert p.returncode == 1, (tool, p.stdout, p.stderr)
        assert p.stderr.startswith(f"{tool[:-3]}: error: {log}: damaged"), (tool, p.stderr)
    p = script("summarize.py", sweep, "--from-logs")
    assert p.returncode == 0, p.stderr
    assert f"point 1 (p001): damaged: {log}: damaged" in p.stdout
    # a sweep's CSV and plots: the damaged point is named and left out, the others are there
    p = script("to_csv.py", sweep, "-o", tmp_path / "csv")
    assert p.returncode == 0 and f"warning: {log}: damaged" in p.stderr, p.stderr
    with open(tmp_path / "csv/train.csv", newline="") as f:
        assert {r["point"] for r in csv.DictReader(f)} == {"p000"}
    p = script("plot_sweep.py", sweep, "--from-logs", "-o", tmp_path / "plots")
    assert p.returncode == 0 and f"warning: {log}: damaged" in p.stderr, p.stderr


def test_resume_of_a_killed_run_with_a_damaged_log_is_refused_at_once(logs, tmp_path, train_bin):
    run = tmp_path / "runs/k"
    shutil.copytree(logs["killed"].parent, run)
    damage(run / "log.h5", "flip")
    y = write_yaml(tmp_path / "k.yaml", TINY_SYNTH.format(name="k", out_dir=tmp_path / "runs", steps=100000, B=4,
                                                          stage=0, accum=1, ckpt_every=0))
    p = run_train(["--yaml", y, "--resume"], timeout=LIMIT)
    assert p.returncode == 1 and f"run log '{run}/log.h5' is damaged" in p.stderr, p.stderr
