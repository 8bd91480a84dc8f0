"""training.fp8_layers: the layers whose block products run in FP8, the others in bf16 (CPU emulation).
A mixed model's buffers are sized per layer (and, where the recompute levels share one buffer between
layers, for the widest): every level runs bit for bit as level 0 does and allocates what the plan
predicted; the FP8 state holds exactly the FP8 layers' tensors; a resume under another set of layers says
so and calibrates the layers it adds; malformed sets are refused naming the key."""
import h5py
import numpy as np
import pytest

from conftest import read_log, run_train, tiny_yaml
from test_recompute import EXTRA, assert_identical_runs, run

MIXED = ["training.precision=fp8", "training.fp8_classifier=true", "training.fp8_layers=1-2"]  # of 4 layers
CLASSIFIER_TENSORS = {"classifier.input", "classifier.weight", "classifier.grad"}


def fp8_names(ckpt_file):
    with h5py.File(ckpt_file, "r") as f:
        g = f["fp8"]
        names = [n.decode() if isinstance(n, bytes) else n for n in g["names"][:]]
        return names, dict(zip(names, g["scale"][:].tolist()))


def layer_tensors(layers):
    return {f"h{l}.{p}.{r}" for l in layers for p in ("qkv", "attproj", "fc", "fcproj")
            for r in ("input", "weight", "grad")}


def recompute_against_level_0(tmp_path, sets, ranks, stage, level, what):
    """The run with `sets` at recompute `level` against the same at level 0: a falling loss, the same losses,
    norms and checkpointed values bit for bit, and the activations and workspace each plan predicted.
    Returns level 0's log and checkpoint folder."""
    r0, c0 = run(tmp_path, "r0", ranks, stage, sets + ["training.recompute=0"])
    rk, ck = run(tmp_path, f"r{level}", ranks, stage, sets + [f"training.recompute={level}"])
    assert rk["loss"][-1] < rk["loss"][0], rk["loss"]
    assert_identical_runs(r0, rk, c0, ck, f"{what}, recompute {level}, {ranks} rank(s), ZeRO {stage}")
    for log in (r0, rk):
        for k in ("activations", "workspace"):
            assert log["mem_pred"][k] == log["mem_meas"][k], (k, log["mem_pred"], log["mem_meas"])
    return r0, c0


def run_fp8_variants(tmp_path, key, variants):
    """One 30-step fp8 run per (name, value of training.<key>): each trains (a finite, falling loss) and
    allocates the activations and workspace its plan predicted. Returns the logs by name."""
    logs = {}
    for name, value in variants:
        y = tiny_yaml(tmp_path, name=name, steps=30, extra=EXTRA)
        p = run_train(["--yaml", y, "--set", "training.precision=fp8", "--set", f"training.{key}={value}"],
                      env={"OMP_NUM_THREADS": "1"})
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        logs[name] = read_log(tmp_path / f"runs/{name}/log.h5")
        loss = logs[name]["loss"]
        assert np.isfinite(loss).all() and loss[-5:].mean() < loss[:5].mean(), (name, loss)
        for k in ("activations", "workspace"):
            assert logs[name]["mem_pred"][k] == logs[name]["mem_meas"][k], (name, k)
    return logs


@pytest.mark.parametrize("ranks,stage,level", [(1, 0, 1), (1, 0, 2), (1, 0, 3), (2, 3, 3)])
def test_mixed_layers_recompute_bit_identical_to_level_0(tmp_path, ranks, stage, level):
    """Layers 0 and 3 in bf16 around FP8 layers 1 and 2: each LayerNorm writes FP8 exactly where its product
    is FP8, including the one before layer 1 (run by layer 0) and the final one (the FP8 classifier); the
    buffers recompute shares between layers hold a bf16 layer's values; at ZeRO 3 only the FP8 layers'
    weights are gathered as FP8 bytes."""
    r0, c0 = recompute_against_level_0(tmp_path, MIXED, ranks, stage, level, "fp8 layers 1-2")
    names, _ = fp8_names(c0 / "rank_00000.h5")
    assert set(names) == layer_tensors([1, 2]) | CLASSIFIER_TENSORS, sorted(names)
    assert r0["attrs"]["precision"].endswith(", 27 scaled tensors"), r0["attrs"]["precision"]


def test_fp8_layers_change_the_run_and_its_memory_by_the_layers_buffers(tmp_path):
    """all, 1-2 and none: three different runs (the key acts), each with a falling loss; the explicit range of every
    layer is the default's policy, bit for bit. At recompute 0 each layer in bf16 instead of FP8 keeps its
    two LayerNorm outputs (2 C) and GELU's (4 C) in 4-byte CPU activations instead of bytes, and has no
    transposed attention output (C bytes) and no FP8 weight copies (each of the 12 C^2 weights and its
    transpose): (3 x 6 C - C) N - 24 C^2 bytes more activations, for N = B T rows."""
    N, C = 4 * 16, 32
    logs = run_fp8_variants(tmp_path, "fp8_layers", (("all", "all"), ("full", "0-3"), ("mid", "1-2"), ("none", "none")))
    assert logs["all"]["loss"].tobytes() == logs["full"]["loss"].tobytes()
    for a, b in (("all", "mid"), ("mid", "none"), ("all", "none")):
        assert logs[a]["loss"].tobytes() != logs[b]["loss"].tobytes(), f"{a} and {b} ran the same"
    act = {k: int(v["mem_meas"]["activations"]) for k, v in logs.items()}
    per_layer = (3 * 6 * C - C) * N - 24 * C * C
    assert act["mid"] - act["all"] == 2 * per_layer and act["none"] - act["all"] == 4 * per_layer, act
    assert logs["none"]["attrs"]["precision"].endswith(", 3 scaled tensors")  # the classifier's alone


def test_a_resume_under_other_fp8_layers_says_so_and_calibrates_the_new_ones(tmp_path):
    y = tiny_yaml(tmp_path, name="r", steps=6, ckpt_every=6, extra=EXTRA)
    sets = ["--set", "training.precision=fp8", "--set", "training.fp8_layers=1-2"]
    run_train(["--yaml", y] + sets, check=True)
    names, _ = fp8_names(tmp_path / "runs/r/checkpoints/step_00000006/rank_00000.h5")
    assert set(names) == layer_tensors([1, 2]) | CLASSIFIER_TENSORS
    p = run_train(["--yaml", y, "--resume", "--set", "training.steps=8", "--set", "checkpoint.every=8",
                   "--set", "training.precision=fp8", "--set", "training.fp8_layers=0-2"])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert ("note: training.fp8_layers was '1-2' in the checkpoint of step 6 and is '0-2' now: the block products "
            "of the layers it adds run in FP8 from here, their scales calibrated first") in p.stderr, p.stderr[-2000:]
    names, scales = fp8_names(tmp_path / "runs/r/checkpoints/step_00000008/rank_00000.h5")
    assert set(names) == layer_tensors([0, 1, 2]) | CLASSIFIER_TENSORS
    for n in layer_tensors([0]):  # calibrated from measured amaxes: powers of two other than the initial 1
        assert scales[n] != 1.0 and np.log2(scales[n]) == np.round(np.log2(scales[n])), (n, scales[n])
    log = read_log(tmp_path / "runs/r/log.h5")
    assert list(log["step"]) == list(range(1, 9)) and np.isfinite(log["loss"]).all()


def test_a_checkpoint_records_its_precision_and_a_resume_compares_sets_not_spellings(tmp_path):
    y = tiny_yaml(tmp_path, name="p", steps=6, ckpt_every=2, extra=EXTRA)
    fp8 = ["--set", "training.precision=fp8"]
    run_train(["--yaml", y] + fp8 + ["--set", "training.fp8_layers=2,1", "--set", "training.fp8_products=fcproj,fc,qkv"],
              check=True)
    ck = tmp_path / "runs/p/checkpoints"
    with h5py.File(ck / "step_00000006/rank_00000.h5", "r") as f:
        rec = {k: f.attrs[k].decode() if isinstance(f.attrs[k], bytes) else f.attrs[k]
               for k in ("fp8_layers", "fp8_products", "fp8_classifier", "fp8_gelu_epilogue")}
    assert rec == {"fp8_layers": "1-2", "fp8_products": "qkv,fc,fcproj", "fp8_classifier": "true",
                   "fp8_gelu_epilogue": "false"}, rec

    def resume(steps, layers, products):
        p = run_train(["--yaml", y, "--resume", "--set", f"training.steps={steps}"] + fp8 +
                      ["--set", f"training.fp8_layers={layers}", "--set", f"training.fp8_products={products}"])
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return p.stderr

    # the same sets spelled otherwise: no note
    assert "note: training.fp8_" not in resume(8, "1-2", "qkv,fc,fcproj")
    # a checkpoint written before the precision was recorded: the sets come from its config, canonical too
    with h5py.File(ck / "step_00000008/rank_00000.h5", "r+") as f:
        for k in rec:
            del f.attrs[k]
    assert "note: training.fp8_" not in resume(10, "1,2", "fc,qkv,fcproj")
    err = resume(12, "0-3", "qkv,fc,fcproj")
    assert "note: training.fp8_layers was '1-2' in the checkpoint of step 10 and is 'all' now" in err, err[-2000:]
    assert "note: training.fp8_products" not in err, err[-2000:]
    log = read_log(tmp_path / "runs/p/log.h5")
    assert list(log["step"]) == list(range(1, 13)) and np.isfinite(log["loss"]).all()


def test_the_dry_run_names_the_layers_in_each_precision(tmp_path):
    y = tiny_yaml(tmp_path, name="d", extra=EXTRA)
    p = run_train(["--yaml", y, "--dry-run", "--set", "training.precision=fp8", "--set", "training.fp8_layers=0,2-3"],
                  check=True)
    assert "| fp8 layers         0 2 3 (bf16: 1)\n" in p.stdout, p.stdout


@pytest.mark.parametrize("sets,message", [
    (["training.fp8_layers=4"], "error: config: training.fp8_layers: layer 4 is outside the model's 4 layers (they are "
                                "numbered 0-3)"),
    (["training.fp8_layers=2-1"], "error: config: training.fp8_layers: the range '2-1' runs backwards"),
    (["training.fp8_layers=1,x"], "error: config: training.fp8_layers: '1,x' is not a set of layers"),
    (["training.fp8_layers=1,"], "error: config: training.fp8_layers: '1,' is not a set of layers"),
    (["training.fp8_layers=none", "training.fp8_classifier=false"],
     "error: config: training.fp8_layers: 'none' with training.fp8_classifier: false leaves no product in FP8"),
])
def test_bad_fp8_layers_are_refused_naming_the_key(tmp_path, sets, message):
    assert_refused(tmp_path, ["training.precision=fp8"] + sets, message)


def assert_refused(tmp_path, sets, message):
    """The tiny run with `sets` exits non-zero before any work, its error starting with `message`."""
    y = tiny_yaml(tmp_path, name="bad", extra=EXTRA)
    p = run_train(["--yaml", y] + [a for kv in sets for a in ("--set", kv)])
    assert p.returncode != 0 and p.stderr.startswith(message), p.stderr
    assert not (tmp_path / "runs/bad").exists()


@pytest.mark.parametrize("key,value", [("fp8_layers", "1-2"), ("fp8_products", "fc")])
def test_fp8_layers_and_products_need_fp8(tmp_path, key, value):
    assert_refused(tmp_path, ["training.precision=bf16", f"training.{key}={value}"],
                   f"error: config: training.{key}: needs training.precision: fp8 (it is bf16)")
