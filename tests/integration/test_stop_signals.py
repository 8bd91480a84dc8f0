"""Stopping a run of several ranks under OpenMPI's mpirun (docs/FORMATS.md, "Exit status"): a SIGTERM or SIGINT
sent to mpirun itself makes it exit 1 whatever its ranks do (it aborts the job: the ranks get SIGTERM
odls_base_sigkill_timeout seconds later, SIGKILL as long again after), though they still checkpoint in that
time; so slurm/lib.sh turns a TERM or INT that reaches its shell into the SIGUSR1 that gives 75."""
import os
import re
import signal
import subprocess

import pytest

from conftest import ROOT, TRAIN, mpirun_cmd, read_log, tiny_yaml

EXIT_CHECKPOINTED = 75
ENV = {"OMP_NUM_THREADS": "1"}


def long_run(tmp_path):
    y = tiny_yaml(tmp_path, steps=1000000)
    y.write_text(y.read_text().replace("log: {every: 1,", "log: {every: 100,"))
    return y


def wait_for(proc, text, limit=2000):
    """Reads proc's stdout until a line holds `text`; returns what it read."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if text in line or len(seen) > limit:
            break
    assert any(text in line for line in seen), "".join(seen)[-3000:]
    return seen


def stopped_and_checkpointed(run_dir):
    attrs = read_log(run_dir / "log.h5")["attrs"]
    m = re.search(r"stopped by a signal at step (\d+) \(received by 2 of 2 ranks\)", attrs["message"])
    assert attrs["status"] == "checkpointed" and m, attrs["message"]
    latest = (run_dir / "checkpoints/latest").read_text().strip()
    assert latest == f"step_{int(m.group(1)):08d}", (latest, attrs["message"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_term_or_int_to_mpirun_checkpoints_but_exits_1(tmp_path, sig):
    y = long_run(tmp_path)
    # the ranks' time to stop, as slurm/lib.sh gives it (OpenMPI's default, 1 s, is short on a loaded machine)
    env = dict(os.environ, **ENV, OMPI_MCA_odls_base_sigkill_timeout="5")
    proc = subprocess.Popen(mpirun_cmd(2) + [str(TRAIN), "--yaml", str(y)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(proc, "step    200/")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, f"mpirun exited {proc.returncode}: if OpenMPI now returns the ranks' 75, " \
                                 f"docs/FORMATS.md and slurm/lib.sh say otherwise\n{err[-3000:]}"
    stopped_and_checkpointed(tmp_path / "runs/t")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_slurm_scripts_turn_term_and_int_into_usr1(tmp_path, sig):
    """run_train of slurm/lib.sh (what train.sh and sweep_point.sbatch run) with the mpirun launcher: the signal
    reaches only its shell, as `scancel --batch` or a preemption's would; the run stops with 75 and the shell
    does not requeue it."""
    y = long_run(tmp_path)
    env = dict(os.environ, **ENV, REPO_DIR=str(ROOT), TRAIN_BIN=str(TRAIN), LAUNCHER="mpirun", SLURM_NTASKS="2",
               MPIRUN_ARGS="--allow-run-as-root --oversubscribe", MPIRUN_KILL_WAIT_S="2")
    script = 'source "$REPO_DIR/slurm/lib.sh"; run_train --yaml "$1"; echo "run_train returned $?"'
    proc = subprocess.Popen(["bash", "-c", script, "bash", str(y)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_for(proc, "step    200/")
        proc.send_signal(sig)  # the shell alone
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    name = sig.name[3:]
    assert f"got SIG{name}: asking the run to checkpoint" in err, err[-3000:]
    assert f"train exited {EXIT_CHECKPOINTED} (after SIG{name})" in err and "not requeued" in err, err[-3000:]
    assert "run_train returned 0" in out, out[-2000:]
    stopped_and_checkpointed(tmp_path / "runs/t")
