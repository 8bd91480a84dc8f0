#!/usr/bin/env python3
"""Scaling across GPU counts: the same sweep run on 1, 2, 4... GPUs, compared point by point.

    python3 scripts/plot_scaling.py runs/zero_1gpu runs/zero_2gpu runs/zero_4gpu [-o OUT_DIR] [--markdown]

Points are matched by their varied values (e.g. zero_stage and model). For each, tokens/s per GPU and
scaling efficiency (tokens/s per GPU over that of the smallest GPU count in the inputs) are printed as
a table and drawn in scaling.png; memory per GPU (measured peak, predicted dashed) in
scaling_memory.png. Works on sweeps still running (rows without a time are left out).
"""
import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h5log  # noqa: E402
from summarize import format_markdown, format_terminal  # noqa: E402


def collect(sweep_dirs):
    """{point key: {gpus: row}} and the varied keys, over several sweeps of the same points."""
    points, varied = {}, []
    for d in sweep_dirs:
        s = h5log.read_summary(d)
        for k in s["varied"]:
            if k not in varied:
                varied.append(k)
        for row in s["rows"]:
            if row.get("status") != "ok" or h5log.is_missing(row.get("tokens_per_s_per_gpu")):
                continue
            key = tuple((k, str(row.get(k))) for k in s["varied"])
            gpus = int(row["world_size"])
            if gpus in points.setdefault(key, {}):
                raise h5log.LogError(f"{d}: a second result for {dict(key)} on {gpus} GPU(s)")
            points[key][gpus] = row
    return points, varied


def efficiency_table(points):
    """Rows of (point label, gpus, tokens/s, tokens/s/GPU, efficiency or None, pred GiB, meas GiB)."""
    out = []
    for key, by_gpus in points.items():
        label = " ".join(f"{k.split('.')[-1]}={v}" for k, v in key)
        base_gpus = min(by_gpus)
        base = by_gpus[base_gpus]["tokens_per_s_per_gpu"]
        for g in sorted(by_gpus):
            r = by_gpus[g]
            eff = r["tokens_per_s_per_gpu"] / base if g != base_gpus else None
            out.append((label, g, r["tokens_per_s"], r["tokens_per_s_per_gpu"], eff,
                        r.get("pred_total", float("nan")) / h5log.GIB, r.get("meas_peak", float("nan")) / h5log.GIB))
    return out


def format_table(rows, markdown):
    head = ["point", "GPUs", "tokens/s", "tokens/s/GPU", "efficiency", "pred GiB/GPU", "meas GiB/GPU"]
    cells = [[p, str(g), f"{t:,.0f}", f"{tg:,.0f}", "-" if e is None else f"{100 * e:.1f}%", f"{pg:.2f}", f"{mg:.2f}"]
             for p, g, t, tg, e, pg, mg in rows]
    left = [True] + [False] * (len(head) - 1)
    return (format_markdown if markdown else format_terminal)(head, cells, left)


def plot(points, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
    fig2, ax3 = plt.subplots(figsize=(9, 4.5))
    for key, by_gpus in points.items():
        label = " ".join(f"{k.split('.')[-1]}={v}" for k, v in key)
        g = sorted(by_gpus)
        tpg = [by_gpus[x]["tokens_per_s_per_gpu"] for x in g]
        line, = ax1.plot(g, tpg, "o-", label=label)
        ax2.plot(g, [100 * t / tpg[0] for t in tpg], "o-", color=line.get_color(), label=label)
        ax3.plot(g, [by_gpus[x]["meas_peak"] / h5log.GIB for x in g], "o-", color=line.get_color(), label=label)
        ax3.plot(g, [by_gpus[x]["pred_total"] / h5log.GIB for x in g], "--", color=line.get_color(), alpha=0.6)
    gpus = sorted({x for by in points.values() for x in by})
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(x) for x in gpus])
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("tokens/s per GPU")
    ax1.set_title("throughput per GPU")
    ax2.set_ylabel(f"% of tokens/s per GPU on {gpus[0]} GPU(s)")
    ax2.set_title("scaling efficiency")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax3.set_ylabel("GiB per GPU (measured peak; predicted dashed)")
    ax3.set_title("memory per GPU")
    ax3.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig2.tight_layout()
    fig.savefig(out_dir / "scaling.png", dpi=110)
    fig2.savefig(out_dir / "scaling_memory.png", dpi=110)
    plt.close(fig)
    plt.close(fig2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dirs", nargs="+", help="the same sweep run on different GPU counts")
    ap.add_argument("-o", "--out-dir", help="where scaling.png and scaling_memory.png go (default: no plots)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    a = ap.parse_args()
    try:
        points, _ = collect(a.sweep_dirs)
    except h5log.LogError as e:
        sys.exit(f"plot_scaling.py: {e}")
    if not points:
        sys.exit("plot_scaling.py: no finished points in " + ", ".join(a.sweep_dirs))
    print(format_table(efficiency_table(points), a.markdown))
    if a.out_dir:
        plot(points, Path(a.out_dir))


if __name__ == "__main__":
    main()
