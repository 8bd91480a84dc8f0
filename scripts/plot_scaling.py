#!/usr/bin/env python3
"""Scaling across GPU counts: the same sweep run on 1, 2, 4... GPUs, compared point by point.

    python3 scripts/plot_scaling.py runs/zero_1gpu runs/zero_2gpu runs/zero_4gpu [-o OUT_DIR] [--markdown]

Points are matched by their varied values (e.g. zero_stage and model). For each, tokens/s per GPU and
scaling efficiency (tokens/s per GPU over that of the smallest GPU count in the inputs) are printed as
a table and drawn in scaling.png; memory per GPU (measured peak, and predicted as a wide pale line) in
scaling_memory.png. Lines are coloured by ZeRO stage, one marker and line style per model size (the
other varied keys). Sweeps run on CPUs say ranks for GPUs. Works on sweeps still running (rows without
a time are left out).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("h5py", "matplotlib", "numpy", "yaml")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import h5log  # noqa: E402
import plot_style as style  # noqa: E402
from summarize import format_markdown, format_terminal  # noqa: E402


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


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
                raise h5log.LogError(f"{d}: a second result for {dict(key)} on {gpus} "
                                     f"{style.rank_word([row])[:-1]}(s)")
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


def all_rows(points):
    return [r for by in points.values() for r in by.values()]


def format_table(rows, markdown, unit="GPU"):
    head = ["point", unit + "s", "tokens/s", f"tokens/s/{unit}", "efficiency", f"pred GiB/{unit}",
            f"meas GiB/{unit}"]
    cells = [[p, str(g), f"{t:,.0f}", f"{tg:,.0f}", "-" if e is None else f"{100 * e:.1f}%", f"{pg:.2f}", f"{mg:.2f}"]
             for p, g, t, tg, e, pg, mg in rows]
    left = [True] + [False] * (len(head) - 1)
    return (format_markdown if markdown else format_terminal)(head, cells, left)


def _styles(points, varied):
    """{point key: (label, colour, marker, line style)}: colour by ZeRO stage (else the first varied
    key), marker and line style by the other varied keys (the model size)."""
    ckey = style.color_key(varied)
    colors = style.colors_for(style.color_values([dict(k) for k in points], ckey))
    rest = []
    for key in points:
        r = tuple((k, v) for k, v in key if k != ckey)
        if r not in rest:
            rest.append(r)
    out = {}
    for key in points:
        d = dict(key)
        r = rest.index(tuple((k, v) for k, v in key if k != ckey))
        group = ", ".join(f"{style.short(k)}={v}" for k, v in rest[r])
        label = style.value_label(ckey, d.get(ckey, "")) + (f", {group}" if group else "")
        out[key] = (label, colors[str(d.get(ckey, ""))], MARKERS[r % len(MARKERS)], LINESTYLES[r % len(LINESTYLES)])
    return out


def plot(points, varied, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    unit = style.rank_word(all_rows(points), plural=False)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
    fig2, ax3 = plt.subplots(figsize=(9, 4.5))
    for key, (label, color, marker, ls) in _styles(points, varied).items():
        by_gpus = points[key]
        g = sorted(by_gpus)
        tpg = [by_gpus[x]["tokens_per_s_per_gpu"] for x in g]
        ax1.plot(g, tpg, marker=marker, ls=ls, color=color, label=label)
        ax2.plot(g, [100 * t / tpg[0] for t in tpg], marker=marker, ls=ls, color=color, label=label)
        ax3.plot(g, [by_gpus[x]["meas_peak"] / h5log.GIB for x in g], marker=marker, ls=ls, color=color,
                 label=label)
        ax3.plot(g, [by_gpus[x]["pred_total"] / h5log.GIB for x in g], ls=ls, color=color, alpha=0.45, lw=3)
    gpus = sorted({x for by in points.values() for x in by})
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(x) for x in gpus])
        ax.set_xlabel(unit + "s")
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel(f"tokens/s per {unit}")
    ax1.set_title(f"throughput per {unit}")
    ax2.set_ylabel(f"% of tokens/s per {unit} on {gpus[0]} {unit}(s)")
    ax2.set_title("scaling efficiency")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax3.set_ylabel(f"GiB per {unit} (measured peak; predicted: wide pale line)")
    ax3.set_title(f"memory per {unit}")
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
        points, varied = collect(a.sweep_dirs)
    except h5log.LogError as e:
        sys.exit(f"plot_scaling.py: {e}")
    if not points:
        sys.exit("plot_scaling.py: no finished points in " + ", ".join(a.sweep_dirs))
    print(format_table(efficiency_table(points), a.markdown, style.rank_word(all_rows(points), plural=False)))
    if a.out_dir:
        plot(points, varied, Path(a.out_dir))


if __name__ == "__main__":
    main()
