#!/usr/bin/env python3
"""Plot a sweep: throughput.png, memory.png (predicted by component vs measured peak), loss.png.

    python3 scripts/plot_sweep.py runs/mysweep [-o OUT_DIR] [--from-logs]

Works on a sweep still running: points that failed, ran out of memory or have not started are
drawn as such, without bars.
"""
import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h5log  # noqa: E402

DONE = ("ok", "running", "checkpointed")
COMPONENT_COLORS = dict(zip(h5log.COMPONENTS, plt.get_cmap("tab10").colors))
MEASURED_COLOR = "0.25"
FAILED_COLOR = "tab:red"


def point_label(row, varied, with_status=True):
    """'key=value' lines of the varied keys (last part of a dotted key), else the point folder;
    then the status when the point did not finish cleanly."""
    parts = [f"{k.split('.')[-1]}={row[k]}" for k in varied if not h5log.is_missing(row.get(k))]
    if "training.micro_batch" not in varied and not h5log.is_missing(row.get("micro_batch")):
        parts.append(f"micro_batch={int(row['micro_batch'])}")  # e.g. found by micro_batch: max
    if not parts:
        parts = [str(row.get("dir") or f"p{row.get('index', 0):03d}")]
    if with_status and row.get("status") not in ("ok", None):
        parts.append(f"[{row.get('status')}]")
    return "\n".join(parts)


def _value(row, col):
    v = row.get(col, float("nan"))
    return float("nan") if h5log.is_missing(v) else float(v)


def _mark_missing(ax, x, row, y=0.0):
    status = row.get("status", "") or "?"
    ax.text(x, y, status, ha="center", va="bottom", rotation=90, color=FAILED_COLOR, fontsize=9)


def _bar_values(ax, bars, values, fmt):
    for b, v in zip(bars, values):
        if np.isfinite(v):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), fmt(v), ha="center", va="bottom",
                    fontsize=8)


def _fig_width(n):
    return max(6.0, 1.0 * n + 2.0)


def _gib_label(v):
    return f"{v:.1f}" if abs(v) >= 1 else f"{v:.2g}"


def _si(v):
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def plot_throughput(summary, path):
    rows, varied = summary["rows"], summary["varied"]
    worlds = {int(r["world_size"]) for r in rows
              if not h5log.is_missing(r.get("world_size")) and r.get("world_size", -1) > 0}
    panels = [("tokens_per_s", "tokens/s")]
    if len(worlds) > 1:
        panels.append(("tokens_per_s_per_gpu", "tokens/s per GPU"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(_fig_width(len(rows)), 4.0 * len(panels)),
                             squeeze=False)
    x = np.arange(len(rows))
    labels = [point_label(r, varied) for r in rows]
    for ax, (col, title) in zip(axes[:, 0], panels):
        vals = np.array([_value(r, col) for r in rows])
        ok = np.isfinite(vals)
        heights = np.where(ok, vals, 0.0)
        colors = ["tab:blue" if r.get("status") in DONE else FAILED_COLOR for r in rows]
        bars = ax.bar(x, heights, color=colors, width=0.6)
        _bar_values(ax, bars, vals, _si)
        for i, r in enumerate(rows):
            if not ok[i]:
                _mark_missing(ax, x[i], r)
        ax.set_ylabel(title)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        if not ok.any():
            ax.set_ylim(0, 1)
    axes[0, 0].set_title(f"throughput ({summary['source']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_memory(summary, path):
    rows, varied = summary["rows"], summary["varied"]
    fig, ax = plt.subplots(figsize=(_fig_width(len(rows)) * 1.2, 5.0))
    x = np.arange(len(rows))
    w = 0.38
    bottom = np.zeros(len(rows))
    for comp in h5log.COMPONENTS:
        vals = np.array([_value(r, "pred_" + comp) for r in rows]) / h5log.GIB
        vals = np.where(np.isfinite(vals), vals, 0.0)
        ax.bar(x - w / 2, vals, w, bottom=bottom, color=COMPONENT_COLORS[comp], label=f"pred {comp}")
        bottom += vals
    pred_total = np.array([_value(r, "pred_total") for r in rows]) / h5log.GIB
    for i, t in enumerate(pred_total):
        top = t if np.isfinite(t) else bottom[i]
        if top > 0:
            ax.text(x[i] - w / 2, top, _gib_label(top), ha="center", va="bottom", fontsize=8)
    meas = np.array([_value(r, "meas_peak") for r in rows]) / h5log.GIB
    ok = np.isfinite(meas)
    bars = ax.bar(x + w / 2, np.where(ok, meas, 0.0), w, color=MEASURED_COLOR, label="measured peak")
    _bar_values(ax, bars, meas, _gib_label)
    for i, r in enumerate(rows):
        if not ok[i]:
            _mark_missing(ax, x[i] + w / 2, r)
    ax.set_xticks(x)
    ax.set_xticklabels([point_label(r, varied) for r in rows], fontsize=8)
    ax.set_ylabel("GiB per rank")
    ax.set_title("memory per rank: predicted (left, by component) vs measured peak (right)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    order = list(range(len(h5log.COMPONENTS)))[::-1] + list(range(len(h5log.COMPONENTS), len(names)))
    ax.legend([handles[i] for i in order], [names[i] for i in order], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))  # components listed top to bottom as stacked
    if not (bottom.any() or ok.any()):
        ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_loss(summary, sweep_dir, path):
    rows, varied = summary["rows"], summary["varied"]
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    colors = plt.get_cmap("tab10").colors
    drawn = 0
    for i, r in enumerate(rows):
        log = h5log.point_log(sweep_dir, r)
        if log is None:
            continue
        color = colors[i % len(colors)]
        label = point_label(r, varied, with_status=False).replace("\n", ", ")
        if r.get("status") != "ok":
            label += f" [{r.get('status')}]"
        tr, ev = log["train"], log["eval"]
        if len(tr["step"]):
            ax.plot(tr["step"], tr["loss"], color=color, lw=1.2, label=label,
                    marker="o" if len(tr["step"]) < 3 else None, ms=4)  # a point or two stays visible
            drawn += 1
        if len(ev["step"]):
            ax.plot(ev["step"], ev["val_loss"], color=color, ls="--", marker="o", ms=3,
                    label=None if len(tr["step"]) else label)
            drawn += 1
    if drawn:
        ax.set_xlabel("step")
        ax.set_ylabel("loss (solid: train, dashed: val)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    else:
        ax.text(0.5, 0.5, "no loss values logged yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("loss per point", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
    plot_memory(summary, paths[1])
    plot_loss(summary, args.sweep_dir, paths[2])
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
