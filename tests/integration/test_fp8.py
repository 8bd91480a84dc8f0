"""training.precision fp8 on the CPU, where the backend emulates the GPU's quantization: the encoding
against an independent NumPy rounding, a small model trained in FP8 against fp32, bit-exact resume with
the FP8 state from a checkpoint, the run log's recipe and saturation counts, and the config's errors."""
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ROOT, read_log, run_train, tiny_yaml, write_yaml
from test_zero import checkpoint_state, flat

TEST_FP8 = ROOT / "build/tests/cpu/test_fp8"


def fp8_values(exp_bits, man_bits):
    """Every non-negative finite value of the format by code (NaN/inf codes as NaN), from its definition."""
    bias = 2 ** (exp_bits - 1) - 1
    codes = np.arange(128)
    e, m = codes >> man_bits, codes & ((1 << man_bits) - 1)
    v = np.where(e == 0, m * 2.0 ** (1 - bias - man_bits), (1 + m / 2 ** man_bits) * 2.0 ** (e - bias))
    if exp_bits == 4:
        v[0x7F] = np.nan  # E4M3: no infinities, one NaN
    else:
        v[e == 31] = np.nan  # E5M2: infinities and NaNs
    return v


def numpy_quantize(x, exp_bits, man_bits):
    """Nearest value, ties to the even code, saturating at the largest finite value."""
    vals = fp8_values(exp_bits, man_bits)
    finite = np.nonzero(~np.isnan(vals))[0]
    top = finite[-1]
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(vals[finite], a), 1, len(finite) - 1)
    lo_code, hi_code = finite[hi - 1], finite[hi]
    dlo, dhi = a - vals[lo_code], vals[hi_code] - a
    code = np.where(dlo < dhi, lo_code, np.where(dhi < dlo, hi_code, np.where(lo_code % 2 == 0, lo_code, hi_code)))
    code = np.where(a >= vals[top], top, code)
    code = np.where(a <= 0, 0, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def test_cpu_quantization_matches_numpy(tmp_path):
    assert TEST_FP8.exists(), f"{TEST_FP8} is not built: run make"
    subprocess.run([str(TEST_FP8), "--dump", str(tmp_path)], check=True, timeout=60)
    x = np.fromfile(tmp_path / "x.f32", dtype=np.float32)
    for name, bits in (("e4m3", (4, 3)), ("e5m2", (5, 2))):
        got = np.fromfile(tmp_path / f"q_{name}.u8", dtype=np.uint8)
        want = numpy_quantize(x, *bits)
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, f"{name}: {bad.size} of {x.size} differ, e.g. x={x[bad[:5]]} got {got[bad[:5]]} want {want[bad[:5]]}"


FP8_MODEL = "model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}"


def fp8_yaml(tmp_path, name, precision="fp8", steps=20, extra="", **kw):
    y = tiny_yaml(tmp_path, name=name, steps=steps, **kw)
    text = y.read_text().replace("training: {device: cpu,", f"training: {{device: cpu, precision: {precision},")
    return write_yaml(y, text + extra)


def test_fp8_training_ends_within_3_percent_of_fp32(tmp_path):
    final = {}
    for prec in ("fp32", "fp8"):
        y = fp8_yaml(tmp_path, prec, precision=prec, steps=150)
        run_train(["--yaml", y], check=True)
        log = read_log(tmp_path / f"runs/{prec}/log.h5")
        final[prec] = float(np.mean(log["loss"][-10:]))
        if prec == "fp8":
            assert log["attrs"]["precision"].startswith("fp8: e4m3 inputs and weights, e5m2 gradients")
            assert "fp8_saturated" in log and log["fp8_saturated"].dtype.kind == "i"
            assert log["fp8_saturated"].sum() < 24 * 150, "most scaled tensors saturated every step"
        else:
            assert log["attrs"]["precision"] == "fp32" and not log["fp8_saturated"].any()
    # both learned (from ln 64 = 4.16 towards the corpus's floor ln 4 = 1.39), and FP8 stays close to fp32
    assert final["fp32"] < 3.0, final
    assert abs(final["fp8"] - final["fp32"]) <= 0.03 * final["fp32"], final


def test_fp8_resume_is_bit_exact_and_checkpoints_hold_the_scales(tmp_path):
    const = "  # constant lr: the schedule does not depend on training.steps\n"
    extra = const
    ya = fp8_yaml(tmp_path, "a", steps=12, ckpt_every=6, extra=extra)
    yb = fp8_yaml(tmp_path, "b", steps=6, ckpt_every=6, extra=extra)
    for y in (ya, yb):
        write_yaml(y, y.read_text().replace("warmup_steps: 2,", "warmup_steps: 2, schedule: constant,"))
    run_train(["--yaml", ya], check=True)
    run_train(["--yaml", yb], check=True)
    ck6 = tmp_path / "runs/b/checkpoints/step_00000006/rank_00000.h5"
    with h5py.File(ck6, "r") as f:
        state = f["fp8_state"][:]
    assert state[0] == 6 + 2, "steps seen by the recipe: 2 calibration passes and 6 steps"
    scales = state[1:1 + 24]
    assert np.all(scales > 0) and np.all(np.log2(scales) == np.round(np.log2(scales))), scales
    assert len(set(scales.tolist())) > 1, "every tensor kept the initial scale"
    p = run_train(["--yaml", yb, "--resume", "--set", "training.steps=12"], check=True)
    assert "resumed from step 6" in p.stdout
    a, b = read_log(tmp_path / "runs/a/log.h5"), read_log(tmp_path / "runs/b/log.h5")
    assert list(b["step"]) == list(range(1, 13))
    for k in ("loss", "grad_norm"):
        assert np.array_equal(a[k], b[k]), f"{k}: {a[k]} vs {b[k]}"
    pa = flat(checkpoint_state(tmp_path / "runs/a/checkpoints/step_00000012")[0], skip_key_bias=False)
    pb = flat(checkpoint_state(tmp_path / "runs/b/checkpoints/step_00000012")[0], skip_key_bias=False)
    assert np.array_equal(pa, pb)


def test_fp8_resume_on_two_ranks_from_one(tmp_path):
    """Resharding: an FP8 checkpoint of one rank resumes on two (ZeRO 2): the scales are the same on every rank."""
    y = fp8_yaml(tmp_path, "r", steps=4, ckpt_every=4)
    run_train(["--yaml", y], check=True)
    p = run_train(["--yaml", y, "--resume", "--set", "training.steps=8", "--set", "training.zero_stage=2",
                   "--set", "training.micro_batch=2"], ranks=2, env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    log = read_log(tmp_path / "runs/r/log.h5")
    assert list(log["step"]) == list(range(1, 9)) and np.isfinite(log["loss"]).all()


@pytest.mark.parametrize("setting,needle", [
    ("model.n_embd=24", "fp8 needs model.n_embd and training.seq_len to be multiples of 16"),
    ("training.fp8_grad_format=e3m4", "training.fp8_grad_format: 'e3m4' is not one of e5m2, e4m3"),
    ("training.fp8_amax_history=0", "training.fp8_amax_history: must be 1-1024"),
])
def test_fp8_config_errors(tmp_path, setting, needle):
    y = fp8_yaml(tmp_path, "bad")
    p = run_train(["--yaml", y, "--set", setting])
    assert p.returncode == 1 and needle in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "runs/bad").exists()


def test_fp8_history_change_on_resume_is_refused(tmp_path):
    y = fp8_yaml(tmp_path, "h", steps=4, ckpt_every=4)
    run_train(["--yaml", y], check=True)
    p = run_train(["--yaml", y, "--resume", "--set", "training.steps=6", "--set", "training.fp8_amax_history=8"])
    assert p.returncode == 1 and "FP8 state" in p.stderr and "fp8_amax_history" in p.stderr, p.stderr[-2000:]
