"""bench/convergence.py: the time to a loss, the windows and the checks on made-up curves, and one real run of
two policies on the CPU (a tiny model, a few steps) that writes the table, the JSON and the plot."""
import importlib.util
import json
import lzma
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_shard

REPO = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("convergence", REPO / "bench" / "convergence.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_time_to_reach_interpolates_between_evaluations_and_says_never():
    c = load()
    s, v = [10.0, 20.0, 30.0], [3.0, 2.0, 1.0]
    assert c.time_to_reach(s, v, 2.5) == pytest.approx(15.0)
    assert c.time_to_reach(s, v, 2.0) == pytest.approx(20.0)
    assert c.time_to_reach(s, v, 3.5) == pytest.approx(10.0)  # reached at the first evaluation
    assert c.time_to_reach(s, v, 0.5) is None


def test_windows_follow_the_run_length():
    c = load()
    assert c.windows(502) == [(1, 50), (51, 200), (201, 251), (252, 502)]
    assert c.windows(60) == [(1, 30), (31, 50), (51, 60)]


def curves(ms, scale=1.0, n=400):
    step = np.arange(1, n + 1)
    loss = scale * (3.0 + 5.0 / np.sqrt(step))
    ev = np.arange(50, n + 1, 50)
    val = scale * (3.1 + 5.0 / np.sqrt(ev))
    return {"step": step, "loss": loss, "step_ms": np.full(n, ms), "eval_step": ev, "val_loss": val,
            "eval_s": ev * ms / 1000.0, "wall_s": n * ms / 1000.0 + 2}


def test_a_faster_policy_on_the_same_curve_reaches_the_loss_sooner_and_passes():
    c = load()
    logs = {"bf16": curves(100.0), "fp8 + classifier": curves(70.0)}
    rows, ok = c.compare(logs, "bf16", 0.01, target=1.3)
    assert ok
    assert rows["fp8 + classifier"]["speedup"] == pytest.approx(100 / 70)
    assert rows["bf16"]["speedup"] == pytest.approx(1.0)


def test_a_loss_two_percent_off_fails_the_one_percent_check_and_a_slow_default_fails_the_target():
    c = load()
    rows, ok = c.compare({"bf16": curves(100.0), "fp8 + classifier": curves(70.0, scale=1.02)}, "bf16", 0.01)
    assert not ok
    assert all(not w["ok"] for w in rows["fp8 + classifier"]["windows"])
    assert all(not e["ok"] for e in rows["fp8 + classifier"]["evals"])  # reported beside the windows
    assert rows["fp8 + classifier"]["epoch_speedup"] == pytest.approx(100 / 70)
    rows, ok = c.compare({"bf16": curves(100.0), "fp8 + classifier": curves(90.0)}, "bf16", 0.01, target=1.3)
    assert not ok and rows["fp8 + classifier"]["speedup"] == pytest.approx(100 / 90)


def test_the_reference_run_again_is_reported_and_not_checked():
    """--ref-repeats: the reference's second run is a row against the first (its run-to-run spread), outside
    the check; a policy off by as much still fails it."""
    c = load()
    logs = {"bf16": curves(100.0), f"bf16 ({c.REPEAT} 2)": curves(100.0, scale=1.03), "fp8 + classifier": curves(70.0)}
    rows, ok = c.compare(logs, "bf16", 0.01)
    assert ok
    assert all(not w["ok"] for w in rows[f"bf16 ({c.REPEAT} 2)"]["windows"])  # 3% off: reported as such
    logs["fp8 + classifier"] = curves(70.0, scale=1.03)
    assert not c.compare(logs, "bf16", 0.01)[1]


def test_another_structure_is_reported_against_the_reference_and_checks_its_own_policies():
    """A structural variant (rope) learning 10% faster is reported against bf16, not failed; its FP8 policy
    is checked against the variant's bf16, and fails when 2% off it."""
    c = load()
    structure = {"bf16": "", "bf16, rope": ", pos_embedding: rope", "fp8 + classifier": "",
                 "fp8 + classifier, rope": ", pos_embedding: rope"}
    logs = {"bf16": curves(100.0), "bf16, rope": curves(100.0, scale=0.9), "fp8 + classifier": curves(70.0),
            "fp8 + classifier, rope": curves(70.0, scale=0.9)}
    rows, ok = c.compare(logs, "bf16", 0.01, structure=structure)
    assert ok
    assert rows["bf16, rope"]["against"] == "bf16" and not rows["bf16, rope"]["checked"]
    assert all(w["rel"] == pytest.approx(-0.1) for w in rows["bf16, rope"]["windows"])  # reported as it is
    assert rows["fp8 + classifier, rope"]["against"] == "bf16, rope" and rows["fp8 + classifier, rope"]["checked"]
    assert rows["fp8 + classifier"]["against"] == "bf16"
    logs["fp8 + classifier, rope"] = curves(70.0, scale=0.9 * 1.02)
    rows, ok = c.compare(logs, "bf16", 0.01, structure=structure)
    assert not ok and all(not w["ok"] for w in rows["fp8 + classifier, rope"]["windows"])
    assert "| bf16 (reported) |" in c.markdown(rows, "bf16", 3.0, 0.01)


def test_runs_two_policies_on_the_cpu_from_xz_shards(tmp_path, train_bin):
    rng = np.random.default_rng(0)
    data = tmp_path / "corpus"
    data.mkdir()
    for kind, n in (("train", 40 * 64 + 1), ("val", 8 * 64 + 1)):
        p = write_shard(tmp_path / f"c_{kind}.bin", rng.integers(0, 50257, n))
        with lzma.open(data / f"c_{kind}.bin.xz", "wb") as f:
            f.write(p.read_bytes())
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "convergence.py"), "--data", str(data), "--out", str(out),
                        "--policies", "bf16,fp8cls", "--model", "tiny", "--device", "cpu", "--batch", "4",
                        "--seq", "64", "--eval-every", "5", "--tolerance", "1", "--target", "0"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads((out / "convergence.json").read_text())
    assert res["steps"] == 10  # one epoch: 40 sequences of 64 at micro-batch 4
    assert set(res["policies"]) == {"bf16", "fp8 + classifier"}
    assert res["curves"]["bf16"]["eval_step"] == [5, 10]
    assert (out / "convergence.png").stat().st_size > 0
    assert "| fp8 + classifier |" in (out / "convergence.md").read_text()
