"""bench/memory_frontier.py on a machine without its GPU: a run that cannot start is a row with its exit
status and no figures, results.json and table.md are written after every run, a folder with results in it
is never written over, and --indices outside the sweep is refused."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "bench" / "memory_frontier.py"


def bench(*args):
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_a_run_that_cannot_start_is_recorded_and_results_are_never_written_over(tmp_path, train_bin):
    out = tmp_path / "mf"
    # the 1558M memory_fit run is planned for a GPU: here it exits at once, and still gets its row
    p = bench("--out", out, "--indices", "", "--limits", "16", "--fit-precisions", "bf16", "--train", train_bin)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["mode"] for r in rows] == ["memory_limit_gb 16, bf16"]
    assert rows[0]["exit"] != 0 and not rows[0].get("tokens_per_s"), rows
    assert "| memory_limit_gb 16, bf16 |" in (out / "table.md").read_text()
    assert not list(out.glob("*.tmp"))
    before = (out / "results.json").read_bytes()
    p = bench("--out", out, "--indices", "", "--limits", "16", "--train", train_bin)
    assert p.returncode != 0 and "is not empty (results are never written over)" in p.stderr
    assert (out / "results.json").read_bytes() == before


def test_indices_outside_the_sweep_are_refused(tmp_path, train_bin):
    p = bench("--out", tmp_path / "x", "--indices", "0,54", "--limits", "", "--train", train_bin)
    assert p.returncode != 0 and "--indices [54] outside 0-53" in p.stderr, p.stderr
