#!/usr/bin/env python3
"""Two builds of this trainer, the same configs, one invocation: the throughput a change of the code
costs or gains, free of the 2-3% between machines. Each config runs A B B A (so drift within the call
cancels), and the figure per build is the mean of its two median step times.

    python3 bench/ab_bench.py --ref /path/to/old/train [--new ./train] --out DIR
                              [--configs d12:64,d48:16] [--variants 0,0fp8] [--steps 12] [--warmup 4]

Variants as in bench/gpu_bench.py (recompute level, then fp8 / det / prof). Writes DIR/ab.json and
DIR/ab.md (a row per config and variant: both builds' ms/step and tokens/s, new / ref), and prints them.
"""
import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import check_variants, ours  # noqa: E402  the same runs gpu_bench makes of this trainer


def points(configs, variants):
    """(preset, micro-batch, variant) for every config "preset:mb" and variant, configs outermost."""
    for cfg in configs.split(","):
        preset, mb = cfg.split(":")
        for v in variants.split(","):
            yield preset, int(mb), v


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--new", default=str(Path(__file__).resolve().parent.parent / "train"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="d12:64,d48:16")
    ap.add_argument("--variants", default="0,0fp8")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    a = ap.parse_args(argv)
    check_variants(ap, a.variants)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for preset, mb, v in points(a.configs, a.variants):
        runs = {"ref": [], "new": []}
        for i, side in enumerate(("ref", "new", "new", "ref")):
            d = out / f"{side}{i}"
            shutil.rmtree(d / "runs", ignore_errors=True)  # this benchmark's own runs of an earlier call
            d.mkdir(exist_ok=True)
            runs[side].append(ours(preset, mb, v, a.steps, a.warmup, d, getattr(a, side)))
        row = {"preset": preset, "micro_batch": mb, "variant": v}
        for side, rs in runs.items():
            ms = [r.get("median_step_ms") for r in rs]
            row[side] = {"status": [r["status"] for r in rs], "median_step_ms": ms,
                         "peak_mem_bytes": [r.get("peak_mem_bytes") for r in rs]}
            if all(ms):
                row[side]["ms"] = statistics.mean(ms)
                row[side]["tokens_per_s"] = statistics.mean(r["tokens_per_s"] for r in rs)
        if row["ref"].get("ms") and row["new"].get("ms"):
            row["new_over_ref_tokens_per_s"] = row["new"]["tokens_per_s"] / row["ref"]["tokens_per_s"]
        rows.append(row)
        (out / "ab.json").write_text(json.dumps(rows, indent=1))
    lines = ["| model | micro-batch | variant | ref ms/step (A, A') | new ms/step (B, B') | new / ref tokens/s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        f = lambda side: (f"{r[side]['ms']:.1f} ({', '.join(f'{x:.1f}' for x in r[side]['median_step_ms'])})"
                          if r[side].get("ms") else "failed: " + ", ".join(r[side]["status"]))
        ratio = f"{r['new_over_ref_tokens_per_s']:.4f}" if "new_over_ref_tokens_per_s" in r else "-"
        lines.append(f"| {r['preset']} | {r['micro_batch']} | {r['variant']} | {f('ref')} | {f('new')} | {ratio} |")
    (out / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all("new_over_ref_tokens_per_s" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
