#!/usr/bin/env python3
"""Start-up: the seconds from the command to a run's first training step, this build beside a reference
build in one invocation (ref, new, new, ref for each config, as bench/ab_bench.py), checkpointing on.

    python3 bench/startup.py --out DIR [--new ./train] [--ref OLD_TRAIN] [--configs d12:64,d48:16]
                             [--device cuda] [--precision fp8] [--seq-len 1024] [--every 1000] [--timeout 300]

Each run is a fresh process on synthetic tokens with checkpoint.every set (so the snapshot's host memory is
reserved and page-locked as a checkpointing run's is; nothing is written before that step), stopped by
SIGKILL once its second step is printed. From its output:
- startup_s: the process's own figure, "N s from the process's start" on its set-up line (the run log's
  `startup_s`; builds before 2026-12-06 do not print it: null);
- to_first_step_s: measured here for any build, from starting the command to the first step's line less
  that step's own time: when the first step began, library loading and the CUDA context included;
- first_step_ms and second_step_ms: the first step holds the one-time work of the first products and
  attention (plan building, algorithm timing), the second is a plain step;
- phases: the set-up line's phases (run directory, allocation, activations, data, initialisation, ...).
Writes DIR/startup.json (every run) and DIR/startup.md (a row per config and build: the means of its two
runs), and prints the table. Exit 1 when a run did not reach its second step.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SETUP = re.compile(r"set-up: (.*?)(?:; ([\d.]+) s from the process's start)?$")
PHASE = re.compile(r"([a-z][a-z ]*?) ([\d.]+) s")
STEP = re.compile(r"^step +(\d+)/\d+ \|.*?\|\s+([\d.]+) ms \|")


def parse(lines, step_wall):
    """The figures of one run's output lines (step_wall: when each step line arrived, seconds)."""
    r = {"startup_s": None, "phases": {}, "first_step_ms": None, "second_step_ms": None, "to_first_step_s": None}
    for line in lines:
        m = SETUP.search(line.rstrip("\n"))
        if m:
            r["phases"] = {k: float(v) for k, v in PHASE.findall(m.group(1))}
            r["startup_s"] = float(m.group(2)) if m.group(2) else None
        m = STEP.match(line)
        if m and m.group(1) in ("1", "2"):
            r["first_step_ms" if m.group(1) == "1" else "second_step_ms"] = float(m.group(2))
    if r["first_step_ms"] is not None and 1 in step_wall:
        r["to_first_step_s"] = step_wall[1] - r["first_step_ms"] / 1000
    return r


def one(train, preset, mb, a, out):
    """One run of `train` until its second step; its figures and status."""
    name = f"{preset}_b{mb}"
    out.mkdir(parents=True, exist_ok=True)
    yaml = out / f"{name}.yaml"
    yaml.write_text(f"""run: {{name: {name}, out_dir: {out}/runs}}
model: {{preset: {preset}}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: {a.device}, precision: {a.precision}, micro_batch: {mb}, seq_len: {a.seq_len}, steps: {a.every + 10},
           lr: 6.0e-4, warmup_steps: 2}}
eval: {{batches: 0}}
log: {{every: 1, progress: false}}
checkpoint: {{every: {a.every}}}
""")
    print("+", train, "--yaml", yaml, flush=True)
    t0 = time.monotonic()
    p = subprocess.Popen([str(train), "--yaml", str(yaml)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, cwd=ROOT, start_new_session=True)
    kill = lambda: os.killpg(p.pid, signal.SIGKILL)  # noqa: E731  the run and anything it started
    timer = threading.Timer(a.timeout, kill)
    timer.start()
    lines, step_wall = [], {}
    try:
        for line in p.stdout:
            lines.append(line)
            m = STEP.match(line)
            if m:
                step_wall.setdefault(int(m.group(1)), time.monotonic() - t0)
                if int(m.group(1)) >= 2:
                    kill()
                    break
    finally:
        timer.cancel()
        try:
            kill()
        except ProcessLookupError:
            pass
        p.wait()
    (out / f"{name}.log").write_text("".join(lines))
    r = parse(lines, step_wall)
    r["status"] = "ok" if r["second_step_ms"] is not None else f"no second step (exit {p.returncode})"
    subprocess.run(["rm", "-rf", str(out / "runs")])
    return r


def mean(rs, key):
    v = [r[key] for r in rs if r.get(key) is not None]
    return statistics.mean(v) if len(v) == len(rs) else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--new", default=str(ROOT / "train"))
    ap.add_argument("--ref", help="a reference build, run beside --new (A B B A)")
    ap.add_argument("--configs", default="d12:64,d48:16", help="preset:micro-batch, comma-separated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--every", type=int, default=1000, help="checkpoint.every (> 2: nothing is written)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run may take to its second step")
    a = ap.parse_args(argv)
    if a.every <= 2:
        ap.error("--every must be above 2: the runs stop after their second step, before any checkpoint")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    order = ("ref", "new", "new", "ref") if a.ref else ("new",)
    rows = []
    for cfg in a.configs.split(","):
        preset, mb = cfg.split(":")
        row = {"preset": preset, "micro_batch": int(mb), "runs": {"ref": [], "new": []}}
        for i, side in enumerate(order):
            r = one(a.new if side == "new" else a.ref, preset, int(mb), a, out / f"{side}{i}")
            row["runs"][side].append(r)
        for side, rs in row["runs"].items():
            if rs:
                row[side] = {k: mean(rs, k) for k in ("startup_s", "to_first_step_s", "first_step_ms", "second_step_ms")}
        rows.append(row)
        (out / "startup.json").write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
    f = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
    lines = ["| model | micro-batch | build | startup_s | to first step (s) | first step (ms) | second step (ms) | set-up phases (first run) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        for side in ("ref", "new"):
            if side not in row:
                continue
            s, first = row[side], row["runs"][side][0]
            phases = ", ".join(f"{k} {v:.1f}" for k, v in first["phases"].items()) or first["status"]
            lines.append(f"| {row['preset']} | {row['micro_batch']} | {side} | {f(s['startup_s'], '{:.2f}')} | "
                         f"{f(s['to_first_step_s'], '{:.2f}')} | {f(s['first_step_ms'], '{:.0f}')} | "
                         f"{f(s['second_step_ms'], '{:.1f}')} | {phases} |")
    (out / "startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = all(r["status"] == "ok" for row in rows for rs in row["runs"].values() for r in rs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
