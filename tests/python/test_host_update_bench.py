"""bench/host_update.py: both builds of the host loop timed in one invocation, every rule and state type."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_writes_a_row_per_rule_state_and_build(tmp_path):
    p = subprocess.run([sys.executable, ROOT / "bench" / "host_update.py", "--out", tmp_path, "--n", "5000",
                        "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "host_update.json").read_text())
    rows = res["rows"]
    v2 = {(r["rule"], r["state"]) for r in rows if r["isa"] == "x86-64-v2"}
    assert v2 == {(rule, s) for rule in ("adamw", "lion") for s in ("fp32", "bf16", "int8")}, rows
    assert all(r["s"] > 0 and r["n"] == 5000 for r in rows)
    assert all(r["speedup_vs_v2"] == 1.0 for r in rows if r["isa"] == "x86-64-v2")
    assert "| adamw | bf16 | x86-64-v2 |" in p.stdout


def test_a_missing_program_is_named(tmp_path):
    p = subprocess.run([sys.executable, ROOT / "bench" / "host_update.py", "--out", tmp_path,
                        "--program", tmp_path / "nope"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "nope not found" in p.stderr
