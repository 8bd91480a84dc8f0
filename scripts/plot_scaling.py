#!/usr/bin/env python3
"""Scaling across GPU counts: the same sweep run on 1, 2, 4... GPUs, compared point by point.

    python3 scripts/plot_scaling.py runs/zero_1gpu runs/zero_2gpu runs/zero_4gpu [-o OUT_DIR] [--markdown]

Points are matched by their varied values (e.g. zero_stage and model). For each, tokens/s per GPU and
scaling efficiency (tokens/s per GPU over that of the smallest GPU count in the inputs) are printed as
a table and drawn in scaling.png (the total tokens/s of each model size against linear scaling, then
the efficiency of every point); memory per GPU (measured peak, less the process's baseline on CPUs as
plot_sweep.py's memory.png has it, and predicted as a wide pale line) in scaling_memory.png. Lines are
coloured by ZeRO stage, one marker and line style per model size (the other varied keys). Sweeps run on
CPUs say ranks for GPUs. Works on sweeps still running (rows without a time are left out).
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
from matplotlib.ticker import FuncFormatter  # noqa: E402

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


def _models(points, varied):
    """[(title, [point keys])]: the points grouped by every varied key but the colour key (the model
    size and its micro-batch), in input order."""
    ckey = style.color_key(varied)
    out = {}
    for key in points:
        rest = ", ".join(f"{style.short(k)}={v}" for k, v in key if k != ckey)
        out.setdefault(rest, []).append(key)
    return list(out.items())


def _si_tick(v, _):
    return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v else "0"


def measured_gib(row):
    """The measured peak per rank in GiB, less the process's baseline where the log knows it (CPU: what
    the process held before the model; GPU: 0), as memory.png of plot_sweep.py draws it."""
    base = row.get("meas_baseline", float("nan"))
    base = 0.0 if h5log.is_missing(base) else float(base)
    return (row.get("meas_peak", float("nan")) - base) / h5log.GIB


def plot(points, varied, out_dir):
    """scaling.png: the total tokens/s of each model size against linear scaling, one panel each, then
    the scaling efficiency of every point; scaling_memory.png: measured and predicted memory per GPU."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = all_rows(points)
    unit = style.rank_word(rows, plural=False)
    styles = _styles(points, varied)
    models = _models(points, varied)
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(4.6 * len(models) + 6.5, 4.5), squeeze=False)
    axes = list(axes.flat)
    eff_ax = axes[-1]
    fig2, ax3 = plt.subplots(figsize=(9, 4.5))
    for ax, (title, keys) in zip(axes, models):
        # total tokens/s against the ideal: each point's own figure at the fewest GPUs, times the GPUs
        top, speedups = 0.0, []
        for key in keys:
            label, color, marker, ls = styles[key]
            g = sorted(points[key])
            total = [points[key][x]["tokens_per_s_per_gpu"] * x for x in g]
            top = max(top, max(total), total[0] / g[0] * g[-1])
            ax.plot(g, total, marker=marker, ls=ls, color=color, label=label.split(",")[0])
            if len(g) > 1:
                speedups.append((g[-1], total[-1] / total[0], g[0]))
        g0 = min(x for key in keys for x in points[key])
        base = sum(points[k][g0]["tokens_per_s_per_gpu"] for k in keys if g0 in points[k]) / \
            sum(1 for k in keys if g0 in points[k])
        counts = sorted({x for key in keys for x in points[key]})
        ax.plot(counts, [base * x for x in counts], color="0.5", ls=":", lw=1.5, label="ideal (linear)")
        if speedups:
            at = max(s[0] for s in speedups)
            fs = [f for g, f, _ in speedups if g == at]
            ratio = f"{min(fs):.2f}x" if max(fs) - min(fs) < 0.005 else f"{min(fs):.2f}-{max(fs):.2f}x"
            ax.text(0.97, 0.05, f"{at} {unit}s: {ratio} the tokens/s of {speedups[0][2]} {unit}",
                    transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=8)
        ax.set_ylim(0, top * 1.08)
        ax.yaxis.set_major_formatter(FuncFormatter(_si_tick))
        ax.set_ylabel("tokens/s, all " + unit + "s")
        ax.set_title("throughput" + (f"\n{title}" if title else ""), fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    for key, (label, color, marker, ls) in styles.items():
        by_gpus = points[key]
        g = sorted(by_gpus)
        tpg = [by_gpus[x]["tokens_per_s_per_gpu"] for x in g]
        eff_ax.plot(g, [100 * t / tpg[0] for t in tpg], marker=marker, ls=ls, color=color, label=label)
        ax3.plot(g, [measured_gib(by_gpus[x]) for x in g], marker=marker, ls=ls, color=color, label=label)
        ax3.plot(g, [by_gpus[x]["pred_total"] / h5log.GIB for x in g], ls=ls, color=color, alpha=0.45, lw=3)
    gpus = sorted({x for by in points.values() for x in by})
    for ax in axes + [ax3]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(x) for x in gpus])
        ax.minorticks_off()
        ax.set_xlabel(unit + "s")
        ax.grid(alpha=0.3)
    eff_ax.set_ylabel(f"% of tokens/s per {unit} on {gpus[0]} {unit}(s)")
    eff_ax.set_title("scaling efficiency", fontsize=10)
    eff_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    on_cpu = any(not h5log.is_missing(r.get("meas_baseline")) and r.get("meas_baseline") > 0 for r in rows)
    measured = "measured peak above the process's baseline" if on_cpu else "measured peak"
    ax3.set_ylabel(f"GiB per {unit}")
    ax3.set_title(f"memory per {unit}: {measured} (line with markers), predicted (wide pale line)", fontsize=10)
    ax3.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig2.tight_layout()
    fig.savefig(out_dir / "scaling.png", dpi=110, bbox_inches="tight")
    fig2.savefig(out_dir / "scaling_memory.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    plt.close(fig2)
    return {"throughput_panels": [t for t, _ in models], "measured": measured}


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
