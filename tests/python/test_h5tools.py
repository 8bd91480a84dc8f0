"""h5log, summarize, plot_sweep, plot_runs and plot_scaling against synthetic files written per
docs/FORMATS.md."""
import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
import h5log  # noqa: E402

COMPONENTS = ["params", "grads", "master", "adam_m", "adam_v", "activations", "workspace", "comm", "snapshot"]
VARIED = ["training.zero_stage", "training.micro_batch"]
SUMMARY_COLUMNS = (
    ["index", "dir"] + VARIED
    + ["status", "message", "device", "world_size", "n_params", "flops_per_token", "median_step_ms",
       "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "final_train_loss", "final_val_loss", "micro_batch",
       "startup_s"]
    + ["pred_" + c for c in COMPONENTS + ["total"]]
    + ["meas_" + c for c in COMPONENTS + ["total"]]
    + ["meas_peak", "meas_baseline"]
)
N_PARAMS = 124_439_808
STARTUP_S = 2.5  # the logs' startup_s
SEQ = 1024
PEAK = 989.5e12
FLOPS_PER_TOKEN = 6 * N_PARAMS + 6 * 12 * 768 * SEQ
GIB = 1 << 30

# One dict per sweep point. step_ms[0] is the slow first step, left out of the median.
POINTS = [
    dict(index=0, zero=0, mb=8, world=1, status="ok", message="",
         step_ms=[900.0, 100.0, 104.0, 96.0, 101.0, 99.0], evals=[(0, 10.9), (5, 6.5)]),
    dict(index=1, zero=1, mb=8, world=2, status="ok", message="",
         step_ms=[1500.0, 160.0, 161.0, 159.0, 160.0, 158.0], evals=[(0, 10.9), (5, 6.1)]),
    dict(index=2, zero=2, mb=16, world=2, status="oom", message="out of memory: cudaMalloc of 2.00 GiB failed",
         step_ms=[], evals=[]),
    dict(index=3, zero=3, mb=8, world=2, status="failed", message="loss is NaN at step 2",
         step_ms=[1400.0, 170.0, 175.0], evals=[]),
]
RUNNING = dict(index=4, zero=1, mb=4, world=2, status="running", message="",
               step_ms=[1200.0, 90.0, 91.0], evals=[(0, 10.95)])


def predicted(p):
    per = {"params": 250_000_000, "grads": 250_000_000, "master": 500_000_000, "adam_m": 500_000_000,
           "adam_v": 500_000_000, "activations": 3_000_000_000 * p["mb"] // 8, "workspace": 100_000_000,
           "comm": 0 if p["world"] == 1 else 200_000_000, "snapshot": 0}
    shard = max(1, p["world"]) if p["zero"] >= 1 else 1
    for k in ("master", "adam_m", "adam_v"):
        per[k] //= shard
    per["total"] = sum(per.values())
    return per


def measured_peak(p):
    return None if p["status"] == "oom" else int(predicted(p)["total"] * 1.05)


def losses(p):
    n = len(p["step_ms"])
    out = list(10.9 - 0.8 * np.arange(n))
    if p["status"] == "failed" and n:
        out[-1] = float("nan")
    return out


def expected_row(p):
    """The summary row for a point, computed here without h5log."""
    tokens_per_step = p["mb"] * SEQ * p["world"]
    ms = float(np.median(p["step_ms"][1:])) if len(p["step_ms"]) > 1 else math.nan
    tps = tokens_per_step / (ms / 1000.0) if ms == ms else math.nan
    pred = predicted(p)
    peak = measured_peak(p)
    row = {
        "index": p["index"], "dir": f"p{p['index']:03d}",
        "training.zero_stage": str(p["zero"]), "training.micro_batch": str(p["mb"]),
        "status": p["status"], "message": p["message"], "device": "cuda", "world_size": p["world"],
        "n_params": N_PARAMS,
        "flops_per_token": float(FLOPS_PER_TOKEN), "median_step_ms": ms, "tokens_per_s": tps,
        "tokens_per_s_per_gpu": tps / p["world"], "mfu": FLOPS_PER_TOKEN * tps / p["world"] / PEAK,
        "final_train_loss": losses(p)[-1] if p["step_ms"] else math.nan,
        "final_val_loss": p["evals"][-1][1] if p["evals"] else math.nan,
        "micro_batch": p["mb"],
        "startup_s": STARTUP_S,
    }
    for c in COMPONENTS + ["total"]:
        row["pred_" + c] = float(pred[c])
        row["meas_" + c] = math.nan
    row["meas_peak"] = float(peak) if peak is not None else math.nan
    row["meas_baseline"] = math.nan
    return row


def config_yaml(p):
    return (f"run:\n  name: p{p['index']:03d}\n  out_dir: runs\nmodel:\n  preset: d12\n"
            f"training:\n  micro_batch: {p['mb']}\n  seq_len: {SEQ}\n  grad_accum: 1\n"
            f"  zero_stage: {p['zero']}\n")


def _extendible(group, name, values, dtype):
    group.create_dataset(name, data=np.asarray(values, dtype=dtype), maxshape=(None,), chunks=(64,))


def fill_log(f, p, n_rows=None):
    """Write a log.h5 per docs/FORMATS.md into the open file f (first n_rows train rows)."""
    n = len(p["step_ms"]) if n_rows is None else n_rows
    a = f.attrs
    a["name"] = f"sweep/p{p['index']:03d}"
    a["config_yaml"] = config_yaml(p)
    a["n_params"] = np.int64(N_PARAMS)
    a["flops_per_token"] = np.float64(FLOPS_PER_TOKEN)
    a["tokens_per_step"] = np.int64(p["mb"] * SEQ * p["world"])
    a["world_size"] = np.int64(p["world"])
    a["zero_stage"] = np.int64(p["zero"])
    a["device"] = "cuda"
    a["hardware"] = f"NVIDIA H200 x{p['world']}"
    a["peak_flops"] = np.float64(PEAK)
    a["startup_s"] = np.float64(STARTUP_S)
    a["git_rev"] = "0123abc"
    a["status"] = p["status"]
    a["message"] = p["message"]
    a["point_index"] = np.int64(p["index"])
    a["point_values"] = f"training.zero_stage={p['zero']}\ntraining.micro_batch={p['mb']}\n"
    train = f.create_group("train")
    steps = np.arange(n)
    _extendible(train, "step", steps, np.int64)
    _extendible(train, "loss", losses(p)[:n], np.float64)
    _extendible(train, "lr", np.full(n, 6e-4), np.float64)
    _extendible(train, "grad_norm", np.full(n, 1.5), np.float64)
    _extendible(train, "step_ms", p["step_ms"][:n], np.float64)
    tps = [p["mb"] * SEQ * p["world"] / (ms / 1000.0) for ms in p["step_ms"][:n]]
    _extendible(train, "tokens_per_s", tps, np.float64)
    _extendible(train, "mfu", [FLOPS_PER_TOKEN * t / p["world"] / PEAK for t in tps], np.float64)
    ev = f.create_group("eval")
    _extendible(ev, "step", [s for s, _ in p["evals"]], np.int64)
    _extendible(ev, "val_loss", [v for _, v in p["evals"]], np.float64)
    pred = f.create_group("memory/predicted")
    for k, v in predicted(p).items():
        pred.attrs[k] = np.int64(v)
    meas = f.create_group("memory/measured")
    if measured_peak(p) is not None:
        meas.attrs["peak"] = np.int64(measured_peak(p))


def append_rows(f, p, start, count):
    """Append train rows start..start+count-1 of point p, as the trainer does (one dataset at a time)."""
    train = f["train"]
    end = start + count
    tps = [p["mb"] * SEQ * p["world"] / (ms / 1000.0) for ms in p["step_ms"][start:end]]
    cols = {"step": np.arange(start, end), "loss": losses(p)[start:end], "lr": np.full(count, 6e-4),
            "grad_norm": np.full(count, 1.5), "step_ms": p["step_ms"][start:end], "tokens_per_s": tps,
            "mfu": [FLOPS_PER_TOKEN * t / p["world"] / PEAK for t in tps]}
    for name, values in cols.items():
        ds = train[name]
        ds.resize((end,))
        ds[start:end] = values
        ds.flush()


def write_log(path, p):
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w", libver="latest") as f:
        fill_log(f, p)


def missing_row(index):
    """The summary row of a point that has not run: text columns set, numbers NaN."""
    row = {c: math.nan for c in SUMMARY_COLUMNS}
    row.update({"index": index, "dir": f"p{index:03d}", "training.zero_stage": "1", "training.micro_batch": "32",
                "status": "missing", "message": "no log.h5 (point not run yet)", "device": ""})
    return row


def write_summary(sweep, points, n_missing=0):
    """summary.h5 and summary.csv per docs/FORMATS.md from the expected rows."""
    rows = [expected_row(p) for p in points]
    rows += [missing_row(len(points) + i) for i in range(n_missing)]
    # As the trainer writes it: index, dir, varied keys, status, message as text; the rest float64.
    with h5py.File(sweep / "summary.h5", "w") as f:
        f.attrs["config_yaml"] = "name: sweep\nsweep:\n  training.zero_stage: [0, 1, 2, 3]\n"
        f.attrs["varied_keys"] = "".join(k + "\n" for k in VARIED)
        g = f.create_group("points")
        for c in SUMMARY_COLUMNS:
            values = [r[c] for r in rows]
            if c in ["index", "dir", *VARIED, "status", "message", "device"]:
                g.create_dataset(c, data=[str(v) for v in values], dtype=h5py.string_dtype())
            else:
                g.create_dataset(c, data=np.asarray(values, dtype=np.float64))
    with open(sweep / "summary.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(SUMMARY_COLUMNS)
        for r in rows:
            w.writerow(["" if isinstance(r[c], float) and math.isnan(r[c]) else r[c] for c in SUMMARY_COLUMNS])


def swmr_writer_main(path, n0):
    """Subprocess body: keep RUNNING's log open in SWMR mode, append rows on request."""
    f = h5py.File(path, "w", libver="latest")
    fill_log(f, RUNNING, n_rows=n0)
    f.swmr_mode = True
    f.flush()
    print("ready", flush=True)
    n = n0
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "append":
            k = int(cmd[1])
            append_rows(f, RUNNING, n, k)
            n += k
            f.flush()
            print("ok", flush=True)
        else:
            break
    f.close()


class LiveWriter:
    def __init__(self, path, n0):
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import test_h5tools as t; t.swmr_writer_main({str(path)!r}, {n0})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._expect("ready")

    def _expect(self, word):
        line = self.proc.stdout.readline().strip()
        if line != word:
            self.proc.kill()
            raise AssertionError(f"SWMR writer said {line!r}, expected {word!r}; "
                                 f"stderr: {self.proc.stderr.read()}")

    def append(self, k):
        self.proc.stdin.write(f"append {k}\n")
        self.proc.stdin.flush()
        self._expect("ok")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("close\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def finished_sweep(tmp_path):
    """p000..p003 (ok, ok, oom, failed) with summary.h5 and summary.csv."""
    sweep = tmp_path / "sweep"
    for p in POINTS:
        write_log(sweep / f"p{p['index']:03d}" / "log.h5", p)
    write_summary(sweep, POINTS)
    return sweep


@pytest.fixture
def running_sweep(tmp_path):
    """No summary.h5 yet; p004 is being written in SWMR mode by another process; p005 not started."""
    sweep = tmp_path / "live"
    for p in POINTS:
        write_log(sweep / f"p{p['index']:03d}" / "log.h5", p)
    (sweep / "p004").mkdir()
    (sweep / "p005").mkdir()
    writer = LiveWriter(sweep / "p004" / "log.h5", 1)
    yield sweep, writer
    writer.close()


def run_script(name, *args):
    return subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "MPLBACKEND": "Agg"})


def assert_close(got, want, what):
    if isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), f"{what}: got {got!r}, want NaN"
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-9), f"{what}: got {got!r}, want {want!r}"
    else:
        assert got == want, f"{what}: got {got!r}, want {want!r}"


def png_shape(path):
    import matplotlib.image
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    img = matplotlib.image.imread(str(path))
    assert img.shape[:2] == (height, width)
    assert img[..., :3].std() > 0.01, f"{path} looks blank"
    return width, height


# ---- h5log ----------------------------------------------------------------------------------------

def test_read_log_ok(finished_sweep):
    p = POINTS[0]
    log = h5log.read_log(finished_sweep / "p000")
    a = log["attrs"]
    assert a["name"] == "sweep/p000"
    assert a["status"] == "ok" and a["message"] == ""
    assert a["n_params"] == N_PARAMS and isinstance(a["n_params"], int)
    assert a["flops_per_token"] == FLOPS_PER_TOKEN
    assert a["tokens_per_step"] == 8 * SEQ
    assert a["hardware"] == "NVIDIA H200 x1"
    assert h5log.parse_point_values(a["point_values"]) == {"training.zero_stage": "0",
                                                           "training.micro_batch": "8"}
    assert log["train"]["step"].tolist() == list(range(6))
    assert log["train"]["step_ms"].tolist() == p["step_ms"]
    assert log["train"]["loss"].tolist() == pytest.approx(losses(p))
    assert log["eval"]["val_loss"].tolist() == [10.9, 6.5]
    assert log["memory"]["predicted"] == predicted(p)
    assert log["memory"]["measured"] == {"peak": measured_peak(p)}


def test_read_log_oom_has_empty_series(finished_sweep):
    log = h5log.read_log(finished_sweep / "p002" / "log.h5")
    assert log["attrs"]["status"] == "oom"
    assert "cudaMalloc" in log["attrs"]["message"]
    for name in h5log.TRAIN_FIELDS:
        assert len(log["train"][name]) == 0
    assert log["memory"]["measured"] == {}


def test_read_log_errors_name_the_file(tmp_path):
    with pytest.raises(h5log.LogError, match="nothere"):
        h5log.read_log(tmp_path / "nothere")
    junk = tmp_path / "junk" / "log.h5"
    junk.parent.mkdir()
    junk.write_bytes(b"not hdf5 at all")
    with pytest.raises(h5log.LogError, match="junk"):
        h5log.read_log(junk)


def test_read_log_while_being_written(running_sweep):
    sweep, writer = running_sweep
    log = h5log.read_log(sweep / "p004")
    assert log["attrs"]["status"] == "running"
    assert log["train"]["step"].tolist() == [0]
    writer.append(2)
    log = h5log.read_log(sweep / "p004")
    assert log["train"]["step"].tolist() == [0, 1, 2]
    assert log["train"]["step_ms"].tolist() == RUNNING["step_ms"]
    assert log["eval"]["val_loss"].tolist() == [10.95]
    row = h5log.summary_row(log)
    assert row["median_step_ms"] == pytest.approx(90.5)
    assert row["tokens_per_s"] == pytest.approx(4 * SEQ * 2 / 0.0905)


def test_summary_from_h5(finished_sweep):
    s = h5log.read_summary(finished_sweep)
    assert s["source"].endswith("summary.h5")
    assert s["columns"] == SUMMARY_COLUMNS
    assert s["varied"] == VARIED
    assert "sweep:" in s["config_yaml"]
    assert len(s["rows"]) == len(POINTS)
    for p, row in zip(POINTS, s["rows"]):
        want = expected_row(p)
        for c in SUMMARY_COLUMNS:
            assert_close(row[c], want[c], f"point {p['index']} column {c}")


def test_summary_h5_with_points_not_run(tmp_path):
    sweep = tmp_path / "partial"
    for p in POINTS[:2]:
        write_log(sweep / f"p{p['index']:03d}" / "log.h5", p)
    write_summary(sweep, POINTS[:2], n_missing=2)
    s = h5log.read_summary(sweep)
    assert [r["index"] for r in s["rows"]] == [0, 1, 2, 3]
    for row in s["rows"][2:]:
        assert row["status"] == "missing"
        for c in ("world_size", "n_params", "micro_batch", "tokens_per_s", "meas_peak"):
            assert math.isnan(row[c]), (c, row[c])
    assert s["rows"][1]["world_size"] == 2 and isinstance(s["rows"][1]["world_size"], int)
    r = run_script("summarize.py", sweep, "--markdown")
    assert r.returncode == 0, r.stderr
    assert "| 3 | 1 | 32 | missing | - |" in r.stdout
    r = run_script("plot_sweep.py", sweep, "-o", tmp_path / "plots")
    assert r.returncode == 0, r.stderr
    png_shape(tmp_path / "plots" / "memory.png")
    png_shape(tmp_path / "plots" / "frontier.png")
    # points not run have neither a measured nor a predicted memory: named, not placed
    drawn = load_script("plot_sweep").plot_frontier(s, sweep, tmp_path / "f.png")
    assert [(d[0], d[3], d[4]) for d in drawn["points"]] == [("Z0 mb8", "ok", "frontier"), ("Z1 mb8", "ok", "frontier"),
                                                             ("Z1 mb32", "missing", ""), ("Z1 mb32", "missing", "")]


def test_summary_from_logs_matches_summary_h5(finished_sweep):
    s = h5log.read_summary(finished_sweep, source="logs")
    assert s["columns"] == SUMMARY_COLUMNS
    assert [r["index"] for r in s["rows"]] == [0, 1, 2, 3]
    for p, row in zip(POINTS, s["rows"]):
        want = expected_row(p)
        for c in SUMMARY_COLUMNS:
            assert_close(row[c], want[c], f"point {p['index']} column {c}")


def test_summary_of_running_sweep(running_sweep):
    sweep, writer = running_sweep
    writer.append(2)
    s = h5log.read_summary(sweep)
    assert not (sweep / "summary.h5").exists()
    by_index = {r["index"]: r for r in s["rows"]}
    assert sorted(by_index) == [0, 1, 2, 3, 4, 5]
    assert by_index[2]["status"] == "oom"
    assert by_index[3]["status"] == "failed" and math.isnan(by_index[3]["final_train_loss"])
    assert by_index[4]["status"] == "running"
    assert by_index[4]["median_step_ms"] == pytest.approx(90.5)
    assert by_index[4]["training.micro_batch"] == "4"
    assert by_index[5]["status"] == "missing"
    assert math.isnan(by_index[5]["tokens_per_s"])


def test_summary_errors(tmp_path):
    with pytest.raises(h5log.LogError, match="no such folder"):
        h5log.read_summary(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(h5log.LogError, match="pNNN"):
        h5log.read_summary(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    with h5py.File(bad / "summary.h5", "w") as f:
        f.create_dataset("points/index", data=np.arange(2))
    with pytest.raises(h5log.LogError, match="points/status"):
        h5log.read_summary(bad)


# ---- summarize ------------------------------------------------------------------------------------

def test_summarize_markdown(finished_sweep):
    r = run_script("summarize.py", finished_sweep, "--markdown")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["index", *VARIED, "status", "GPUs", "tokens/s", "tokens/s/GPU", "MFU %", "median ms",
                      "pred GiB", "meas GiB", "train loss", "val loss"]
    assert set(lines[1].replace("|", "").split()) <= {"---:", ":---"}
    rows = {}
    for line in lines[2:]:
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[int(cells[0])] = dict(zip(header, cells))
    assert sorted(rows) == [0, 1, 2, 3]
    want0 = expected_row(POINTS[0])
    assert rows[0]["tokens/s"] == "81,920"
    assert rows[0]["MFU %"] == f"{100 * want0['mfu']:.1f}"
    assert rows[0]["median ms"] == "100.0"
    assert predicted(POINTS[0])["total"] == 5_100_000_000
    assert rows[0]["pred GiB"] == "4.75"
    assert rows[0]["val loss"] == "6.5000"
    assert rows[1]["tokens/s"] == "102,400" and rows[1]["tokens/s/GPU"] == "51,200" and rows[1]["GPUs"] == "2"
    assert rows[2]["status"] == "oom" and rows[2]["tokens/s"] == "-" and rows[2]["meas GiB"] == "-"
    assert rows[3]["status"] == "failed" and rows[3]["train loss"] == "-"
    assert rows[1]["training.zero_stage"] == "1"
    assert any("cudaMalloc" in line for line in lines), "oom message not listed"


def test_summarize_terminal_running_sweep(running_sweep):
    sweep, writer = running_sweep
    r = run_script("summarize.py", sweep)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header_i = next(i for i, line in enumerate(lines) if line.startswith("index"))
    table = lines[header_i:header_i + 2 + 6]
    widths = [len(x) for x in table[1].split("  ")]
    assert len(widths) == 1 + len(VARIED) + 10  # + GPUs
    for line in table[2:]:
        assert line.split()[0] in {"0", "1", "2", "3", "4", "5"}
    body = "\n".join(table)
    for status in ("ok", "oom", "failed", "running", "missing"):
        assert status in body
    assert "loss is NaN at step 2" in r.stdout


def test_summarize_bad_input(tmp_path):
    r = run_script("summarize.py", tmp_path / "nope")
    assert r.returncode == 1
    assert "nope" in r.stderr and "error" in r.stderr


# ---- plots ----------------------------------------------------------------------------------------

def load_script(name):
    import importlib
    return importlib.import_module(name)


def test_plot_sweep_finished(finished_sweep, tmp_path):
    out = tmp_path / "plots"
    r = run_script("plot_sweep.py", finished_sweep, "-o", out)
    assert r.returncode == 0, r.stderr
    for name in ("throughput.png", "memory.png", "loss.png"):
        assert (out / name).stat().st_size > 0
        w, h = png_shape(out / name)
        assert w > 0 and h > 0
    plot_sweep = load_script("plot_sweep")
    drawn = plot_sweep.plot_throughput(h5log.read_summary(finished_sweep), tmp_path / "t.png")
    # coloured by zero_stage, grouped by micro_batch (the other varied key); per-GPU tokens/s, so the
    # 2-GPU point's bar is half its total; the oom point has no bar
    assert drawn["ylabel"] == "tokens/s per GPU"
    bars = dict(drawn["panels"])
    assert set(bars) == {"micro_batch=8, 124M params", "micro_batch=16, 124M params"}
    mb8 = {label.split("\n")[0]: v for label, v, _ in bars["micro_batch=8, 124M params"]}
    assert list(mb8) == ["ZeRO-0", "ZeRO-1", "ZeRO-3"]
    assert mb8["ZeRO-0"] == pytest.approx(expected_row(POINTS[0])["tokens_per_s_per_gpu"])
    assert mb8["ZeRO-1"] == pytest.approx(8 * SEQ * 2 / 0.160 / 2)
    (label, value, color), = bars["micro_batch=16, 124M params"]
    assert label.startswith("ZeRO-2") and math.isnan(value) and color == "tab:red"
    # world sizes differ (1 and 2): each bar says its GPU count
    assert [lab.split("\n")[1] for lab, _, _ in bars["micro_batch=8, 124M params"]] == ["1 GPU", "2 GPUs", "2 GPUs"]


def test_plot_sweep_running_and_equal_worlds(running_sweep, tmp_path):
    sweep, writer = running_sweep
    writer.append(1)
    r = run_script("plot_sweep.py", sweep)
    assert r.returncode == 0, r.stderr
    for name in ("throughput.png", "memory.png", "loss.png"):
        png_shape(sweep / name)


# A ZeRO sweep as experiments/zero.yaml makes it: grid zero_stage x zip (model, micro_batch), so the two
# model sizes alternate in point order. Memory components are the log's own (`components` attribute).
def write_zero_sweep(sweep, device="cuda", components=("params", "grads", "master", "optimizer", "activations"),
                     world=2, identical=True, legacy=False):
    sizes = [("d12", 64, 124_439_808), ("d48", 16, 1_557_611_200)]
    index = 0
    for stage in range(4):
        for preset, mb, n in sizes:
            path = sweep / f"p{index:03d}" / "log.h5"
            path.parent.mkdir(parents=True)
            with h5py.File(path, "w") as f:
                a = f.attrs
                a.update({"name": f"zero/p{index:03d}", "device": device, "world_size": np.int64(world),
                          "n_params": np.int64(n), "tokens_per_step": np.int64(mb * SEQ * world),
                          "flops_per_token": 6.0 * n, "peak_flops": PEAK if device == "cuda" else 0.0,
                          "status": "ok", "message": "", "point_index": np.int64(index),
                          "point_values": f"training.zero_stage={stage}\nmodel.preset={preset}\n"
                                          f"training.micro_batch={mb}\n",
                          "config_yaml": f"training:\n  micro_batch: {mb}\n  seq_len: {SEQ}\n"})
                # tokens/s per rank: 100k * (stage + 1) for d12, 10k * (stage + 1) for d48
                per_rank = (100_000 if preset == "d12" else 10_000) * (stage + 1)
                steps = np.arange(1, 11)
                loss = (10.0 if preset == "d12" else 9.0) - 0.2 * steps
                if not identical and stage == 3:
                    loss = loss + 0.5  # a stage whose curve differs visibly
                _extendible(f.require_group("train"), "step", steps, np.int64)
                _extendible(f["train"], "loss", loss, np.float64)
                _extendible(f["train"], "step_ms", np.full(10, mb * SEQ / per_rank * 1000), np.float64)
                ev = f.require_group("eval")
                _extendible(ev, "step", [10], np.int64)
                _extendible(ev, "val_loss", [loss[-1] + 0.1], np.float64)
                scale = 1 << 30 if preset == "d48" else 1 << 28
                pred = {c: (i + 1) * scale // (stage + 1) for i, c in enumerate(components)}
                pred["total"] = sum(pred.values())
                g, m = f.require_group("memory/predicted"), f.require_group("memory/measured")
                for k, v in pred.items():
                    g.attrs[k] = np.int64(v)
                if not legacy:
                    g.attrs["components"] = "".join(c + "\n" for c in components)
                    m.attrs["components"] = g.attrs["components"]
                baseline = 30 << 20 if device == "cpu" else 0
                m.attrs["peak"] = np.int64(baseline + pred["total"] + (5 << 20))
                m.attrs["baseline"] = np.int64(baseline)
            index += 1


def test_zero_sweep_plots_group_by_model_colour_by_stage(tmp_path):
    sweep = tmp_path / "zero"
    write_zero_sweep(sweep)
    plot_sweep = load_script("plot_sweep")
    summary = h5log.read_summary(sweep)
    drawn = plot_sweep.plot_throughput(summary, tmp_path / "t.png")
    assert [title for title, _ in drawn["panels"]] == ["preset=d12, micro_batch=64, 124M params",
                                                       "preset=d48, micro_batch=16, 1.56B params"]
    for (title, bars), per in zip(drawn["panels"], (100_000, 10_000)):
        assert [b[0] for b in bars] == ["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
        assert [b[1] for b in bars] == pytest.approx([per * (s + 1) for s in range(4)])  # per rank, not total
    colours = [[b[2] for b in bars] for _, bars in drawn["panels"]]
    assert colours[0] == colours[1] and len(set(colours[0])) == 4  # one colour per stage, in every panel

    mem = plot_sweep.plot_memory(summary, sweep, tmp_path / "m.png")
    # the log's own components, top to bottom as stacked: no adam_m/adam_v invented
    assert mem["legend"] == ["predicted: activations", "predicted: optimizer", "predicted: master",
                             "predicted: grads", "predicted: params", "measured peak"]
    assert mem["unit"] == "GiB"
    (_, d48), = [p for p in mem["panels"] if p[0].startswith("preset=d48")]
    for stage, (label, pred, meas) in enumerate(d48):
        assert label == f"ZeRO-{stage}"
        assert pred == pytest.approx(15 / (stage + 1), rel=1e-6)  # 1+2+3+4+5 GiB over the stage + 1
        assert meas == pytest.approx(pred + 5 / 1024, rel=1e-6)

    loss = plot_sweep.plot_loss(summary, sweep, tmp_path / "l.png")
    # 8 points, 2 curves: each model size's stages coincide and are drawn once, marked as such
    assert loss == {"preset=d12, micro_batch=64, 124M params": ["ZeRO-0, ZeRO-1, ZeRO-2, ZeRO-3 (4 identical curves)"],
                    "preset=d48, micro_batch=16, 1.56B params": ["ZeRO-0, ZeRO-1, ZeRO-2, ZeRO-3 (4 identical curves)"]}
    for name in ("t.png", "m.png", "l.png"):
        png_shape(tmp_path / name)


def test_zero_sweep_plots_on_cpu_and_from_older_logs(tmp_path):
    sweep = tmp_path / "cpu"
    write_zero_sweep(sweep, device="cpu", world=2, identical=False)
    plot_sweep = load_script("plot_sweep")
    summary = h5log.read_summary(sweep)
    drawn = plot_sweep.plot_throughput(summary, tmp_path / "t.png")
    assert drawn["ylabel"] == "tokens/s per rank"
    mem = plot_sweep.plot_memory(summary, sweep, tmp_path / "m.png")
    # measured: the peak resident set less the 30 MiB the process held before the model, so labelled
    assert mem["legend"][-1] == "measured: peak RSS above baseline"
    assert "baseline" in mem["title"] and "30 MiB" in mem["title"]
    (_, d12), = [p for p in mem["panels"] if p[0].startswith("preset=d12")]
    for stage, (_, pred, meas) in enumerate(d12):
        assert meas == pytest.approx(pred + 5 / 1024, rel=1e-6)  # GiB: 5 MiB above the prediction
    loss = plot_sweep.plot_loss(summary, sweep, tmp_path / "l.png")
    assert loss["preset=d12, micro_batch=64, 124M params"] == ["ZeRO-0, ZeRO-1, ZeRO-2 (3 identical curves)",
                                                              "ZeRO-3"]

    old = tmp_path / "old"  # logs without the components attribute: adam_m and adam_v, as they were written
    write_zero_sweep(old, components=("params", "grads", "master", "adam_m", "adam_v", "activations",
                                      "workspace", "comm", "snapshot"), legacy=True)
    mem = plot_sweep.plot_memory(h5log.read_summary(old), old, tmp_path / "m_old.png")
    assert "predicted: adam_m" in mem["legend"] and "predicted: adam_v" in mem["legend"]
    r = run_script("plot_sweep.py", old)
    assert r.returncode == 0, r.stderr
    r = run_script("summarize.py", sweep)
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("index")).split()
    assert "ranks" in header and "tokens/s/rank" in header and "GPUs" not in header


def test_plot_sweep_bad_input(tmp_path):
    r = run_script("plot_sweep.py", tmp_path / "absent")
    assert r.returncode == 1 and "absent" in r.stderr


# ---- the memory frontier (plot_sweep's frontier.png) ------------------------------------------------

def test_pareto_front_picks_exactly_the_points_no_other_beats():
    plot_sweep = load_script("plot_sweep")
    nan = math.nan
    #          0    1    2    3    4    5    6    7     8    9
    memory = [10., 12., 12., 12., 20., 8.0, 25., nan, 10., 30.]
    speed = [100, 100, 150, 150, 140, 500, 200, 300, 100, nan]
    ok = [True] * 10
    ok[5] = False  # failed: the least memory and the most tokens/s, yet no candidate
    # 1: as fast as 0 in more memory; 4: slower than 2 in more; 7, 9: nothing to place them by.
    # 0 and 8, 2 and 3: alike in both, so neither beats the other: both on it. By memory, ties by index.
    assert plot_sweep.pareto_front(memory, speed, ok) == [0, 8, 2, 3, 6]
    # had the failed point counted, it would have pushed every other point off
    assert plot_sweep.pareto_front(memory, speed) == [5]
    assert plot_sweep.pareto_front([], []) == []
    assert plot_sweep.pareto_front([4.0], [1.0], [False]) == []


def test_frontier_marks_failed_points_at_their_prediction(finished_sweep, tmp_path):
    """ok, ok, oom, failed (finished_sweep): both points that ran are on the frontier (ZeRO-1's shards
    use less memory, ZeRO-0's single GPU is faster per GPU); the oom point and the point whose loss went
    NaN are marked at their predicted totals and stacked beside the frontier's, in order of memory."""
    plot_sweep = load_script("plot_sweep")
    drawn = plot_sweep.plot_frontier(h5log.read_summary(finished_sweep), finished_sweep, tmp_path / "f.png")
    png_shape(tmp_path / "f.png")
    gib = [measured_peak(p) / GIB if measured_peak(p) else predicted(p)["total"] / GIB for p in POINTS]
    assert drawn["points"] == [("Z0 mb8", pytest.approx(gib[0]), pytest.approx(81920.0), "ok", "frontier"),
                               ("Z1 mb8", pytest.approx(gib[1]), pytest.approx(51200.0), "ok", "frontier"),
                               ("Z2 mb16", pytest.approx(predicted(POINTS[2])["total"] / GIB), pytest.approx(math.nan, nan_ok=True), "oom", "predicted"),
                               ("Z3 mb8", pytest.approx(predicted(POINTS[3])["total"] / GIB), pytest.approx(math.nan, nan_ok=True), "failed", "predicted")]
    assert drawn["frontier"] == ["Z1 mb8", "Z0 mb8"]
    assert [b[0] for b in drawn["bars"]] == ["Z3 mb8", "Z1 mb8", "Z0 mb8", "Z2 mb16"]
    bars = {b[0]: b for b in drawn["bars"]}
    assert math.isnan(bars["Z2 mb16"][2])  # out of memory: no measured bar, its status instead
    assert bars["Z3 mb8"][2] == pytest.approx(measured_peak(POINTS[3]) / GIB)  # ran two steps: measured
    assert drawn["cards"] == []  # 4-9 GiB: no 12, 16 or 24 GiB card within
    # the points that ran: 8 sequences of 1024 tokens on 1 GPU and on 2
    assert "global batch 8,192-16,384 tokens (differs between points)" in drawn["title"]


def write_frontier_sweep(sweep):
    """GPT-2 1558M on one GPU over optimizer_state x recompute x micro_batch x master_weights, one global batch
    of 524,288 tokens (gradient accumulation): fp32 master weights and fp32 optimizer state cost memory and
    save a little time, recompute 3 saves activations at 22% of the speed, a larger micro-batch is faster.
    A point predicting more than 75 GiB runs out of memory: fp32 r0 mb16 fp32-master, 75.6 GiB."""
    n, comps = 1_557_611_200, ("params", "grads", "master", "optim", "activations", "workspace")
    grid = [(o, r, mb, mw) for o in ("fp32", "int8") for r in (0, 3) for mb in (4, 16) for mw in ("true", "false")]
    for index, (opt, rc, mb, mw) in enumerate(grid):
        pred = {"params": 2 * n, "grads": 2 * n, "master": 4 * n if mw == "true" else 0,
                "optim": 8 * n if opt == "fp32" else 2 * n, "activations": mb * (3.2 if rc == 0 else 0.45) * GIB,
                "workspace": 1.2 * GIB}
        pred = {k: int(v) for k, v in pred.items()}
        pred["total"] = sum(pred.values())
        oom = pred["total"] > 75 * GIB
        per_s = 9000 * (0.78 if rc else 1.0) * (0.97 if opt == "int8" else 1.0) * (1.08 if mb == 16 else 1.0) \
            * (1.01 if mw == "false" else 1.0)
        path = sweep / f"p{index:03d}" / "log.h5"
        path.parent.mkdir(parents=True)
        with h5py.File(path, "w") as f:
            f.attrs.update({"name": f"frontier/p{index:03d}", "device": "cuda", "world_size": np.int64(1),
                            "n_params": np.int64(n), "tokens_per_step": np.int64(524288), "status": "oom" if oom else "ok",
                            "message": "out of memory" if oom else "", "point_index": np.int64(index),
                            "point_values": f"training.optimizer_state={opt}\ntraining.recompute={rc}\n"
                                            f"training.micro_batch={mb}\ntraining.master_weights={mw}\n",
                            "config_yaml": f"model:\n  preset: d48\ntraining:\n  micro_batch: {mb}\n  seq_len: {SEQ}\n"})
            steps = np.arange(0 if oom else 4)
            _extendible(f.require_group("train"), "step", steps, np.int64)
            _extendible(f["train"], "loss", 10.0 - 0.1 * steps, np.float64)
            _extendible(f["train"], "step_ms", np.full(len(steps), 524288 / per_s * 1000), np.float64)
            g, m = f.require_group("memory/predicted"), f.require_group("memory/measured")
            for k, v in pred.items():
                g.attrs[k] = np.int64(v)
            g.attrs["components"] = m.attrs["components"] = "".join(c + "\n" for c in comps)
            if not oom:
                m.attrs["peak"] = np.int64(pred["total"] * 1.04 + 0.3 * GIB)
            m.attrs["baseline"] = np.int64(0)


def test_frontier_of_a_large_model_over_its_memory_axes(tmp_path):
    sweep = tmp_path / "frontier"
    write_frontier_sweep(sweep)
    plot_sweep = load_script("plot_sweep")
    drawn = plot_sweep.plot_frontier(h5log.read_summary(sweep), sweep, tmp_path / "f.png")
    png_shape(tmp_path / "f.png")
    # fp32 master weights cost memory and time: no point keeping them is on the frontier; of the others,
    # fp32 r3 mb4 (20.4 GiB predicted) is slower than int8 r3 mb16 (17.1 GiB), fp32 r3 mb16 (25.8) than
    # int8 r0 mb4 (22.7), and every other one is the fastest within its memory
    assert drawn["frontier"] == ["int8 r3 mb4 no-master", "int8 r3 mb16 no-master", "int8 r0 mb4 no-master",
                                 "fp32 r0 mb4 no-master", "int8 r0 mb16 no-master", "fp32 r0 mb16 no-master"]
    oom, = [d for d in drawn["points"] if d[3] == "oom"]
    assert oom[0] == "fp32 r0 mb16 fp32-master" and oom[4] == "predicted" and oom[1] == pytest.approx(75.6, abs=0.05)
    assert [b[0] for b in drawn["bars"]] == drawn["frontier"] + ["fp32 r0 mb16 fp32-master"]  # by memory
    assert drawn["cards"] == [12, 16, 24] and drawn["unit"] == "GiB"
    assert drawn["xlabel"] == "measured peak memory per GPU (GiB)"
    assert drawn["title"].startswith("memory frontier of GPT-2 1558M (d48, 1.56B params), global batch 524,288 "
                                     "tokens (1 GPU per point): tokens/s per GPU against peak memory per GPU")
    assert drawn["legend"][:2] == ["predicted: workspace", "predicted: activations"]  # the logs' components


def test_frontier_is_drawn_for_one_model_only(tmp_path):
    """A sweep over model sizes gets throughput, memory and loss plots but no frontier.png: no memory
    budget compares the speeds of two models. It says so, and the others are drawn."""
    sweep = tmp_path / "zero"
    write_zero_sweep(sweep)
    r = run_script("plot_sweep.py", sweep)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(sweep / n) for n in ("throughput.png", "memory.png", "loss.png")]
    assert r.stderr.strip() == ("plot_sweep: no frontier.png: its points train 2 model sizes (124M params, "
                                "1.56B params); a frontier compares ways to train one model")
    assert not (sweep / "frontier.png").exists()
    one = tmp_path / "one"
    write_frontier_sweep(one)
    r = run_script("plot_sweep.py", one)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == str(one / "frontier.png") and r.stderr == ""
    png_shape(one / "frontier.png")


def test_plot_runs(finished_sweep, running_sweep, tmp_path):
    sweep, writer = running_sweep
    out = tmp_path / "runs.png"
    r = run_script("plot_runs.py", finished_sweep / "p000", finished_sweep / "p001" / "log.h5",
                   sweep / "p004", "-o", out)
    assert r.returncode == 0, r.stderr
    w, h = png_shape(out)
    assert (w, h) == (800, 500)
    out2 = tmp_path / "tokens.png"
    r = run_script("plot_runs.py", finished_sweep / "p000", "--tokens", "-o", out2)
    assert r.returncode == 0, r.stderr
    png_shape(out2)
    r = run_script("plot_runs.py", finished_sweep / "p000", tmp_path / "missing_run", "-o", tmp_path / "x.png")
    assert r.returncode == 1 and "missing_run" in r.stderr
    assert not (tmp_path / "x.png").exists()


def test_plot_runs_draws_the_synthetic_corpus_floor(finished_sweep, tmp_path):
    """A run on the synthetic corpus gets the line no model can go below, ln(synthetic_branching) from
    its config; a run on other data gets none."""
    plot_runs = load_script("plot_runs")
    synthetic = tmp_path / "q" / "log.h5"
    p = dict(POINTS[0], index=9)
    write_log(synthetic, p)
    with h5py.File(synthetic, "a") as f:
        f.attrs["config_yaml"] = config_yaml(p) + "data:\n  synthetic: true\n  synthetic_branching: 4\n"
    logs = [h5log.read_log(synthetic), h5log.read_log(finished_sweep / "p001")]
    legend = plot_runs.plot_runs(logs, ["q", "p1"], tmp_path / "q.png")
    floors = [label for label in legend if label.startswith("ln ")]
    assert floors == [f"ln 4 = {math.log(4):.3f}: the lowest loss possible on this corpus"]
    assert "q val (last 6.500)" in legend
    assert not [lab for lab in plot_runs.plot_runs(logs[1:], ["p1"], tmp_path / "p.png") if lab.startswith("ln ")]
    png_shape(tmp_path / "q.png")


# ---- plot_scaling ---------------------------------------------------------------------------------

def test_plot_scaling_efficiency_table_and_plots(tmp_path):
    """The same two points on 1 and 2 GPUs: efficiency = tokens/s per GPU against 1 GPU's."""
    one, two = tmp_path / "s1", tmp_path / "s2"
    one.mkdir()
    two.mkdir()
    base = [POINTS[0], dict(POINTS[0], index=1, zero=1)]  # 100 ms median steps on 1 GPU
    write_summary(one, base)
    # on 2 GPUs: 104 ms and 125 ms per step for the same per-GPU work, and a point that failed
    write_summary(two, [dict(base[0], world=2, step_ms=[900.0] + [104.0] * 5),
                        dict(base[1], world=2, step_ms=[900.0] + [125.0] * 5),
                        dict(POINTS[3], index=2)])
    out = tmp_path / "plots"
    r = run_script("plot_scaling.py", one, two, "-o", out, "--markdown")
    assert r.returncode == 0, r.stderr
    rows = {}
    for line in r.stdout.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = cells
    assert rows[("zero_stage=0 micro_batch=8", "1")][4] == "-"
    assert rows[("zero_stage=0 micro_batch=8", "2")][4] == f"{100 * 100 / 104:.1f}%"
    assert rows[("zero_stage=1 micro_batch=8", "2")][4] == "80.0%"
    assert rows[("zero_stage=0 micro_batch=8", "2")][3] == f"{8 * SEQ / 0.104:,.0f}"
    assert not any(k[0].startswith("zero_stage=3") for k in rows), "a failed point has no throughput to compare"
    for name in ("scaling.png", "scaling_memory.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_scaling_rejects_two_results_for_one_gpu_count(tmp_path):
    s = tmp_path / "s"
    s.mkdir()
    write_summary(s, [POINTS[0]])
    r = run_script("plot_scaling.py", s, s)
    assert r.returncode != 0
    assert "second result" in r.stderr and "1 GPU" in r.stderr


def test_plot_scaling_draws_each_model_against_linear_and_memory_as_memory_png(tmp_path):
    """scaling.png: one throughput panel per model size (total tokens/s against linear scaling);
    scaling_memory.png: the measured peak less the process's baseline on CPUs, as memory.png has it."""
    sweeps = []
    for world in (1, 2):
        sweeps.append(tmp_path / f"cpu_{world}")
        write_zero_sweep(sweeps[-1], device="cpu", world=world)
    plot_scaling = load_script("plot_scaling")
    points, varied = plot_scaling.collect(sweeps)
    drawn = plot_scaling.plot(points, varied, tmp_path / "out")
    assert drawn["throughput_panels"] == ["preset=d12, micro_batch=64", "preset=d48, micro_batch=16"]
    assert drawn["measured"] == "measured peak above the process's baseline"
    mem = load_script("plot_sweep").plot_memory(h5log.read_summary(sweeps[1]), sweeps[1], tmp_path / "m.png")
    (_, d12), = [p for p in mem["panels"] if p[0].startswith("preset=d12")]
    for stage, (_, _, meas) in enumerate(d12):
        row = points[(("training.zero_stage", str(stage)), ("model.preset", "d12"),
                      ("training.micro_batch", "64"))][2]
        assert plot_scaling.measured_gib(row) == pytest.approx(meas, rel=1e-9)  # the same figure in both plots
    for name in ("scaling.png", "scaling_memory.png"):
        png_shape(tmp_path / "out" / name)
