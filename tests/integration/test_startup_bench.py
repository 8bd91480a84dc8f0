"""bench/startup.py on the CPU: both builds' runs stopped after their second step, with the process's own
start-up figure, the set-up phases and the first steps' times read from their output; a build whose run
never reaches a step is reported as such and fails the benchmark."""
import json
import subprocess
import sys

from conftest import ROOT, TRAIN


def startup(tmp_path, ref):
    return subprocess.run([sys.executable, ROOT / "bench/startup.py", "--out", tmp_path / "out", "--ref", ref,
                           "--new", TRAIN, "--configs", "tiny:2", "--device", "cpu", "--precision", "bf16",
                           "--seq-len", "32", "--timeout", "60"], capture_output=True, text=True, timeout=300)


def test_both_builds_are_measured_to_their_first_step(tmp_path, train_bin):
    p = startup(tmp_path, TRAIN)
    assert p.returncode == 0, p.stdout + p.stderr
    row = json.loads((tmp_path / "out/startup.json").read_text())["rows"][0]
    assert [len(row["runs"][s]) for s in ("ref", "new")] == [2, 2]
    for r in row["runs"]["ref"] + row["runs"]["new"]:
        assert r["status"] == "ok", r
        assert {"allocation", "initialisation", "checkpoint memory"} <= set(r["phases"]), r["phases"]
        assert r["startup_s"] is not None and r["first_step_ms"] > 0 and r["second_step_ms"] > 0, r
        # the bench's own clock from the command: at least the process's figure, less its one-decimal rounding
        assert r["to_first_step_s"] > r["startup_s"] - 0.06, r
    # no run was left to write a checkpoint or to go on
    assert not list((tmp_path / "out").glob("*/runs"))
    md = (tmp_path / "out/startup.md").read_text().splitlines()
    assert [line.split("|")[3].strip() for line in md[2:]] == ["ref", "new"], md


def test_a_build_that_never_starts_fails_the_benchmark(tmp_path, train_bin):
    broken = tmp_path / "broken-train"
    broken.write_text("#!/bin/sh\necho 'error: no GPU here' >&2\nexit 3\n")
    broken.chmod(0o755)
    p = startup(tmp_path, broken)
    assert p.returncode == 1, p.stdout + p.stderr
    row = json.loads((tmp_path / "out/startup.json").read_text())["rows"][0]
    assert [r["status"] for r in row["runs"]["ref"]] == ["no second step (exit 3)"] * 2
    assert all(r["status"] == "ok" for r in row["runs"]["new"])
    assert "no second step (exit 3)" in (tmp_path / "out/startup.md").read_text()
