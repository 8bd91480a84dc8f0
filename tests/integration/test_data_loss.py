"""Finished work is never lost: on every path a run fails by (divergence, a bad shard, a failed log write, an
evaluation failure, a stop signal), the checkpoint being written in the background is published when its
write completes, whether it finished before the failure or after it; only a write that itself failed, or
that stopped making progress, is discarded. And `export` never writes over a run or an existing file.

The order of the write and the failure is forced with GPT2_TRAIN_FAULT (src/run/faults.hpp):
checkpoint_done@R:S puts rank R's write of step S on disk before training goes on (the failure then finds it
finished but not yet published), checkpoint_late@R:S holds it until the run waits for it (the failure finds it
still running)."""
import os
import re
import subprocess

import h5py
import numpy as np
import pytest

from conftest import read_log, run_train, tiny_yaml, write_shard

EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_CHECKPOINTED = 1, 2, 75
ENV = {"OMP_NUM_THREADS": "1"}


def complete(run_dir):
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if re.fullmatch(r"step_\d+", p.name)) if root.is_dir() else []


def leftovers(run_dir):
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if p.name.endswith((".tmp", ".deleting"))) if root.is_dir() else []


def latest(run_dir):
    return (run_dir / "checkpoints/latest").read_text().strip()


def order_spec(order, step, ranks):
    """GPT2_TRAIN_FAULT specs that put every rank's write of `step` in `order` relative to the failure."""
    if order == "mixed":  # rank 0's write finished, rank 1's still to start
        return f"checkpoint_done@0:{step},checkpoint_late@1:{step}"
    return ",".join(f"checkpoint_{order}@{r}:{step}" for r in range(ranks))


def assert_finite_checkpoint(ckpt):
    with h5py.File(ckpt / "rank_00000.h5", "r") as f:
        for g in f:
            if isinstance(f[g], h5py.Group):
                for k in f[g]:
                    assert np.isfinite(f[g][k][:]).all(), f"{ckpt}: {g}/{k}"


# Each failure at the step after the checkpoint of step `at` (written in the background), before the boundary
# that would publish it: (at, overrides, GPT2_TRAIN_FAULT of the failure, exit status, what stderr says)
def failure(kind, tmp_path, ranks):
    if kind == "divergence":
        # lr 1e30: the update of step 1 is finite (~1e30), the forward of step 2 overflows (NaN loss)
        return 1, ["training.lr=1e30", "training.warmup_steps=0", "training.schedule=constant",
                   "checkpoint.every=1", "training.steps=5"], "", EXIT_FAILURE, "diverged at step 2"
    if kind == "log":
        return 10, [], "log@0:11", EXIT_FAILURE, "writing the run log"
    if kind == "eval":
        return 10, ["eval.every=1", "eval.batches=1"], f"eval_data@{ranks - 1}:11", EXIT_FAILURE, \
            f"in eval_data on rank {ranks - 1} at step 11"
    if kind == "data":
        # a token id outside the vocabulary in the rows of step 11 (file order: 64 tokens a step per rank)
        tokens = np.random.default_rng(0).integers(0, 64, size=8192)
        tokens[10 * 64 * ranks + 5] = 1000
        write_shard(tmp_path / "train.bin", tokens)
        return 10, ["data.synthetic=false", f"data.train={tmp_path / 'train.bin'}", "data.shuffle=false"], "", \
            EXIT_BAD_INPUT, "token id 1000 is outside the vocabulary"
    if kind == "signal":
        return 10, ["training.steps=1000"], f"sigterm@{ranks - 1}:11", EXIT_CHECKPOINTED, "stopped by a signal at step 11"
    raise ValueError(kind)


def with_sets(args, sets):
    for s in sets:
        args += ["--set", s]
    return args


@pytest.mark.parametrize("kind", ["divergence", "log", "eval", "data", "signal"])
@pytest.mark.parametrize("order", ["done", "late"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_failure_publishes_the_checkpoint_in_flight(tmp_path, kind, order, ranks):
    at, sets, fault, code, needle = failure(kind, tmp_path, ranks)
    y = tiny_yaml(tmp_path, steps=20, ckpt_every=10)
    env = dict(ENV, GPT2_TRAIN_FAULT=",".join(x for x in (fault, order_spec(order, at, ranks)) if x))
    p = run_train(with_sets(["--yaml", y], sets), ranks=ranks, env=env, timeout=300)
    run_dir = tmp_path / "runs/t"
    assert p.returncode == code, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    assert needle in p.stderr + p.stdout, p.stderr[-3000:]
    want = f"step_{at:08d}"
    assert want in complete(run_dir) and not leftovers(run_dir), (complete(run_dir), leftovers(run_dir))
    assert f"checkpoint written at step {at}:" in p.stdout, p.stdout[-3000:]
    assert_finite_checkpoint(run_dir / "checkpoints" / want)
    log = read_log(run_dir / "log.h5")
    if kind == "signal":  # and the stop's own checkpoint after it
        assert latest(run_dir) == "step_00000011" and log["attrs"]["status"] == "checkpointed"
    else:
        assert latest(run_dir) == want, latest(run_dir)
        assert log["attrs"]["status"] == "failed" and needle in log["attrs"]["message"], log["attrs"]
    if kind == "divergence":  # the step before the divergence is the last good checkpoint, and it is named
        assert f"the last good checkpoint is {run_dir / 'checkpoints' / want}" in p.stderr, p.stderr[-3000:]
    # it resumes
    q = run_train(with_sets(["--yaml", y, "--resume"], sets + [f"training.steps={at + 1}"]), ranks=ranks, env=ENV)
    if kind in ("data", "divergence"):  # the same bad token again, or weights of 1e30 again, one step on
        assert q.returncode == code and f"resumed from step {at}" in q.stdout, q.stderr[-3000:]
    elif kind == "signal":  # the stop's checkpoint is step 11: already there
        assert q.returncode == 0 and "resumed from step 11" in q.stdout, q.stderr[-3000:]
    else:
        assert q.returncode == 0 and f"resumed from step {at}" in q.stdout, q.stderr[-3000:]


def test_two_ranks_one_write_done_one_still_to_start(tmp_path):
    at, _, fault, code, needle = failure("log", tmp_path, 2)
    y = tiny_yaml(tmp_path, steps=20, ckpt_every=10)
    p = run_train(["--yaml", y], ranks=2, env=dict(ENV, GPT2_TRAIN_FAULT=f"{fault},{order_spec('mixed', at, 2)}"))
    run_dir = tmp_path / "runs/t"
    assert p.returncode == code and needle in p.stderr, p.stderr[-3000:]
    assert complete(run_dir) == ["step_00000010"] and not leftovers(run_dir)


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_write_that_failed_is_discarded_on_the_way_out(tmp_path, ranks):
    """The write in flight fails by itself (checkpoint@R:10) after the run failed (log@0:11): no step 10, the
    run's own failure is what it exits with, and both are said."""
    y = tiny_yaml(tmp_path, steps=20, ckpt_every=10)
    spec = f"log@0:11,checkpoint@{ranks - 1}:10," + order_spec("late", 10, ranks)
    p = run_train(["--yaml", y], ranks=ranks, env=dict(ENV, GPT2_TRAIN_FAULT=spec))
    run_dir = tmp_path / "runs/t"
    assert p.returncode == EXIT_FAILURE, p.stderr[-3000:]
    assert "writing the run log" in p.stderr and "the checkpoint being written was not kept" in p.stderr, p.stderr
    assert complete(run_dir) == [] and not leftovers(run_dir)
    msg = read_log(run_dir / "log.h5")["attrs"]["message"]
    assert "writing the run log" in msg and "in checkpoint on rank" in msg, msg


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_write_without_progress_is_given_up(tmp_path, ranks):
    """A write stuck for good (checkpoint_hold: it never writes a byte) does not keep a failed run from ending:
    after checkpoint.stall_s without progress it is given up, the previous checkpoint stands."""
    y = tiny_yaml(tmp_path, steps=30, ckpt_every=10)
    spec = f"log@0:21,checkpoint_hold@{ranks - 1}:20"
    p = run_train(["--yaml", y, "--set", "checkpoint.stall_s=1"], ranks=ranks, env=dict(ENV, GPT2_TRAIN_FAULT=spec),
                  timeout=120)
    run_dir = tmp_path / "runs/t"
    assert p.returncode == EXIT_FAILURE, p.stderr[-3000:]
    assert "writing the run log" in p.stderr and "wrote nothing for 1 s" in p.stderr and "given up" in p.stderr, \
        p.stderr[-3000:]
    assert complete(run_dir) == ["step_00000010"] and latest(run_dir) == "step_00000010"
    assert read_log(run_dir / "log.h5")["attrs"]["status"] == "failed"


def test_cpu_runs_say_training_waited_for_the_copy(tmp_path):
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=2, ckpt_every=1)], env=ENV, check=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith("checkpoint written")]
    assert len(lines) == 2 and all("training waited for the copy" in line for line in lines), lines
    assert "on the device" not in p.stdout


# ---- export writes nowhere it may not
def test_export_refuses_what_exists_and_never_touches_a_run(tmp_path):
    run_train(["--yaml", tiny_yaml(tmp_path, steps=2, ckpt_every=1)], env=ENV, check=True)
    run_dir = tmp_path / "runs/t"
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}

    def export(out, *more):
        return run_train(["export", "--ckpt", run_dir, "--out", out, *more], env=ENV)

    model = tmp_path / "model.bin"
    model.write_text("precious")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    for out, fmt in ((model, "llmc"), (hf, "hf")):
        p = export(out, "--format", fmt)
        assert p.returncode == EXIT_BAD_INPUT and "exists" in p.stderr and "--force" in p.stderr, p.stderr
    assert model.read_text() == "precious" and (hf / "config.json").read_text() == "{}"
    # never the run's log, a kept log or anything under checkpoints/, even with --force
    for out in (run_dir / "log.h5", run_dir / "log.1.h5", run_dir / "checkpoints/step_00000002/rank_00000.h5",
                run_dir / "checkpoints/model.bin", run_dir / "checkpoints/step_00000001"):
        for force in ([], ["--force"]):
            p = export(out, *force)
            assert p.returncode == EXIT_BAD_INPUT and "never writes there" in p.stderr, (out, p.stderr)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"} == files
    # on purpose
    p = export(model, "--force")
    assert p.returncode == 0 and model.stat().st_size > 1000, p.stderr
    p = export(hf, "--format", "hf", "--force")
    assert p.returncode == 0 and (hf / "model.safetensors").is_file(), p.stderr
    p = export(tmp_path / "new.bin")
    assert p.returncode == 0 and (tmp_path / "new.bin").is_file(), p.stderr


# ---- sample --logits and export --out: one rule for what they may write
def run_files(run_dir):
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


@pytest.fixture
def csv_run(tmp_path):
    """A finished run with log.csv (train.csv, eval.csv), a lock file and two checkpoints."""
    run_train(["--yaml", tiny_yaml(tmp_path, steps=2, ckpt_every=1, extra="log: {csv: true}\n")], env=ENV, check=True)
    run_dir = tmp_path / "runs/t"
    assert {".lock", "log.h5", "train.csv", "eval.csv"} <= {p.name for p in run_dir.iterdir()}
    return run_dir


def test_sample_logits_never_writes_over_a_run_or_an_existing_file(csv_run, tmp_path):
    files = run_files(csv_run)

    def sample(out, *more):
        return run_train(["sample", "--ckpt", csv_run, "--prompt-ids", "1,2,3", "--tokens", "2", "--logits", out,
                          *more], env=ENV)

    (tmp_path / "kept.log.h5").symlink_to(csv_run / "log.h5")  # a link to a run's log is that log
    for out in (csv_run / "log.h5", csv_run / ".lock", csv_run / "train.csv", csv_run / "eval.csv",
                csv_run / "checkpoints/step_00000002/rank_00000.h5", csv_run / "checkpoints/new.h5",
                csv_run / "checkpoints/latest", csv_run, tmp_path / "kept.log.h5"):
        for force in ([], ["--force"]):
            p = sample(out, *force)
            assert p.returncode == EXIT_BAD_INPUT and "sample never writes there" in p.stderr, (out, p.stderr)
            assert p.stderr.startswith(f"error: --logits '{out}' "), p.stderr
    assert run_files(csv_run) == files
    # a file of the user's: only with --force
    mine = tmp_path / "logits.h5"
    mine.write_text("precious")
    p = sample(mine)
    assert p.returncode == EXIT_BAD_INPUT and "exists: give --force" in p.stderr and mine.read_text() == "precious"
    p = sample(mine, "--force")
    assert p.returncode == 0, p.stderr
    with h5py.File(mine, "r") as f:
        assert f["logits"].shape == (3, 64)
    p = sample(tmp_path / "new.h5")
    assert p.returncode == 0 and (tmp_path / "new.h5").is_file() and not list(tmp_path.glob("*.tmp")), p.stderr
    # beside a run, a file of another name is the user's
    p = sample(csv_run / "logits.h5")
    assert p.returncode == 0, p.stderr


def test_export_force_never_replaces_a_runs_lock_or_csv_files(csv_run, tmp_path):
    files = run_files(csv_run)
    for out, fmt in ((csv_run / ".lock", "llmc"), (csv_run / "train.csv", "llmc"), (csv_run / "eval.csv", "llmc"),
                     (csv_run, "hf"), (csv_run / "checkpoints", "hf")):
        p = run_train(["export", "--ckpt", csv_run, "--out", out, "--format", fmt, "--force"], env=ENV)
        assert p.returncode == EXIT_BAD_INPUT and "export never writes there" in p.stderr, (out, p.stderr)
    assert run_files(csv_run) == files


def test_a_failed_logits_write_leaves_the_file_it_would_replace(csv_run, small_fs):
    mine = small_fs / "logits.h5"
    mine.write_text("precious")
    # the rest of the small filesystem filled, so that the logits (30 x 64 floats) cannot be written
    fd = os.open(small_fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 1024):
            pass
    except OSError:
        pass
    os.close(fd)
    prompt = ",".join(["1"] * 30)
    p = run_train(["sample", "--ckpt", csv_run, "--prompt-ids", prompt, "--tokens", "0", "--logits", mine,
                   "--force"], env=ENV)
    assert p.returncode == EXIT_BAD_INPUT and p.stderr.startswith("error: --logits"), p.stderr
    assert mine.read_text() == "precious" and sorted(x.name for x in small_fs.iterdir()) == ["filler", "logits.h5"]
