#!/usr/bin/env python3
"""Plot a sweep: throughput.png, memory.png, loss.png, frontier.png.

    python3 scripts/plot_sweep.py runs/mysweep [-o OUT_DIR] [--from-logs]

Points are grouped by model size (every varied key but one, in one panel per group) and coloured by
the ZeRO stage (or, in a sweep that does not vary it, by the first varied key). throughput.png: tokens/s
per GPU (per rank on CPUs). memory.png: per rank, the predicted memory stacked by component beside the
measured peak (on CPUs the peak resident set above what the process held before it allocated the
model, its baseline). loss.png: train (solid) and val (dashed) loss; curves that coincide are drawn once
and labelled as such. frontier.png: tokens/s per GPU against the measured peak memory per GPU (as
memory.png measures it), one marker per point labelled with its varied values ("int8 r3 mb8"), the
Pareto frontier (the most tokens/s within a memory budget) as a step line through the points no other
point beats in both, the others faded, points that did not run to the end at their predicted total on
the x axis, and the memory of 12, 16 and 24 GiB cards where the axis reaches them; beside it, the
frontier's points (and those that did not run) as memory.png draws them. Every sweep whose points train
one model gets it, whichever keys it varies; a sweep over model sizes gets none (a note on stderr says
so), since no memory budget compares the speeds of different models. Works on a sweep still running:
points that failed, ran out of memory or have not started are drawn as such, without bars.
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
import matplotlib.text  # noqa: E402
import matplotlib.ticker  # noqa: E402
import matplotlib.transforms  # noqa: E402
import numpy as np  # noqa: E402

import h5log  # noqa: E402
import plot_style as style  # noqa: E402
import yaml  # noqa: E402

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


def _mark_missing(ax, x, row, y=0.0, label="", fontsize=9):
    """The point's status (after its label, when given), upwards from (x, y), in the failed colour."""
    status = row.get("status", "") or "?"
    ax.text(x, y, f"{label}: {status}" if label else status, ha="center", va="bottom", rotation=90,
            color=style.FAILED_COLOR, fontsize=fontsize)


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


# Memory of common cards (GiB), a dashed line each on frontier.png where its memory axis reaches them
CARD_GIB = (12, 16, 24)
# A varied key's value in a point's label on frontier.png ("int8 r3 mb8"); any other key is key=value
COMPACT = {"training.optimizer_state": "{}", "training.precision": "{}", "training.recompute": "r{}",
           "training.micro_batch": "mb{}", "training.grad_accum": "ga{}", "training.zero_stage": "Z{}",
           "model.preset": "{}"}
GPT2_NAMES = {"d12": "GPT-2 124M", "d24": "GPT-2 350M", "d36": "GPT-2 774M", "d48": "GPT-2 1558M"}


def compact_label(row, keys):
    """What tells the point apart in few characters: its value of each key, e.g. 'int8 r3 mb8 no-master'."""
    parts = []
    for k in keys:
        v = str(row.get(k, ""))
        if k == "training.master_weights":
            parts.append({"true": "fp32-master", "fp32": "fp32-master", "false": "no-master", "none": "no-master",
                          "compensated": "comp-master"}.get(v.lower(), f"master={v}"))
        else:
            parts.append(COMPACT[k].format(v) if k in COMPACT else f"{style.short(k)}={v}")
    return " ".join(parts) or "run"


def pareto_front(memory, speed, ok=None):
    """Indices of the points on the memory frontier, by memory (equal memory: by index).

    A point is on it when no other point has both less or equal memory and more or equal speed, strictly
    better in one: the most speed for at most its memory. Points alike in both are on it together. A point
    whose memory or speed is NaN, or whose ok is false (it failed, ran out of memory, has not run), is
    never on it and pushes no other point off it.
    """
    n = len(memory)
    ok = [True] * n if ok is None else list(ok)
    cand = [i for i in range(n) if ok[i] and math.isfinite(memory[i]) and math.isfinite(speed[i])]

    def beats(j, i):
        return (memory[j] <= memory[i] and speed[j] >= speed[i]
                and (memory[j] < memory[i] or speed[j] > speed[i]))
    front = [i for i in cand if not any(beats(j, i) for j in cand)]
    return sorted(front, key=lambda i: (memory[i], i))


def frontier_skipped(summary):
    """Why the sweep gets no frontier.png ('' when it gets one): its points train models of several sizes,
    whose speeds no one budget compares."""
    sizes = sorted({int(r["n_params"]) for r in summary["rows"] if not h5log.is_missing(r.get("n_params"))
                    and r["n_params"] > 0})
    if len(sizes) > 1:
        return (f"its points train {len(sizes)} model sizes ({', '.join(style.params_text(n) for n in sizes)});"
                " a frontier compares ways to train one model")
    return ""


def _model_text(summary, sweep_dir):
    """'GPT-2 1558M (d48, 1.56B params)', 'n_layer 2, n_embd 32 (28.5k params)' from a point's log's
    config, else the parameter count alone."""
    sizes = {style.params_text(r.get("n_params")) for r in summary["rows"]} - {""}
    params = sizes.pop() if len(sizes) == 1 else ""
    for r in summary["rows"]:
        if r.get("status") in ("missing", "unreadable", "damaged"):
            continue
        log = h5log.point_log(sweep_dir, r)
        if log is None:
            continue
        try:
            model = (yaml.safe_load(log["attrs"].get("config_yaml", "") or "") or {}).get("model") or {}
        except yaml.YAMLError:
            break
        preset = str(model.get("preset") or "")
        if preset in GPT2_NAMES:
            name, detail = GPT2_NAMES[preset], [preset, params]
        elif preset:
            name, detail = f"model {preset}", [params]
        elif model.get("n_layer"):
            name, detail = f"n_layer {model['n_layer']}, n_embd {model.get('n_embd')}", [params]
        else:
            break
        detail = ", ".join(d for d in detail if d)
        return f"{name} ({detail})" if detail else name
    return params or "model"


def _global_batch_text(rows):
    """'global batch 524,288 tokens': the tokens of an optimizer step (tokens/s x median step time) of the
    points that ran; both ends when they differ."""
    toks = sorted({round(_value(r, "tokens_per_s") * _value(r, "median_step_ms") / 1000.0) for r in rows
                   if r.get("status") in style.DONE and math.isfinite(_value(r, "tokens_per_s") *
                                                                   _value(r, "median_step_ms"))})
    if not toks:
        return ""
    if len(toks) == 1:
        return f"global batch {toks[0]:,} tokens"
    return f"global batch {toks[0]:,}-{toks[-1]:,} tokens (differs between points)"


# Where a label may go (offsets in points from its marker, with the text's alignment there): beside,
# above and below it first, then farther out in eight directions, joined to it by a thin line
_DIRECTIONS = [(1, 0.4, "left", "bottom"), (1, -0.4, "left", "top"), (-1, 0.4, "right", "bottom"),
               (-1, -0.4, "right", "top"), (0, 1, "center", "bottom"), (0, -1, "center", "top"),
               (0.7, 0.7, "left", "bottom"), (-0.7, 0.7, "right", "bottom"), (0.7, -0.7, "left", "top"),
               (-0.7, -0.7, "right", "top")]
LABEL_OFFSETS = [(dx * r, dy * r, ha, va, r > 8) for r in (6, 14, 24, 36, 50) for dx, dy, ha, va in _DIRECTIONS]


def _place_labels(fig, ax, items, lines=()):
    """items: [(x, y, text, text kwargs)], most important first. Each label goes to the first offset where
    it overlaps no label, marker or line (lines: [(xs, ys)] in data coordinates) placed before it and stays
    inside the axes, else where it overlaps least. The axes' limits and layout must be final."""
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    taken = []
    for x, y, _, _ in items:
        px, py = ax.transData.transform((x, y))
        taken.append((px - 4, py - 4, px + 4, py + 4))
    for xs, ys in lines:  # a small box every few pixels along each segment
        pts = ax.transData.transform(np.column_stack([xs, ys]))
        for (x0, y0), (x1, y1) in zip(pts[:-1], pts[1:]):
            for f in np.linspace(0.0, 1.0, max(2, int(math.hypot(x1 - x0, y1 - y0) / 4))):
                px, py = x0 + f * (x1 - x0), y0 + f * (y1 - y0)
                taken.append((px - 1, py - 1, px + 1, py + 1))

    def cost(b):
        hit = sum(max(0.0, min(b.x1, t[2]) - max(b.x0, t[0])) * max(0.0, min(b.y1, t[3]) - max(b.y0, t[1]))
                  for t in taken)
        outside = (max(0.0, box.x0 - b.x0) + max(0.0, b.x1 - box.x1) + max(0.0, box.y0 - b.y0)
                   + max(0.0, b.y1 - box.y1))
        return hit + 1000.0 * outside

    for x, y, text, kw in items:
        best = None
        for dx, dy, ha, va, line in LABEL_OFFSETS:
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                            arrowprops=dict(arrowstyle="-", lw=0.5, color="0.6", shrinkA=1, shrinkB=3)
                            if line else None, **kw)
            t.update_positions(renderer)
            b = matplotlib.text.Text.get_window_extent(t, renderer).padded(1.0)  # the text, not its line
            c = cost(b)
            if best is None or c < best[0]:
                if best is not None:
                    best[1].remove()
                best = (c, t, b)
            else:
                t.remove()
            if c == 0:
                break
        taken.append((best[2].x0, best[2].y0, best[2].x1, best[2].y1))


def _frontier_panel(ax, rows, varied, labels, xs, speed, where, front, scale):
    """frontier.png's left panel; returns the GiB of the card lines drawn and the step line's corners."""
    ckey = style.color_key(varied)
    colors = style.colors_for(style.color_values(rows, ckey))
    placed = [x for x, w in zip(xs, where) if w]
    lo, hi = (min(placed), max(placed)) if placed else (0.0, 1.0)
    pad = (hi - lo) * 0.08 or hi * 0.1 or 1.0
    xlim = (max(0.0, lo - pad), hi + pad)
    ran = [w in ("frontier", "off") for w in where]
    ran_speed = [s for s, r in zip(speed, ran) if r]
    slow, fast = (min(ran_speed), max(ran_speed)) if ran_speed else (0.0, 1.0)
    # the points' range with room for labels, and a strip at the bottom for the points that did not run
    span = (fast - slow) or fast * 0.1 or 1.0
    ylim = (max(0.0, slow - span * (0.45 if "predicted" in where else 0.12)), fast + span * 0.12)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    cards = []
    for gib in CARD_GIB:
        x = gib * h5log.GIB / scale
        if xlim[0] < x < xlim[1]:
            cards.append(gib)
            ax.axvline(x, color="0.5", ls="--", lw=0.8, zorder=0)
            ax.text(x, 1.0, f"{gib} GiB", transform=matplotlib.transforms.blended_transform_factory(
                ax.transData, ax.transAxes), ha="center", va="bottom", fontsize=7, color="0.4")
    corners = []
    if front:
        fx = [xs[i] for i in front] + [xlim[1]]  # on to the right edge: no more speed for more memory
        fy = [speed[i] for i in front] + [speed[front[-1]]]
        corners = [(np.repeat(fx, 2)[1:], np.repeat(fy, 2)[:-1])]
        ax.step(fx, fy, where="post", color="0.15", lw=1.3, zorder=1,
                label="Pareto frontier: the most tokens/s within a memory budget")
    for i, r in enumerate(rows):
        color = colors[str(r.get(ckey, ""))]
        if where[i] == "frontier":
            ax.scatter(xs[i], speed[i], s=46, color=color, edgecolors="black", linewidths=0.8, zorder=3)
        elif where[i] == "off":
            ax.scatter(xs[i], speed[i], s=30, color=color, alpha=0.35, zorder=2)
        elif where[i] == "predicted":
            ax.scatter(xs[i], ylim[0], s=40, marker="x", color=style.FAILED_COLOR, zorder=3, clip_on=False)
            _mark_missing(ax, xs[i], r, y=ylim[0] + span * 0.02, label=labels[i], fontsize=7)
    handles = [plt.Line2D([], [], ls="", marker="o", color=colors[v], label=style.value_label(ckey, v))
               for v in style.color_values([r for r, ok in zip(rows, ran) if ok] or rows, ckey)]
    handles += ax.get_legend_handles_labels()[0]
    handles.append(plt.Line2D([], [], ls="", marker="o", color="0.5", alpha=0.35,
                              label="off the frontier: another point is faster in as little memory"))
    if cards:
        handles.append(plt.Line2D([], [], ls="--", lw=0.8, color="0.5",
                                  label=f"the memory of a {' / '.join(map(str, cards))} GiB card"))
    if "predicted" in where:
        handles.append(plt.Line2D([], [], ls="", marker="x", color=style.FAILED_COLOR,
                                  label="did not run to the end: at its predicted total, on the x axis"))
    unplaced = [f"{labels[i]} ({rows[i].get('status') or '?'})" for i in range(len(rows)) if not where[i]]
    if unplaced:  # named under the legend: no prediction either (not run yet)
        handles.append(plt.Line2D([], [], ls="", label=_wrap("not drawn, no memory to place them by: "
                                                            + ", ".join(unplaced), 60)))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _si(v)))
    ax.grid(alpha=0.3)
    ax.set_title(f"one marker per point, labelled by {', '.join(style.short(k) for k in varied) or 'run'}",
                 fontsize=9, pad=14 if cards else 6)  # room for the cards' sizes
    return cards, corners


def plot_frontier(summary, sweep_dir, path):
    """tokens/s per GPU against the measured peak memory per GPU, the Pareto frontier drawn through the
    points that no other beats in both (left), and the memory of the frontier's points and of those that
    did not run to the end, predicted by component beside measured (right).

    Returns what it drew: {"title", "unit", "xlabel", "legend", "points": [(label, memory, tokens/s,
    status, where)] (where: "frontier", "off" (faded), "predicted" (failed, out of memory or not run: at
    its predicted total on the x axis) or "" (nothing to place it by)), "frontier": [labels by memory],
    "cards": [GiB of the card lines drawn], "bars": [(label, predicted, measured)]}; memory in the plot's
    unit."""
    rows, varied = summary["rows"], summary["varied"]
    mem = _memory_context(summary, sweep_dir)
    unit, scale = mem["unit"], mem["scale"]
    rank = style.rank_word(rows, plural=False)
    n = len(rows)
    labels = [compact_label(r, varied) for r in rows]
    speed = [_value(r, "tokens_per_s_per_gpu") for r in rows]
    measured = [m / scale for m in mem["measured"]]
    predicted = [_value(r, "pred_total") / scale for r in rows]
    done = [r.get("status") in style.DONE for r in rows]
    front = pareto_front(measured, speed, done)
    ran = [done[i] and math.isfinite(measured[i]) and math.isfinite(speed[i]) for i in range(n)]
    where = ["frontier" if i in front else "off" if ran[i] else "predicted" if math.isfinite(predicted[i])
             else "" for i in range(n)]
    xs = [measured[i] if ran[i] else predicted[i] for i in range(n)]
    drawn = {"unit": unit, "frontier": [labels[i] for i in front],
             "points": [(labels[i], xs[i], speed[i] if ran[i] else math.nan, rows[i].get("status", ""), where[i])
                        for i in range(n)]}

    bars = sorted([i for i in range(n) if where[i] in ("frontier", "predicted")], key=lambda i: (xs[i], i))
    right = max(3.4, 0.75 * len(bars) + 1.0)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(8.5 + right, 6.4), gridspec_kw={"width_ratios": [8.5, right]})
    drawn["cards"], corners = _frontier_panel(ax, rows, varied, labels, xs, speed, where, front, scale)
    drawn["xlabel"] = f"measured peak memory per {rank} ({unit})" + (", peak RSS above baseline" if mem["cpu"]
                                                                     else "")
    ax.set_xlabel(drawn["xlabel"])
    ax.set_ylabel(f"tokens/s per {rank}")

    wrapped = ["\n".join(textwrap.wrap(labels[i], 9, break_on_hyphens=False)) for i in bars]
    stacked = _memory_bars(bx, mem, [rows[i] for i in bars], [mem["measured"][i] for i in bars], wrapped)
    drawn["bars"] = [(labels[i], pred, meas) for i, (_, pred, meas) in zip(bars, stacked)]
    bx.tick_params(axis="x", labelsize=7)
    bx.set_ylabel(f"{unit} per {rank}")
    bx.set_title("the frontier's points" + (" and those that did not run to the end" if "predicted" in where else "")
                 + ", by memory:\npredicted by component (left bar), measured (right bar)", fontsize=9)
    if not bars:
        bx.text(0.5, 0.5, "no point ran", ha="center", va="center", transform=bx.transAxes)
    drawn["legend"] = _memory_legend(fig, bx, mem, anchor=(1.0, 0.8))

    batch = _global_batch_text(rows)
    title = (f"memory frontier of {_model_text(summary, sweep_dir)}{', ' + batch if batch else ''}"
             f"{_world_text(rows)}: tokens/s per {rank} against peak memory per {rank}\n({summary['source']})")
    if mem["cpu_note"]:
        title += "\n" + mem["cpu_note"]
    drawn["title"] = title
    width = int((fig.get_size_inches()[0] + 2.0) * 13)  # characters across the figure, legend included
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.split("\n")), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    # labels last, on the final layout: the frontier's first, then the faded points'
    _place_labels(fig, ax, [(xs[i], speed[i], labels[i], {"fontsize": 7}) for i in front]
                  + [(xs[i], speed[i], labels[i], {"fontsize": 6.5, "alpha": 0.6}) for i in range(n)
                     if where[i] == "off"], corners)
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
    skipped = frontier_skipped(summary)
    if skipped:
        print(f"plot_sweep: no frontier.png: {skipped}", file=sys.stderr)
    else:
        paths.append(out / "frontier.png")
        plot_frontier(summary, args.sweep_dir, paths[-1])
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
