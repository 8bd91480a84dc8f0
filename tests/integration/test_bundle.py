"""scripts/bundle.sh: the relocatable copy of the CUDA build runs from its own folder, with OpenBLAS linked in
and the libraries it copied found through DIR/lib (skipped, with a message, where the build has no CUDA)."""
import os
import subprocess

import pytest

from conftest import ROOT


def test_bundle_runs_from_its_folder(tmp_path, train_bin):
    if not (ROOT / "build" / "cu").is_dir():
        pytest.skip("SKIP: no CUDA build in build/ (bundle.sh relinks the CUDA objects)")
    out = tmp_path / "bundle"
    p = subprocess.run(["bash", ROOT / "scripts/bundle.sh", out], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    for name in ("train", "test_ops", "test_step", "gemm_algos", "attention_plans", "host_pinning"):
        assert (out / name).is_file() and os.access(out / name, os.X_OK), name
    copied = sorted(f.name for f in (out / "lib").iterdir())
    assert any(n.startswith("libyaml-cpp") for n in copied), copied
    assert any(n.startswith("libboost_program_options") for n in copied), copied
    needed = subprocess.run(["ldd", out / "train"], capture_output=True, text=True).stdout
    assert "libopenblas" not in needed, "OpenBLAS should be linked in statically"
    env = dict(os.environ, LD_LIBRARY_PATH=f"{out / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    # the copy parses, validates and plans a run on its own (CPU device: no GPU needed)
    r = subprocess.run([out / "train", "--yaml", ROOT / "experiments/quickstart.yaml", "--dry-run", "--set",
                        "training.device=cpu"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "predicted memory" in r.stdout
    assert not list(tmp_path.glob(".bundle.*")), "the staging folder was left behind"
    # an existing folder is never overwritten
    again = subprocess.run(["bash", ROOT / "scripts/bundle.sh", out], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "exists" in again.stderr
    assert (out / "train").is_file()


def test_bundle_without_a_build_names_the_problem(tmp_path):
    p = subprocess.run(["bash", ROOT / "scripts/bundle.sh", tmp_path / "b"], capture_output=True, text=True,
                       env=dict(os.environ, BUILD=str(tmp_path / "nobuild")), timeout=60)
    assert p.returncode == 1 and "no CUDA build" in p.stderr and "make" in p.stderr
    assert not (tmp_path / "b").exists()
