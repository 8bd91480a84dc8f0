"""training.recompute 3 (full-block recompute: each layer keeps only its block's input, the residual
stream, and each block's backward runs the block's forward again) against recompute 0: bit-identical
runs (every loss, gradient norm, validation loss, parameter and FP8 scale) in fp32 and FP8 emulation, on
one rank and on two ranks at ZeRO 3; the activations it allocates are the ones predicted; micro_batch max
uses the smaller prediction; the level is validated. The same comparison on a GPU (bf16 and FP8,
training.deterministic) is skipped on machines without one."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import rank_file_arrays, read_log, run_train, tiny_yaml, write_yaml

# four layers (blocks whose input is the previous block's fused residual + LayerNorm; at ZeRO 3 the backward
# gathers some layers' parameters again, FP8 weights as FP8 bytes, for the recomputation), two
# micro-batches a step, an evaluation every 3 steps (the shared buffers overwritten between steps)
EXTRA = "model: {n_layer: 4}\neval: {every: 3, batches: 2}\n"
STEPS = 6


def run(tmp_path, name, ranks, stage, sets):
    y = tiny_yaml(tmp_path, name=name, B=4 // ranks, stage=stage, accum=2, steps=STEPS, ckpt_every=STEPS, extra=EXTRA)
    args = ["--yaml", y] + [a for kv in sets for a in ("--set", kv)]
    p = run_train(args, ranks=ranks, timeout=180, env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, f"{name} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return read_log(tmp_path / "runs" / name / "log.h5"), tmp_path / "runs" / name / f"checkpoints/step_{STEPS:08d}"


def assert_identical_runs(a, b, ckpt_a, ckpt_b, what):
    for key in ("loss", "grad_norm", "val_loss"):
        assert len(a[key]) > 0 and a[key].tobytes() == b[key].tobytes(), f"{what}: {key} {a[key]} vs {b[key]}"
    files = sorted(p.name for p in ckpt_a.glob("rank_*.h5"))
    assert files and files == sorted(p.name for p in ckpt_b.glob("rank_*.h5"))
    for fn in files:
        x, y = rank_file_arrays(ckpt_a / fn), rank_file_arrays(ckpt_b / fn)
        assert sorted(x) == sorted(y) and any(k.endswith("param") for k in x), (what, sorted(x))
        for k in x:
            u, v = np.asarray(x[k]), np.asarray(y[k])
            same = u.tolist() == v.tolist() if u.dtype.kind in "OSU" else u.tobytes() == v.tobytes()
            assert same and u.shape == v.shape, f"{what}: {fn} {k} differs"


PRECISIONS = {"fp32": [], "fp8": ["training.precision=fp8", "training.fp8_classifier=true"],
              "fp8-relu2": ["training.precision=fp8", "training.fp8_classifier=true", "model.activation=relu2"],
              # the recomputed q and k rotated again (model.pos_embedding rope): the same bits
              "fp8-rope": ["training.precision=fp8", "training.fp8_classifier=true", "model.pos_embedding=rope"]}


@pytest.mark.parametrize("ranks,stage", [(1, 0), (2, 3)])
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_recompute3_is_bit_identical_to_recompute0(tmp_path, precision, ranks, stage):
    sets = PRECISIONS[precision]
    r0, c0 = run(tmp_path, "r0", ranks, stage, sets + ["training.recompute=0"])
    r3, c3 = run(tmp_path, "r3", ranks, stage, sets + ["training.recompute=3"])
    assert r3["loss"][-1] < r3["loss"][0], r3["loss"]
    assert_identical_runs(r0, r3, c0, c3, f"{precision}, {ranks} rank(s), ZeRO {stage}")
    # the run allocated the activations the plan predicted, fewer than recompute 0's
    for k in ("activations", "workspace"):
        assert r3["mem_pred"][k] == r3["mem_meas"][k], (k, r3["mem_pred"], r3["mem_meas"])
    assert r3["mem_meas"]["activations"] < r0["mem_meas"]["activations"]


def dry_run(tmp_path, name, sets):
    y = tiny_yaml(tmp_path, name=name, extra=EXTRA)
    p = run_train(["--yaml", y, "--dry-run"] + [a for kv in sets for a in ("--set", kv)], env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    micro = int(re.search(r"batch\s+micro (\d+) x", p.stdout).group(1))
    mem = {k: int(v) for k, v in re.findall(r"\| (\w+) +[\d.]+ \w+ +(\d+) B", p.stdout)}
    return micro, mem


def test_recompute3_activations_are_the_block_inputs_and_one_block(tmp_path):
    """The dry run's activations at recompute 3 against recompute 2: the other layers' qkv, attention
    output, residual after attention, fc output (fp32 on the CPU), LayerNorm statistics and softmax
    statistics are no longer kept (the tiny model: 4 layers, 32 wide, 2 heads, micro-batch 4 x 16)."""
    N, C, NH, L = 4 * 16, 32, 2, 4
    per_layer = 4 * N * (3 * C + C + C + 4 * C) + 4 * (4 * N + NH * N)
    act = {r: dry_run(tmp_path, f"d{r}", [f"training.recompute={r}"])[1]["activations"] for r in (2, 3)}
    assert act[2] - act[3] == (L - 1) * per_layer, act


def test_micro_batch_max_uses_the_recompute3_prediction(tmp_path):
    cap = 0.01
    sets = ["training.micro_batch=max", f"training.memory_limit_gb={cap}"]
    b0, m0 = dry_run(tmp_path, "m0", sets + ["training.recompute=0"])
    b3, m3 = dry_run(tmp_path, "m3", sets + ["training.recompute=3"])
    assert b3 > b0 >= 1, (b0, b3)
    assert m0["total"] <= cap * 2**30 and m3["total"] <= cap * 2**30, (m0, m3)


@pytest.mark.parametrize("level", [-1, 4])
def test_recompute_level_out_of_range_is_refused(tmp_path, level):
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y, "--set", f"training.recompute={level}"])
    assert p.returncode == 1, p.stdout + p.stderr
    assert "training.recompute: must be 0, 1, 2 or 3" in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists()


# ---- the GPU: bf16 and FP8, training.deterministic (bit-reproducible steps), recompute 3 against 0

def has_gpu():
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


GPU_YAML = """
run: {{name: {name}, out_dir: {out}, seed: 7}}
model: {{n_layer: 4, n_head: 4, n_embd: 256, vocab_size: 50257, max_seq_len: 256}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: cuda, micro_batch: 4, seq_len: 256, grad_accum: 2, steps: 8, lr: 1.0e-3, warmup_steps: 2,
           deterministic: true}}
eval: {{every: 4, batches: 2}}
log: {{every: 1, progress: false}}
checkpoint: {{every: 8}}
"""


@pytest.mark.skipif(not has_gpu(), reason="SKIP: no CUDA device on this machine (GPU tests run on the GPU machine)")
@pytest.mark.parametrize("precision", ["bf16", "fp8", "fp8 layers 1-2", "fp8 products qkv,fc,fcproj",
                                       "fp8 products attproj", "fp8 products fc", "bf16 relu2", "fp8 relu2",
                                       "bf16 rope"])
def test_gpu_recompute3_is_bit_identical_to_recompute0(tmp_path, precision):
    runs = {}
    for r in (0, 3):
        name = f"g{r}"
        y = write_yaml(tmp_path / f"{name}.yaml", GPU_YAML.format(name=name, out=tmp_path / "runs"))
        sets = [f"training.precision={precision.split()[0]}", f"training.recompute={r}"]
        if precision.startswith("fp8"):
            sets.append("training.fp8_classifier=true")
        if precision == "fp8 layers 1-2":  # layers 0 and 3 in bf16 (training.fp8_layers)
            sets.append("training.fp8_layers=1-2")
        if precision.startswith("fp8 products"):  # the others in bf16 (training.fp8_products)
            sets.append(f"training.fp8_products={precision.split()[2]}")
        if precision.endswith("relu2"):  # an activation no product epilogue applies (model.activation)
            sets.append("model.activation=relu2")
        if precision.endswith("rope"):  # rotary position embeddings (model.pos_embedding)
            sets.append("model.pos_embedding=rope")
        p = run_train(["--yaml", y] + [a for kv in sets for a in ("--set", kv)], timeout=600)
        assert p.returncode == 0, f"{name} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        runs[r] = (read_log(tmp_path / "runs" / name / "log.h5"), tmp_path / "runs" / name / "checkpoints/step_00000008")
    (a, ca), (b, cb) = runs[0], runs[3]
    assert_identical_runs(a, b, ca, cb, f"cuda {precision}")
    assert np.isfinite(a["loss"]).all() and a["loss"][-1] < a["loss"][0], (precision, a["loss"])
    assert b["mem_pred"]["activations"] < a["mem_pred"]["activations"]
    for log in (a, b):  # the activations allocated are the ones predicted (FP8 and bf16 layers sized apart)
        assert log["mem_pred"]["activations"] == log["mem_meas"]["activations"], (precision, log["mem_pred"], log["mem_meas"])
