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


def slurm_shell(script, *args):
    """bash -c SCRIPT ARGS, with slurm/lib.sh set to run mpirun with 2 ranks. SIGINT is at its default, as Slurm starts
    a batch script: a test run in the background of a shell without job control (`pytest ... &` in a script)
    inherits it ignored, and bash cannot trap a signal that was ignored when it started. A session of its own, so
    that end_session() also ends a run that the shell has left behind."""
    env = dict(os.environ, **ENV, REPO_DIR=str(ROOT), TRAIN_BIN=str(TRAIN), LAUNCHER="mpirun", SLURM_NTASKS="2",
               MPIRUN_ARGS="--allow-run-as-root --oversubscribe", MPIRUN_KILL_WAIT_S="2")
    return subprocess.Popen(["bash", "-c", script, "bash", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def end_session(proc):
    """Kills what is left in the session of slurm_shell's shell: on a failure, mpirun that it left running."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_slurm_scripts_turn_term_and_int_into_usr1(tmp_path, sig):
    """run_train of slurm/lib.sh (what train.sh and sweep_point.sbatch run) with the mpirun launcher: the signal
    reaches only its shell, as `scancel --batch` or a preemption's would; the run stops with 75 and the shell
    does not requeue it."""
    y = long_run(tmp_path)
    proc = slurm_shell('source "$REPO_DIR/slurm/lib.sh"; run_train --yaml "$1"; echo "run_train returned $?"', y)
    try:
        wait_for(proc, "step    200/")
        proc.send_signal(sig)  # the shell alone
        out, err = proc.communicate(timeout=120)
    finally:
        end_session(proc)
    name = sig.name[3:]
    assert f"got SIG{name}: asking the run to checkpoint" in err, err[-3000:]
    assert f"train exited {EXIT_CHECKPOINTED} (after SIG{name})" in err and "not requeued" in err, err[-3000:]
    assert "run_train returned 0" in out, out[-2000:]
    stopped_and_checkpointed(tmp_path / "runs/t")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("before", ['"$@"', "pid=$!"], ids=["launcher_not_started", "pid_not_known"])
def test_slurm_scripts_pass_on_a_signal_that_comes_as_the_run_starts(tmp_path, sig, before):
    """The same with the signal reaching the shell as run_forwarding starts the launcher: a DEBUG trap sends it just
    before the command that starts it, or just after (before its pid is known). The shell must neither die of it
    nor drop it (the run would go on without a stop): it passes it on once the launcher exists. The launcher
    then exits 75, or 138 where the USR1 reaches it or the ranks before their handler; both are a stop, not
    requeued."""
    y = long_run(tmp_path)
    script = r"""source "$REPO_DIR/slurm/lib.sh"
    test_sig=$2 test_before=$3
    set -T  # functions run the DEBUG trap too
    trap '[[ -z ${sent:-} && $BASH_COMMAND == "$test_before" ]] && {
        sent=1; log "test: SIG$test_sig to this shell"; kill -s "$test_sig" $$; }' DEBUG
    run_train --yaml "$1"; echo "run_train returned $?" """
    name = sig.name[3:]
    proc = slurm_shell(script, y, name, before)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        end_session(proc)
    assert f"test: SIG{name} to this shell" in err, f"no command `{before}` in run_forwarding?\n{err[-3000:]}"
    assert f"got SIG{name}: asking the run to checkpoint" in err, err[-3000:]
    m = re.search(rf"train exited (\d+) \(after SIG{name}\)", err)
    assert m and m.group(1) in ("75", "138") and "not requeued" in err, err[-3000:]
    assert "run_train returned 0" in out, out[-2000:]
    if m.group(1) == "75":
        stopped_and_checkpointed(tmp_path / "runs/t")


def test_slurm_scripts_say_when_sigint_cannot_be_trapped():
    """A shell that started with SIGINT ignored (a background job of a shell without job control) cannot trap it,
    and a SIGINT will not stop the run: run_forwarding says so rather than fail in silence."""
    p = subprocess.run(["bash", "-c", 'source "$REPO_DIR/slurm/lib.sh"; run_forwarding true; echo "returned $?"'],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, REPO_DIR=str(ROOT)),
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert "warning: SIGINT was ignored when this shell started" in p.stderr, p.stderr
    assert "SIGTERM" not in p.stderr and "SIGUSR1" not in p.stderr, p.stderr
    assert "returned 0" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("last", [False, True])
def test_a_stop_signal_during_a_long_evaluation_ends_it(tmp_path, last):
    # an evaluation of far more batches than the test waits for: only the stop can end it in time
    steps = 2 if last else 4
    y = tiny_yaml(tmp_path, steps=steps, ckpt_every=0, extra="eval: {every: 2, batches: 100000000}\n")
    proc = subprocess.Popen([str(TRAIN), "--yaml", str(y)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, **ENV))
    try:
        wait_for(proc, "step      1/")  # step 2's evaluation comes next
        import time
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = tmp_path / "runs/t"
    log = read_log(run_dir / "log.h5")
    assert "the evaluation at step 2 was stopped by a signal during the validation loss" in out, out[-2000:]
    # the step's checkpoint and exit 75, as for a stop between steps, the final evaluation's too
    assert proc.returncode == EXIT_CHECKPOINTED and log["attrs"]["status"] == "checkpointed", (proc.returncode, err)
    assert "stopped by a signal at step 2 (received by 1 of 1 ranks) during its evaluation" in log["attrs"]["message"]
    assert (run_dir / "checkpoints/latest").read_text().strip() == "step_00000002"
    assert list(log["eval_step"]) == []  # nothing of it was measured whole
    # the resumed run evaluates step 2 first (a shorter evaluation: eval.* may change on resume)
    p = subprocess.run([str(TRAIN), "--yaml", str(y), "--resume", "eval.batches=2"], capture_output=True, text=True,
                       env=dict(os.environ, **ENV), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    log = read_log(run_dir / "log.h5")
    assert log["attrs"]["status"] == "ok" and list(log["eval_step"]) == ([2] if last else [2, 4])
    assert list(log["step"]) == list(range(1, steps + 1))
