"""Reliability on CPU ranks: a failure on one rank ends every rank at once, a diverging run keeps its good
checkpoints, runs never clobber each other, write failures are named errors, damaged checkpoints of any
kind fall back, and bad settings are refused before any work."""
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import TRAIN, flip_bit, mpirun_cmd, read_log, run_train, tiny_yaml, write_shard, write_yaml

EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OOM = 1, 2, 3
BOUND_S = 60  # a one-rank failure must end the whole job within this (it hung until the wall clock before)


def snapshot(root):
    """path -> sha256 of every file under root (to show a run was left byte for byte as it was)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file() and p.name != ".lock"}


def timed_run(args, ranks, env=None):
    t0 = time.monotonic()
    p = run_train(args, ranks=ranks, timeout=BOUND_S + 60, env=env)
    return p, time.monotonic() - t0


# ---- no hang: a failure on one rank, in each phase, ends every rank with the documented status
@pytest.mark.parametrize("fault,needle", [
    ("setup@1", "in setup on rank 1"),
    ("step@1:3", "in step on rank 1 at step 3"),
    ("eval@1:4", "in eval on rank 1 at step 4"),
    ("checkpoint@1:4", "in checkpoint on rank 1 at step 4"),
    ("log@0:3", "writing the run log"),
])
def test_one_rank_failure_ends_every_rank(tmp_path, train_bin, fault, needle):
    y = tiny_yaml(tmp_path, steps=40, ckpt_every=4, extra="eval: {every: 4, batches: 2}\n")
    p, secs = timed_run(["--yaml", y], ranks=2, env={"GPT2_TRAIN_FAULT": fault})
    assert p.returncode == EXIT_FAILURE, f"{fault}: exit {p.returncode}\n{p.stderr[-3000:]}"
    assert needle in p.stderr, p.stderr[-3000:]
    assert secs < BOUND_S, f"{fault}: took {secs:.0f} s"
    if fault.startswith(("setup", "log", "checkpoint")):  # agreed failures: rank 0 closes the log with the reason
        log = read_log(tmp_path / "runs/t/log.h5") if (tmp_path / "runs/t/log.h5").exists() else None
        if log is not None:
            assert log["attrs"]["status"] == "failed" and "injected fault" in log["attrs"]["message"]


def test_bad_token_on_one_rank_ends_every_rank(tmp_path, train_bin):
    # B=4, T=16 on 2 ranks: a micro-batch is 128 tokens, rank 1 reads tokens 64-128 of it. One bad id in
    # rank 1's rows of the third step: only rank 1 sees it.
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, size=4096)
    tokens[2 * 128 + 64 + 10] = 1000
    write_shard(tmp_path / "bad.bin", tokens)
    extra = f"data: {{synthetic: false, train: '{tmp_path / 'bad.bin'}', shuffle: false}}\n"
    y = tiny_yaml(tmp_path, steps=20, extra=extra)
    p, secs = timed_run(["--yaml", y], ranks=2)
    assert p.returncode == EXIT_BAD_INPUT, p.stderr[-3000:]
    assert "token id 1000 is outside the vocabulary" in p.stderr and "rank 1" in p.stderr, p.stderr[-3000:]
    assert secs < BOUND_S
    log = read_log(tmp_path / "runs/t/log.h5")
    assert list(log["step"]) == [1, 2] and log["attrs"]["status"] == "failed"


# ---- a diverging run never writes a non-finite state, and keeps its last good checkpoint
def test_divergence_keeps_a_finite_loadable_checkpoint(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=30, ckpt_every=5)
    p = run_train(["--yaml", y, "--set", "training.steps=10"], check=True)
    good = tmp_path / "runs/t/checkpoints/step_00000010"
    assert good.is_dir()
    # a weight decay of 1e38 at lr 1000: the first update overflows the weights (the loss and gradient norm of
    # that step are still finite, so only the optimizer's own check can see it)
    p = run_train(["--yaml", y, "--resume", "--set", "training.lr=1000", "--set", "training.weight_decay=1e38",
                   "--set", "checkpoint.every=1", "--set", "training.warmup_steps=0",
                   "--set", "training.schedule=constant"])
    assert p.returncode == EXIT_FAILURE, p.stderr[-3000:]
    assert "diverged at step 11" in p.stderr and "not finite" in p.stderr and str(good) in p.stderr, p.stderr
    ckpts = sorted(x.name for x in (tmp_path / "runs/t/checkpoints").iterdir() if x.name.startswith("step_"))
    assert ckpts[-1] == "step_00000010", ckpts
    with h5py.File(good / "rank_00000.h5", "r") as f:
        for g in f:
            for k in f[g]:
                assert np.isfinite(f[g][k][:]).all(), f"{g}/{k}"
    # and it resumes
    run_train(["--yaml", y, "--resume", "--set", "training.steps=12"], check=True)
    assert list(read_log(tmp_path / "runs/t/log.h5")["step"])[-2:] == [11, 12]


# ---- one run per directory
def test_rerun_without_resume_touches_nothing(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    run_train(["--yaml", y], check=True)
    before = snapshot(tmp_path / "runs/t")
    p = run_train(["--yaml", y])
    assert p.returncode == EXIT_BAD_INPUT and "already holds a run" in p.stderr and "--resume" in p.stderr
    assert snapshot(tmp_path / "runs/t") == before
    # on purpose: run.overwrite replaces it
    run_train(["--yaml", y, "--set", "run.overwrite=true", "--set", "training.steps=4"], check=True)
    assert list(read_log(tmp_path / "runs/t/log.h5")["step"]) == [1, 2, 3, 4]
    assert sorted(x.name for x in (tmp_path / "runs/t/checkpoints").iterdir()) == ["latest", "step_00000003",
                                                                                  "step_00000004"]  # the final one


def test_second_run_into_a_running_directory_is_refused(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=100000, ckpt_every=0)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen([str(TRAIN), "--yaml", str(y)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        log = tmp_path / "runs/t/log.h5"
        for _ in range(600):
            if log.exists():
                break
            time.sleep(0.05)
        # the same run again, and one that says --resume: both refused while the first holds the directory
        for extra in ([], ["--resume"], ["--set", "run.overwrite=true"]):
            p = run_train(["--yaml", y] + extra)
            assert p.returncode == EXIT_BAD_INPUT, p.stderr
            assert "in use by another run" in p.stderr or "already holds a run" in p.stderr, p.stderr
        assert first.poll() is None, "the first run was disturbed"
    finally:
        first.send_signal(signal.SIGINT)
        rc = first.wait(timeout=120)
    assert rc == 75
    assert read_log(tmp_path / "runs/t/log.h5")["attrs"]["status"] == "checkpointed"


def test_resume_with_changed_settings_is_refused_before_the_log_changes(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    run_train(["--yaml", y, "--set", "training.steps=3"], check=True)
    before = snapshot(tmp_path / "runs/t")
    for key, value in (("training.seq_len", "8"), ("training.micro_batch", "2"), ("run.seed", "8")):
        p = run_train(["--yaml", y, "--resume", "--set", f"{key}={value}"])
        assert p.returncode == EXIT_BAD_INPUT and "may not change on resume" in p.stderr, p.stderr
        assert key.split(".")[1] in p.stderr or "tokens per step" in p.stderr
        assert snapshot(tmp_path / "runs/t") == before
    # what may change: the length of the run, the learning rate, the ZeRO stage
    run_train(["--yaml", y, "--resume", "--set", "training.lr=5e-3"], check=True)
    assert list(read_log(tmp_path / "runs/t/log.h5")["step"]) == list(range(1, 7))


# ---- write failures: a full filesystem
@pytest.mark.parametrize("ranks", [1, 2])
def test_full_disk_during_checkpoint(tmp_path, train_bin, small_fs, ranks):
    out = small_fs / "runs"
    y = write_yaml(tmp_path / "f.yaml", tiny_yaml(tmp_path, steps=40, ckpt_every=1).read_text().replace(
        str(tmp_path / "runs"), str(out)))
    p, secs = timed_run(["--yaml", y], ranks=ranks)
    assert p.returncode == EXIT_FAILURE, p.stderr[-3000:]
    assert "checkpoint write failed" in p.stderr and "is full" in p.stderr, p.stderr[-3000:]
    assert secs < BOUND_S and "Segmentation" not in p.stderr
    log = read_log(out / "t/log.h5")  # closed, readable, and it says why
    assert log["attrs"]["status"] == "failed" and "checkpoint write failed" in log["attrs"]["message"]
    done = sorted(x for x in (out / "t/checkpoints").iterdir() if x.name.startswith("step_"))
    assert done and not any(x.name.endswith(".tmp") for x in done)
    # the previous checkpoint is intact: resume from it elsewhere and finish
    shutil.copytree(out / "t", tmp_path / "runs/t")
    (tmp_path / "runs/t/.lock").unlink(missing_ok=True)
    last = int(done[-1].name.split("_")[1])
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=last + 2, ckpt_every=0), "--resume"], ranks=ranks, check=True)
    assert f"resumed from step {last}" in p.stdout


def test_full_disk_during_log_write(tmp_path, train_bin, small_fs):
    """The filesystem fills while a 2-rank run (no checkpoints) goes on: its next log write fails on rank 0."""
    out = small_fs / "runs"
    y = write_yaml(tmp_path / "f.yaml", tiny_yaml(tmp_path, steps=1000000).read_text().replace(
        str(tmp_path / "runs"), str(out)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(mpirun_cmd(2) + [str(TRAIN), "--yaml", str(y)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(600):
            if (out / "t/log.h5").exists():
                break
            time.sleep(0.05)
        time.sleep(0.5)
        try:  # fill the disk
            with open(small_fs / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        _, err = proc.communicate(timeout=BOUND_S + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_FAILURE, err[-3000:]
    assert "writing the run log" in err and "is full" in err, err[-3000:]
    assert "Segmentation" not in err
    (small_fs / "filler").unlink()
    with h5py.File(out / "t/log.h5", "r") as f:  # still an HDF5 file h5py opens, with the rows written
        assert f["train/step"].shape[0] >= 1


# ---- integrity of everything: damage to metadata or to HDF5's own structure falls back too
@pytest.mark.parametrize("where", ["superblock", "step attribute"])
def test_damage_outside_the_tensors_falls_back(tmp_path, train_bin, where):
    y = tiny_yaml(tmp_path, steps=20, ckpt_every=10)
    run_train(["--yaml", y], check=True)
    ref = read_log(tmp_path / "runs/t/log.h5")
    newest = tmp_path / "runs/t/checkpoints/step_00000020/rank_00000.h5"
    if where == "superblock":
        flip_bit(newest, 9)  # HDF5's own structure: parsing it could crash the library
    else:
        data = newest.read_bytes()
        i = data.find(np.int64(20).tobytes(), data.find(b"step"))  # the value next to the attribute's name
        assert i > 0
        flip_bit(newest, i)  # step 20 -> 21: a valid file claiming the wrong step
    # the run completed (a resume of it is a no-op): its checkpoints resume as those of a run killed after step 20
    shutil.copytree(tmp_path / "runs/t/checkpoints", tmp_path / "runs/k/checkpoints")
    p = run_train(["--yaml", y, "--resume", "--set", "run.name=k"], check=True)
    assert "falling back" in p.stderr and "checksum mismatch" in p.stderr, p.stderr
    assert "resumed from step 10" in p.stdout
    got = read_log(tmp_path / "runs/k/log.h5")  # steps 11-20 again, the same as before
    assert list(got["step"]) == list(range(11, 21)) and np.array_equal(got["loss"], ref["loss"][10:])


# ---- validation up front: exit 1 (3 for memory) with no output directory
def assert_no_output(tmp_path):
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.rglob("*"))


@pytest.mark.parametrize("key,value", [("training.lr", ".nan"), ("training.beta1", ".inf"),
                                       ("training.weight_decay", "1e39"), ("training.grad_clip", "-.inf")])
def test_non_finite_settings_are_refused(tmp_path, train_bin, key, value):
    y = tiny_yaml(tmp_path)
    for args in (["--yaml", y, "--set", f"{key}={value}"], ["--yaml", y, "--set", f"{key}={value}", "--dry-run"]):
        p = run_train(args)
        assert p.returncode == EXIT_BAD_INPUT and key in p.stderr and "finite" in p.stderr, p.stderr
    assert_no_output(tmp_path)


def test_cpu_config_larger_than_memory_exits_3_before_allocating(tmp_path, train_bin):
    y = write_yaml(tmp_path / "big.yaml", f"""
run: {{name: big, out_dir: {tmp_path / 'runs'}}}
model: {{preset: d48}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: cpu, micro_batch: 64, seq_len: 1024, steps: 1}}
""")
    t0 = time.monotonic()
    p = run_train(["--yaml", y], timeout=120)
    assert p.returncode == EXIT_OOM and "out of host memory" in p.stderr and "available" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 30
    assert_no_output(tmp_path)


def test_unwritable_output_path_is_refused_before_work(tmp_path, train_bin):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y, "--set", f"run.out_dir={blocker}/runs"])
    assert p.returncode == EXIT_BAD_INPUT and "is a file, not a directory" in p.stderr, p.stderr
    assert "set-up" not in p.stdout
    assert_no_output(tmp_path)


@pytest.mark.parametrize("args,needle", [
    (["--index", "x"], "--index"),
    (["--set", "training.steps"], "key.path=value"),
    (["--set", "training.micro_batch=[1]"], "training.micro_batch"),
])
def test_user_errors_are_not_internal_errors(tmp_path, train_bin, args, needle):
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y] + args)
    assert p.returncode == EXIT_BAD_INPUT and needle in p.stderr and "internal error" not in p.stderr, p.stderr
    assert_no_output(tmp_path)
