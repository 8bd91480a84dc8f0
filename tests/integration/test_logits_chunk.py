"""training.logits_chunk: the classifier's rows of logits at a time. A smaller chunk allocates a smaller
logits buffer (predicted and measured alike) and trains the same model to within the rounding of the weight
gradient's other summation order; FP8 wants a multiple of 16; memory_fit tries the smaller chunk where it
lets a larger micro-batch fit."""
import numpy as np
import pytest

from conftest import run_train, tiny_yaml
from test_zero import run_ok


def test_a_smaller_chunk_allocates_less_and_trains_alike(tmp_path):
    # micro-batch 4 x seq 16: 64 rows of logits, in one chunk by default and in four of 16
    whole, _ = run_ok(tmp_path, 1, "whole", B=4, steps=6)
    parts, _ = run_ok(tmp_path, 1, "parts", B=4, steps=6, sets=["training.logits_chunk=16"])
    for log in (whole, parts):
        for k in ("workspace", "activations", "params"):
            assert log["mem_pred"][k] == log["mem_meas"][k], (k, log["mem_pred"], log["mem_meas"])
    # the logits buffer: 64 x 128 padded vocabulary rows of fp32 against 16 of them
    assert whole["mem_meas"]["workspace"] - parts["mem_meas"]["workspace"] == 4 * 128 * (64 - 16)
    assert parts["loss"][0] == whole["loss"][0]  # the forward's losses do not depend on the chunk
    np.testing.assert_allclose(parts["loss"], whole["loss"], rtol=2e-5)


@pytest.mark.parametrize("value,why", [("-1", "must be >= 0 (0 = 8192 rows)"),
                                       ("24", "precision fp8 needs a multiple of 16")])
def test_bad_chunks_are_refused(tmp_path, value, why):
    sets = ["--set", f"training.logits_chunk={value}"] + (["--set", "training.precision=fp8"] if value == "24" else [])
    p = run_train(["--yaml", tiny_yaml(tmp_path, name="r")] + sets)
    assert p.returncode == 1 and f"training.logits_chunk: {why}" in p.stderr, p.stderr
    assert not (tmp_path / "runs" / "r").exists()
