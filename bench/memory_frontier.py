#!/usr/bin/env python3
"""GPT-2 1558M's memory frontier on one GPU, with PyTorch's memory-saving configurations in the same call.

    python3 bench/memory_frontier.py --out DIR [--indices 0-53] [--limits 12,16,24] [--fit-precisions fp8,bf16]
                                     [--small] [--torch [--torch-runs 0,1,2]] [--steps N] [--set KEY=VALUE]...

Runs, each point as its own process (a point that runs out of memory costs only itself):
  frontier   the points of experiments/memory_frontier.yaml given by --indices (all 54 by default), then
             its summary (DIR/runs/memory_frontier/summary.csv) and plot (frontier.png beside it)
  fit        for each --limits L and --fit-precisions P: the same model and global batch with
             training.memory_fit: auto and training.memory_limit_gb: L (the trainer picks state type, master
             weights, recompute and micro-batch), under DIR/runs/fit_<P>_<L>
  small      (--small) GPT-2 124M with memory_fit: auto in 4 GiB, the same global batch
  torch      (--torch) bench/pytorch_gpt2.py on the same model and global batch: fused AdamW (fp32 weights,
             the unconstrained baseline), bitsandbytes AdamW8bit with per-block checkpointing, and the
             same with bf16 weights (no fp32 master), each as it runs best at micro-batch 16
Memory per run: the trainer's measured peak (its device allocations; PyTorch: max_memory_allocated) and
the GPU's used memory above idle while the run goes on (nvidia-smi every 100 ms: the whole process, CUDA
context and libraries included).
Writes DIR/results.json (after every run, so a run cut short keeps what finished; one object per run: mode, predicted and measured peak bytes per rank, median
step ms, tokens/s, ratios) and DIR/table.md, whose ratios are against two runs of this invocation: the
trainer's bf16 point with fp32 state and master, no recompute, micro-batch 16 (the unconstrained run;
frontier index 6) and PyTorch's bitsandbytes + checkpointing + bf16 weights (with --torch).
"""
import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import project_env  # noqa: E402

project_env.need("h5py", "numpy", "yaml")
import yaml  # noqa: E402

import h5log  # noqa: E402

EXPERIMENT = ROOT / "experiments" / "memory_frontier.yaml"
GIB = float(1 << 30)
UNCONSTRAINED = 6  # frontier index: bf16, recompute 0, micro-batch 16, fp32 state and master
TORCH_RUNS = [  # name, extra arguments of bench/pytorch_gpt2.py
    ("pytorch fused AdamW", []),
    ("pytorch bnb AdamW8bit + block checkpointing", ["--optimizer", "bnb-adamw8bit", "--checkpoint-blocks"]),
    ("pytorch bnb AdamW8bit + block checkpointing + bf16 weights",
     ["--optimizer", "bnb-adamw8bit", "--checkpoint-blocks", "--bf16-weights"]),
]
ANCHOR = TORCH_RUNS[2][0]


def indices(text, n):
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    bad = [i for i in out if not 0 <= i < n]
    if bad:
        raise SystemExit(f"memory_frontier: error: --indices {bad} outside 0-{n - 1}")
    return out


class DeviceMemory:
    """The GPU's used memory while a run goes on (nvidia-smi every 100 ms): its peak less the used memory
    before the run, i.e. everything the run's process held on the device (CUDA context and libraries
    included), the figure a card's capacity must cover. None without nvidia-smi."""

    def __init__(self):
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.idle = self._now()
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                          "-lms", "100", "-i", "0"], stdout=subprocess.PIPE, text=True)

    @staticmethod
    def _now():
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True).stdout.split()
        return float(out[0]) if out else math.nan

    def stop(self):
        """Peak bytes above idle, or None."""
        if not self.proc:
            return None
        self.proc.terminate()
        text = self.proc.communicate()[0]
        used = [float(x) for x in text.split() if x.replace(".", "", 1).isdigit()]
        return (max(used) - self.idle) * float(1 << 20) if used else None


def run(cmd, log, timeout, watch=None):
    """Runs cmd with its output in log; returns the exit status (124: timed out). watch: a dict that gets
    'device_used_peak' (DeviceMemory's figure) when given."""
    mem = DeviceMemory() if watch is not None else None
    with open(log, "w") as f:
        try:
            rc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    if mem is not None:
        watch["device_used_peak"] = mem.stop()
    return rc


def trainer_row(mode, run_dir, rc):
    """The run's figures from its log.h5: the resolved choices, memory and speed."""
    row = {"mode": mode, "impl": "train", "exit": rc}
    try:
        log = h5log.read_log(run_dir)
    except (h5log.LogError, FileNotFoundError, OSError) as e:
        row["status"] = f"no log ({e})"
        return row
    s = h5log.summary_row(log)
    cfg = yaml.safe_load(log["attrs"].get("config_yaml", "")) or {}
    t = cfg.get("training", {})
    row.update(status=s["status"], median_step_ms=s["median_step_ms"], tokens_per_s=s["tokens_per_s"],
               pred_bytes=s.get("pred_total"), peak_bytes=s.get("meas_peak"),
               choice={k: t.get(k) for k in ("precision", "optimizer_state", "master_weights", "offload",
                                             "recompute", "micro_batch", "grad_accum")})
    # the accumulation a step runs: total_batch_tokens, where given, decides it (the key keeps its 1)
    if t.get("total_batch_tokens") and t.get("micro_batch") and t.get("seq_len"):
        row["choice"]["grad_accum"] = int(t["total_batch_tokens"]) // (int(t["micro_batch"]) * int(t["seq_len"]) *
                                                                     int(log["attrs"].get("world_size", 1)))
    return row


def torch_row(mode, args, out, steps, warmup):
    js = out / f"torch_{len(list(out.glob('torch_*.json')))}.json"
    cmd = [sys.executable, ROOT / "bench" / "pytorch_gpt2.py", "--preset", "d48", "--micro-batch", "16",
           "--steps", steps, "--warmup", warmup, "--json", js] + args
    w = {}
    rc = run(cmd, js.with_suffix(".log"), 900, w)
    row = {"mode": mode, "impl": "pytorch", "exit": rc, **w}
    if js.exists():
        r = json.loads(js.read_text())
        row.update(status=r.get("status", "ok"), median_step_ms=r.get("median_step_ms"),
                   tokens_per_s=r.get("tokens_per_s"), peak_bytes=r.get("peak_mem_bytes"),
                   reserved_bytes=r.get("peak_reserved_bytes"))
    else:
        row["status"] = f"failed (exit {rc}; {js.with_suffix('.log').name})"
    return row


def fit_yaml(base, out, name, preset, limit, precision, no_master=False):
    c = {k: v for k, v in base.items() if k != "sweep"}
    c = json.loads(json.dumps(c))  # a deep copy
    c["run"] = {"name": name, "out_dir": str(out / "runs")}
    c["model"] = {"preset": preset}
    c["training"].update(precision=precision, memory_fit="auto", memory_limit_gb=limit)
    if no_master:
        c["training"]["master_weights"] = "none"
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def table(rows):
    def num(v, f):
        return f.format(v) if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else "-"
    lines = ["| mode | choice | predicted GiB | peak GiB (allocated) | device GiB (nvidia-smi) | ms/step | tokens/s | "
             "vs unconstrained bf16 | vs PyTorch bnb bf16 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ch = r.get("choice") or {}
        choice = " ".join(f"{k}={v}" for k, v in ch.items() if v is not None)
        lines.append(f"| {r['mode']} | {choice or '-'} | {num((r.get('pred_bytes') or math.nan) / GIB, '{:.2f}')} | "
                     f"{num((r.get('peak_bytes') or math.nan) / GIB, '{:.2f}')} | "
                     f"{num((r.get('device_used_peak') or math.nan) / GIB, '{:.2f}')} | {num(r.get('median_step_ms'), '{:.1f}')} | "
                     f"{num(r.get('tokens_per_s'), '{:,.0f}')} | {num(r.get('vs_unconstrained'), '{:.3f}')} | "
                     f"{num(r.get('vs_anchor'), '{:.3f}')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a new folder for the runs and results")
    ap.add_argument("--train", default=str(ROOT / "train"))
    ap.add_argument("--indices", default="0-53", help="frontier points, e.g. 0-53 or 3,13,17 ('' for none)")
    ap.add_argument("--limits", default="12,16,24", help="memory_limit_gb values for memory_fit: auto ('' for none)")
    ap.add_argument("--fit-precisions", default="fp8,bf16")
    ap.add_argument("--no-master-below", type=float, default=0,
                    help="limits below this also set training.master_weights: none (the smallest state: bf16 "
                         "parameters alone), as a user of so small a card would")
    ap.add_argument("--small", action="store_true", help="also GPT-2 124M with memory_fit: auto in 4 GiB")
    ap.add_argument("--torch", action="store_true", help="also PyTorch's configurations (bench/pytorch_gpt2.py)")
    ap.add_argument("--torch-runs", default="", help="with --torch, which of them (0-based, e.g. 2 for the anchor; "
                    "default all)")
    ap.add_argument("--steps", type=int, default=8, help="steps of every trainer run (the first is left out)")
    ap.add_argument("--point-timeout", type=int, default=240)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every trainer run (repeatable), e.g. training.gradient_release=true")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"memory_frontier: error: {out} is not empty (results are never written over)")
    out.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(EXPERIMENT.read_text())
    n = 1
    for values in base["sweep"].get("grid", {}).values():
        n *= len(values)
    n *= len(next(iter(base["sweep"]["zip"].values()))) if base["sweep"].get("zip") else 1
    rows = []
    common = ["--set", f"run.out_dir={out / 'runs'}", "--set", f"training.steps={a.steps}"]
    common += [x for kv in a.set for x in ("--set", kv)]

    def save():
        """The results so far, with their ratios, written whole after every run (a call cut short keeps them)."""
        ref = next((r for r in rows if r.get("index") == UNCONSTRAINED and r.get("tokens_per_s")), None)
        anchor = next((r for r in rows if r["mode"] == ANCHOR and r.get("tokens_per_s")), None)
        for r in rows:
            if r.get("tokens_per_s") and "124M" not in r["mode"]:
                if ref:
                    r["vs_unconstrained"] = r["tokens_per_s"] / ref["tokens_per_s"]
                if anchor:
                    r["vs_anchor"] = r["tokens_per_s"] / anchor["tokens_per_s"]
        for name, text in (("results.json", json.dumps(rows, indent=1, default=str)), ("table.md", table(rows))):
            tmp = out / (name + ".tmp")
            tmp.write_text(text)
            tmp.replace(out / name)

    def train(mode, cmd, log, run_dir, **extra):
        w = {}
        rc = run([a.train] + cmd, log, a.point_timeout, w)
        row = {**trainer_row(mode, run_dir, rc), **w, **extra}
        rows.append(row)
        save()
        print(f"{mode}: exit {rc}, {row.get('status')}, {row.get('choice')}, {row.get('tokens_per_s')} tokens/s",
              flush=True)

    for i in indices(a.indices, n):
        train(f"frontier {i}", ["--yaml", EXPERIMENT, "--index", i] + common, out / f"point_{i:03d}.log",
              out / "runs" / "memory_frontier" / f"p{i:03d}", index=i)
    if a.indices:
        run([a.train, "--yaml", EXPERIMENT, "--summarize"] + common[:2], out / "summarize.log", 120)
        run([sys.executable, ROOT / "scripts" / "plot_sweep.py", out / "runs" / "memory_frontier"], out / "plot.log", 300)
    for limit in [x for x in a.limits.split(",") if x]:
        for prec in [x for x in a.fit_precisions.split(",") if x]:
            name, no_master = f"fit_{prec}_{limit}", float(limit) < a.no_master_below
            y = fit_yaml(base, out, name, "d48", float(limit), prec, no_master=no_master)
            train(f"memory_limit_gb {limit}, {prec}" + (", master_weights none" if no_master else ""),
                  ["--yaml", y, "--set", f"training.steps={a.steps}"] + common[4:], out / f"{name}.log", out / "runs" / name)
    if a.small:
        y = fit_yaml(base, out, "fit_124m_4", "d12", 4.0, "bf16")
        train("GPT-2 124M, memory_limit_gb 4, bf16", ["--yaml", y, "--set", f"training.steps={a.steps}"] + common[4:],
              out / "fit_124m_4.log", out / "runs" / "fit_124m_4")
    if a.torch:
        for k, (mode, args) in enumerate(TORCH_RUNS):
            if a.torch_runs and str(k) not in a.torch_runs.split(","):
                continue
            rows.append(torch_row(mode, args, out, a.steps + 4, 4))
            save()
            print(f"{mode}: {rows[-1].get('status')}, {rows[-1].get('tokens_per_s')} tokens/s", flush=True)
    save()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
