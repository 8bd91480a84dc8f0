"""Shared pytest fixtures: the built binary, the shared data folder, and a runner for ./train."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "train"
SHARED = ROOT.parent / "shared" / "data"


def mpirun_cmd(n):
    """mpirun prefix for n ranks on this machine (root-safe, oversubscribed, one thread per rank)."""
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n),
            "-x", "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1"]


@pytest.fixture(scope="session")
def train_bin():
    if not TRAIN.exists():
        pytest.fail(f"{TRAIN} is not built: run `make` first")
    return TRAIN


@pytest.fixture(scope="session")
def shared_data():
    d = SHARED / "tinyshakespeare"
    if not (d / "tiny_shakespeare_val.bin").exists():
        pytest.skip(f"SKIP: shared data not found at {d}")
    return SHARED


def run_train(args, cwd=None, ranks=1, timeout=600, env=None, check=False):
    """Runs ./train (under mpirun when ranks > 1); returns the CompletedProcess."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "2")
    e.update(env or {})
    cmd = (mpirun_cmd(ranks) if ranks > 1 else []) + [str(TRAIN)] + [str(a) for a in args]
    p = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def write_yaml(path, text):
    Path(path).write_text(text)
    return Path(path)


# A tiny model on the synthetic corpus: fast enough for many runs per test.
TINY_SYNTH = """
run: {{name: {name}, out_dir: {out_dir}, seed: 7}}
model: {{n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}}
data: {{synthetic: true, synthetic_vocab: 64, synthetic_branching: 4}}
training: {{device: cpu, micro_batch: {B}, seq_len: 16, steps: {steps}, lr: 1.0e-2, warmup_steps: 2,
           grad_clip: 1.0, weight_decay: 0.1, zero_stage: {stage}, grad_accum: {accum}}}
eval: {{every: 0, batches: 2}}
log: {{every: 1, progress: false}}
checkpoint: {{every: {ckpt_every}, keep_last: 3}}
"""


def tiny_yaml(tmp_path, name="t", steps=20, B=4, stage=0, accum=1, ckpt_every=0, extra=""):
    text = TINY_SYNTH.format(name=name, out_dir=tmp_path / "runs", steps=steps, B=B, stage=stage, accum=accum,
                             ckpt_every=ckpt_every) + extra
    return write_yaml(tmp_path / f"{name}.yaml", text)


def flip_bit(path, offset, mask=0x01):
    """Damages one byte of a file in place: the bits of mask flipped at offset."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def read_log(path):
    import h5py
    with h5py.File(path, "r") as f:
        out = {k: f["train"][k][:] for k in f["train"]}
        out["eval_step"] = f["eval/step"][:]
        out["val_loss"] = f["eval/val_loss"][:]
        out["attrs"] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        out["mem_pred"] = dict(f["memory/predicted"].attrs) if "memory/predicted" in f else {}
        out["mem_meas"] = dict(f["memory/measured"].attrs) if "memory/measured" in f else {}
    return out


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs (root mounts it), for full-disk tests; skipped with a message where it cannot be mounted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"SKIP: cannot mount a small tmpfs here ({p.stderr.strip()})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
