"""training.gradient_release: each bucket's update runs as its gradient completes in the backward, with no
whole-model gradients. The same training as without it, bit for bit (losses and every checkpointed value)
under every state type, master kind, recompute level and FP8; the gradients' memory predicted and measured
as the role buffers alone; resumable; and refused, by name, where a bucket's update would have to wait."""
import shutil

import numpy as np
import pytest

from conftest import as_killed, rank_file_arrays, read_log, run_train, tiny_yaml


def train(tmp_path, name, release, extra="", steps=6, ckpt_every=6, args=(), ranks=1):
    y = tiny_yaml(tmp_path, name=name, steps=steps, ckpt_every=ckpt_every,
                  extra=f"training: {{grad_clip: 0.0, gradient_release: {str(release).lower()}}}\n" + extra)
    p = run_train(["--yaml", y, *args], ranks=ranks)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return tmp_path / "runs" / name, p


@pytest.mark.parametrize("extra", [
    "",
    "training: {optimizer_state: int8, master_weights: compensated, recompute: 3}\n",
    "training: {optimizer_state: bf16, master_weights: none, recompute: 1}\n",
    "training: {precision: fp8, recompute: 2}\n",
    "training: {optimizer: lion, lr: 1.0e-3}\n",
], ids=["fp32", "int8-compensated-r3", "bf16-state-no-master-r1", "fp8-r2", "lion"])
def test_the_same_training_bit_for_bit(tmp_path, extra):
    whole, _ = train(tmp_path, "whole", False, extra)
    rel, _ = train(tmp_path, "rel", True, extra)
    a, b = read_log(whole / "log.h5"), read_log(rel / "log.h5")
    assert int(b["mem_meas"]["grads"]) == 0 < int(a["mem_meas"]["grads"])  # released, and not
    assert np.array_equal(a["loss"], b["loss"]), (a["loss"], b["loss"])
    # the norm is summed bucket by bucket: the same up to the order of the sum
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-5)
    # every dataset (the state; the attributes name the config, which differs)
    ca, cb = (rank_file_arrays(d / "checkpoints/step_00000006/rank_00000.h5") for d in (whole, rel))
    assert ca.keys() == cb.keys() and len(ca) > 0
    for k in ca:
        assert np.array_equal(ca[k], cb[k]), k


@pytest.mark.parametrize("stage,extra", [
    (0, ""),
    (1, ""),
    (2, "training: {optimizer_state: int8, recompute: 3}\n"),
    (3, "training: {precision: fp8}\n"),
], ids=["zero0", "zero1", "zero2-int8-r3", "zero3-fp8"])
def test_two_ranks_the_same_training_bit_for_bit(tmp_path, stage, extra):
    """On two ranks each bucket is reduced (all-reduce at stage 0, reduce-scatter from stage 1) as the
    backward goes on and this rank's piece updated once it is: the same training as without release."""
    extra = f"training: {{zero_stage: {stage}}}\n" + extra
    whole, _ = train(tmp_path, "whole", False, extra, ranks=2)
    rel, p = train(tmp_path, "rel", True, extra, ranks=2)
    a, b = read_log(whole / "log.h5"), read_log(rel / "log.h5")
    assert np.array_equal(a["loss"], b["loss"]), (a["loss"], b["loss"])
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-5)
    assert int(b["mem_pred"]["grads"]) == int(b["mem_meas"]["grads"]) == 0
    assert int(a["mem_meas"]["grads"]) > 0
    for rank in (0, 1):
        f = f"checkpoints/step_00000006/rank_{rank:05d}.h5"
        ca, cb = rank_file_arrays(whole / f), rank_file_arrays(rel / f)
        assert ca.keys() == cb.keys() and len(ca) > 0
        for k in ca:
            assert np.array_equal(ca[k], cb[k]), (rank, k)


def test_no_whole_model_gradients_predicted_or_held(tmp_path):
    four = "model: {n_layer: 4}\n"  # more layers than the role buffers' two
    whole, _ = train(tmp_path, "whole", False, four)
    rel, _ = train(tmp_path, "rel", True, four)
    a, b = read_log(whole / "log.h5"), read_log(rel / "log.h5")
    assert int(b["mem_pred"]["grads"]) == int(b["mem_meas"]["grads"]) == 0
    assert int(a["mem_pred"]["grads"]) == int(a["mem_meas"]["grads"]) >= 4 * int(a["attrs"]["n_params"])
    # the buckets' gradients in the four role buffers instead (the communication component's, as stage 2's),
    # predicted as held: the largest bucket of each role, fewer bytes than the whole model's
    added = int(b["mem_pred"]["comm"]) - int(a["mem_pred"]["comm"])
    assert int(b["mem_pred"]["comm"]) == int(b["mem_meas"]["comm"])
    assert 0 < added < int(a["mem_pred"]["grads"]), (added, a["mem_pred"]["grads"])
    for log in (a, b):
        for k in ("params", "grads", "master", "optim", "comm"):
            assert int(log["mem_pred"][k]) == int(log["mem_meas"][k]), (k, log["mem_pred"], log["mem_meas"])


def test_resumes_bit_for_bit_and_from_a_run_without_it(tmp_path):
    ref, _ = train(tmp_path, "ref", True, steps=8, ckpt_every=4)
    # runs with and without release, stopped after their step-4 checkpoint, resumed with release
    for name, release in (("a", True), ("b", False)):
        d, _ = train(tmp_path, name, release, steps=8, ckpt_every=4)
        shutil.rmtree(d / "checkpoints/step_00000008")
        as_killed(d)
        y = tiny_yaml(tmp_path, name=name, steps=8, ckpt_every=4,
                      extra="training: {grad_clip: 0.0, gradient_release: true}\n")
        p = run_train(["--yaml", y, "--resume"])
        assert p.returncode == 0 and "resumed from step 4" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
        assert np.array_equal(read_log(d / "log.h5")["loss"], read_log(ref / "log.h5")["loss"]), name


@pytest.mark.parametrize("extra,ranks,why", [
    ("training: {gradient_release: true}\n", 1, "training.grad_clip 0"),
    ("training: {gradient_release: true, grad_clip: 0.0, grad_accum: 2}\n", 1, "grad_accum 1"),
    ("training: {gradient_release: true, grad_clip: 0.0, grad_accum: 2}\n", 2, "grad_accum 1"),
    ("training: {gradient_release: true, grad_clip: 0.0, offload: optimizer}\n", 1, "training.offload none"),
])
def test_refused_by_name_before_any_work(tmp_path, extra, ranks, why):
    y = tiny_yaml(tmp_path, name="r", extra=extra)
    p = run_train(["--yaml", y], ranks=ranks)
    assert p.returncode != 0
    assert "training.gradient_release" in p.stderr and why in p.stderr, p.stderr
    assert not (tmp_path / "runs/r").exists()
