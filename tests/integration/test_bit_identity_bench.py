"""bench/bit_identity.py on the CPU: a build against itself is identical case by case, and a build that
trains differently (here: the same binary with another learning rate) is found out, series by series."""
import json
import subprocess
import sys

from conftest import ROOT, TRAIN


def bit_identity(tmp_path, new, only="fp32,2ranks-zero1"):
    return subprocess.run([sys.executable, ROOT / "bench/bit_identity.py", "--ref", TRAIN, "--new", new,
                           "--out", tmp_path / "out", "--only", only], capture_output=True, text=True, timeout=600)


def test_a_build_against_itself_is_identical(tmp_path, train_bin):
    p = bit_identity(tmp_path, TRAIN)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads((tmp_path / "out/bit_identity.json").read_text())["cases"]
    assert [(r["case"], r["result"]) for r in rows] == [("fp32", "identical"), ("2ranks-zero1", "identical")]


def test_a_build_that_trains_otherwise_differs(tmp_path, train_bin):
    other = tmp_path / "other-train"
    other.write_text(f'#!/bin/sh\nif [ "$1" = --yaml ]; then exec {TRAIN} "$@" --set training.lr=0.011; fi\n'
                     f'exec {TRAIN} "$@"\n')
    other.chmod(0o755)
    p = bit_identity(tmp_path, other, only="fp32")
    assert p.returncode == 1, p.stdout + p.stderr
    row = json.loads((tmp_path / "out/bit_identity.json").read_text())["cases"][0]
    assert row["result"].startswith("differs: train/loss") and "final parameters" in row["result"], row
    assert len(row["series"]["train/loss"]["new"]) == 12


def test_a_model_no_gpt2_file_holds_is_compared_in_its_checkpoint(tmp_path, train_bin):
    """rope, a case run only when named: export refuses it, so the final state is the checkpoint's tensors,
    which a change of the learning rate moves (found out) and the same binary repeats (identical)."""
    p = bit_identity(tmp_path, TRAIN, only="rope")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads((tmp_path / "out/bit_identity.json").read_text())["cases"]
    assert [(r["case"], r["result"]) for r in rows] == [("rope", "identical")]
    other = tmp_path / "other-train"
    other.write_text(f'#!/bin/sh\nif [ "$1" = --yaml ]; then exec {TRAIN} "$@" --set training.lr=0.011; fi\n'
                     f'exec {TRAIN} "$@"\n')
    other.chmod(0o755)
    p = bit_identity(tmp_path / "2", other, only="rope")
    assert p.returncode == 1, p.stdout + p.stderr
    row = json.loads((tmp_path / "2/out/bit_identity.json").read_text())["cases"][0]
    assert "final parameters" in row["result"] and "export" not in row["result"], row


def test_an_unknown_case_is_named(tmp_path):
    p = bit_identity(tmp_path, TRAIN, only="fp32,alibi")
    assert p.returncode == 2 and "unknown case alibi" in p.stderr, p.stderr
