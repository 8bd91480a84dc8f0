"""Checkpoints written in the background (checkpoint.async): the same bytes and the same resumes as
waiting for them, kill -9 during a background write, a failed write that training goes on past, the
final checkpoint of a run, and the snapshot's memory in the prediction."""
import os
import re
import shutil
import signal
import subprocess

import numpy as np
import pytest

from conftest import as_killed, read_log, tiny_yaml
from test_checkpoint import ckpt_step, finish, latest, params, run, start, train_pids, wait_for_step, yaml


def complete(run_dir):
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if re.fullmatch(r"step_\d+", p.name))


@pytest.mark.parametrize("ranks,stage", [(1, 0), (2, 0), (2, 2)])
def test_async_and_sync_give_identical_checkpoints_and_resumes(tmp_path, ranks, stage):
    sync = yaml(tmp_path, "s", stage=stage, steps=8, ckpt_every=4)
    run(["--yaml", sync, "--set", "checkpoint.async=false"], ranks=ranks)
    asy = yaml(tmp_path, "a", stage=stage, steps=8, ckpt_every=4)
    run(["--yaml", asy, "--set", "checkpoint.async=true", "--set", "checkpoint.threads=3"], ranks=ranks)
    s_dir, a_dir = tmp_path / "runs/s", tmp_path / "runs/a"
    assert complete(s_dir) == complete(a_dir) == ["step_00000004", "step_00000008"]
    for step in ("step_00000004", "step_00000008"):
        assert np.array_equal(params(s_dir / "checkpoints" / step), params(a_dir / "checkpoints" / step)), step
    # resuming from the background-written step 4 gives the uninterrupted run's steps 5-8, bit for bit
    ref = read_log(s_dir / "log.h5")
    shutil.rmtree(a_dir / "checkpoints/step_00000008")
    as_killed(a_dir)
    p = run(["--yaml", asy, "--resume"], ranks=ranks)
    assert "resumed from step 4" in p.stdout, p.stdout[-2000:]
    got = read_log(a_dir / "log.h5")
    assert list(got["step"]) == list(range(1, 9)) and np.array_equal(got["loss"], ref["loss"])


@pytest.mark.parametrize("ranks", [1, 2])
def test_kill9_during_a_background_write_then_resume(tmp_path, ranks, monkeypatch):
    ref = yaml(tmp_path, "ref", steps=8, ckpt_every=2)
    run(["--yaml", ref], ranks=ranks)
    y = yaml(tmp_path, "k", steps=8, ckpt_every=2)
    # the last rank's write of step 4 never finishes; training goes on past it (to step 6, where the next
    # checkpoint waits for it)
    monkeypatch.setenv("GPT2_TRAIN_FAULT", f"checkpoint_hold@{ranks - 1}:4")
    proc = start(["--yaml", y], ranks=ranks)
    monkeypatch.delenv("GPT2_TRAIN_FAULT")
    wait_for_step(proc, 5)
    for pid in train_pids(proc):
        os.kill(pid, signal.SIGKILL)
    finish(proc)
    run_dir = tmp_path / "runs/k"
    assert (run_dir / "checkpoints/step_00000004.tmp").is_dir()
    assert complete(run_dir) == ["step_00000002"] and ckpt_step(latest(run_dir)) == 2
    p = run(["--yaml", y, "--resume"], ranks=ranks)
    assert "resumed from step 2" in p.stdout, p.stdout[-2000:]
    got, want = read_log(run_dir / "log.h5"), read_log(tmp_path / "runs/ref/log.h5")
    assert list(got["step"]) == list(range(1, 9)) and np.array_equal(got["loss"], want["loss"])
    assert not any(p.name.endswith(".tmp") for p in (run_dir / "checkpoints").iterdir())


def test_final_checkpoint_when_steps_is_not_a_multiple(tmp_path):
    y = yaml(tmp_path, "f", steps=7, ckpt_every=3)
    p = run(["--yaml", y])
    run_dir = tmp_path / "runs/f"
    assert complete(run_dir) == ["step_00000003", "step_00000006", "step_00000007"]
    assert ckpt_step(latest(run_dir)) == 7 and "checkpoint written at step 7" in p.stdout
    # without checkpoint.every, none
    run(["--yaml", yaml(tmp_path, "n", steps=3, ckpt_every=0)])
    assert not (tmp_path / "runs/n/checkpoints").exists()


def test_failed_background_write_trains_on_with_the_previous_checkpoint(tmp_path, small_fs):
    """checkpoint.on_error: continue. The checkpoints live on a 1 MiB filesystem (the log does not): the
    first two fit (about 0.4 MB each; keep_last 3), the next ones fail with the disk full."""
    y = yaml(tmp_path, "c", steps=8, ckpt_every=2)
    run_dir = tmp_path / "runs/c"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").symlink_to(small_fs)
    # --resume: the run directory holds a checkpoints folder already (finding none in it, it starts afresh)
    p = run(["--yaml", y, "--resume", "--set", "checkpoint.on_error=continue"])
    assert "checkpoint write failed" in p.stderr and "is full" in p.stderr, p.stderr[-3000:]
    assert "training goes on" in p.stderr and "previous checkpoint is kept" in p.stderr
    log = read_log(run_dir / "log.h5")
    assert list(log["step"]) == list(range(1, 9))
    assert log["attrs"]["status"] == "ok" and "checkpoint write failed" in log["attrs"]["message"]
    done = complete(run_dir)
    assert done and done[-1] < "step_00000008", done
    assert not any(x.name.endswith(".tmp") for x in small_fs.iterdir())
    last = ckpt_step(latest(run_dir))
    assert done[-1] == f"step_{last:08d}"
    # it loads: resume from it (another directory, on a normal disk) and train to step 8 again
    fresh = tmp_path / "runs/c2"
    shutil.copytree(small_fs, fresh / "checkpoints")
    p = run(["--yaml", y, "--resume", "--set", "run.name=c2", "--set", "checkpoint.every=0"])
    assert f"resumed from step {last}" in p.stdout
    assert np.array_equal(read_log(fresh / "log.h5")["loss"], log["loss"][last:])


def test_a_snapshot_of_several_pieces_is_predicted_and_resumes(tmp_path):
    """A snapshot over 512 MiB is laid out in pieces of whole slots, each from a 2 MiB boundary, so that a GPU
    page-locks it a piece at a time (src/io/snapshot.cpp): the prediction is its size, padding included, and
    the checkpoints copied through it resume bit for bit. 78M parameters: 0.94 GB of fp32 state, 2 pieces."""
    extra = ("model: {n_layer: 2, n_head: 8, n_embd: 1024, vocab_size: 50257, max_seq_len: 1024}\n"
             "data: {synthetic_vocab: 50257}\ntraining: {micro_batch: 1}\n")
    y = tiny_yaml(tmp_path, name="big", steps=4, ckpt_every=2, extra=extra)
    run(["--yaml", y], timeout=300)
    d = tmp_path / "runs/big"
    log = read_log(d / "log.h5")
    pred, meas, n = int(log["mem_pred"]["snapshot"]), int(log["mem_meas"]["snapshot"]), int(log["attrs"]["n_params"])
    assert pred == meas, (pred, meas)
    # the parameters (the vocabulary padded to 50304 rows) and both AdamW moments in fp32, every slot a multiple
    # of 16 values here, and the padding before the second piece: more than nothing, less than 2 MiB
    unpieced = 3 * 4 * (n + (50304 - 50257) * 1024)
    assert 0 < pred - unpieced < (2 << 20), (pred, unpieced)
    assert complete(d) == ["step_00000002", "step_00000004"]
    shutil.rmtree(d / "checkpoints/step_00000004")
    as_killed(d)
    p = run(["--yaml", y, "--resume"], timeout=300)
    assert "resumed from step 2" in p.stdout, p.stdout[-2000:]
    assert np.array_equal(read_log(d / "log.h5")["loss"], log["loss"])


@pytest.mark.parametrize("ranks", [1, 2])
def test_snapshot_memory_is_predicted_and_measured(tmp_path, ranks):
    y = yaml(tmp_path, "m", steps=2, ckpt_every=1)
    p = run(["--yaml", y, "--dry-run"], ranks=1)
    assert re.search(r"\| snapshot\s+\d", p.stdout), p.stdout
    run(["--yaml", y], ranks=ranks)
    log = read_log(tmp_path / "runs/m/log.h5")
    pred, meas = int(log["mem_pred"]["snapshot"]), int(log["mem_meas"]["snapshot"])
    # fp32 on the CPU: parameters and both AdamW moments, this rank's share
    n = int(log["attrs"]["n_params"])
    assert pred == meas and 3 * 4 * n // ranks <= pred < 3 * 4 * n // ranks + 3 * 4 * 4096, (pred, meas, n)
