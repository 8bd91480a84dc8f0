"""bench/checkpoint_io.py on its small CPU model: the raw dd figures with one stream and with --streams,
the better of them as the disk's, and the checkpoint's own write and read held against it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_checkpoint_io_against_raw_dd(tmp_path):
    if not (REPO / "train").exists():
        pytest.skip("SKIP: ./train is not built (make)")
    out = tmp_path / "io.json"
    p = subprocess.run([sys.executable, REPO / "bench/checkpoint_io.py", "--dir", tmp_path / "d", "--out", out,
                        "--raw-gb", "0.14", "--streams", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert sorted(r["raw_by_streams"]) == ["1", "2"] and r["checkpoint_threads"] == 2
    streams = r["raw_by_streams"].values()
    assert r["raw_write_gbps"] == max(s["write_gbps"] for s in streams) > 0
    assert r["raw_read_gbps"] == max(s["read_gbps"] for s in streams) > 0
    # the checkpoint is the run's files, a few tens of MB of state for the small model
    assert 0.01 < r["checkpoint_gb"] < 0.2
    assert r["checkpoint_write_s"] > 0 and r["checkpoint_read_s"] > 0 and r["snapshot_queued_s"] >= 0
    assert r["write_fraction_of_raw"] == pytest.approx(r["checkpoint_gb"] / r["checkpoint_write_s"] / r["raw_write_gbps"])
    assert r["read_fraction_of_raw"] == pytest.approx(r["checkpoint_gb"] / r["checkpoint_read_s"] / r["raw_read_gbps"])
    assert not list((tmp_path / "d").glob("raw_*.bin")), "dd's files were left behind"


def test_checkpoint_io_names_a_failed_run(tmp_path):
    """A config the trainer refuses ends the benchmark with its exit status and output, not a JSON."""
    if not (REPO / "train").exists():
        pytest.skip("SKIP: ./train is not built (make)")
    out = tmp_path / "io.json"
    p = subprocess.run([sys.executable, REPO / "bench/checkpoint_io.py", "--dir", tmp_path / "d", "--out", out,
                        "--raw-gb", "0.07", "--set", "training.micro_batch=-3"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0 and "micro_batch" in p.stderr and not out.exists()
