"""The readers of run logs against the trainer's own. Damaged logs (a flipped byte, a file cut short; of a
finished run or of a writer killed mid-run): every reader gives up within seconds naming the file, and the
sweep summary lists the point as damaged. Runs that stop: to_tensorboard --follow notices a killed run's
free lock, follows a stopped run through its resume, and to_csv never replaces a live run's CSV files."""
import csv
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import numpy as np

from conftest import ROOT, TINY_SYNTH, as_killed, flip_bit, merge_sections, read_log, run_train, tiny_yaml, write_yaml

SCRIPTS = ROOT / "scripts"
LIMIT = 60  # seconds: a reader still going then is hanging (HDF5's SWMR retries never ended before)
SWEEP = "sweep:\n  grid:\n    training.lr: [0.01, 0.02]\n"


def sweep_yaml(root):
    text = TINY_SYNTH.format(name="sw", out_dir=root / "runs", steps=4, B=4, stage=0, accum=1, ckpt_every=0)
    return write_yaml(root / "sw.yaml", text + SWEEP)


def long_run(root, name, ckpt_every=0, extra=""):
    """A run of many steps, started in its own session; returns (process, its yaml)."""
    y = write_yaml(root / f"{name}.yaml", merge_sections(TINY_SYNTH.format(
        name=name, out_dir=root / "runs", steps=100000, B=4, stage=0, accum=1, ckpt_every=ckpt_every), extra))
    proc = subprocess.Popen([str(ROOT / "train"), "--yaml", str(y)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    return proc, y


def wait_for_step(proc, step):
    deadline = time.time() + LIMIT
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("step") and int(line.split()[1].split("/")[0]) >= step:
            return
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"the run did not reach step {step}")


def killed_log(root, train_bin):
    """The log.h5 a writer killed -9 after step 3 leaves: still flagged as open for SWMR writing, so only a
    SWMR reader opens it."""
    proc, _ = long_run(root, "k")
    try:
        wait_for_step(proc, 3)
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


def test_summarize_says_what_it_wrote(logs, tmp_path):
    shutil.copytree(logs["sweep"], tmp_path / "runs/sw")
    p = run_train(["--yaml", sweep_yaml(tmp_path), "--summarize"], timeout=LIMIT)
    sweep = tmp_path / "runs/sw"
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout == f"summary of 2 point(s): {sweep}/summary.csv, {sweep}/summary.h5\n"


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


def follow(run, *args):
    return subprocess.Popen([sys.executable, str(SCRIPTS / "to_tensorboard.py"), str(run), "--follow", "--interval",
                             "0.2", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended(proc, timeout=LIMIT):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"to_tensorboard --follow did not end in {timeout} s\n{out}\n{err}")
    return proc.returncode, out, err


def test_follow_ends_when_a_killed_runs_lock_is_free(tmp_path, train_bin):
    run, _ = long_run(tmp_path, "k")
    try:
        wait_for_step(run, 2)
        tb = follow(tmp_path / "runs/k", "--grace", "1")
        time.sleep(1)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    rc, out, err = ended(tb)
    assert rc == 0, err
    assert f"{tmp_path}/runs/k/log.h5: stopped (running, no trainer holds its lock)" in out


def test_follow_goes_on_through_a_stop_and_its_resume(tmp_path, train_bin):
    pytest.importorskip("tensorboard", reason="SKIP: tensorboard not installed (scripts/requirements.txt)")
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    run, y = long_run(tmp_path, "r", ckpt_every=2)
    wait_for_step(run, 1)
    tb = follow(tmp_path / "runs/r", "--grace", "120")
    try:
        wait_for_step(run, 3)
        os.killpg(run.pid, signal.SIGUSR1)  # as Slurm before a requeue: checkpoint, exit 75
        assert run.wait(timeout=LIMIT) == 75
        time.sleep(2)
        assert tb.poll() is None, tb.communicate()  # status checkpointed: a resume may come
        run_train(["--yaml", y, "--resume", "training.steps=8"], check=True, timeout=LIMIT)
    except BaseException:
        tb.kill()
        raise
    rc, out, err = ended(tb)
    assert rc == 0, err
    acc = EventAccumulator(str(tmp_path / "runs/r/tensorboard"), size_guidance={SCALARS: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/step_ms")] == list(range(1, 9))  # each step once


def test_follow_until_stop_ends_at_a_stop(tmp_path, train_bin):
    run, _ = long_run(tmp_path, "u", ckpt_every=2)
    wait_for_step(run, 1)
    tb = follow(tmp_path / "runs/u", "--until-stop")
    wait_for_step(run, 2)
    os.killpg(run.pid, signal.SIGUSR1)
    assert run.wait(timeout=LIMIT) == 75
    rc, out, err = ended(tb)
    assert rc == 0 and "checkpointed" in out, (out, err)


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_to_csv_writes_the_trainers_columns_and_numbers(tmp_path, train_bin):
    text = merge_sections(TINY_SYNTH.format(name="c", out_dir=tmp_path / "runs", steps=4, B=4, stage=0, accum=1,
                                            ckpt_every=0), "log: {csv: true}\n")
    run_train(["--yaml", write_yaml(tmp_path / "c.yaml", text)], check=True)
    run = tmp_path / "runs/c"
    p = script("to_csv.py", run, "-o", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    for name in ("train.csv", "eval.csv"):
        mine, theirs = read_rows(tmp_path / "out" / name), read_rows(run / name)
        assert mine[0] == theirs[0]  # the same columns in the same order
        assert len(mine) == len(theirs) == (5 if name == "train.csv" else 2)
        lr = mine[0].index("lr") if name == "train.csv" else -1
        for a, b in zip(mine[1:], theirs[1:]):
            assert [x for i, x in enumerate(a) if i != lr] == [x for i, x in enumerate(b) if i != lr]
            if lr >= 0:  # the float32 the optimizer used, in its own shortest text
                assert np.float32(a[lr]) == np.float32(b[lr]) and a[lr] == str(np.float32(b[lr])).removesuffix(".0")


def test_to_csv_never_replaces_a_live_runs_csv(tmp_path, train_bin):
    run, _ = long_run(tmp_path, "l", extra="log: {csv: true}\n")
    folder = tmp_path / "runs/l"
    try:
        wait_for_step(run, 2)
        before = os.stat(folder / "train.csv").st_ino
        p = script("to_csv.py", folder)
        assert p.returncode == 1
        assert p.stderr.startswith(f"to_csv: error: {folder} is the folder of a live run"), p.stderr
        assert os.stat(folder / "train.csv").st_ino == before  # the trainer's file, still appended to
        wait_for_step(run, 4)
        p = script("to_csv.py", folder, "-o", tmp_path / "elsewhere")
        assert p.returncode == 0, p.stderr
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    rows = read_rows(folder / "train.csv")
    assert [int(r[0]) for r in rows[1:]][:4] == [1, 2, 3, 4]


def test_follow_replaces_the_steps_a_resume_runs_again(tmp_path, train_bin):
    pytest.importorskip("tensorboard", reason="SKIP: tensorboard not installed (scripts/requirements.txt)")
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    import h5py
    y = write_yaml(tmp_path / "a.yaml", TINY_SYNTH.format(name="a", out_dir=tmp_path / "runs", steps=6, B=4, stage=0,
                                                          accum=1, ckpt_every=4))
    run_train(["--yaml", y], check=True)
    # as a kill after step 6 whose checkpoint never got written leaves it: the resume goes on from step 4
    run = tmp_path / "runs/a"
    shutil.rmtree(run / "checkpoints/step_00000006")
    (run / "checkpoints/latest").write_text("step_00000004\n")
    as_killed(run)
    tb = follow(run, "--grace", "120")
    out = run / "tensorboard"

    def steps_seen():
        if not out.is_dir():
            return None, []
        acc = EventAccumulator(str(out), size_guidance={SCALARS: 0})
        acc.Reload()
        return acc, [e.step for e in acc.Scalars("train/step_ms")] if "train/step_ms" in acc.Tags()["scalars"] else []

    try:
        deadline = time.time() + LIMIT
        while steps_seen()[1] != list(range(1, 7)):
            assert time.time() < deadline and tb.poll() is None, "the first 6 steps never came"
            time.sleep(0.2)
        run_train(["--yaml", y, "--resume", "training.steps=9"], check=True, timeout=LIMIT)
    except BaseException:
        tb.kill()
        raise
    rc, _, err = ended(tb)
    assert rc == 0, err
    with h5py.File(run / "log.h5", "r") as f:
        logged = list(zip(f["train/step"][()].tolist(), f["train/step_ms"][()].tolist()))
    assert [s for s, _ in logged] == list(range(1, 10))
    acc, _ = steps_seen()
    # each step once, as the log has it now: steps 5 and 6 of the first run are gone
    assert [(e.step, e.value) for e in acc.Scalars("train/step_ms")] == \
        [(s, pytest.approx(v, rel=1e-6)) for s, v in logged]


def test_resume_waits_for_a_reader_holding_the_log(tmp_path, train_bin):
    """a reader that is not a SWMR reader (h5py's plain read; to_tensorboard --follow between two polls)
    holds the log's file lock while it reads: a resume that starts then waits for it instead of calling the
    log damaged"""
    y = tiny_yaml(tmp_path, name="h", steps=4, ckpt_every=2)
    assert run_train(["--yaml", y]).returncode == 0
    as_killed(tmp_path / "runs" / "h")  # so that --resume continues it
    holder = subprocess.Popen([sys.executable, "-c", "import h5py, sys, time\n"
                               "f = h5py.File(sys.argv[1], 'r')\nprint('open', flush=True)\ntime.sleep(2)",
                               str(tmp_path / "runs" / "h" / "log.h5")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        p = run_train(["--yaml", y, "--resume", "--set", "training.steps=6"], timeout=LIMIT)
        assert p.returncode == 0, p.stderr
        assert holder.poll() is None or holder.returncode == 0  # it held the lock while the resume started
    finally:
        holder.kill()
        holder.wait()
    steps = read_log(tmp_path / "runs" / "h" / "log.h5")["step"]
    assert list(steps) == [1, 2, 3, 4, 5, 6]
