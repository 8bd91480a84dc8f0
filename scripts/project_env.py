"""The project's Python packages for its scripts, from any shell.

scripts/setup.sh installs them into .venv/ beside the checkout, so `python3 scripts/x.py` in a shell
that has not activated it would find none of them. Each script calls need() before its imports: when
a package is missing from the interpreter that runs it, the script runs itself again with
.venv/bin/python3; when that is missing too (or lacks the package), it says what to run and exits 1.
"""
import importlib.util
import os
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
VENV_PYTHON = SCRIPTS.parent / ".venv" / "bin" / "python3"
# set on the second run, so a .venv that lacks a package too ends in the message, not in a loop
_AGAIN = "GPT2_TRAIN_VENV_REEXEC"


def need(*modules):
    """Make sure `modules` (top-level import names) can be imported by the script being run."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    ours = script is not None and script.parent == SCRIPTS and script.suffix == ".py"
    if ours and VENV_PYTHON.is_file() and not os.environ.get(_AGAIN):
        os.environ[_AGAIN] = "1"
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), sys.argv[0], *sys.argv[1:]])
    name = script.name if ours else "this script"
    if not VENV_PYTHON.is_file():
        where = f"there is no {VENV_PYTHON}: run `bash scripts/setup.sh` in {SCRIPTS.parent} to make it"
    else:
        where = (f"{VENV_PYTHON} lacks them too: run `bash scripts/setup.sh` "
                 f"(or {VENV_PYTHON} -m pip install -r {SCRIPTS / 'requirements.txt'})")
    sys.exit(f"{name}: error: needs the Python package(s) {', '.join(missing)}, which {sys.executable} "
             f"cannot import; {where}")
