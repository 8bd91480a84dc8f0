"""What --resume does in each state a run directory can be in (docs/FORMATS.md, "Resuming"): a completed run is
left byte for byte as it is, a run that cannot reach the steps asked for is refused before any work, a run
killed before its first checkpoint starts over only after its log is kept; and what a resume finds wrong (the
model, the data files, the log, the disk) is named, exit 1, before anything changes."""
import hashlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, TRAIN, mpirun_cmd, read_log, run_train, tiny_yaml, write_shard, write_yaml
from test_checkpoint import train_pids

EXIT_BAD_INPUT = 1
ENV = {"OMP_NUM_THREADS": "1"}


def snapshot(root):
    """path -> sha256 of every file under root (the run's lock file aside: every run opens it)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file() and p.name != ".lock"}


def run(args, ranks=1, **kw):
    return run_train([str(a) for a in args], ranks=ranks, env=ENV, **kw)


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def refused(p, *needles):
    assert p.returncode == EXIT_BAD_INPUT, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    for n in needles:
        assert n in p.stderr, (n, p.stderr[-3000:])
    assert "set-up:" not in p.stdout  # before any work
    return p


def killed_run(y, after, ranks=1):
    """Starts the run of y and kills it (SIGKILL, every rank) once its stdout shows `after`."""
    cmd = (mpirun_cmd(ranks) if ranks > 1 else []) + [str(TRAIN), "--yaml", str(y)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **ENV), start_new_session=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if after in line:
            break
    for pid in train_pids(proc):  # every rank (mpirun gives its ranks process groups of their own)
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert any(after in line for line in seen), "".join(seen)[-3000:]


# ---- completed runs
@pytest.mark.parametrize("every", [0, 3])
def test_resume_of_a_completed_run_changes_nothing(tmp_path, every):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=every)
    ok(run(["--yaml", y]))
    run_dir = tmp_path / "runs/t"
    before = snapshot(run_dir)
    for ranks in (1, 2):  # a resubmitted job may also get another number of ranks
        p = ok(run(["--yaml", y, "--resume"], ranks=ranks))
        assert "already complete at step 6" in p.stdout and "0 step(s)" not in p.stdout, p.stdout[-2000:]
        assert snapshot(run_dir) == before
    # checkpoint.resume: auto is the same as --resume
    ok(run(["--yaml", y, "--set", "checkpoint.resume=auto"]))
    assert snapshot(run_dir) == before


def test_more_steps_on_a_completed_run(tmp_path):
    # without a checkpoint it cannot be extended: refused, untouched
    y = tiny_yaml(tmp_path, name="n", steps=6, ckpt_every=0)
    ok(run(["--yaml", y]))
    before = snapshot(tmp_path / "runs/n")
    refused(run(["--yaml", y, "--resume", "--set", "training.steps=9"]), "completed 6 step(s)",
            "no checkpoint to continue from")
    assert snapshot(tmp_path / "runs/n") == before
    # with one it goes on from its final checkpoint
    y = tiny_yaml(tmp_path, name="c", steps=6, ckpt_every=3)
    ok(run(["--yaml", y]))
    p = ok(run(["--yaml", y, "--resume", "--set", "training.steps=9"]))
    assert "resumed from step 6" in p.stdout
    assert list(read_log(tmp_path / "runs/c/log.h5")["step"]) == list(range(1, 10))


def test_fewer_steps_than_the_run_has_reached_are_refused(tmp_path):
    y = tiny_yaml(tmp_path, name="c", steps=6, ckpt_every=3)
    ok(run(["--yaml", y]))
    before = snapshot(tmp_path / "runs/c")
    refused(run(["--yaml", y, "--resume", "--set", "training.steps=4"]), "training.steps is 4", "completed 6 step(s)")
    assert snapshot(tmp_path / "runs/c") == before
    # a run killed after its checkpoint of step 6: the checkpoint's step is the floor
    y = tiny_yaml(tmp_path, name="k", steps=100000, ckpt_every=3)
    killed_run(y, "checkpoint written at step 6")
    before = snapshot(tmp_path / "runs/k")
    p = refused(run(["--yaml", y, "--resume", "--set", "training.steps=4"]), "training.steps is 4",
                "below the step the run has reached")
    assert "cannot resume from the checkpoint of step" in p.stderr
    assert snapshot(tmp_path / "runs/k") == before


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_killed_run_without_checkpoint_starts_over_keeping_its_log(tmp_path, ranks):
    y = tiny_yaml(tmp_path, steps=100000, ckpt_every=0)
    killed_run(y, "step      3/", ranks=ranks)
    run_dir = tmp_path / "runs/t"
    old = (run_dir / "log.h5").read_bytes()
    p = ok(run(["--yaml", y, "--resume", "--set", "training.steps=4"], ranks=ranks))
    assert f"is kept as {run_dir / 'log.1.h5'}" in p.stdout and "status running" in p.stdout, p.stdout[-2000:]
    assert (run_dir / "log.1.h5").read_bytes() == old
    assert list(read_log(run_dir / "log.h5")["step"]) == [1, 2, 3, 4]


def test_a_failed_run_without_checkpoint_starts_over_keeping_its_log(tmp_path):
    y = tiny_yaml(tmp_path, steps=4, ckpt_every=0)
    p = run_train(["--yaml", str(y)], env=dict(ENV, GPT2_TRAIN_FAULT="log@0:2"))
    run_dir = tmp_path / "runs/t"
    assert p.returncode == 2 and read_log(run_dir / "log.h5")["attrs"]["status"] == "failed", p.stderr[-2000:]
    old = (run_dir / "log.h5").read_bytes()
    p = ok(run(["--yaml", y, "--resume"]))
    assert f"is kept as {run_dir / 'log.1.h5'}" in p.stdout and "status failed" in p.stdout, p.stdout[-2000:]
    assert (run_dir / "log.1.h5").read_bytes() == old and read_log(run_dir / "log.1.h5")["attrs"]["status"] == "failed"
    assert list(read_log(run_dir / "log.h5")["step"]) == [1, 2, 3, 4]
    # now complete: the next resubmission changes nothing
    before = snapshot(run_dir)
    assert "already complete at step 4" in ok(run(["--yaml", y, "--resume"])).stdout
    assert snapshot(run_dir) == before


def resign_manifest(ckpt):
    """The MANIFEST's sizes and extent hashes recomputed from the files as they are now."""
    from test_checkpoint_io import xxh3_lib
    xxh3 = xxh3_lib()
    out, raw = [], None
    for line in (Path(ckpt) / "MANIFEST").read_text().splitlines():
        w = line.split()
        if w[0] == "file":
            raw = (Path(ckpt) / w[1]).read_bytes()
            out.append(f"file {w[1]} {len(raw)}")
        elif len(w) == 4:
            off, n = int(w[1]), int(w[2])
            out.append(f"{w[0]} {off} {n} {xxh3(raw[off:off + n]):016x}")
        else:
            out.append(line)
    (Path(ckpt) / "MANIFEST").write_text("\n".join(out) + "\n")


# ---- what a resume finds changed or damaged
def test_a_changed_model_dimension_is_named(tmp_path):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    ok(run(["--yaml", y, "--set", "training.steps=3"]))
    before = snapshot(tmp_path / "runs/t")
    p = refused(run(["--yaml", y, "--resume", "--set", "model.n_layer=3", "--set", "model.n_embd=64"]),
                "holds another model", "model.n_layer was 2 and is 3 now", "model.n_embd was 32 and is 64 now")
    assert "unusable" not in p.stderr and "falling back" not in p.stderr and "no usable checkpoint" not in p.stderr
    assert snapshot(tmp_path / "runs/t") == before


def test_a_changed_parameter_table_is_named(tmp_path):
    """Each bucket's tensors are recorded by name: a table that differs under the same dimensions is named."""
    import h5py
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    ok(run(["--yaml", y, "--set", "training.steps=3"]))
    rank0 = next((tmp_path / "runs/t/checkpoints").glob("step_*/rank_00000.h5"))
    with h5py.File(rank0, "r+") as f:
        held = f["b0001"].attrs["tensors"]
        held = held.decode() if isinstance(held, bytes) else str(held)
        assert held.startswith("qkvw 0 ") and "ln1b" in held, held
        f["b0001"].attrs["tensors"] = held.replace("ln1b", "ln1x")
    resign_manifest(rank0.parent)  # as a program with that table would have written it: not damage
    before = snapshot(tmp_path / "runs/t")
    refused(run(["--yaml", y, "--resume"]), "holds another model", "bucket b0001 held", "ln1x")
    assert snapshot(tmp_path / "runs/t") == before


def test_changed_data_files_are_named(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "a_000.bin", rng.integers(0, 64, 4096))
    write_shard(data / "a_001.bin", rng.integers(0, 64, 4096))
    y = tiny_yaml(tmp_path, steps=9, ckpt_every=3)
    y.write_text(y.read_text().replace("data: {synthetic: true, synthetic_vocab: 64, synthetic_branching: 4}",
                                       f"data: {{synthetic: false, train: '{data}/a_*.bin', shuffle: true}}"))
    ok(run(["--yaml", y, "--set", "training.steps=3"]))
    assert "a_001.bin" in read_log(tmp_path / "runs/t/log.h5")["attrs"]["data_files"]
    # untouched files: it resumes
    shutil.copytree(tmp_path / "runs/t", tmp_path / "runs/same")
    ok(run(["--yaml", y, "--resume", "--set", "run.name=same", "--set", "training.steps=4"]))
    # the same glob over other files: one replaced (same size), one grown, one added
    write_shard(data / "a_000.bin", rng.integers(0, 64, 4096))
    write_shard(data / "a_001.bin", rng.integers(0, 64, 5000))
    write_shard(data / "a_002.bin", rng.integers(0, 64, 4096))
    before = snapshot(tmp_path / "runs/t")
    refused(run(["--yaml", y, "--resume"]), "may not change on resume",
            f"'{data}/a_000.bin' holds other bytes now", f"'{data}/a_001.bin' was 9216 bytes and is 11024",
            f"'{data}/a_002.bin' is new", "data.allow_changed_files")
    assert snapshot(tmp_path / "runs/t") == before
    # on purpose: warned, and it goes on
    p = ok(run(["--yaml", y, "--resume", "--set", "data.allow_changed_files=true"]))
    assert "warning: the files behind data.train changed" in p.stderr and "a_002.bin" in p.stderr, p.stderr[-2000:]
    assert "resumed from step 3" in p.stdout


@pytest.mark.parametrize("where", [0, 512])  # HDF5's signature; the root group's header (HDF5 opens the file)
def test_a_damaged_log_is_named(tmp_path, where):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    ok(run(["--yaml", y, "--set", "training.steps=3"]))
    log = tmp_path / "runs/t/log.h5"
    b = bytearray(log.read_bytes())
    b[where:where + 16] = b"\xa5" * 16
    log.write_bytes(bytes(b))
    before = snapshot(tmp_path / "runs/t")
    p = refused(run(["--yaml", y, "--resume"]), f"run log '{log}' is damaged", "move it away")
    assert "HDF5 call failed" not in p.stderr
    assert snapshot(tmp_path / "runs/t") == before
    # moved away as it says: the run goes on from its checkpoint with a new log
    log.rename(tmp_path / "damaged.h5")
    p = ok(run(["--yaml", y, "--resume"]))
    assert "resumed from step 3" in p.stdout and list(read_log(log)["step"]) == [4, 5, 6]


def test_a_checkpoints_path_that_is_a_file_is_refused_before_work(tmp_path):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    run_dir = tmp_path / "runs/t"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").write_text("not a folder")
    # resumed, or a new run told to replace what is there
    for flag in ("--resume", "run.overwrite=true"):
        refused(run(["--yaml", y, flag]), f"'{run_dir / 'checkpoints'}' is not a directory")
        assert not (run_dir / "log.h5").exists() and (run_dir / "checkpoints").read_text() == "not a folder"


def test_too_little_disk_for_the_log_is_refused(tmp_path, small_fs):
    """Less room than the log and its 256 KiB reserve take: refused before any work, so that no run ever has a
    log that a full disk leaves unreadable or without its status."""
    with open(small_fs / "filler", "wb") as f:
        f.write(b"\0" * ((1 << 20) - (200 << 10)))
    out = small_fs / "runs"
    y = write_yaml(tmp_path / "s.yaml", tiny_yaml(tmp_path, steps=5).read_text().replace(str(tmp_path / "runs"), str(out)))
    refused(run(["--yaml", y]), f"the filesystem of '{small_fs}' has", "bytes free", "free some space")
    assert not (out / "t/log.h5").exists()
    # with the room back it runs, and its log closes readable with its status
    (small_fs / "filler").unlink()
    ok(run(["--yaml", y]))
    assert read_log(out / "t/log.h5")["attrs"]["status"] == "ok"


# ---- the Slurm scripts always pass --resume: resubmitting a finished point changes nothing
def test_resubmitted_sweep_point_is_left_as_it_is(tmp_path):
    y = write_yaml(tmp_path / "sw.yaml", tiny_yaml(tmp_path, name="sw", steps=4).read_text() +
                   "sweep: {grid: {training.lr: [0.01, 0.02]}}\n")
    env = dict(os.environ, **ENV, REPO_DIR=str(ROOT), TRAIN_BIN=str(TRAIN), LAUNCHER="mpirun",
               MPIRUN_ARGS="--allow-run-as-root --oversubscribe", SLURM_ARRAY_TASK_ID="1", SLURM_NTASKS="1",
               SLURM_JOB_NODELIST="localhost")

    def point():
        return subprocess.run(["bash", str(ROOT / "slurm/sweep_point.sbatch"), str(y)], env=env, capture_output=True,
                              text=True, timeout=300)

    p = point()
    assert p.returncode == 0 and "run ok: 4 step(s)" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    run_dir = tmp_path / "runs/sw/p001"
    before = snapshot(run_dir)
    p = point()
    assert p.returncode == 0 and "already complete at step 4" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert "train exited 0" in p.stderr
    assert snapshot(run_dir) == before


# ---- a dry run of a resume checks what the resume checks
@pytest.fixture
def shard_run(tmp_path):
    """A 3-step run on token shards with a checkpoint of step 3, left as a kill after it leaves it."""
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    write_shard(tmp_path / "data" / "a.bin", rng.integers(0, 64, 4000))
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3,
                  extra=f"data: {{synthetic: false, train: '{tmp_path}/data/*.bin', shuffle: true}}\n")
    ok(run(["--yaml", y, "--set", "training.steps=3"]))
    from conftest import as_killed
    as_killed(tmp_path / "runs/t")
    return y


@pytest.mark.parametrize("change, needle", [
    ("training.seq_len=8", "training.seq_len was 16 and is 8 now"),
    ("model.n_layer=3", "model.n_layer was 2 and is 3 now"),
    ("run.seed=8", "run.seed was 7 and is 8 now"),
    ("training.micro_batch=2", "tokens per step"),
    ("data.shuffle=false", "data.shuffle was true and is false now"),
    ("training.steps=2", "training.steps is 2, below the step the run has reached"),
])
def test_dry_run_of_a_resume_refuses_what_the_resume_refuses(tmp_path, shard_run, change, needle):
    before = snapshot(tmp_path / "runs/t")
    real = refused(run(["--yaml", shard_run, "--resume", change]), needle)
    dry = refused(run(["--yaml", shard_run, "--resume", "--dry-run", change]), needle)
    assert dry.stderr.splitlines()[0] == real.stderr.splitlines()[0]
    assert snapshot(tmp_path / "runs/t") == before


def test_dry_run_of_a_resume_says_what_it_would_do(tmp_path, shard_run):
    p = ok(run(["--yaml", shard_run, "--resume", "--dry-run"]))
    assert "--resume: continues from the checkpoint of step 3" in p.stdout, p.stdout[-2000:]
    ok(run(["--yaml", shard_run, "--resume"]))
    refused(run(["--yaml", shard_run, "--resume", "--dry-run", "training.steps=5"]), "training.steps is 5",
            "completed 6 step(s)")
    assert "nothing to do" in ok(run(["--yaml", shard_run, "--resume", "--dry-run"])).stdout
