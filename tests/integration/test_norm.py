"""model.norm: rmsnorm in place of GPT-2's LayerNorm, end to end on the CPU: it trains (each precision), its
checkpoints resume bit for bit and carry the norm (a resume under the other norm is named, exit 1, nothing
changed), its parameter table has no norm biases, and the GPT-2 file formats refuse it by name."""
import numpy as np
import pytest

from conftest import read_log, run_train, tiny_yaml
from test_resume_states import ok, refused, run, snapshot
from test_zero import checkpoint_state, latest_checkpoint, run_ok

RMS = ["model.norm=rmsnorm"]


@pytest.mark.parametrize("precision", ["fp32", "fp8"])
def test_rmsnorm_trains_and_differs_from_layernorm(tmp_path, precision):
    sets = [f"training.precision={precision}"]
    ln, _ = run_ok(tmp_path, 1, "ln", steps=30, sets=sets)
    rms, run_dir = run_ok(tmp_path, 1, "rms", steps=30, sets=sets + RMS)
    loss = np.asarray(rms["loss"])
    ln_loss = np.asarray(ln["loss"])
    # it learns (the synthetic corpus from ln(64) ~ 4.2), as far as LayerNorm does in as many steps
    assert np.all(np.isfinite(loss)) and loss[-5:].mean() < loss[:3].mean() - 0.25, loss
    assert abs(loss[-5:].mean() - ln_loss[-5:].mean()) < 0.05 * ln_loss[-5:].mean(), (loss, ln_loss)
    assert not np.array_equal(loss, np.asarray(ln["loss"]))  # another model: not LayerNorm under another name
    # the predicted memory is what was allocated (no bias tensors, no bias gradients)
    for k in ("params", "activations"):
        assert rms["mem_pred"][k] == rms["mem_meas"][k], (k, rms["mem_pred"], rms["mem_meas"])
    assert rms["mem_meas"]["params"] < ln["mem_meas"]["params"]
    state, _, _ = checkpoint_state(latest_checkpoint(run_dir))
    assert state, "no parameters in the checkpoint"


def test_rmsnorm_resumes_bit_for_bit(tmp_path):
    # a constant learning rate: the first half run alone (4 steps) follows the whole run's schedule
    sets = RMS + ["training.schedule=constant"]
    whole, _ = run_ok(tmp_path, 1, "whole", steps=8, sets=sets)
    y = tiny_yaml(tmp_path, name="parts", steps=8, ckpt_every=4)
    args = [a for kv in sets for a in ("--set", kv)]
    ok(run(["--yaml", y, *args, "--set", "training.steps=4"]))
    ok(run(["--yaml", y, *args, "--resume"]))
    parts = read_log(tmp_path / "runs/parts/log.h5")
    assert list(parts["loss"]) == list(whole["loss"])


def test_a_resume_under_the_other_norm_is_named(tmp_path):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    ok(run(["--yaml", y, "--set", "training.steps=3"]))
    before = snapshot(tmp_path / "runs/t")
    refused(run(["--yaml", y, "--resume", "--set", RMS[0]]), "holds another model",
            "model.norm was layernorm and is rmsnorm now")
    assert snapshot(tmp_path / "runs/t") == before


def test_gpt2_files_refuse_rmsnorm(tmp_path):
    _, run_dir = run_ok(tmp_path, 1, "r", steps=2, sets=RMS)
    for fmt in ("llmc", "hf"):
        out = tmp_path / f"out_{fmt}"
        p = run_train(["export", "--ckpt", str(run_dir), "--out", str(out), "--format", fmt])
        assert p.returncode == 1 and "model.norm rmsnorm" in p.stderr, p.stderr
        assert not out.exists()
    y = tiny_yaml(tmp_path, name="i", extra=f"model: {{norm: rmsnorm, init_from: '{tmp_path}/model.bin'}}")
    p = run_train(["--yaml", str(y)])
    assert p.returncode == 1 and "model.init_from" in p.stderr and "rmsnorm" in p.stderr, p.stderr


def test_unknown_norm_is_refused(tmp_path):
    p = run_train(["--yaml", str(tiny_yaml(tmp_path)), "--set", "model.norm=batchnorm"])
    assert p.returncode == 1 and "model.norm" in p.stderr and "layernorm" in p.stderr, p.stderr


def test_the_plan_names_the_norm_and_counts_its_parameters(tmp_path):
    y = str(tiny_yaml(tmp_path))
    ln, rms = (run_train(["--yaml", y, "--dry-run"] + extra) for extra in ([], ["--set", RMS[0]]))
    for p, name in ((ln, "layernorm"), (rms, "rmsnorm")):
        assert p.returncode == 0, p.stderr
        assert f"wide, vocab" in p.stdout and f"), {name}\n" in p.stdout, p.stdout[:800]
    count = lambda p: int(p.stdout.split("| parameters")[1].split()[0])
    # the tiny model: 2 layers of width 32, so 2 x 2 + 1 norm biases of 32
    assert count(ln) - count(rms) == 5 * 32
