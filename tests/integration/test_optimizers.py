"""training.optimizer end to end on CPU ranks: Lion trains, agrees across ZeRO stages and world sizes as
AdamW does, keeps half AdamW's state (predicted, measured, in checkpoints), resumes bit for bit, can be
swept, and a checkpoint does not resume under the other optimizer."""
import h5py
import numpy as np
import pytest

from conftest import read_log, run_train, tiny_yaml
from test_zero import assert_close_losses, assert_close_params, checkpoint_state, latest_checkpoint, run_ok

LION = ["training.optimizer=lion", "training.lr=2.0e-3", "training.beta2=0.99", "training.weight_decay=0.3"]


def test_lion_learns_and_keeps_one_moment(tmp_path):
    lion, dl = run_ok(tmp_path, 1, "lion", sets=LION)
    adamw, da = run_ok(tmp_path, 1, "adamw")
    assert np.all(np.isfinite(lion["loss"])) and lion["loss"][-1] < lion["loss"][0] - 0.2, lion["loss"]
    assert not np.array_equal(lion["loss"], adamw["loss"])
    # state: Lion one fp32 slot per parameter, AdamW two; predicted and measured agree
    assert int(lion["mem_pred"]["optim"]) * 2 == int(adamw["mem_pred"]["optim"]) > 0
    assert int(lion["mem_meas"]["optim"]) == int(lion["mem_pred"]["optim"])
    with h5py.File(latest_checkpoint(dl) / "rank_00000.h5", "r") as f:
        assert sorted(f["b0001"].keys()) == ["m", "param"]
    with h5py.File(latest_checkpoint(da) / "rank_00000.h5", "r") as f:
        assert sorted(f["b0001"].keys()) == ["m", "param", "v"]


@pytest.mark.parametrize("ranks", [2, 3])
def test_lion_stages_match_one_rank(tmp_path, ranks):
    """ranks x micro-batch 2 at every ZeRO stage == one rank x micro-batch 2*ranks (Lion's sign makes
    small gradient differences either nothing or a whole lr step, so the parameters are compared loosely
    and the losses tightly)."""
    one, d1 = run_ok(tmp_path, 1, "one", B=2 * ranks, sets=LION)
    p1 = checkpoint_state(latest_checkpoint(d1))[0]
    for stage in range(4):
        log, d = run_ok(tmp_path, ranks, f"z{stage}", B=2, stage=stage, sets=LION)
        assert_close_losses(log, one, f"lion, {ranks} ranks, stage {stage}", norm_rtol=5e-5)
        assert_close_params(checkpoint_state(latest_checkpoint(d))[0], p1, f"lion stage {stage}", atol=1e-2)


def test_lion_resumes_bit_for_bit(tmp_path):
    full, _ = run_ok(tmp_path, 1, "full", sets=LION, steps=12, ckpt_every=12)
    half, d = run_ok(tmp_path, 1, "half", sets=LION + ["training.steps=12"], steps=6, ckpt_every=6)
    y = tiny_yaml(tmp_path, name="half", steps=12, ckpt_every=6)
    p = run_train(["--yaml", y, "--resume"] + [a for s in LION for a in ("--set", s)])
    assert p.returncode == 0, p.stderr
    resumed = read_log(d / "log.h5")
    assert resumed["loss"].tobytes() == full["loss"].tobytes()


def test_resume_under_another_optimizer_is_refused(tmp_path):
    run_ok(tmp_path, 1, "r", steps=4, ckpt_every=2)
    y = tiny_yaml(tmp_path, name="r", steps=8, ckpt_every=2)
    p = run_train(["--yaml", y, "--resume", "--set", "training.optimizer=lion"])
    assert p.returncode == 1
    assert "training.optimizer was adamw and is lion now" in p.stderr


def test_optimizer_sweep_and_dry_run(tmp_path):
    y = tiny_yaml(tmp_path, name="sw", steps=3,
                  extra="sweep:\n  grid: {training.optimizer: [adamw, lion]}\n")
    rows = {}
    for i, name in enumerate(("adamw", "lion")):
        dry = run_train(["--yaml", y, "--dry-run", "--index", str(i)])
        assert dry.returncode == 0, dry.stderr
        assert f"| optimizer          {name}" in dry.stdout
        rows[name] = int(next(l for l in dry.stdout.splitlines() if l.startswith("| optim ")).split()[-2])
    assert rows["adamw"] == 2 * rows["lion"] > 0
    p = run_train(["--yaml", y])
    assert p.returncode == 0, p.stderr
    opt = {}
    for point in ("p000", "p001"):
        log = read_log(tmp_path / "runs" / "sw" / point / "log.h5")
        opt[log["attrs"]["point_values"].strip()] = int(log["mem_pred"]["optim"])
    assert opt == {"training.optimizer=adamw": rows["adamw"], "training.optimizer=lion": rows["lion"]}


def test_unknown_optimizer_is_named(tmp_path):
    y = tiny_yaml(tmp_path, name="u", steps=2)
    p = run_train(["--yaml", y, "--set", "training.optimizer=sgd"])
    assert p.returncode == 1
    assert "training.optimizer: 'sgd' is not one of adamw, lion" in p.stderr
    assert not (tmp_path / "runs" / "u").exists()


@pytest.mark.parametrize("optimizer,key,value", [("adamw", "training.beta1", "0.5"), ("adamw", "training.beta2", "0.5"),
                                                 ("adamw", "training.eps", "1.0e-3"), ("lion", "training.beta2", "0.5")])
def test_each_declared_hyperparameter_reaches_its_rule(tmp_path, optimizer, key, value):
    """a rule's hyperparameters come from their training.<name> keys through the plan to the update: setting
    one changes that optimizer's losses after the first update."""
    base = [f"training.optimizer={optimizer}"]
    a, _ = run_ok(tmp_path, 1, "a", sets=base, steps=4)
    b, _ = run_ok(tmp_path, 1, "b", sets=base + [f"{key}={value}"], steps=4)
    assert a["loss"][0] == b["loss"][0] and not np.array_equal(a["loss"][1:], b["loss"][1:]), (a["loss"], b["loss"])


@pytest.mark.parametrize("key,value,why", [("training.beta1", "1.0", "must be in [0, 1)"),
                                           ("training.beta2", "-0.1", "must be in [0, 1)"),
                                           ("training.eps", "0", "must be > 0")])
def test_a_hyperparameter_outside_its_declared_range_is_refused(tmp_path, key, value, why):
    p = run_train(["--yaml", tiny_yaml(tmp_path, name="r"), "--set", f"{key}={value}"])
    assert p.returncode == 1 and f"{key}: {why}" in p.stderr, p.stderr
    assert not (tmp_path / "runs" / "r").exists()
