"""The C++ tests (GoogleTest programs build/tests/cpu/test_* and, where a GPU is present,
build/tests/gpu/test_*), one pytest item per C++ test: each program runs once, and every test's own
outcome (passed, failed with GoogleTest's messages, skipped with its reason) is reported as its own."""
import json
import re
import shutil
import subprocess
from functools import lru_cache
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


def listed(binary):
    """[(binary, 'Suite.name')] from --gtest_list_tests."""
    p = subprocess.run([str(binary), "--gtest_list_tests"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return [(binary, "<list failed>")]
    out, suite = [], None
    for line in p.stdout.splitlines():
        if not line.strip() or line.startswith("Running main()"):
            continue
        if not line.startswith(" "):
            suite = line.strip().rstrip(".")
        else:
            out.append((binary, f"{suite}.{line.split('#')[0].strip()}"))
    return out


@lru_cache(maxsize=None)
def results(binary):
    """Runs the program once; {'Suite.name': (result, messages)} and its output."""
    report = Path(f"/tmp/gtest_{binary.parent.name}_{binary.name}_{id(binary)}.json")
    report.unlink(missing_ok=True)
    p = subprocess.run([str(binary), f"--gtest_output=json:{report}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800)
    out = {}
    if report.exists():
        for suite in json.loads(report.read_text())["testsuites"]:
            for t in suite["testsuite"]:
                msgs = [f["failure"] for f in t.get("failures", [])]
                out[f"{suite['name']}.{t['name']}"] = (t["result"], msgs)
        report.unlink()
    return out, p


def skip_reason(output, test):
    """The message GTEST_SKIP printed before the test's [  SKIPPED ] line."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("[  SKIPPED ]") and test in line:
            for prev in reversed(lines[max(0, i - 5):i]):
                if prev.strip() and not prev.startswith("["):
                    return re.sub(r"^.*?: Skipped\s*", "", prev).strip()
    return "skipped"


CASES = [c for b in CPU_TESTS + GPU_TESTS for c in listed(b)]


def test_cpu_programs_are_built():
    assert CPU_TESTS, "no C++ test programs in build/tests/cpu: run make"
    assert len([c for c in CASES if c[0] in CPU_TESTS]) >= 40, "the C++ programs list too few tests"


@pytest.mark.parametrize("binary,name", CASES, ids=[f"{b.name}:{n}" for b, n in CASES])
def test_cpp(binary, name):
    if binary in GPU_TESTS and not has_gpu():
        pytest.skip("SKIP: no CUDA device on this machine; GPU tests run on the GPU machine")
    got, p = results(binary)
    assert name in got, (f"{binary.name} did not report {name} (exit {p.returncode})\n"
                         f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    result, msgs = got[name]
    if result == "SKIPPED":
        pytest.skip(f"SKIP: {skip_reason(p.stdout + p.stderr, name)}")
    assert not msgs, f"{name} failed:\n" + "\n".join(msgs)


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
