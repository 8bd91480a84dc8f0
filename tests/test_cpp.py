"""Runs the C++ test programs (build/tests/cpu/test_*, and build/tests/gpu/test_* where a GPU is present)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_TESTS = sorted((ROOT / "build/tests/cpu").glob("test_*"))
GPU_TESTS = sorted((ROOT / "build/tests/gpu").glob("test_*"))


def has_gpu():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def run(binary):
    p = subprocess.run([str(binary)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    print(p.stdout[-20000:])
    print(p.stderr[-20000:])
    assert p.returncode == 0, f"{binary.name} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    assert " passed, 0 failed" in p.stdout


def test_cpu_programs_are_built():
    assert CPU_TESTS, "no C++ test programs in build/tests/cpu: run make"


@pytest.mark.parametrize("binary", CPU_TESTS, ids=[b.name for b in CPU_TESTS])
def test_cpu(binary):
    run(binary)


@pytest.mark.parametrize("binary", GPU_TESTS, ids=[b.name for b in GPU_TESTS])
def test_gpu(binary):
    if not has_gpu():
        pytest.skip("SKIP: no CUDA device on this machine; GPU tests run on the GPU machine")
    run(binary)


def test_gpu_suite_reports_skip_without_gpu():
    if has_gpu():
        pytest.skip("GPU present: the GPU programs above ran")
    pytest.skip("SKIP: no CUDA device on this machine; GPU kernel and whole-step tests were not run")


GEMM_ALGOS = ROOT / "build/bench/gemm_algos"


def test_gemm_algos_rejects_unknown_arguments():
    if not GEMM_ALGOS.exists():
        pytest.skip("SKIP: build/bench/gemm_algos not built (CPU-only build)")
    for args in (["--bogus"], ["--json"], ["--sustain"], ["--sustain", "0"], ["--sustain", "5x"]):
        p = subprocess.run([str(GEMM_ALGOS), *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "usage:" in p.stderr


ATTENTION_PLANS = ROOT / "build/bench/attention_plans"


def test_attention_plans_rejects_bad_arguments():
    if not ATTENTION_PLANS.exists():
        pytest.skip("SKIP: build/bench/attention_plans not built (CPU-only build)")
    for args in (["--bogus"], ["--json"], ["--shapes"]):
        p = subprocess.run([str(ATTENTION_PLANS), *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "usage:" in p.stderr
    for shapes in ("64:1024:12", "64:1024:12:0", "a:b:c:d", "64:1024:12:64x", ""):
        p = subprocess.run([str(ATTENTION_PLANS), "--shapes", shapes], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, (shapes, p.stdout, p.stderr)
        assert "--shapes" in p.stderr


@pytest.mark.parametrize("survey", [GEMM_ALGOS, ATTENTION_PLANS], ids=["gemm_algos", "attention_plans"])
def test_gpu_survey_without_gpu_skips_and_writes_nothing(tmp_path, survey):
    if not survey.exists():
        pytest.skip(f"SKIP: build/bench/{survey.name} not built (CPU-only build)")
    if has_gpu():
        pytest.skip("GPU present: the survey runs in bench/gpu_suite.sh")
    out = tmp_path / "survey.json"
    p = subprocess.run([str(survey), "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "SKIP: no CUDA device" in p.stdout
    assert not out.exists() and not (tmp_path / "survey.json.tmp").exists()