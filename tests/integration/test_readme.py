"""README.md walked as a new user would, in a fresh shell: every command of its command blocks, in order,
run as written in a copy of the checkout (its own runs/, data/ and home), and what it prints or writes
checked. Commands that need a GPU, mpirun over GPUs, the network or the whole test suite are checked as far
as this machine allows (each says how below). A README command the walk does not know fails the test, so
the two stay in step. Also every `python3 scripts/...` command of README.md and docs/ starts from a fresh
shell (`--help`).

The fresh shell: PATH without .venv/bin, no PYTHONPATH or VIRTUAL_ENV, HOME a new folder (the GPT-2
vocabulary a first prepare_data.py run downloads is put in its ~/.cache/gpt2-bpe beforehand: CI is offline),
CUDA_HOME a folder without nvcc (the walk takes the CPU build; the quickstart's order with nvcc but no GPU
is tested by test_quickstart_trains_before_the_cuda_build). The copy of the checkout has the sources as
symbolic links, and the checkout's build/ (its objects, so nothing is compiled again but main's link)."""
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ROOT, SHARED, mpirun_cmd

README = ROOT / "README.md"
FRESH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COMMAND_WORDS = ("bash", "./train", "python3", "mpirun", "curl", ".venv/bin/tensorboard", "sbatch")


def command_blocks(text):
    """[(line number, command)] of the README's indented command blocks (a block whose first word is a
    command; the file listings of Output and Layout are not), in order; `# comments` dropped."""
    out, block = [], []
    lines = text.splitlines()

    def flush():
        if block and block[0][1].split()[0] in COMMAND_WORDS:
            out.extend(block)
        block.clear()

    in_fence = False
    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence and line.startswith("    ") and line.strip():
            words = shlex.split(line, comments=True)
            if words:
                block.append((i, shlex.join(words)))
        elif line.strip():
            flush()
    flush()
    return out


def fresh_env(home, extra=None):
    env = {"PATH": FRESH_PATH, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", "USER": "root",
           "CUDA_HOME": str(home / "no-cuda")}
    for k in ("OMP_NUM_THREADS",):  # CI's core count, as the suite runs everything
        if k in os.environ:
            env[k] = os.environ[k]
    env.update(extra or {})
    return env


def tracked_files(root):
    """The paths git tracks in the checkout at root (its index), or None where git cannot tell."""
    try:
        p = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, timeout=60)
    except OSError:
        return None
    files = [f for f in p.stdout.decode().split("\0") if f]
    return files if p.returncode == 0 and files else None


def make_checkout(dest, root=ROOT):
    """dest: the checkout's sources as links (folders real, so `find` and make see every file), its build/
    and .venv as links; runs/, data/ and ./train its own. Only the top-level entries git tracks are taken
    (and of runs/ and data/ only their tracked files): what a user made in the checkout beside them, such as
    the README's quickstart.bin, quickstart-hf/ or input.txt, never reaches the walk, and the walk writes
    into the copy, never into the checkout. (Where git cannot tell: every entry but the ignored outputs.)"""
    tracked = tracked_files(root)
    dest.mkdir()
    for entry in root.iterdir():
        if entry.name in ("build", ".venv"):
            (dest / entry.name).symlink_to(entry)
            continue
        if tracked is None:
            if entry.name in ("runs", "data", "train", ".git", ".pytest_cache", "tb") or entry.name.endswith(".png"):
                continue
        elif not any(f == entry.name or f.startswith(entry.name + "/") for f in tracked):
            continue
        if entry.name in ("runs", "data"):  # the walk's own, with what the project keeps there
            for f in tracked or []:
                if f.startswith(entry.name + "/"):
                    (dest / f).parent.mkdir(parents=True, exist_ok=True)
                    (dest / f).symlink_to(root / f)
        elif entry.is_file():
            (dest / entry.name).symlink_to(entry)
        elif entry.is_dir():
            subprocess.run(["cp", "-as", str(entry), str(dest / entry.name)], check=True)
    return dest


class Walk:
    def __init__(self, root, home):
        self.root, self.home = root, home
        self.log = []

    def sh(self, command, timeout=900, env=None, check=True):
        t = time.time()
        p = subprocess.run(["bash", "-c", command], cwd=self.root, env=fresh_env(self.home, env),
                           capture_output=True, text=True, timeout=timeout)
        self.log.append(f"{time.time() - t:6.1f} s  rc {p.returncode}  {command}")
        if check:
            assert p.returncode == 0, f"`{command}` exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
        return p

    def log_h5(self, run):
        with h5py.File(self.root / "runs" / run / "log.h5", "r") as f:
            return {"status": f.attrs["status"], "steps": f["train/step"][()], "val": f["eval/val_loss"][()],
                    "precision": f.attrs["precision"]}


# ---- what each README command is checked by -------------------------------------------------------------

def quickstart(w, cmd):
    p = w.sh(cmd, timeout=1500)
    assert "plot: runs/quickstart/loss.png" in p.stdout
    log = w.log_h5("quickstart")
    assert log["status"] == "ok" and log["steps"][-1] == 600
    assert 1.386 < log["val"][-1] < 1.5  # "ends near a validation loss of 1.43", above the ln 4 floor
    assert (w.root / "runs/quickstart/loss.png").stat().st_size > 10_000
    # run again: resumes the finished run, plots it again
    p = w.sh(cmd, timeout=600)
    assert w.log_h5("quickstart")["steps"][-1] == 600


def run_tests(w, cmd):
    # the whole suite is what runs this test: its script is checked to parse and to run pytest over tests/
    w.sh("bash -n scripts/run_tests.sh")
    assert re.search(r"pytest .*tests", (w.root / "scripts/run_tests.sh").read_text())


def train_run(w, cmd):
    w.sh(cmd, timeout=900)
    words = shlex.split(cmd)
    over = dict(a.split("=", 1) for a in words if "=" in a and not a.startswith("-"))
    log = w.log_h5(over.get("run.name", "quickstart"))
    assert log["status"] == "ok" and log["steps"][-1] == int(over["training.steps"]), log["steps"][-5:]
    if "training.precision" in over:
        assert log["precision"].startswith("fp8")
    if over.get("log.csv") == "true":
        assert (w.root / "runs" / over["run.name"] / "train.csv").is_file()


def dry_run(w, cmd):
    p = w.sh(cmd)
    assert re.search(r"\b8 point", p.stdout) or p.stdout.count("\n") > 8, p.stdout[-2000:]


def memory_plan(w, cmd):
    p = w.sh(cmd)  # the plan of a smaller footprint: its state and activations as the dry run predicts them
    assert "2 int8 values per parameter" in p.stdout and re.search(r"\| activations +\d", p.stdout), p.stdout[-2000:]


def frontier_plan(w, cmd):
    p = w.sh(cmd)  # every point of the frontier sweep predicted, on a machine without its GPU
    assert "54 point(s)" in p.stdout and "training.master_weights=compensated" in p.stdout, p.stdout[-2000:]


def list_points(w, cmd):
    p = w.sh(cmd)
    points = [line for line in p.stdout.splitlines() if re.match(r"\s*\d+\s", line)]
    assert len(points) == 8 and "zero_stage" in p.stdout, p.stdout


def sample_ids(w, cmd):
    p = w.sh(cmd)
    ids = [int(x) for x in p.stdout.replace(" | ", " ").split()]  # the prompt | what was generated
    assert ids[:3] == [1, 2, 3] and len(ids) == 3 + 16 and all(0 <= i < 256 for i in ids)


def export_llmc(w, cmd):
    w.sh(cmd)
    header = np.fromfile(w.root / "quickstart.bin", dtype="<i4", count=8)
    assert header[0] == 20240326 and header[3] == 256  # llm.c's magic, the vocabulary


def export_hf(w, cmd):
    p = w.sh(cmd)
    assert "no tokenizer files: the model's 256-token vocabulary is not GPT-2's BPE" in p.stdout
    cfg = json.loads((w.root / "quickstart-hf/config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["vocab_size"] == 256
    assert (w.root / "quickstart-hf/model.safetensors").is_file()


def plot_runs(w, cmd):
    p = w.sh(cmd)
    assert p.stdout.strip() == "cmp.png" and (w.root / "cmp.png").stat().st_size > 10_000


def to_tensorboard(w, cmd):
    w.sh(cmd)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    for run in ("quickstart", "lr1e-3"):
        acc = EventAccumulator(str(w.root / "tb" / run), size_guidance={"scalars": 0})
        acc.Reload()
        assert [e.step for e in acc.Scalars("train/loss")] == w.log_h5(run)["steps"].tolist(), run


def tensorboard(w, cmd):
    """Serves as written until it says where (or finds its port taken: it has read the logdir then)."""
    proc = subprocess.Popen(["bash", "-c", "exec " + cmd], cwd=w.root, env=fresh_env(w.home),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "http://" in line or "already in use" in line:
                break
        text = "".join(seen)
        assert "TensorBoard" in text and ("http://" in text or "already in use" in text), text
        if "http://" in text:
            port = int(re.search(r":(\d+)/", text).group(1))
            with socket.create_connection(("localhost", port), timeout=10):
                pass
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    w.log.append(f"  (served)  {cmd}")


def to_csv(w, cmd):
    w.sh(cmd)
    rows = (w.root / "runs/quickstart/train.csv").read_text().splitlines()
    steps = w.log_h5("quickstart")["steps"].tolist()
    assert rows[0].startswith("step,loss,") and [int(r.split(",")[0]) for r in rows[1:]] == steps


def config_reference(w, cmd):
    p = w.sh(cmd)
    assert p.stdout == (ROOT / "docs/CONFIG.md").read_text()


def gpu_later(w, cmd):
    """GPU-only: checked after the walk (the data they name is made further down)."""
    w.deferred.append(cmd)


def curl_input(w, cmd):
    # offline: the shared copy of that very file stands in for the download
    assert "tinyshakespeare/input.txt" in cmd and shlex.split(cmd)[:2] == ["curl", "-LO"]
    shutil.copy(SHARED / "tinyshakespeare/input.txt", w.root / "input.txt")
    w.log.append(f"  (offline: shared copy)  {cmd}")


def prepare_data(w, cmd):
    w.sh(cmd, timeout=600)
    for name in ("tiny_shakespeare_train.bin", "tiny_shakespeare_val.bin"):
        made = (w.root / "data/tinyshakespeare" / name).read_bytes()
        assert made == (SHARED / "tinyshakespeare" / name).read_bytes(), name  # llm.c's shards, token for token


def accum_clip_point(w, cmd):
    # 150 steps of a 50257-token model take minutes on 2 cores: the same command, 10 steps
    w.sh(cmd + " training.steps=10", timeout=900)
    log = w.log_h5("accum_clip/p000")
    assert log["status"] == "ok" and log["steps"][-1] == 10
    assert (w.root / "runs/accum_clip/p000/checkpoints/latest").is_file()
    w.log.append("  (10 steps)  " + cmd)


def sample_text(w, cmd):
    p = w.sh(cmd, timeout=300)
    assert p.stdout.startswith("ROMEO:") and len(p.stdout) > len("ROMEO:") + 10, p.stdout


def zero_results(w, cmd):
    """Needs runs/zero from the GPU sweep: run as written on a stand-in, the same sweep of ZeRO stages on 2
    CPU ranks with a tiny model."""
    w.deferred.append(cmd)


HANDLERS = [
    (r"^bash scripts/run_quickstart\.sh$", quickstart),
    (r"^bash scripts/run_tests\.sh$", run_tests),
    (r"^\./train --yaml experiments/quickstart\.yaml .*training\.steps=\d+", train_run),
    (r"^\./train --yaml experiments/quickstart\.yaml training\.recompute=3 .*--dry-run$", memory_plan),
    (r"^\./train --yaml experiments/zero\.yaml --dry-run$", dry_run),
    (r"^\./train --yaml experiments/zero\.yaml --list$", list_points),
    (r"^\./train sample --ckpt runs/quickstart ", sample_ids),
    (r"^\./train export --ckpt runs/quickstart --out quickstart\.bin$", export_llmc),
    (r"^\./train export --ckpt runs/quickstart --format hf --out quickstart-hf$", export_hf),
    (r"^python3 scripts/plot_runs\.py runs/quickstart ", plot_runs),
    (r"^python3 scripts/to_tensorboard\.py runs/quickstart ", to_tensorboard),
    (r"^\.venv/bin/tensorboard --logdir tb$", tensorboard),
    (r"^python3 scripts/to_csv\.py runs/quickstart$", to_csv),
    (r"^\./train --config-reference$", config_reference),
    (r"^mpirun -np \d+ \./train --yaml experiments/zero\.yaml$", gpu_later),
    (r"^mpirun -np \d+ \./train --yaml experiments/zero_max\.yaml$", gpu_later),
    (r"^mpirun -np \d+ \./train --yaml experiments/zero_shared_gpu\.yaml --index \d+$", gpu_later),
    (r"^\./train --yaml experiments/zero\.yaml --index \d+$", gpu_later),
    (r"^\./train --yaml experiments/scaling\.yaml$", gpu_later),
    (r"^\./train --yaml experiments/long_run\.yaml --resume$", gpu_later),
    (r"^\./train --yaml experiments/structure\.yaml$", gpu_later),
    (r"^\./train --yaml experiments/gpt2_1558m_16gb\.yaml$", gpu_later),
    (r"^\./train --yaml experiments/memory_frontier\.yaml --dry-run$", frontier_plan),
    (r"^python3 scripts/(summarize|plot_sweep|to_tensorboard)\.py runs/zero", zero_results),
    (r"^curl ", curl_input),
    (r"^python3 scripts/prepare_data\.py input\.txt ", prepare_data),
    (r"^\./train --yaml experiments/accum_clip\.yaml --index 0$", accum_clip_point),
    (r"^python3 scripts/sample\.py --ckpt runs/accum_clip/p000 ", sample_text),
]

ZERO_STANDIN = """run: {name: zero, out_dir: runs}
model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}
data: {synthetic: true, synthetic_vocab: 64}
training: {device: cpu, seq_len: 16, steps: 6, micro_batch: 4, warmup_steps: 1}
eval: {batches: 0}
log: {every: 1, progress: false}
sweep:
  grid: {training.zero_stage: [0, 1, 2, 3]}
"""


def check_gpu_commands(w):
    for cmd in w.deferred:
        words = shlex.split(cmd)
        if words[0] == "mpirun":
            # the launcher is there; the sweep it starts is planned for its GPUs here
            w.sh("mpirun --version")
            p = w.sh(shlex.join(words[3:] + ["--dry-run"]))
            assert "cuda" in p.stdout
        elif words[:2] == ["./train", "--yaml"]:
            p = w.sh(cmd + " --dry-run")  # every key valid, the data there: only the GPU is missing
            if "long_run" in cmd or "structure" in cmd:
                assert "train data: 1 shard(s), 305261 tokens" in p.stdout
            if "16gb" in cmd:  # memory_fit's choice for a 16 GiB card, planned here
                assert "chosen:    optimizer_state int8" in p.stdout and "master_weights compensated" in p.stdout
        else:
            continue
        w.log.append("  (GPU: planned with --dry-run)  " + cmd)
    zero = [c for c in w.deferred if "runs/zero" in c]
    if zero:
        (w.root / "zero_standin.yaml").write_text(ZERO_STANDIN)
        mpi = " ".join(mpirun_cmd(2))
        w.sh(f"{mpi} ./train --yaml zero_standin.yaml", timeout=600)
        for cmd in zero:
            p = w.sh(cmd)
            if "summarize" in cmd:
                rows = [line for line in p.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
                assert len(rows) == 4 and all("| ok |" in r for r in rows), p.stdout
                assert "tokens/s/rank" in p.stdout  # CPU ranks are not called GPUs
            elif "to_tensorboard" in cmd:  # --follow ends: every point has ended
                runs = sorted(d.name for d in (w.root / "runs/zero/tensorboard").iterdir())
                assert runs == [f"p00{i}_zero_stage-{i}" for i in range(4)], runs
            else:
                for name in ("throughput.png", "memory.png", "loss.png"):
                    assert (w.root / "runs/zero" / name).stat().st_size > 10_000
            w.log.append("  (on a CPU stand-in of runs/zero)  " + cmd)


def check_every_experiment(w):
    """Every shipped experiment runs from what the README made: named in it, and planned (all its points,
    its data checked) in the walk's checkout, where only the README's commands made data/."""
    readme = README.read_text()
    for yaml in sorted((ROOT / "experiments").glob("*.yaml")):
        assert yaml.name in readme, f"the README does not say how to run experiments/{yaml.name}"
        p = w.sh(f"./train --yaml experiments/{yaml.name} --dry-run")
        if "data/tinyshakespeare" in yaml.read_text():
            assert "train data: 1 shard(s), 305261 tokens" in p.stdout, yaml.name
        w.log.append(f"  (planned)  experiments/{yaml.name}")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, train_bin, shared_data):
    tmp = tmp_path_factory.mktemp("readme")
    home = tmp / "home"
    (home / ".cache/gpt2-bpe").mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):  # what prepare_data.py would download on a first run
        shutil.copy(SHARED / "gpt2" / name, home / ".cache/gpt2-bpe" / name)
    return make_checkout(tmp / "checkout"), home


def test_readme_commands_work_as_written(checkout):
    root, home = checkout
    commands = command_blocks(README.read_text())
    assert len(commands) >= 20, commands
    w = Walk(root, home)
    w.deferred = []
    unknown = [(n, c) for n, c in commands if sum(bool(re.search(p, c)) for p, _ in HANDLERS) != 1]
    assert not unknown, f"README commands the walk does not know, or not one way (see HANDLERS): {unknown}"
    unused = [p for p, _ in HANDLERS if not any(re.search(p, c) for _, c in commands)]
    assert not unused, f"the walk expects README commands that are gone: {unused}"
    try:
        for n, cmd in commands:
            handler = next(h for p, h in HANDLERS if re.search(p, cmd))
            handler(w, cmd)
        check_gpu_commands(w)
        check_every_experiment(w)
    finally:
        print("README walk:\n" + "\n".join(w.log))


def docs_script_commands():
    """Every `python3 scripts/X.py` of README.md and docs/*.md: (file, script)."""
    found = set()
    for md in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for m in re.finditer(r"python3 (scripts/\w+\.py)", md.read_text()):
            found.add((md.name, m.group(1)))
    return sorted(found)


def test_the_walk_takes_only_the_project_from_the_checkout(tmp_path):
    """What a user left in the checkout after following the README (quickstart.bin, quickstart-hf/,
    input.txt, data/tinyshakespeare/, runs/, tb/, cmp.png) is not in the walk's copy, and the checkout is
    left as it was; the sources are, also one not yet added to git, and data/README.md."""
    root = tmp_path / "checkout"
    for f in ("Makefile", "README.md", "src/a.cpp", "data/README.md", "experiments/q.yaml"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    left = ["quickstart.bin", "input.txt", "cmp.png", "notes.txt", "quickstart-hf/config.json",
            "data/tinyshakespeare/tiny_shakespeare_val.bin", "runs/quickstart/log.h5", "tb/quickstart/events"]
    for f in left + ["src/new.cpp", "build/cli/main.o"]:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.parts)

    copy = make_checkout(tmp_path / "walk", root)
    have = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
    for f in ("Makefile", "README.md", "src/a.cpp", "src/new.cpp", "experiments/q.yaml", "data/README.md"):
        assert (copy / f).read_text() == f, (f, have)
    assert (copy / "build").is_symlink() and (copy / "build/cli/main.o").is_file()
    assert not [f for f in left if (copy / f).exists() or (copy / f.split("/")[0]).is_symlink()], have
    assert not (copy / "quickstart-hf").exists() and not (copy / "tb").exists(), have
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.parts) == before


@pytest.mark.parametrize("where,script", docs_script_commands())
def test_documented_scripts_start_from_a_fresh_shell(where, script, tmp_path):
    assert (ROOT / script).is_file(), f"{where} names {script}, which does not exist"
    p = subprocess.run(["bash", "-c", f"python3 {script} --help"], cwd=ROOT, env=fresh_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage:"), f"{where}: python3 {script}: {p.stderr}"


def test_documented_venv_commands_exist():
    """`.venv/bin/X` commands of README.md and docs/ name programs the set-up installs."""
    for md in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for m in re.finditer(r"\.venv/bin/([\w.-]+)", md.read_text()):
            assert (ROOT / ".venv/bin" / m.group(1)).exists(), f"{md.name}: .venv/bin/{m.group(1)}"


def test_quickstart_trains_before_the_cuda_build(tmp_path, train_bin):
    """With nvcc but no GPU the quickstart trains with the CPU-only build first; the CUDA build comes after
    (here an nvcc that records when it was called and fails, so nothing CUDA is compiled)."""
    if not (ROOT / ".venv/lib").is_dir():
        pytest.skip("SKIP: no .venv (scripts/setup.sh makes it)")
    root = make_checkout(tmp_path / "checkout")
    # its own build/: the CPU objects copied, none of the CUDA ones, so that the CUDA build calls nvcc
    (root / "build").unlink()
    shutil.copytree(ROOT / "build", root / "build", symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == ROOT / "build"
                                             and n in ("cu", "tests", "bench", "train-cpu")])
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin/nvcc").write_text("#!/bin/sh\n"
                                   f"test -f {root}/runs/quickstart/loss.png && echo trained >> {tmp_path}/nvcc.calls\n"
                                   f"test -f {root}/runs/quickstart/loss.png || echo early >> {tmp_path}/nvcc.calls\n"
                                   "exit 1\n")
    (cuda / "bin/nvcc").chmod(0o755)
    p = subprocess.run(["bash", "scripts/run_quickstart.sh", "training.steps=20", "eval.every=10",
                        "checkpoint.every=10"], cwd=root, capture_output=True, text=True, timeout=900,
                       env=fresh_env(tmp_path, {"CUDA_HOME": str(cuda)}))
    assert p.returncode != 0, "the failing nvcc should fail the CUDA build"
    assert "building the CPU-only build/train-cpu first" in p.stdout
    with h5py.File(root / "runs/quickstart/log.h5", "r") as f:
        assert f.attrs["status"] == "ok" and f["train/step"][-1] == 20
    calls = (tmp_path / "nvcc.calls").read_text().split()
    assert calls and set(calls) == {"trained"}, calls  # every nvcc call came after the plot was written
    assert (root / "build/train-cpu").is_file()
