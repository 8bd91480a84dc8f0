"""scripts/project_env.py: a script run by a Python without the project's packages runs itself again
with .venv/bin/python3, or says what to run."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SYSTEM_PYTHON = "/usr/bin/python3"
FRESH = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


def system_python_lacks(module):
    if not Path(SYSTEM_PYTHON).is_file():
        return False
    p = subprocess.run([SYSTEM_PYTHON, "-c", f"import {module}"], capture_output=True, env=FRESH)
    return p.returncode != 0


@pytest.mark.parametrize("script", ["summarize.py", "plot_sweep.py", "plot_runs.py", "plot_scaling.py",
                                    "to_csv.py", "to_tensorboard.py", "prepare_data.py", "sample.py",
                                    "prepare_hellaswag.py"])
def test_scripts_run_from_a_fresh_shell(script):
    if not system_python_lacks("h5py") and not system_python_lacks("numpy"):
        pytest.skip(f"SKIP: {SYSTEM_PYTHON} has the packages itself: nothing to run again")
    if not (REPO / ".venv/bin/python3").is_file():
        pytest.skip("SKIP: no .venv in this checkout (scripts/setup.sh makes it)")
    p = subprocess.run([SYSTEM_PYTHON, str(SCRIPTS / script), "--help"], capture_output=True, text=True,
                       env=FRESH, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: ")


def copy_with(tmp_path, body, venv_python=None):
    """A checkout of project_env.py and one script x.py; .venv/bin/python3 only when venv_python."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPTS / "project_env.py", tmp_path / "scripts")
    (tmp_path / "scripts/x.py").write_text("import project_env\n" + body)
    if venv_python:
        (tmp_path / ".venv/bin").mkdir(parents=True)
        (tmp_path / ".venv/bin/python3").symlink_to(venv_python)
    return tmp_path / "scripts/x.py"


def test_no_venv_says_what_to_run(tmp_path):
    x = copy_with(tmp_path, "project_env.need('json', 'no_such_module_here')\nprint('ran')\n")
    p = subprocess.run([sys.executable, str(x)], capture_output=True, text=True, env=FRESH)
    assert p.returncode == 1 and "ran" not in p.stdout
    assert "x.py: error:" in p.stderr and "no_such_module_here" in p.stderr and "json" not in p.stderr
    assert "bash scripts/setup.sh" in p.stderr and str(tmp_path / ".venv") in p.stderr


def test_runs_again_with_the_venv_once(tmp_path):
    # the .venv's python has json but not the missing module: one more run, then the message (no loop)
    x = copy_with(tmp_path, "import sys\nprint('run by', sys.executable, flush=True)\n"
                            "project_env.need('no_such_module_here')\n", venv_python=sys.executable)
    p = subprocess.run([sys.executable, str(x), "a b", "--flag"], capture_output=True, text=True, env=FRESH,
                       timeout=60)
    assert p.returncode == 1
    runs = [line for line in p.stdout.splitlines() if line.startswith("run by")]
    assert runs == [f"run by {sys.executable}", f"run by {tmp_path / '.venv/bin/python3'}"]
    assert "lacks them too" in p.stderr and "requirements.txt" in p.stderr

    # arguments travel unchanged, and a script with what it needs runs once
    y = copy_with(tmp_path / "y", "import sys\nproject_env.need('json')\nprint(sys.argv[1:])\n",
                  venv_python=sys.executable)
    p = subprocess.run([sys.executable, str(y), "a b", "--flag"], capture_output=True, text=True, env=FRESH)
    assert p.returncode == 0 and p.stdout.strip() == "['a b', '--flag']"
