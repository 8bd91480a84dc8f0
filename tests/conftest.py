"""Shared pytest fixtures: the built binary, the shared data folder, and a runner for ./train."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "train"
# The shared test data (GPT-2's vocabulary, the tinyshakespeare shards): $TEST_DATA_DIR, as for the C++
# tests (tests/test_util.hpp), default ../shared/data beside the checkout. Tests that need it skip without it.
SHARED = Path(os.environ.get("TEST_DATA_DIR") or ROOT.parent / "shared" / "data")


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


def dump_of(program, out):
    """Runs a C++ test program's `--dump DIR` into the folder out (its values for a NumPy reference to check);
    fails the test, naming the program, when it is not built."""
    if not program.exists():
        pytest.fail(f"{program} is not built: run make")
    subprocess.run([str(program), "--dump", str(out)], check=True, capture_output=True, text=True)
    return out


def write_shard(path, tokens):
    """A token shard as docs/DATA.md has it (256-int32 header, then uint16 tokens); returns its path."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    Path(path).write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())
    return Path(path)


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


def _load_merging(text):
    """YAML text whose mappings may give a key twice (extra = "training: {...}\n" + "training: {...}\n"):
    the values of a repeated key merged key by key where both are mappings, else the later one."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node):
        out = {}
        for k, v in node.value:
            key, value = loader.construct_object(k, deep=True), loader.construct_object(v, deep=True)
            out[key] = {**out[key], **value} if isinstance(out.get(key), dict) and isinstance(value, dict) else value
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=Loader)


def merge_sections(base, extra):
    """base + extra; a section that extra gives again (or gives twice) is merged into base's key by key
    (the trainer refuses a section given twice), and then every section is written as one flow mapping."""
    import yaml
    add = _load_merging(extra) if extra.strip() else None
    if not isinstance(add, dict) or (not set(add) & set(yaml.safe_load(base)) and add == yaml.safe_load(extra)):
        return base + extra
    merged = yaml.safe_load(base)
    for section, body in add.items():
        merged[section] = {**(merged.get(section) or {}), **(body or {})} if isinstance(body, dict) else body
    return "".join(yaml.safe_dump({k: v}, default_flow_style=True, width=1 << 16, sort_keys=False).strip()[1:-1] + "\n"
                   for k, v in merged.items())


def tiny_yaml(tmp_path, name="t", steps=20, B=4, stage=0, accum=1, ckpt_every=0, extra=""):
    text = TINY_SYNTH.format(name=name, out_dir=tmp_path / "runs", steps=steps, B=B, stage=stage, accum=accum,
                             ckpt_every=ckpt_every)
    return write_yaml(tmp_path / f"{name}.yaml", merge_sections(text, extra))


def flip_bit(path, offset, mask=0x01):
    """Damages one byte of a file in place: the bits of mask flipped at offset."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def as_killed(run_dir):
    """Makes a finished run's log.h5 say what a kill after its last step leaves (status `running`), so that
    --resume continues it from its checkpoints (a completed run is left as it is: docs/FORMATS.md)."""
    import h5py
    with h5py.File(Path(run_dir) / "log.h5", "r+") as f:
        f.attrs["status"] = "running"


def int8_code(signed):
    """The 256 values of an int8 optimizer-state code, ascending (docs/DESIGN.md, The optimizer), written from
    their definition: logarithmic steps from a float ratio applied by float products."""
    r = np.float32(float.fromhex("0x1.d34a8p-1") if signed else float.fromhex("0x1.d3a098p-1"))
    n = 127 if signed else 255
    mag = [np.float32(1)]
    for _ in range(n - 1):
        mag.append(np.float32(mag[-1] * r))
    mag = np.array(mag, np.float32)  # 1 down to the smallest step
    if signed:
        values = np.concatenate([-mag, [np.float32(0)], mag[::-1], [np.float32(1)]])
    else:
        values = np.concatenate([[np.float32(0)], mag[::-1]])
    assert values.dtype == np.float32 and values.size == 256
    return values


def rank_file_arrays(path):
    """Every dataset of a checkpoint rank file (parameters, optimizer state, FP8 state), by name."""
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


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
