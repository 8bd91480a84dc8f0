#!/usr/bin/env python3
"""Plot a sweep: throughput.png, memory.png, loss.png.

    python3 scripts/plot_sweep.py runs/mysweep [-o OUT_DIR] [--from-logs]

Points are grouped by model size (every varied key but one, in one panel per group) and coloured by
the ZeRO stage (or, in a sweep that does not vary it, by the first varied key). throughput.png: tokens/s
per GPU (per rank on CPUs). memory.png: per rank, the predicted memory stacked by component beside the
measured peak (on CPUs the peak resident set above what the process held before it allocated the
model, its baseline). loss.png: train (solid) and val (dashed) loss; curves that coincide are drawn once
and labelled as such. Works on a sweep still running: points that failed, ran out of memory or have not
started are drawn as such, without bars.
"""
import argparse
import math
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("h5py", "matplotlib", "numpy", "yaml")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import h5log  # noqa: E402
import plot_style as style  # noqa: E402

MEASURED_COLOR = "0.25"
MIB = float(1 << 20)
# curves closer than this share of the panel's loss range are one line to the eye (about a pixel)
COINCIDE_SHARE = 0.002


def _value(row, col):
    v = row.get(col, float("nan"))
    return float("nan") if h5log.is_missing(v) else float(v)


def _si(v):
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def _panels(n):
    cols = min(n, 4)
    return cols, (n + cols - 1) // cols


def _subplots(n, width, height):
    cols, nrows = _panels(n)
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols + 2.2, height * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


# characters of a 9-point panel title on one line of a 3.2-inch panel
PANEL_CHARS = 40


def _wrap(text, chars):
    """text broken into lines of at most chars characters (its own line breaks kept): a title that fits
    its panel or figure, neither clipped nor running into its neighbour's."""
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def _figure_chars(fig):
    """Characters of a 10-point title on one line across the figure."""
    return max(40, int(fig.get_figwidth() * 72 / 6.5))


def _mark_missing(ax, x, row, y=0.0):
    ax.text(x, y, row.get("status", "") or "?", ha="center", va="bottom", rotation=90,
            color=style.FAILED_COLOR, fontsize=9)


def _colored_points(members, ckey):
    """The group's rows in colour-key order (one bar each)."""
    return sorted(members, key=lambda r: style.sort_key(r.get(ckey, "")) if ckey else (0, 0.0, ""))


def plot_throughput(summary, path):
    """Returns what it drew: {"ylabel", "panels": [(title, [(bar label, tokens/s per rank or NaN, colour)])]}."""
    rows, varied = summary["rows"], summary["varied"]
    ckey = style.color_key(varied)
    colors = style.colors_for(style.color_values(rows, ckey))
    unit = style.rank_word(rows, plural=False)
    grouped = style.groups(rows, varied)
    fig, axes = _subplots(len(grouped), 3.2, 3.8)
    drawn = {"panels": []}
    for ax, (title, members) in zip(axes, grouped):
        members = _colored_points(members, ckey)
        x = np.arange(len(members))
        vals = np.array([_value(r, "tokens_per_s_per_gpu") for r in members])
        ok = np.isfinite(vals)
        cols = [colors[str(r.get(ckey, ""))] if r.get("status") in style.DONE else style.FAILED_COLOR
                for r in members]
        bars = ax.bar(x, np.where(ok, vals, 0.0), color=cols, width=0.7)
        for b, v in zip(bars, vals):
            if np.isfinite(v):
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), _si(v), ha="center", va="bottom",
                        fontsize=8)
        for i, r in enumerate(members):
            if not ok[i]:
                _mark_missing(ax, x[i], r)
        labels = [style.value_label(ckey, r.get(ckey, "")) + _world_note(r, rows) for r in members]
        drawn["panels"].append((title, list(zip(labels, vals.tolist(), cols))))
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(_wrap(title, PANEL_CHARS), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, max(np.nanmax(np.where(ok, vals, 0.0)) * 1.15, 1.0))
    drawn["ylabel"] = f"tokens/s per {unit}"
    axes[0].set_ylabel(drawn["ylabel"])
    title = f"throughput per {unit}{_world_text(rows)}, by {_by(varied)}\n({summary['source']})"
    fig.suptitle(_wrap(title, _figure_chars(fig)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return drawn


def _world_note(row, rows):
    """'\\n2 GPUs' under a bar when the points ran on different numbers of ranks."""
    worlds = {r.get("world_size") for r in rows if not h5log.is_missing(r.get("world_size"))}
    if len(worlds) < 2 or h5log.is_missing(row.get("world_size")):
        return ""
    n = int(row["world_size"])
    return f"\n{n} {style.rank_word(rows, plural=n != 1)}"


def _world_text(rows):
    """' (2 GPUs per point)' when every point ran on the same number of ranks."""
    worlds = {int(r["world_size"]) for r in rows if not h5log.is_missing(r.get("world_size"))}
    if len(worlds) != 1:
        return ""
    n = worlds.pop()
    return f" ({n} {style.rank_word(rows, plural=n != 1)} per point)"


def _by(varied):
    ckey = style.color_key(varied)
    rest = [style.short(k) for k in varied if k != ckey]
    colour = "ZeRO stage" if ckey == style.COLOR_KEY else (style.short(ckey) if ckey else "point")
    return colour + (f" per {', '.join(rest)}" if rest else "")


def _baselines(summary, sweep_dir):
    """Each row's measured baseline in bytes (NaN: unknown): the summary's meas_baseline, else its log's."""
    out = []
    for r in summary["rows"]:
        b = _value(r, "meas_baseline")
        if math.isnan(b) and r.get("status") not in ("missing", "unreadable", "damaged"):
            log = h5log.point_log(sweep_dir, r)
            if log is not None and "baseline" in log["memory"].get("measured", {}):
                b = float(log["memory"]["measured"]["baseline"])
        out.append(b)
    return out


def _memory_context(summary, sweep_dir):
    """What memory.png and frontier.png draw memory with: the components and their colours, the unit,
    and each row's measured peak in bytes (on CPUs less the process's baseline where known: `measured`,
    aligned with the rows), with the legend words and title note for it."""
    rows = summary["rows"]
    components = summary["components"] or list(h5log.COMPONENTS)
    cpu = "cpu" in style.devices(rows)
    bases = _baselines(summary, sweep_dir)
    measured = [_value(r, "meas_peak") for r in rows]
    if cpu:
        measured = [m - b if not math.isnan(b) else m for m, b in zip(measured, bases)]
    largest = max([_value(r, "pred_total") for r in rows] + [_value(r, "meas_peak") for r in rows]
                  + [0.0], key=lambda v: 0.0 if math.isnan(v) else v)
    unit, scale = ("GiB", h5log.GIB) if largest >= h5log.GIB else ("MiB", MIB)
    known = sorted({b for b in bases if not math.isnan(b)})
    label, note = "measured peak", ""
    if cpu:
        label = "measured: peak RSS above baseline" if known else "measured: peak RSS (with the process's baseline)"
        span = (f"{known[0] / MIB:.0f}-{known[-1] / MIB:.0f}" if len(known) > 1 and
                round(known[0] / MIB) != round(known[-1] / MIB) else f"{known[0] / MIB:.0f}") if known else ""
        note = ("CPU: measured is the peak resident set above the process's baseline (what it held before "
                f"allocating the model: {span} MiB)" if known else
                "CPU: measured is the peak resident set, the process's libraries included (no baseline in "
                "these logs)")
    return {"components": components, "cpu": cpu, "unit": unit, "scale": scale, "measured": measured,
            "measured_label": label, "cpu_note": note,
            "colors": dict(zip(components, plt.get_cmap("tab10").colors + plt.get_cmap("Set3").colors))}


def _memory_bars(ax, mem, members, measured, labels):
    """Per point, its predicted components stacked (left bar) beside its measured peak (right bar), each
    topped by its total; a point without a measured peak gets its status in place of the right bar.
    measured: the points' measured bytes (from mem["measured"]). Returns [(label, predicted, measured)]
    in mem's unit."""
    x = np.arange(len(members))
    w = 0.38
    bottom = np.zeros(len(members))
    for comp in mem["components"]:
        vals = np.array([_value(r, "pred_" + comp) for r in members]) / mem["scale"]
        vals = np.where(np.isfinite(vals), vals, 0.0)
        ax.bar(x - w / 2, vals, w, bottom=bottom, color=mem["colors"][comp], label=comp)
        bottom += vals
    meas = np.array(measured, dtype=float) / mem["scale"]
    ok = np.isfinite(meas)
    ax.bar(x + w / 2, np.where(ok, meas, 0.0), w, color=MEASURED_COLOR, label=mem["measured_label"])
    top = max(float(np.max(bottom)) if len(bottom) else 0.0,
              float(np.nanmax(np.where(ok, meas, 0.0))) if len(meas) else 0.0)
    for i, r in enumerate(members):
        if bottom[i] > 0:
            ax.text(x[i] - w / 2, bottom[i], f"{bottom[i]:.3g}", ha="center", va="bottom", fontsize=7)
        if ok[i]:
            ax.text(x[i] + w / 2, meas[i], f"{meas[i]:.3g}", ha="center", va="bottom", fontsize=7)
        else:
            _mark_missing(ax, x[i] + w / 2, r)
    ax.set_xticks(x)
    ax.set_xticklabels([label + "\npred | meas" for label in labels], fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, max(top * 1.15, 1e-3))
    return list(zip(labels, bottom.tolist(), meas.tolist()))


def _memory_legend(fig, ax, mem, anchor=(1.0, 0.85)):
    """The components' legend beside the figure, top to bottom as stacked, then the measured bar;
    returns its labels."""
    n = len(mem["components"])
    handles, names = ax.get_legend_handles_labels()
    order = list(range(n))[::-1] + list(range(n, len(names)))
    labels = ["predicted: " + names[i] if i < n else names[i] for i in order]
    fig.legend([handles[i] for i in order], labels, fontsize=7, loc="upper left", bbox_to_anchor=anchor)
    return labels


def plot_memory(summary, sweep_dir, path):
    """Returns what it drew: {"title", "legend", "unit", "panels": [(title, [(bar label, predicted, measured)])]}
    (predicted and measured in the plot's unit)."""
    rows, varied = summary["rows"], summary["varied"]
    ckey = style.color_key(varied)
    mem = _memory_context(summary, sweep_dir)
    measured = {id(r): m for r, m in zip(rows, mem["measured"])}
    grouped = style.groups(rows, varied)
    fig, axes = _subplots(len(grouped), 3.6, 4.4)
    drawn = {"unit": mem["unit"], "panels": []}
    for ax, (title, members) in zip(axes, grouped):
        members = _colored_points(members, ckey)
        labels = [style.value_label(ckey, r.get(ckey, "")) for r in members]
        drawn["panels"].append((title, _memory_bars(ax, mem, members, [measured[id(r)] for r in members],
                                                    labels)))
        ax.set_title(_wrap(title, PANEL_CHARS), fontsize=9)
    axes[0].set_ylabel(f"{mem['unit']} per {style.rank_word(rows, plural=False)}")
    drawn["legend"] = _memory_legend(fig, axes[0], mem)
    title = (f"memory per {style.rank_word(rows, plural=False)}{_world_text(rows)}: predicted by component "
             f"(left bar), measured (right bar), by {_by(varied)}")
    if mem["cpu_note"]:
        title += "\n" + mem["cpu_note"]
    drawn["title"] = title
    # wrapped to the figure's width (about 13 characters an inch at this size), legend included
    width = int((fig.get_size_inches()[0] + 2.0) * 13)
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.split("\n")), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return drawn


def plot_loss(summary, sweep_dir, path):
    """Returns what it drew: {panel title: [legend label of each line drawn]}."""
    rows, varied = summary["rows"], summary["varied"]
    ckey = style.color_key(varied)
    colors = style.colors_for(style.color_values(rows, ckey))
    grouped = style.groups(rows, varied)
    fig, axes = _subplots(len(grouped), 4.6, 4.0)
    anything = False
    drawn = {}
    for ax, (title, members) in zip(axes, grouped):
        drawn[title] = []
        members = _colored_points(members, ckey)
        logs = [(r, h5log.point_log(sweep_dir, r)) for r in members]
        logs = [(r, log) for r, log in logs if log is not None and (len(log["train"]["step"]) or
                                                                 len(log["eval"]["step"]))]
        if not logs:
            ax.text(0.5, 0.5, "no loss values logged yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(_wrap(title, PANEL_CHARS), fontsize=9)
            continue
        anything = True
        curves = [(np.concatenate([log["train"]["step"], -1 - np.asarray(log["eval"]["step"])]),
                   np.concatenate([log["train"]["loss"], log["eval"]["val_loss"]])) for _, log in logs]
        values = np.concatenate([c[1] for c in curves])
        values = values[np.isfinite(values)]
        spread = float(values.max() - values.min()) if len(values) else 0.0
        for members_i, diff in style.coinciding(curves, COINCIDE_SHARE * spread):
            r, log = logs[members_i[0]]
            color = colors[str(r.get(ckey, ""))]
            names = [style.value_label(ckey, logs[i][0].get(ckey, "")) for i in members_i]
            label = ", ".join(names) + style.coincide_note(len(members_i), diff)
            bad = [f"{style.value_label(ckey, logs[i][0].get(ckey, ''))} [{logs[i][0].get('status')}]"
                   for i in members_i if logs[i][0].get("status") not in ("ok", "running")]
            if bad:
                label += " " + " ".join(b.split(" ", 1)[1] for b in bad)
            tr, ev = log["train"], log["eval"]
            drawn[title].append(label)
            if len(tr["step"]):
                ax.plot(tr["step"], tr["loss"], color=color, lw=1.4, label=label,
                        marker="o" if len(tr["step"]) < 3 else None, ms=4)  # a point or two stays visible
            if len(ev["step"]):
                ax.plot(ev["step"], ev["val_loss"], color=color, ls="--", marker="o", ms=3,
                        label=None if len(tr["step"]) else label)
        ax.set_title(_wrap(title, PANEL_CHARS), fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss (solid: train, dashed: val)")
    fig.suptitle(f"loss, by {_by(varied)}" if anything else "loss", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", help="the sweep's output folder")
    ap.add_argument("-o", "--out-dir", help="where the PNGs go (default: the sweep folder)")
    ap.add_argument("--from-logs", action="store_true",
                    help="compute the rows from pNNN/log.h5 even when summary.h5 exists")
    args = ap.parse_args(argv)
    try:
        summary = h5log.read_summary(args.sweep_dir, "logs" if args.from_logs else "auto")
    except h5log.LogError as e:
        print(f"plot_sweep: error: {e}", file=sys.stderr)
        return 1
    if not summary["rows"]:
        print(f"plot_sweep: error: {summary['source']}: no points", file=sys.stderr)
        return 1
    out = Path(args.out_dir or args.sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "throughput.png", out / "memory.png", out / "loss.png"]
    plot_throughput(summary, paths[0])
    plot_memory(summary, args.sweep_dir, paths[1])
    plot_loss(summary, args.sweep_dir, paths[2])
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
