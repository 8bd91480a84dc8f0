"""scripts/setup.sh's Python side: the CUDA build's cudnn-frontend headers are installed only where there is
nvcc, without the wheel's ~600 MB of dependencies, and never through scripts/requirements.txt.

setup.sh runs as written in a copy of scripts/ with stand-ins: a .venv whose python3 records what it is
asked (and answers the import check and sysconfig's purelib), dpkg-query saying every apt package is there,
apt-get and sudo that fail the test if called, CUDA_HOME with or without bin/nvcc; SETUP_SKIP_BUILD=1.
Nothing is installed and the real .venv is not touched."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PYTHON_STUB = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  -c) case "$2" in
        *sysconfig*) echo "{purelib}" ;;
        *) exit {import_rc} ;;
      esac ;;
esac
exit 0
"""


def run_setup(tmp_path, nvcc, packages_there, header_there):
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for f in ("setup.sh", "requirements.txt"):
        shutil.copy(REPO / "scripts" / f, root / "scripts" / f)
    log, purelib = tmp_path / "python.calls", tmp_path / "site-packages"
    (purelib / "include").mkdir(parents=True)
    if header_there:
        (purelib / "include/cudnn_frontend.h").write_text("")
    venv = root / ".venv/bin"
    venv.mkdir(parents=True)
    (venv / "python3").write_text(PYTHON_STUB.format(log=log, purelib=purelib, import_rc=0 if packages_there else 1))
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "dpkg-query").write_text("#!/bin/sh\necho 'install ok installed'\n")
    for name in ("apt-get", "sudo"):
        (stubs / name).write_text(f"#!/bin/sh\necho '{name} called' >&2\nexit 3\n")
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    if nvcc:
        (cuda / "bin/nvcc").write_text("#!/bin/sh\nexit 0\n")
    for f in [venv / "python3", *stubs.iterdir(), *(cuda / "bin").iterdir()]:
        f.chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "CUDA_HOME": str(cuda),
           "SETUP_SKIP_BUILD": "1"}
    p = subprocess.run(["bash", str(root / "scripts/setup.sh")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return [c for c in calls if c.startswith("-m pip install")], root


@pytest.mark.parametrize("nvcc", [False, True], ids=["cpu-only", "nvcc"])
def test_requirements_leave_out_the_cuda_headers(tmp_path, nvcc):
    """A machine without the Python packages gets scripts/requirements.txt, which names no CUDA wheel; the
    cudnn-frontend headers come alone (--no-deps), and only with nvcc."""
    pips, root = run_setup(tmp_path, nvcc=nvcc, packages_there=False, header_there=False)
    assert "-m pip install -q -r scripts/requirements.txt" in pips, pips
    requirements = (root / "scripts/requirements.txt").read_text()
    named = [line.split("#")[0].strip() for line in requirements.splitlines()]
    assert not [n for n in named if n.startswith(("nvidia-", "cuda", "cutlass"))], requirements
    frontend = [c for c in pips if "nvidia-cudnn-frontend" in c]
    if nvcc:
        assert frontend == ["-m pip install -q --no-deps nvidia-cudnn-frontend>=1.0"], pips
    else:
        assert frontend == [], pips


@pytest.mark.parametrize("header_there", [False, True], ids=["no-header", "header"])
def test_packages_there_installs_only_a_missing_header_with_nvcc(tmp_path, header_there):
    """Run again with every package there: nothing is installed, except the headers where nvcc is and
    they are not."""
    pips, _ = run_setup(tmp_path, nvcc=True, packages_there=True, header_there=header_there)
    assert pips == ([] if header_there else ["-m pip install -q --no-deps nvidia-cudnn-frontend>=1.0"]), pips
    pips, _ = run_setup(tmp_path / "cpu", nvcc=False, packages_there=True, header_there=False)
    assert pips == [], pips
