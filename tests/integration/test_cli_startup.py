"""What the command line does before any training: which commands start MPI, bad input under mpirun, what a
dry run checks and prints, the progress bar, and that nothing is written by a command that fails or only
prints."""
import os
import pty
import re
import select
import subprocess
import time

import h5py
import numpy as np
import pytest
import yaml

from conftest import ROOT, TRAIN, mpirun_cmd, run_train, tiny_yaml, write_yaml

# OpenMPI's MPI_Init fails under this ("A requested component was not found ... Framework: pml"), so a
# command that works with it set never started MPI.
NO_MPI = {"OMPI_MCA_pml": "no_such_component"}


def tree(path):
    """Every path under path with its size and modification time: what a command may not change."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def mpirun(args, n=2, env=None, timeout=300):
    """./train under mpirun with n ranks; env entries are passed to every rank (-x)."""
    fwd = [a for k, v in (env or {}).items() for a in ("-x", f"{k}={v}")]
    cmd = mpirun_cmd(n) + fwd + [str(TRAIN)] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def exported(tmp_path, train_bin):
    """The tiny model (2 layers, 32 wide) trained one step and exported as an llm.c file and a Hugging Face folder."""
    y = tiny_yaml(tmp_path, name="src", steps=1, ckpt_every=1)
    run_train(["--yaml", y], check=True)
    ck = tmp_path / "runs/src"
    run_train(["export", "--ckpt", ck, "--out", tmp_path / "m.bin"], check=True)
    run_train(["export", "--ckpt", ck, "--format", "hf", "--out", tmp_path / "m-hf"], check=True)
    return tmp_path / "m.bin", tmp_path / "m-hf"


# --- MPI starts only for commands that train or sample -------------------------------------------------

def test_mpi_breaking_environment_really_breaks_training(tmp_path, train_bin):
    # the control for the tests below: under NO_MPI a command that starts MPI fails
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=1)], env=NO_MPI)
    assert p.returncode != 0
    assert "+-- config" not in p.stdout  # it ended in MPI_Init, before printing its plan


@pytest.mark.parametrize("args", [
    ["--help"],
    ["--config-reference"],
    ["--yaml", "{yaml}", "--list"],
    ["--yaml", "{yaml}", "--dry-run"],
    ["--yaml", ROOT / "experiments/zero.yaml", "--dry-run"],
    ["--yaml", ROOT / "experiments/zero.yaml", "--list"],
])
def test_commands_that_only_read_and_print_do_not_start_mpi(tmp_path, train_bin, args):
    y = tiny_yaml(tmp_path)
    p = run_train([str(a).format(yaml=y) for a in args], env=NO_MPI)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr == "", p.stderr
    assert p.stdout.strip()


def test_config_error_without_mpi_is_one_line(tmp_path, train_bin):
    p = run_train(["--yaml", tiny_yaml(tmp_path), "--dry-run", "training.no_such_key=1"], env=NO_MPI)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == ["error: config: unknown key 'training.no_such_key' (in an override)"]


def test_dry_run_under_mpirun_plans_for_its_world_and_prints_once(tmp_path, train_bin):
    y = tiny_yaml(tmp_path)
    p = mpirun(["--yaml", y, "--dry-run"], env=NO_MPI)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("+-- config") == 1
    assert "world size 2" in p.stdout
    assert "micro 4 x seq 16 x accum 1 x ranks 2 = 128 tokens/step" in p.stdout
    p = mpirun(["--yaml", y, "--list"], env=NO_MPI)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["0\tt\t"]


# --- bad input under mpirun: one message, exit 1, no MPI_Abort ----------------------------------------

@pytest.mark.parametrize("overrides,needle", [
    (["training.no_such_key=1"], "unknown key 'training.no_such_key'"),  # the YAML and the command line
    (["model.n_head=3"], "divisible"),                                    # validation, after MPI started
    (["training.total_batch_tokens=192"], "training.total_batch_tokens"),  # right for 1 rank, not for 2
    (["data.synthetic=false", "data.train={tmp}/none_*.bin"], "no data files match"),  # the files a run reads
])
def test_bad_input_under_mpirun_is_one_message_from_rank_0(tmp_path, train_bin, overrides, needle):
    p = mpirun(["--yaml", tiny_yaml(tmp_path)] + [o.format(tmp=tmp_path) for o in overrides])
    assert p.returncode == 1, p.stdout + p.stderr
    ours = [l for l in p.stderr.splitlines() if l.startswith("error:") or "[rank" in l]
    assert len(ours) == 1 and needle in ours[0], p.stderr
    assert "(on rank" not in ours[0] and "config error" not in ours[0], ours[0]  # every rank's: said once
    assert "MPI_ABORT" not in p.stderr
    assert "+-- config" not in p.stdout
    assert not (tmp_path / "runs").exists()


def test_earlier_run_under_mpirun_is_one_message(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=2)
    run_train(["--yaml", y], check=True)
    before = tree(tmp_path / "runs")
    p = mpirun(["--yaml", y])
    assert p.returncode == 1, p.stdout + p.stderr
    ours = [l for l in p.stderr.splitlines() if l.startswith("error:") or "[rank" in l]
    assert len(ours) == 1 and "already holds a run" in ours[0], p.stderr
    assert "MPI_ABORT" not in p.stderr
    assert tree(tmp_path / "runs") == before


# --- --dry-run checks model.init_from as the run does ---------------------------------------------------

@pytest.mark.parametrize("which", ["llmc", "hf"])
def test_dry_run_refuses_an_init_from_of_other_dimensions_as_the_run_does(tmp_path, exported, which):
    path = exported[0] if which == "llmc" else exported[1]
    y = tiny_yaml(tmp_path, name="b", steps=1)
    args = ["--yaml", y, f"model.init_from={path}"]
    ok = run_train(args + ["--dry-run"])
    assert ok.returncode == 0, ok.stderr
    dry = run_train(args + ["model.n_embd=64", "--dry-run"])
    assert dry.returncode == 1
    assert "n_embd is 32 but the config says 64" in dry.stderr
    run = run_train(args + ["model.n_embd=64"])
    assert run.returncode == 1
    assert run.stderr == dry.stderr  # the same check, the same message
    assert not (tmp_path / "runs/b").exists()


def test_dry_run_refuses_a_truncated_model_file(tmp_path, exported):
    cut = tmp_path / "cut.bin"
    data = exported[0].read_bytes()
    cut.write_bytes(data[:-4])
    p = run_train(["--yaml", tiny_yaml(tmp_path, name="b"), f"model.init_from={cut}", "--dry-run"])
    assert p.returncode == 1
    assert f"model file '{cut}' is truncated: {len(data) - 4} bytes" in p.stderr


def test_dry_run_snapshot_note_only_when_the_run_checkpoints(tmp_path, train_bin):
    note = "checkpoint snapshot:"
    for every, shown in [(0, False), (100, True)]:
        y = tiny_yaml(tmp_path, name=f"c{every}", ckpt_every=every)
        p = run_train(["--yaml", y, "training.device=cuda", "--dry-run"])  # planned for cuda on any machine
        assert p.returncode == 0, p.stderr
        assert (note in p.stdout) == shown, p.stdout


# --- the progress bar moves every step, rate-limited ----------------------------------------------------

def run_on_terminal(args, timeout=300):
    """Runs ./train with its stdout on a pseudo-terminal it controls (so it draws the progress bar); returns
    (exit status, output, seconds)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["OMP_NUM_THREADS"] = "1"
        os.execv(str(TRAIN), [str(TRAIN)] + [str(a) for a in args])
    out, t0 = b"", time.time()
    while time.time() - t0 < timeout:
        r, _, _ = select.select([fd], [], [], 1.0)
        if not r:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace"), time.time() - t0


def test_progress_bar_moves_between_logged_steps_at_most_ten_times_a_second(tmp_path, train_bin):
    steps = 400
    y = tiny_yaml(tmp_path, steps=steps, B=16, extra="")
    code, out, seconds = run_on_terminal(["--yaml", y, "log.every=1000", "log.progress=true",
                                          "model.n_layer=4", "model.n_embd=64", "training.seq_len=32"])
    assert code == 0, out
    done = [int(m) for m in re.findall(rf"\] (\d+)/{steps}  ETA", out)]
    assert done, out
    # logged: steps 1 and 400; every other bar comes from the steps in between, redrawn as they go
    between = [d for d in done if 1 < d < steps]
    assert between, f"the bar showed only {sorted(set(done))} in {seconds:.1f} s"
    assert between == sorted(between)
    assert done[-1] == steps
    assert len(between) <= 10 * seconds + 1, f"{len(between)} redraws in {seconds:.1f} s"


# --- --resume is in the printed and stored config -------------------------------------------------------

def test_resume_is_in_the_printed_and_stored_config(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=2, ckpt_every=2)
    run_train(["--yaml", y], check=True)
    p = run_train(["--yaml", y, "--resume", "training.steps=4"], check=True)
    row = [l for l in p.stdout.splitlines() if l.startswith("| checkpoint.resume")]
    assert row and row[0].split()[-1] == '"auto"', row
    with h5py.File(tmp_path / "runs/t/log.h5", "r") as f:
        assert yaml.safe_load(f.attrs["config_yaml"])["checkpoint"]["resume"] == "auto"
    dry = run_train(["--yaml", y, "--resume", "--dry-run", "training.steps=4"], check=True)
    assert '"auto"' in [l for l in dry.stdout.splitlines() if l.startswith("| checkpoint.resume")][0]
    plain = run_train(["--yaml", y, "--dry-run"], check=True)
    assert '"never"' in [l for l in plain.stdout.splitlines() if l.startswith("| checkpoint.resume")][0]


# --- nothing is written by bad input, --list or --dry-run ----------------------------------------------

@pytest.mark.parametrize("overrides,needle", [
    (["model.n_embd=64", "model.init_from={model}"], "n_embd is 32"),
    (["model.init_from={tmp}/missing.bin"], "missing.bin"),
    (["data.synthetic=false", "data.train={tmp}/none_*.bin"], "no data files match"),
    (["data.synthetic=false", "data.train={tmp}/train.bin", "data.val={tmp}/none_*.bin"], "data.val"),
    (["eval.hellaswag={tmp}/missing.jsonl"], "missing.jsonl"),
    (["eval.vocab={tmp}/missing.json"], "missing.json"),
])
def test_bad_input_leaves_nothing_behind(tmp_path, exported, overrides, needle):
    y = tiny_yaml(tmp_path, name="b", steps=2)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, 4096]  # a token shard (docs/DATA.md), for the cases that need good training data
    (tmp_path / "train.bin").write_bytes(header.tobytes() + (np.arange(4096) % 64).astype(np.uint16).tobytes())
    args = [o.format(model=exported[0], tmp=tmp_path) for o in overrides]
    for extra in [[], ["--dry-run"]]:
        p = run_train(["--yaml", y] + args + extra)
        assert p.returncode == 1, p.stdout + p.stderr
        assert needle in p.stderr
        assert "+-- config" not in p.stdout
        assert not (tmp_path / "runs/b").exists(), list((tmp_path / "runs/b").rglob("*"))


def test_list_and_dry_run_write_nothing(tmp_path, exported):
    y = tiny_yaml(tmp_path, name="b", steps=2, ckpt_every=1, extra="sweep:\n  grid: {training.lr: [1.0e-3, 2.0e-3]}\n")
    before = tree(tmp_path)
    for args in [["--list"], ["--dry-run"], ["--dry-run", "--index", "1"], ["--dry-run", "--resume"],
                 [f"model.init_from={exported[0]}", "--dry-run"]]:
        p = run_train(["--yaml", y] + args)
        assert p.returncode == 0, p.stderr
        assert tree(tmp_path) == before, args


@pytest.mark.parametrize("every", [0, 2])
def test_cpu_plan_counts_the_snapshot_only_when_the_run_takes_it(tmp_path, train_bin, every):
    y = tiny_yaml(tmp_path, name=f"s{every}", steps=2, ckpt_every=every)
    p = run_train(["--yaml", y, "--dry-run"])
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if line.startswith("| snapshot"))
    assert (row.split()[-2] == "0") == (every == 0), row
    assert ("more per rank if a stop signal makes a checkpoint" in p.stdout) == (every == 0), p.stdout
    assert run_train(["--yaml", y]).returncode == 0
    from conftest import read_log
    log = read_log(tmp_path / "runs" / f"s{every}" / "log.h5")
    assert log["mem_pred"]["snapshot"] == log["mem_meas"]["snapshot"], (log["mem_pred"], log["mem_meas"])


# --- scripts/run_quickstart.sh run again after the README's `training.steps=650 --resume` ------------------

def quickstart_tree(tmp_path):
    """The script in a tree of its own: set-up, make and the plot stubbed, ./train the real one, the
    quickstart YAML a tiny run of 4 steps."""
    import shutil
    t = tmp_path / "qs"
    (t / "scripts").mkdir(parents=True)
    (t / "experiments").mkdir()
    shutil.copy(ROOT / "scripts" / "run_quickstart.sh", t / "scripts")
    (t / "scripts" / "setup.sh").write_text("exit 0\n")
    (t / "scripts" / "plot_runs.py").write_text("import sys; open(sys.argv[sys.argv.index('-o') + 1], 'w').write('png')\n")
    (t / "Makefile").write_text("train:\n\t@true\n")
    (t / "train").symlink_to(TRAIN)
    (t / ".venv").symlink_to((ROOT / ".venv").resolve())
    text = tiny_yaml(tmp_path, name="quickstart", steps=4, ckpt_every=2).read_text()
    (t / "experiments" / "quickstart.yaml").write_text(text.replace(str(tmp_path / "runs"), "runs"))
    return t


def test_quickstart_again_after_a_longer_resume_is_nothing_to_do(tmp_path, train_bin):
    t = quickstart_tree(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_HOME=str(tmp_path / "no-cuda"))
    sh = lambda: subprocess.run(["bash", "scripts/run_quickstart.sh"], cwd=t, env=env, capture_output=True, text=True,
                                timeout=300)
    assert sh().returncode == 0
    p = run_train(["--yaml", "experiments/quickstart.yaml", "training.steps=6", "--resume"], cwd=t)
    assert p.returncode == 0, p.stderr
    (t / "runs/quickstart/loss.png").unlink()
    p = sh()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "already complete at step 6, nothing to train" in p.stdout, p.stdout[-2000:]
    assert (t / "runs/quickstart/loss.png").exists()


def test_summary_counts_evaluation_and_memory_is_explained(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=4, extra="eval: {every: 2, batches: 2}\n")
    p = run_train(["--yaml", y])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    at = next(i for i, l in enumerate(lines) if l.startswith("run ok: 4 step(s) in "))
    assert re.match(r"  evaluation: \dm\d\ds besides the steps' time$", lines[at + 1]), lines[at:]
    assert re.search(r"memory: the plan predicts [\d.]+ \w+ per rank for the run's buffers; a step line's mem is the "
                     r"process's peak RSS, which held [\d.]+ \w+ \(the binary and its libraries\)", p.stdout), p.stdout


def test_one_rank_zero_dry_run_says_how_to_plan_for_more(tmp_path, train_bin):
    hint = "plan for the ranks the run will have with `mpirun -np N ./train ... --dry-run`"
    y = tiny_yaml(tmp_path)
    for stage, shown in [(0, False), (2, True)]:
        p = run_train(["--yaml", y, f"training.zero_stage={stage}", "--dry-run"])
        assert p.returncode == 0 and (hint in p.stdout) == shown, p.stdout[-1500:]
    p = mpirun(["--yaml", y, "training.zero_stage=2", "--dry-run"], env=NO_MPI)
    assert p.returncode == 0 and hint not in p.stdout, p.stdout[-1500:]
