"""GPU end to end (skipped with a message on machines without a CUDA device): the loss curve of 50
steps on tinyshakespeare follows the CPU path, a bf16 GPT-2 124M run resumes (bit for bit with
training.deterministic), and a checkpoint written in the background holds its step's state."""
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED, TRAIN, read_log, run_train, write_yaml


def has_gpu():
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not has_gpu(), reason="SKIP: no CUDA device on this machine (GPU tests run on the GPU machine)")


def data_dir():
    d = Path(os.environ.get("GPT_SHARED_DATA", SHARED)) / "tinyshakespeare"
    if not (d / "tiny_shakespeare_train.bin").exists():
        pytest.skip(f"SKIP: tinyshakespeare shards not found in {d}")
    return d


def test_loss_curve_follows_cpu_within_bf16_tolerance(tmp_path):
    d = data_dir()
    base = f"""
model: {{preset: tiny, max_seq_len: 256}}
data: {{train: {d / 'tiny_shakespeare_train.bin'}, val: {d / 'tiny_shakespeare_val.bin'}}}
training: {{micro_batch: 8, seq_len: 128, steps: 50, lr: 3.0e-3, warmup_steps: 5, min_lr_frac: 0.1}}
eval: {{every: 25, batches: 4}}
log: {{every: 1, progress: false}}
"""
    curves = {}
    for dev, prec in [("cpu", "fp32"), ("cuda", "bf16"), ("cuda", "fp32")]:
        y = write_yaml(tmp_path / f"{dev}{prec}.yaml", f"run: {{name: {dev}{prec}, out_dir: {tmp_path}}}\n" + base)
        run_train(["--yaml", y, "--set", f"training.device={dev}", "--set", f"training.precision={prec}"], check=True,
                  env={"OMP_NUM_THREADS": "8"})
        curves[dev + prec] = read_log(tmp_path / f"{dev}{prec}/log.h5")["loss"]
    ref = curves["cpufp32"]
    for k in ["cudabf16", "cudafp32"]:
        diff = np.abs(curves[k] - ref)
        print(k, "max |loss - cpu loss| =", diff.max(), "at step", diff.argmax() + 1)
    # bf16: 8-bit mantissas through 50 Adam steps; the curves agree to a few hundredths of a nat
    assert np.max(np.abs(curves["cudabf16"] - ref)) < 0.15
    assert abs(np.mean(curves["cudabf16"][-10:]) - np.mean(ref[-10:])) < 0.05
    # fp32 (TF32 matmuls, bf16 attention inputs): closer still
    assert np.max(np.abs(curves["cudafp32"] - ref)) < 0.05


@pytest.mark.parametrize("deterministic", [True, False])
def test_gpt2_124m_bf16_resume(tmp_path, deterministic):
    """deterministic: true resumes bit for bit; the fast mode (non-deterministic attention backward,
    timed matmul algorithms) resumes onto the same curve within bf16 run-to-run noise."""
    yaml = f"""
run: {{name: r, out_dir: {tmp_path}}}
model: {{preset: d12}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: cuda, micro_batch: 8, seq_len: 1024, steps: 12, lr: 6.0e-4, warmup_steps: 2, schedule: constant,
           deterministic: {str(deterministic).lower()}}}
eval: {{batches: 0}}
log: {{every: 1, progress: false, op_profile: true}}
checkpoint: {{every: 6, keep_last: 2}}
"""
    y = write_yaml(tmp_path / "r.yaml", yaml)
    p = run_train(["--yaml", y, "--set", "run.name=full"], check=True)
    full = read_log(tmp_path / "full/log.h5")["loss"]
    # the op profile covers the 11 steps after the warm-up and names the model's ops
    assert "op profile over 11 steps" in p.stdout + p.stderr
    for op in ("attention_bwd", "matmul_fwd 768x3072 +gelu", "classifier", "adamw", "(idle between ops)"):
        assert op in p.stdout + p.stderr, op
    # the same run stopped after its step-6 checkpoint, then resumed
    run_train(["--yaml", y, "--set", "run.name=part", "--set", "training.steps=6"], check=True)
    run_train(["--yaml", y, "--set", "run.name=part", "--resume"], check=True)
    part = read_log(tmp_path / "part/log.h5")
    assert list(part["step"]) == list(range(1, 13))
    print("full", full, "\nresumed", part["loss"])
    if deterministic:
        assert np.array_equal(part["loss"], full), "resumed losses differ from the uninterrupted run"
    else:
        assert np.max(np.abs(part["loss"] - full)) < 0.02, "resumed losses left the uninterrupted run's curve"


@pytest.mark.parametrize("every", [1, 3])
def test_background_checkpoint_holds_its_steps_state(tmp_path, every):
    """checkpoint.async: the snapshot is copied on the copy stream while the next step computes, and that
    step's update waits for the copies on the device. So the checkpoint written in the background holds
    the same bytes as the one written while training waits; its bf16 parameters, copied as bf16 and
    widened on the host, are exact bf16 values next to their master weights. Every step (every=1) the
    first checkpoint comes while its host memory may still be being page-locked on its own thread."""
    yaml = f"""
run: {{name: a, out_dir: {tmp_path}}}
model: {{preset: d12}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: cuda, micro_batch: 4, seq_len: 512, steps: 6, lr: 6.0e-4, warmup_steps: 2, deterministic: true}}
eval: {{batches: 0}}
log: {{every: 1, progress: false}}
checkpoint: {{every: {every}, keep_last: 2}}
"""
    y = write_yaml(tmp_path / "a.yaml", yaml)
    p = run_train(["--yaml", y], check=True)
    assert "could not page-lock" not in p.stderr
    run_train(["--yaml", y, "--set", "run.name=s", "--set", "checkpoint.async=false"], check=True)
    import h5py
    for step in (f"step_{6 - every:08d}", "step_00000006"):
        with h5py.File(tmp_path / "a/checkpoints" / step / "rank_00000.h5", "r") as fa, \
                h5py.File(tmp_path / "s/checkpoints" / step / "rank_00000.h5", "r") as fs:
            for g in fa:
                if not g.startswith("b"):
                    continue
                for name in fa[g]:
                    a, s = fa[g][name][()], fs[g][name][()]
                    assert np.array_equal(a.view(np.uint32), s.view(np.uint32)), f"{step} {g}/{name} differs"
                p, m = fa[g]["param"][()], fa[g]["master"][()]
                assert not np.any(p.view(np.uint32) & 0xFFFF), f"{step} {g}/param holds values that are not bf16"
                assert np.all(np.abs(p - m) <= np.abs(m) * 2.0 ** -7 + 1e-30), f"{step} {g}/param is not its master rounded"
