#!/usr/bin/env python3
"""The optimizer's host update (training.offload's loop, optim::step_host) per parameter, built for
x86-64-v2 and for x86-64-v3 (AVX2 + FMA, what the trainer picks on a CPU that has them), in one
invocation on this machine's threads: bf16 parameters and gradients, an fp32 master, each rule and state
type, the best of four passes over N parameters.

    python3 bench/host_update.py --out DIR [--n 16777216] [--threads T]

Runs build/tests/cpu/test_optim_state --bench N (make builds it). Writes DIR/host_update.json (one row per
rule, state type and build: seconds, ns per parameter, and the x86-64-v3 build's speed-up over the v2
build) and prints the table.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "build" / "tests" / "cpu" / "test_optim_state"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=1 << 24, help="parameters per pass")
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS (0: OpenMP's default)")
    ap.add_argument("--program", default=str(PROGRAM))
    a = ap.parse_args(argv)
    if not Path(a.program).exists():
        sys.exit(f"host_update: {a.program} not found (run make first)")
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(a.threads)} if a.threads else {}))
    p = subprocess.run([a.program, "--bench", str(a.n)], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"host_update: {a.program} --bench exited {p.returncode}: {p.stderr[-2000:]}")
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    base = {(r["rule"], r["state"]): r["s"] for r in rows if r["isa"] == "x86-64-v2"}
    for r in rows:
        r["speedup_vs_v2"] = base[(r["rule"], r["state"])] / r["s"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_update.json").write_text(json.dumps({"n": a.n, "threads": env.get("OMP_NUM_THREADS", "default"),
                                                      "rows": rows}, indent=1))
    print("| rule | state | build | ns/parameter | x v2 |\n| --- | --- | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['rule']} | {r['state']} | {r['isa']} | {r['ns_per_param']:.2f} | {r['speedup_vs_v2']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
