"""What a new user meets first: arguments never ignored, numbers as written, dry runs anywhere (GPU
configs on a CPU node, data checked, one table per sweep), a terminal fit for piped logs, and outputs that
h5py and pandas users can read (units, elapsed time, tokens, legends naming the swept values)."""
import csv
import math
import os
import pty
import re
import select
import subprocess
import sys

import h5py
import numpy as np
import yaml

from conftest import ROOT, TRAIN, TINY_SYNTH, mpirun_cmd, run_train, tiny_yaml, write_yaml

sys.path.insert(0, str(ROOT / "scripts"))
import h5log  # noqa: E402
import plot_runs  # noqa: E402

SWEEP = "sweep:\n  grid: {training.lr: [1.0e-3, 3.0e-3]}\n"


def sweep_yaml(tmp_path, name="sw", steps=3, extra=""):
    text = TINY_SYNTH.format(name=name, out_dir=tmp_path / "runs", steps=steps, B=4, stage=0, accum=1,
                             ckpt_every=0) + extra + SWEEP
    return write_yaml(tmp_path / f"{name}.yaml", text)


def config_row(stdout, key):
    m = re.search(rf"^\| {re.escape(key)}\s+(\S+)\s*$", stdout, re.M)
    assert m, f"{key} not in the printed config:\n{stdout}"
    return m.group(1)


# -- 1. arguments ------------------------------------------------------------------------------------

def test_bare_key_value_is_an_override(tmp_path, train_bin):
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y, "--dry-run", "training.steps=7", "training.lr=3e-4"], check=True)
    assert config_row(p.stdout, "training.steps") == "7"
    assert config_row(p.stdout, "training.lr") == "0.0003"


def test_stray_arguments_are_errors_naming_them(tmp_path, train_bin):
    y = tiny_yaml(tmp_path)
    for args in (["--yaml", y, "bogus"], ["sample", "--ckpt", tmp_path, "bogus"],
                 ["export", "--ckpt", tmp_path, "--out", tmp_path / "m.bin", "bogus"]):
        p = run_train(args)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "'bogus'" in p.stderr
    assert not (tmp_path / "runs").exists()


def test_override_of_a_swept_key_is_an_error(tmp_path, train_bin):
    y = sweep_yaml(tmp_path)
    for args in (["--set", "training.lr=0.5"], ["training.lr=0.5"]):
        p = run_train(["--yaml", y, "--dry-run", *args])
        assert p.returncode == 1, p.stdout
        assert "the sweep varies training.lr" in p.stderr
    run_train(["--yaml", y, "--dry-run", "--set", "training.steps=2"], check=True)  # an unswept key is fine


# -- 2. numbers ---------------------------------------------------------------------------------------

def test_config_numbers_print_as_the_user_wrote_them(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=2)
    p = run_train(["--yaml", y, "--dry-run", "--set", "training.lr=3e-4"], check=True)
    assert config_row(p.stdout, "training.lr") == "0.0003"
    assert config_row(p.stdout, "training.beta1") == "0.9"
    assert config_row(p.stdout, "training.eps") == "1.0e-08"
    run_train(["--yaml", y, "--set", "training.lr=3e-4"], check=True)
    with h5py.File(tmp_path / "runs/t/log.h5", "r") as f:
        text = f.attrs["config_yaml"]
    assert "lr: 0.0003\n" in text and "beta2: 0.95\n" in text and "0000" not in text.replace("0.0003", "")
    cfg = yaml.safe_load(text)
    assert cfg["training"]["lr"] == 0.0003 and isinstance(cfg["training"]["eps"], float)
    assert cfg["training"]["grad_clip"] == 1.0 and isinstance(cfg["training"]["grad_clip"], float)


def test_summary_csv_numbers_round_trip(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, steps=2)
    run_train(["--yaml", y], check=True)
    with open(tmp_path / "runs/sw/summary.csv") as f:
        rows = list(csv.DictReader(f))
    with h5py.File(tmp_path / "runs/sw/summary.h5", "r") as f:
        pts = f["points"]
        for col in ("final_train_loss", "median_step_ms", "tokens_per_s", "flops_per_token"):
            for i, row in enumerate(rows):
                assert float(row[col]) == pts[col][i], (col, row[col], pts[col][i])  # every digit kept
        assert pts["index"].dtype.kind == "i" and list(pts["index"][()]) == [0, 1]
    assert [r["training.lr"] for r in rows] == ["1.0e-3", "3.0e-3"]  # the values as written


# -- 3. dry runs ----------------------------------------------------------------------------------------

def memory_bytes(stdout, component):
    m = re.search(rf"^\| {component}\s+.*?(\d+) B$", stdout, re.M)
    assert m, stdout
    return int(m.group(1))


def test_dry_run_plans_a_gpu_config_without_a_gpu(tmp_path, train_bin):
    base = "model: {preset: d48}\ndata: {synthetic: true}\ntraining: {micro_batch: 16, seq_len: 1024, device: %s}\n"
    gpu = run_train(["--yaml", write_yaml(tmp_path / "g.yaml", base % "cuda"), "--dry-run"], check=True).stdout
    cpu = run_train(["--yaml", write_yaml(tmp_path / "c.yaml", base % "cpu"), "--dry-run"], check=True).stdout
    assert "cuda (bf16)" in gpu and "cpu (fp32)" in cpu
    # bf16 parameters and gradients, fp32 master weights and moments: what the GPU run's /memory/predicted says
    assert memory_bytes(gpu, "params") * 2 == memory_bytes(cpu, "params")
    assert memory_bytes(gpu, "master") == memory_bytes(cpu, "params")
    auto = run_train(["--yaml", write_yaml(tmp_path / "a.yaml", base % "auto"), "--dry-run"], check=True).stdout
    if "cpu (fp32)" in auto:
        assert "device: auto -> cpu (no CUDA device here)" in auto


def test_dry_run_checks_the_data_files(tmp_path, train_bin):
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y, "--dry-run", "data.synthetic=false", f"data.train={tmp_path}/none_*.bin"])
    assert p.returncode == 1 and "no data files match" in p.stderr and "data.train" in p.stderr
    (tmp_path / "junk.bin").write_bytes(b"\0" * 2048)
    p = run_train(["--yaml", y, "--dry-run", "data.synthetic=false", f"data.train={tmp_path}/junk.bin"])
    assert p.returncode == 1 and "magic number" in p.stderr and "junk.bin" in p.stderr
    hdr = np.zeros(256, np.int32)
    hdr[:3] = [20240520, 1, 600]
    with open(tmp_path / "ok.bin", "wb") as f:
        f.write(hdr.tobytes() + (np.arange(600) % 64).astype(np.uint16).tobytes())
    p = run_train(["--yaml", y, "--dry-run", "data.synthetic=false", f"data.train={tmp_path}/ok.bin"], check=True)
    assert "train data: 1 shard(s), 600 tokens" in p.stdout
    assert not (tmp_path / "runs").exists()


def test_dry_run_of_a_sweep_is_one_table(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, extra="")
    p = run_train(["--yaml", y, "--dry-run", "--set", "training.memory_limit_gb=0.0005"], check=True)
    assert "+-- config" not in p.stdout  # no whole config per point
    rows = [l for l in p.stdout.splitlines() if re.match(r"^\d+\s+p\d{3}\s", l)]
    assert len(rows) == 2, p.stdout
    for i, row in enumerate(rows):
        cols = row.split()
        assert cols[:3] == [str(i), f"p{i:03d}", "2x32"] and "NO" in cols  # 512 KiB is too little
    assert "training.lr=3.0e-3" in rows[1]
    p = run_train(["--yaml", y, "--dry-run"], check=True)
    assert all(" n/a " in l for l in p.stdout.splitlines() if re.match(r"^\d+\s+p\d{3}\s", l))
    p = run_train(["--yaml", y, "--dry-run", "--index", "1"], check=True)  # one point: its whole plan
    assert "+-- config" in p.stdout and config_row(p.stdout, "training.lr") == "0.003"


# -- 4. terminal ------------------------------------------------------------------------------------------

def test_no_progress_bar_in_mpirun_output(tmp_path, train_bin):
    # mpirun hands every rank a pseudo-terminal even when its own output is a pipe
    y = tiny_yaml(tmp_path, steps=3)
    cmd = mpirun_cmd(2) + [str(TRAIN), "--yaml", str(y), "--set", "log.progress=true"]
    p = subprocess.run(cmd, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert b"\r" not in p.stdout and b"step      3/3" in p.stdout


def test_progress_bar_on_an_interactive_terminal(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=3)
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(str(TRAIN), [str(TRAIN), "--yaml", str(y), "--set", "log.progress=true"])
    out = b""
    while True:
        r, _, _ = select.select([fd], [], [], 120)
        if not r:
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert b"\r[" in out and b"ETA" in out


def test_step_lines_and_the_run_summary(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, steps=4, ckpt_every=2)
    out = run_train(["--yaml", y, "eval.every=2"], check=True).stdout
    step = [l for l in out.splitlines() if l.startswith("step      4/4")][0]
    assert re.search(r"\| \dm\d\ds \| mem [\d.]+ (MiB|GiB|KiB)", step), step
    assert re.search(r"^run ok: 4 step\(s\) in \dm\d\ds, \d+ tokens/s, best val loss \d\.\d{4}$", out, re.M), out
    assert f"log: {tmp_path}/runs/t/log.h5" in out
    assert f"last checkpoint: {tmp_path}/runs/t/checkpoints/step_00000004" in out


def test_a_sweep_ends_with_one_line_per_point(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, steps=2)
    out = run_train(["--yaml", y], check=True).stdout
    tail = out[out.index("sweep: 2 of 2 point(s) ok"):].splitlines()[1:]
    assert len(tail) == 2 and tail[0].startswith("  p000 training.lr=1.0e-3: ok, 2 steps in")
    assert "tokens/s" in tail[1] and "training.lr=3.0e-3" in tail[1]


# -- 6. outputs for h5py and pandas --------------------------------------------------------------------------

def datasets(f):
    out = []
    f.visititems(lambda name, obj: out.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_every_dataset_has_units_and_train_has_time_and_tokens(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, steps=4)
    run_train(["--yaml", y, "checkpoint.every=4"], check=True)
    sw = tmp_path / "runs/sw"
    for path in [sw / "summary.h5", sw / "p000/log.h5", sw / "p000/checkpoints/step_00000004/rank_00000.h5"]:
        with h5py.File(path, "r") as f:
            for name, ds in datasets(f):
                assert isinstance(ds.attrs.get("units"), str), f"{path}:{name} has no units"
    with h5py.File(sw / "p000/log.h5", "r") as f:
        tr = f["train"]
        assert tr["elapsed_s"].attrs["units"] == "s" and tr["tokens"].attrs["units"] == "tokens"
        elapsed = tr["elapsed_s"][()]
        assert len(elapsed) == 4 and np.all(np.diff(elapsed) > 0) and elapsed[0] > 0
        assert list(tr["tokens"][()]) == [s * f.attrs["tokens_per_step"] for s in tr["step"][()]]
        assert isinstance(f.attrs["config_yaml"], str) and isinstance(f.attrs["status"], str)
    with h5py.File(sw / "p000/checkpoints/step_00000004/rank_00000.h5", "r") as f:
        assert f.attrs["format_version"] == 4  # XXH3-64 hashes in the MANIFEST; int8 state as codes and scales
    log = h5log.read_log(sw / "p000")
    assert len(log["train"]["elapsed_s"]) == 4 and len(log["train"]["tokens"]) == 4
    rows = h5log.read_summary(sw)["rows"]
    assert all(isinstance(r["status"], str) and isinstance(r["dir"], str) for r in rows)


def test_plot_legends_name_the_swept_values(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, steps=2)
    run_train(["--yaml", y], check=True)
    logs = [h5log.read_log(tmp_path / f"runs/sw/p00{i}") for i in (0, 1)]
    assert [plot_runs.run_label(log, "x") for log in logs] == ["lr=1.0e-3", "lr=3.0e-3"]
    p = subprocess.run([sys.executable, ROOT / "scripts/plot_runs.py", tmp_path / "runs/sw/p000",
                        tmp_path / "runs/sw/p001", "-o", tmp_path / "loss.png"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
