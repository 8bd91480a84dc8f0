#!/usr/bin/env python3
"""Plot train and val loss of several runs on one figure, and their HellaSwag accuracy beside it
when they evaluated it. A run on the synthetic corpus (data.synthetic) also gets its floor: every
token has synthetic_branching equally likely successors, so no model's loss goes below ln(branching).

    python3 scripts/plot_runs.py runs/a runs/b/log.h5 [-o loss.png] [--tokens] [--logy]
"""
import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("h5py", "matplotlib", "numpy", "yaml")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

import h5log  # noqa: E402


def run_label(log, given):
    """A sweep point by its swept values (`lr=0.001, zero_stage=2`), any other run by its name."""
    name = log["attrs"].get("name") or str(given)
    values = h5log.parse_point_values(log["attrs"].get("point_values", ""))
    if values:
        name = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in values.items())
    status = log["attrs"].get("status", "")
    return name if status in ("ok", "") else f"{name} [{status}]"


def loss_floor(log):
    """ln(data.synthetic_branching) for a run on the synthetic corpus (the best loss any model can reach
    there), else None."""
    try:
        cfg = yaml.safe_load(log["attrs"].get("config_yaml", "") or "") or {}
    except yaml.YAMLError:
        return None
    data = cfg.get("data", {}) if isinstance(cfg, dict) else {}
    branching = data.get("synthetic_branching") if isinstance(data, dict) else None
    if not data.get("synthetic") or not isinstance(branching, int) or branching < 1:
        return None
    return branching


def has_hellaswag(log):
    return bool(np.isfinite(np.asarray(log["eval"]["hellaswag_acc_norm"], dtype=float)).any())


def plot_runs(logs, labels, path, tokens=False, logy=False):
    """Draw each log's train loss (solid) and val loss (dashed) into path; with HellaSwag results, a
    second panel with acc_norm (solid) and acc (dotted). Returns the loss panel's legend labels."""
    accuracy = any(has_hellaswag(log) for log in logs)
    fig, axes = plt.subplots(1, 2 if accuracy else 1, figsize=(14.0 if accuracy else 8.0, 5.0), squeeze=False)
    ax = axes[0][0]
    colors = plt.get_cmap("tab10").colors
    drawn = 0
    for i, (log, label) in enumerate(zip(logs, labels)):
        scale = 1.0
        if tokens:
            scale = float(log["attrs"].get("tokens_per_step", 0) or 0)
            if scale <= 0:
                raise h5log.LogError(f"{log['path']}: no tokens_per_step attribute, cannot use --tokens")
        color = colors[i % len(colors)]
        tr, ev = log["train"], log["eval"]
        if len(tr["step"]):
            ax.plot(np.asarray(tr["step"]) * scale, tr["loss"], color=color, lw=1.2, label=f"{label} train",
                    marker="o" if len(tr["step"]) < 3 else None, ms=4)  # a point or two stays visible
            drawn += 1
        if len(ev["step"]):
            last = np.asarray(ev["val_loss"], dtype=float)
            last = last[np.isfinite(last)]
            ax.plot(np.asarray(ev["step"]) * scale, ev["val_loss"], color=color, ls="--", marker="o", ms=3,
                    label=f"{label} val" + (f" (last {last[-1]:.3f})" if len(last) else ""))
            drawn += 1
    for branching in sorted({b for b in map(loss_floor, logs) if b}):
        floor = math.log(branching)
        ax.axhline(floor, color="0.35", ls=":", lw=1.2,
                   label=f"ln {branching} = {floor:.3f}: the lowest loss possible on this corpus")
    legend = ax.get_legend_handles_labels()[1]
    if drawn:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        if logy:
            ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no loss values logged yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("tokens" if tokens else "step")
    ax.set_ylabel("loss")
    if accuracy:
        plot_accuracy(axes[0][1], logs, labels, colors, tokens)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return legend


def plot_accuracy(ax, logs, labels, colors, tokens):
    for i, (log, label) in enumerate(zip(logs, labels)):
        if not has_hellaswag(log):
            continue
        ev, color = log["eval"], colors[i % len(colors)]
        scale = float(log["attrs"].get("tokens_per_step", 0) or 0) if tokens else 1.0
        ok = np.isfinite(np.asarray(ev["hellaswag_acc_norm"], dtype=float))
        x = np.asarray(ev["step"])[ok] * scale
        ax.plot(x, np.asarray(ev["hellaswag_acc_norm"])[ok], color=color, marker="o", ms=3, label=f"{label} acc_norm")
        ax.plot(x, np.asarray(ev["hellaswag_acc"])[ok], color=color, ls=":", marker=".", label=f"{label} acc")
    ax.set_xlabel("tokens" if tokens else "step")
    ax.set_ylabel("HellaSwag accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or log.h5 files")
    ap.add_argument("-o", "--output", default="loss.png", help="PNG to write (default loss.png)")
    ap.add_argument("--tokens", action="store_true", help="tokens seen on x instead of steps")
    ap.add_argument("--logy", action="store_true", help="logarithmic loss axis")
    args = ap.parse_args(argv)
    try:
        logs = [h5log.read_log(r) for r in args.runs]
        labels = [run_label(log, r) for log, r in zip(logs, args.runs)]
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        plot_runs(logs, labels, out, tokens=args.tokens, logy=args.logy)
    except h5log.LogError as e:
        print(f"plot_runs: error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
