"""ZeRO stages on 2 GPUs (NCCL), skipped with a message on machines with fewer GPUs: stages 1-3 follow
stage 0 within bf16 tolerance, and 2 ranks x micro-batch b follow 1 rank x 2b."""
import shutil
import subprocess

import numpy as np
import pytest

from conftest import TRAIN, read_log, write_yaml


def gpu_count():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    p = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return len(p.stdout.strip().splitlines()) if p.returncode == 0 else 0


pytestmark = pytest.mark.skipif(gpu_count() < 2, reason="SKIP: fewer than 2 CUDA devices on this machine")

BASE = """
run: {{name: {name}, out_dir: {out}}}
model: {{n_layer: 4, n_head: 4, n_embd: 256, max_seq_len: 256}}
data: {{synthetic: true, synthetic_vocab: 2048}}
training: {{device: cuda, micro_batch: {B}, seq_len: 256, steps: 20, lr: 1.0e-3, warmup_steps: 2, zero_stage: {stage}}}
eval: {{batches: 0}}
log: {{every: 1, progress: false}}
"""


def run(tmp_path, name, ranks, B, stage):
    y = write_yaml(tmp_path / f"{name}.yaml", BASE.format(name=name, out=tmp_path, B=B, stage=stage))
    cmd = ["mpirun", "--allow-run-as-root", "-np", str(ranks), "-x", "LD_LIBRARY_PATH", "-x", "NCCL_NVLS_ENABLE",
           str(TRAIN), "--yaml", str(y)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return read_log(tmp_path / name / "log.h5")["loss"]


def test_stages_follow_stage_0_on_two_gpus(tmp_path):
    ref = run(tmp_path, "s0", 2, 8, 0)
    for stage in [1, 2, 3]:
        got = run(tmp_path, f"s{stage}", 2, 8, stage)
        d = np.abs(got - ref)
        print(f"stage {stage}: max |loss - stage 0 loss| = {d.max():.4f}")
        # bf16 gradients are summed in another order (all-reduce vs reduce-scatter): the curves agree to a
        # few hundredths over 20 steps (measured on 2 H200s: 0.037 for each of stages 1-3). A lost or
        # doubled gradient shard moves the loss by tenths within a few steps.
        assert d.max() < 0.1, (stage, got, ref)


def test_two_ranks_match_one_rank_with_twice_the_micro_batch(tmp_path):
    two = run(tmp_path, "two", 2, 8, 0)
    one = run(tmp_path, "one", 1, 16, 0)
    d = np.abs(two - one)
    print(f"max |2 ranks - 1 rank| = {d.max():.4f}")
    # two bf16 partial gradients summed by NCCL vs one fp32-accumulated product rounded once
    # (measured: 0.017 and 0.054 in two sessions' runs)
    assert d.max() < 0.1
