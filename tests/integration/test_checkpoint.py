"""Checkpoints on CPU (1 and several ranks): bit-exact resume after SIGUSR1, kill -9 during a write,
resharding to another world size and ZeRO stage, and named errors for damaged or mismatched checkpoints."""
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import TRAIN, as_killed, flip_bit, mpirun_cmd, read_log, run_train, tiny_yaml
from test_zero import PARAM_ATOL, checkpoint_state, flat

EXIT_BAD_INPUT, EXIT_CHECKPOINTED = 1, 75
ENV = {"OMP_NUM_THREADS": "1"}  # 2 cores shared by up to 3 ranks: more threads only spin
# Evaluating 40 batches after every step makes a step take tens of milliseconds without changing the
# training, so a signal sent after step 3 lands well before step 20.
SLOW = 40
# Resharding changes the order of the gradient sums (see test_zero.py): over 10 steps the losses moved by
# up to 1.6e-7 when this was written.
LOSS_ATOL = 1e-6


def yaml(tmp_path, name, eval_batches=None, keep_last=None, **kw):
    """conftest's tiny run; eval_batches > 0 evaluates that many batches after every step."""
    y = tiny_yaml(tmp_path, name=name, **kw)
    text = y.read_text()
    if eval_batches:
        text = text.replace("eval: {every: 0, batches: 2}", f"eval: {{every: 1, batches: {eval_batches}}}")
    if keep_last:
        text = text.replace("keep_last: 3}", f"keep_last: {keep_last}}}")
    y.write_text(text)
    return y


def run(args, ranks=1, ok=(0,), timeout=120):
    p = run_train([str(a) for a in args], ranks=ranks, timeout=timeout, env=ENV)
    assert p.returncode in ok, f"exit {p.returncode} (expected {ok})\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    return p


def start(args, ranks=1):
    cmd = (mpirun_cmd(ranks) if ranks > 1 else []) + [str(TRAIN)] + [str(a) for a in args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **ENV), start_new_session=True)


def train_pids(proc):
    """The ./train processes of a Popen (itself, or mpirun's children)."""
    if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "train":
        return [proc.pid]
    out = subprocess.run(["pgrep", "-P", str(proc.pid), "-x", "train"], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def wait_for_step(proc, step, timeout=60):
    """Reads the run's stdout until it reports `step`; returns the lines read."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("step") and line.split()[1].split("/")[0] == str(step):
            return lines
    rc = proc.poll()
    if rc is None:
        os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    raise AssertionError(f"step {step} not reached; exit {rc}\n{''.join(lines)[-3000:]}\n{err[-3000:]}")


def finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the run did not end")
    return proc.returncode, out, err


def steps_once(log, n):
    assert list(log["step"]) == list(range(1, n + 1)), f"log steps {list(log['step'])}: expected 1..{n} once each"


def latest(run_dir):
    root = Path(run_dir) / "checkpoints"
    return root / (root / "latest").read_text().strip()


def ckpt_step(ckpt):
    with h5py.File(Path(ckpt) / "rank_00000.h5", "r") as f:
        return int(f.attrs["step"])


def params(ckpt):
    """Every parameter of a checkpoint, the key bias included (for bit-exact comparisons)."""
    return flat(checkpoint_state(ckpt)[0], skip_key_bias=False)


# ---- SIGUSR1 -> checkpoint, exit 75; --resume continues bit for bit
@pytest.mark.parametrize("ranks,stage", [(1, 0), (2, 0), (2, 2)])
def test_signal_then_resume_is_bit_exact(tmp_path, ranks, stage):
    ya = yaml(tmp_path, "a", stage=stage, ckpt_every=20, eval_batches=SLOW)
    run(["--yaml", ya], ranks=ranks)
    a = read_log(tmp_path / "runs/a/log.h5")
    steps_once(a, 20)

    yb = yaml(tmp_path, "b", stage=stage, ckpt_every=5, eval_batches=SLOW)
    proc = start(["--yaml", yb], ranks=ranks)
    wait_for_step(proc, 3)
    for pid in train_pids(proc):  # as a scheduler would: every rank gets the signal
        os.kill(pid, signal.SIGUSR1)
    rc, out, err = finish(proc)
    assert rc == EXIT_CHECKPOINTED, f"SIGUSR1: exit {rc}, expected 75\n{out[-2000:]}\n{err[-2000:]}"
    bdir = tmp_path / "runs/b"
    stopped = ckpt_step(latest(bdir))
    assert 3 <= stopped < 20, f"stopped at step {stopped}"
    b1 = read_log(bdir / "log.h5")
    assert b1["attrs"]["status"] == "checkpointed"
    steps_once(b1, stopped)
    assert "resume" in out + err

    p = run(["--yaml", yb, "--resume"], ranks=ranks)
    assert f"resumed from step {stopped}" in p.stdout
    b = read_log(bdir / "log.h5")
    assert b["attrs"]["status"] == "ok"
    steps_once(b, 20)
    # the same run, bit for bit: losses, gradient norms, validation and the final parameters
    for k in ("loss", "grad_norm", "lr"):
        diff = np.nonzero(a[k] != b[k])[0]
        assert diff.size == 0, f"{k} differs from step {b['step'][diff[0]]} (resumed at {stopped}): {a[k][diff]} vs {b[k][diff]}"
    assert np.array_equal(a["eval_step"], b["eval_step"]) and np.array_equal(a["val_loss"], b["val_loss"])
    assert np.array_equal(params(latest(tmp_path / "runs/a")), params(latest(bdir)))


def test_sigusr1_through_mpirun(tmp_path):
    """SIGUSR1 to mpirun (what a batch system signals) reaches the ranks: checkpoint, exit 75."""
    y = yaml(tmp_path, "m", stage=3, steps=200, eval_batches=SLOW)
    proc = start(["--yaml", y], ranks=2)
    wait_for_step(proc, 2)
    proc.send_signal(signal.SIGUSR1)
    rc, out, err = finish(proc)
    assert rc == EXIT_CHECKPOINTED, f"exit {rc}\n{out[-2000:]}\n{err[-2000:]}"
    ck = latest(tmp_path / "runs/m")
    assert sorted(p.name for p in ck.iterdir()) == ["MANIFEST", "rank_00000.h5", "rank_00001.h5"]
    assert 2 <= ckpt_step(ck) < 200
    assert read_log(tmp_path / "runs/m/log.h5")["attrs"]["status"] == "checkpointed"


# ---- kill -9 at random moments, many during a checkpoint write
def kill_at_random(tmp_path, name, ranks, steps, rng):
    """Starts a run that checkpoints every step, kills every rank with SIGKILL a random moment after
    step 2; returns (yaml, whether a .tmp checkpoint folder was left behind)."""
    y = yaml(tmp_path, name, steps=steps, stage=2 if ranks > 1 else 0, ckpt_every=1, keep_last=2)
    proc = start(["--yaml", y], ranks=ranks)
    wait_for_step(proc, 2)
    time.sleep(rng.uniform(0.0, 0.05))
    for pid in train_pids(proc):
        os.kill(pid, signal.SIGKILL)
    finish(proc)
    root = tmp_path / "runs" / name / "checkpoints"
    return y, any(p.name.endswith(".tmp") for p in root.iterdir())


@pytest.mark.parametrize("ranks", [1, 2])
def test_kill9_during_checkpoint_then_resume(tmp_path, ranks):
    steps = 30
    ref = yaml(tmp_path, "ref", steps=steps, stage=2 if ranks > 1 else 0, ckpt_every=1, keep_last=2)
    run(["--yaml", ref], ranks=ranks)
    want = read_log(tmp_path / "runs/ref/log.h5")
    rng = random.Random(1234)
    in_tmp, tries = 0, 0
    while tries < 8 and (tries < 3 or in_tmp < 2):
        tries += 1
        name = f"k{tries}"
        y, left_tmp = kill_at_random(tmp_path, name, ranks, steps, rng)
        in_tmp += left_tmp
        root = tmp_path / "runs" / name / "checkpoints"
        # `latest` names a complete checkpoint, and every complete one loads
        complete = sorted(p for p in root.iterdir() if re.fullmatch(r"step_\d+", p.name))
        if (root / "latest").exists():
            assert (root / (root / "latest").read_text().strip()) in complete
        for ck in complete:
            run(["export", "--ckpt", ck, "--out", tmp_path / "x.bin", "--force"])
        # resume (the checkpoints only: the run log's own recovery is the next test) and finish the run
        fresh = tmp_path / "runs" / f"{name}r"
        shutil.copytree(root, fresh / "checkpoints")
        p = run(["--yaml", y, "--resume", "--set", f"run.name={name}r"], ranks=ranks)
        got = read_log(fresh / "log.h5")
        resumed = [int(s.split()[3]) for s in p.stdout.splitlines() if s.startswith("resumed from step")]
        start_step = resumed[0] if resumed else 0
        assert resumed or ("starting from scratch" in p.stdout and not complete), p.stdout[-2000:]
        assert start_step == (ckpt_step(complete[-1]) if complete else 0), "resume should take the newest complete checkpoint"
        assert list(got["step"]) == list(range(start_step + 1, steps + 1))
        assert np.array_equal(got["loss"], want["loss"][start_step:]), f"try {tries}: losses differ after resuming at {start_step}"
    assert in_tmp >= 1, f"no kill in {tries} tries landed during a checkpoint write"


def test_kill9_then_resume_in_place(tmp_path):
    """After kill -9, --resume in the same run directory continues the log: each step once."""
    steps = 30
    y, _ = kill_at_random(tmp_path, "k", 1, steps, random.Random(5))
    ref = yaml(tmp_path, "ref", steps=steps, ckpt_every=1, keep_last=2)
    run(["--yaml", ref])
    run(["--yaml", y, "--resume"])
    got = read_log(tmp_path / "runs/k/log.h5")
    steps_once(got, steps)
    assert np.array_equal(got["loss"], read_log(tmp_path / "runs/ref/log.h5")["loss"])


# ---- resharding: 2 ranks stage 2 -> 1 rank stage 0, 3 ranks stage 3
def test_reshard_resume(tmp_path):
    # 12 sequences per step on every world size: 2 x 6, 1 x 12, 3 x 4
    y2 = yaml(tmp_path, "two", B=6, stage=2, ckpt_every=10)
    run(["--yaml", y2], ranks=2)
    ref = read_log(tmp_path / "runs/two/log.h5")
    src = tmp_path / "runs/two/checkpoints/step_00000010"
    for ranks, stage, B in ((1, 0, 12), (3, 3, 4), (2, 1, 6)):
        name = f"r{ranks}s{stage}"
        dst = tmp_path / "runs" / name / "checkpoints"
        dst.mkdir(parents=True)
        shutil.copytree(src, dst / src.name)
        (dst / "latest").write_text(src.name + "\n")
        y = yaml(tmp_path, name, B=B, stage=stage, ckpt_every=10)
        p = run(["--yaml", y, "--resume"], ranks=ranks)
        assert "resumed from step 10" in p.stdout
        got = read_log(tmp_path / "runs" / name / "log.h5")
        assert list(got["step"]) == list(range(11, 21))
        diff = np.abs(got["loss"] - ref["loss"][10:])
        assert diff.max() <= LOSS_ATOL, f"{ranks} ranks stage {stage}: losses after resharding differ by {diff.max():.3g}"
        ck = latest(tmp_path / "runs" / name)
        assert ckpt_step(ck) == 20 and len(list(ck.glob("rank_*.h5"))) == ranks
        # all but the key bias (driven by rounding noise, see test_zero.flat) agree to rounding
        pd = np.abs(flat(checkpoint_state(ck)[0]) - flat(checkpoint_state(latest(tmp_path / "runs/two"))[0])).max()
        assert pd <= PARAM_ATOL, f"{ranks} ranks stage {stage}: parameters after resharding differ by {pd:.3g}"
        print(f"{ranks} ranks stage {stage}: max loss diff {diff.max():.3g}, max parameter diff {pd:.3g}")


# ---- damaged and mismatched checkpoints
@pytest.fixture
def two_checkpoints(tmp_path):
    """A finished 1-rank run with checkpoints at steps 10 and 20 (keep_last 2)."""
    y = yaml(tmp_path, "c", steps=20, ckpt_every=10, keep_last=2)
    run(["--yaml", y])
    run_dir = tmp_path / "runs/c"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_00000010", "step_00000020"]
    return y, run_dir, read_log(run_dir / "log.h5")


def truncate(path):
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def flip_byte(path, dataset="b0001/param"):
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        off = ds.id.get_offset() + ds.id.get_storage_size() // 2
    flip_bit(path, off, 0x10)


DAMAGE = {
    "truncated": (truncate, "truncated"),
    "flipped": (flip_byte, "checksum mismatch"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_checkpoint(two_checkpoints, tmp_path, kind):
    y, run_dir, ref = two_checkpoints
    damage, words = DAMAGE[kind]
    newest = run_dir / "checkpoints/step_00000020"
    damage(newest / "rank_00000.h5")
    # loading that checkpoint names the problem and fails
    p = run(["export", "--ckpt", newest, "--out", tmp_path / "x.bin"], ok=(EXIT_BAD_INPUT,))
    assert words in p.stderr and "rank_00000.h5" in p.stderr, p.stderr
    # checkpoint.resume: auto falls back to step 10, says so on stderr, and trains steps 11-20 again.
    # Checkpointing at step 11: the damaged step 20, from the abandoned timeline, is dropped then (rather
    # than step 10 by keep_last); the run's final checkpoint is a new step 20, and keep_last drops step 10.
    as_killed(run_dir)  # a completed run would be left as it is
    p = run(["--yaml", y, "--set", "checkpoint.resume=auto", "--set", "checkpoint.every=11"])
    assert "step_00000020" in p.stderr and "falling back" in p.stderr and words in p.stderr, p.stderr
    assert "resumed from step 10" in p.stdout
    got = read_log(run_dir / "log.h5")
    steps_once(got, 20)
    assert np.array_equal(got["loss"], ref["loss"])
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left == ["latest", "step_00000011", "step_00000020"], left
    assert params(newest).size and ckpt_step(newest) == 20  # the new one, loadable
    # with nothing to fall back to: a named error, exit 1
    for step in ("00000011", "00000020"):
        damage(run_dir / f"checkpoints/step_{step}/rank_00000.h5")
    as_killed(run_dir)
    p = run(["--yaml", y, "--resume"], ok=(EXIT_BAD_INPUT,))
    assert "no usable checkpoint" in p.stderr and words in p.stderr, p.stderr


def test_checkpoint_of_another_model(two_checkpoints):
    y, run_dir, _ = two_checkpoints
    as_killed(run_dir)  # a completed run would be left as it is
    p = run(["--yaml", y, "--resume", "--set", "model.n_embd=64"], ok=(EXIT_BAD_INPUT,))
    assert "another model" in p.stderr and "model.n_embd was 32 and is 64 now" in p.stderr, p.stderr
    assert "falling back" not in p.stderr and "no usable checkpoint" not in p.stderr, p.stderr


def test_missing_rank_file(tmp_path):
    y = yaml(tmp_path, "mr", stage=1, steps=10, ckpt_every=10)
    run(["--yaml", y], ranks=2)
    ck = latest(tmp_path / "runs/mr")
    (ck / "rank_00001.h5").unlink()
    p = run(["--yaml", y, "--resume", "--set", "training.steps=12"], ranks=2, ok=(EXIT_BAD_INPUT,))
    assert "incomplete" in p.stderr and "rank_00001.h5" in p.stderr, p.stderr
