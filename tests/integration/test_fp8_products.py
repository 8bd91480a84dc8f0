"""training.fp8_products: which block products run in FP8 in the FP8 layers, the others in bf16 (CPU emulation).
Each product's input buffer, its FP8 state and its weight copies exist exactly where the product is FP8:
every recompute level runs bit for bit as level 0 does and allocates what the plan predicted, on one rank
and at ZeRO 3 on two (whose layers then gather whole, not as FP8 bytes); the key composes with
fp8_layers; a resume under another set says so and calibrates the products it adds; bad sets are refused
naming the key."""
import numpy as np
import pytest

from conftest import read_log, run_train, tiny_yaml
from test_fp8_layers import CLASSIFIER_TENSORS, assert_refused, fp8_names, recompute_against_level_0, run_fp8_variants
from test_recompute import EXTRA

PRODUCTS = ("qkv", "attproj", "fc", "fcproj")


def tensors(layers, products):
    return {f"h{l}.{p}.{r}" for l in layers for p in products for r in ("input", "weight", "grad")}


@pytest.mark.parametrize("products", ["qkv,fc,fcproj", "attproj", "fc"])
@pytest.mark.parametrize("ranks,stage,level", [(1, 0, 1), (1, 0, 2), (1, 0, 3), (2, 3, 3)])
def test_some_products_recompute_bit_identical_to_level_0(tmp_path, products, ranks, stage, level):
    """Each LayerNorm writes FP8 exactly where the product it feeds is FP8 (ln1: qkv, ln2: fc); GELU's output
    is FP8 where fcproj is; the buffers recompute shares between layers hold the bf16 products' values; the
    FP8 state holds exactly the FP8 products' tensors."""
    sets = ["training.precision=fp8", f"training.fp8_products={products}"]
    r0, c0 = recompute_against_level_0(tmp_path, sets, ranks, stage, level, f"fp8 products {products}")
    names, _ = fp8_names(c0 / "rank_00000.h5")
    chosen = products.split(",")
    assert set(names) == tensors(range(4), chosen) | CLASSIFIER_TENSORS, sorted(names)
    assert r0["attrs"]["precision"].endswith(f", {12 * len(chosen) + 3} scaled tensors"), r0["attrs"]["precision"]


def test_fp8_products_change_the_run_and_its_memory_by_the_products_buffers(tmp_path):
    """all and the four names: the same run bit for bit; each smaller set a different run with a falling loss.
    At recompute 0, attproj in bf16 instead of FP8 has no transposed attention output (C bytes a row) and no
    FP8 weight copy (C^2 and its transpose) in each of the 4 layers; qkv in bf16 keeps ln1's output in 4-byte
    CPU activations instead of bytes (3 C more a row) and has no weight copies (3 C^2, twice)."""
    N, C, L = 4 * 16, 32, 4
    logs = run_fp8_variants(tmp_path, "fp8_products", (("all", "all"), ("named", "fcproj,fc,attproj,qkv"),
                                                       ("noatt", "qkv,fc,fcproj"), ("noqkv", "attproj,fc,fcproj"),
                                                       ("mlp", "fc,fcproj")))
    assert logs["all"]["loss"].tobytes() == logs["named"]["loss"].tobytes()
    for other in ("noatt", "noqkv", "mlp"):
        assert logs["all"]["loss"].tobytes() != logs[other]["loss"].tobytes(), f"all and {other} ran the same"
    act = {k: int(v["mem_meas"]["activations"]) for k, v in logs.items()}
    attproj = L * (C * N + 2 * C * C)
    qkv = L * (3 * C * N - 2 * 3 * C * C)
    assert act["all"] - act["noatt"] == attproj, act
    assert act["noqkv"] - act["all"] == qkv, act
    assert act["all"] - act["mlp"] == attproj - qkv, act


def test_fp8_products_compose_with_fp8_layers(tmp_path):
    y = tiny_yaml(tmp_path, name="c", steps=4, ckpt_every=4, extra=EXTRA)
    p = run_train(["--yaml", y, "--set", "training.precision=fp8", "--set", "training.fp8_layers=1-2",
                   "--set", "training.fp8_products=fc,fcproj"], check=True)
    names, _ = fp8_names(tmp_path / "runs/c/checkpoints/step_00000004/rank_00000.h5")
    assert set(names) == tensors([1, 2], ["fc", "fcproj"]) | CLASSIFIER_TENSORS, sorted(names)
    log = read_log(tmp_path / "runs/c/log.h5")
    assert log["mem_pred"]["activations"] == log["mem_meas"]["activations"]


def test_a_resume_under_other_fp8_products_says_so_and_calibrates_the_new_ones(tmp_path):
    y = tiny_yaml(tmp_path, name="r", steps=6, ckpt_every=6, extra=EXTRA)
    sets = ["--set", "training.precision=fp8"]
    run_train(["--yaml", y] + sets + ["--set", "training.fp8_products=fc,fcproj"], check=True)
    p = run_train(["--yaml", y, "--resume", "--set", "training.steps=8", "--set", "checkpoint.every=8",
                   "--set", "training.fp8_products=qkv,fc,fcproj"] + sets)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert ("note: training.fp8_products was 'fc,fcproj' in the checkpoint of step 6 and is 'qkv,fc,fcproj' now: "
            "the products it adds run in FP8 from here, their scales calibrated first") in p.stderr, p.stderr[-2000:]
    names, scales = fp8_names(tmp_path / "runs/r/checkpoints/step_00000008/rank_00000.h5")
    assert set(names) == tensors(range(4), ["qkv", "fc", "fcproj"]) | CLASSIFIER_TENSORS
    for n in tensors(range(4), ["qkv"]):  # calibrated from measured amaxes: powers of two other than the initial 1
        assert scales[n] != 1.0 and np.log2(scales[n]) == np.round(np.log2(scales[n])), (n, scales[n])


def test_the_dry_run_names_the_products_in_each_precision(tmp_path):
    y = tiny_yaml(tmp_path, name="d", extra=EXTRA)
    p = run_train(["--yaml", y, "--dry-run", "--set", "training.precision=fp8", "--set",
                   "training.fp8_products=fcproj,qkv,fc"], check=True)
    assert "| fp8 products       qkv fc fcproj (bf16: attproj)\n" in p.stdout, p.stdout


@pytest.mark.parametrize("value,message", [
    ("fcproj", "error: config: training.fp8_products: 'fcproj' has fcproj without fc: GELU's derivative is applied "
               "in fc's FP8 gradient cast, so fcproj in FP8 needs fc in FP8 too"),
    ("qkv,proj", "error: config: training.fp8_products: 'qkv,proj' is not a set of block products (give `all`, or "
                 "some of qkv, attproj, fc, fcproj joined by commas"),
    ("fc,fc", "error: config: training.fp8_products: 'fc,fc' names fc twice"),
    ("", "error: config: training.fp8_products: '' is not a set of block products"),
    ("qkv,", "error: config: training.fp8_products: 'qkv,' is not a set of block products"),
])
def test_bad_fp8_products_are_refused_naming_the_key(tmp_path, value, message):
    assert_refused(tmp_path, ["training.precision=fp8", f"training.fp8_products={value}"], message)
