"""What the plots share: which varied key colours the bars and lines (the ZeRO stage when it is
varied), how points are grouped (by the other varied keys: model size, micro-batch), the words for
a rank (GPU on cuda, else rank), and which curves coincide.

Imported by plot_sweep.py and plot_scaling.py after their project_env check.
"""
import math

import numpy as np

import h5log

COLOR_KEY = "training.zero_stage"
# ZeRO stages 0-3 and any other colour key's values, in order: distinct hues that stay apart in print
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
           "#CCB974", "#64B5CD")
FAILED_COLOR = "tab:red"
DONE = ("ok", "running", "checkpointed")


def short(key):
    """training.zero_stage -> zero_stage."""
    return key.split(".")[-1]


def sort_key(value):
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def color_key(varied):
    """The varied key whose values get the colours: the ZeRO stage when varied, else the first key."""
    if COLOR_KEY in varied:
        return COLOR_KEY
    return varied[0] if varied else None


def color_values(rows, key):
    """The colour key's values in the rows, in numeric (else text) order."""
    if key is None:
        return [""]
    return sorted({str(r.get(key, "")) for r in rows}, key=sort_key)


def colors_for(values):
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(values)}


def value_label(key, value):
    if key == COLOR_KEY:
        return f"ZeRO-{value}"
    return f"{short(key)}={value}" if key else "run"


def params_text(n):
    """124439808 -> '124M params'; '' when unknown."""
    if h5log.is_missing(n) or n is None or n <= 0:
        return ""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{suffix} params"
    return f"{int(n)} params"


def groups(rows, varied):
    """[(title, [rows])]: points grouped by every varied key but the colour key, in sweep order; the
    title names the group's values and its parameter count (the model size)."""
    ckey = color_key(varied)
    keys = [k for k in varied if k != ckey]
    out = {}
    for r in rows:
        out.setdefault(tuple(str(r.get(k, "")) for k in keys), []).append(r)
    titled = []
    for values, members in out.items():
        parts = [f"{short(k)}={v}" for k, v in zip(keys, values)]
        sizes = {params_text(r.get("n_params")) for r in members} - {""}
        if len(sizes) == 1:
            parts.append(sizes.pop())
        mb = {r.get("micro_batch") for r in members if not h5log.is_missing(r.get("micro_batch"))}
        if "training.micro_batch" not in varied and len(mb) == 1:
            parts.append(f"micro_batch={int(mb.pop())}")
        titled.append((", ".join(parts) or "all points", members))
    return titled


def devices(rows):
    return {str(r.get("device") or "") for r in rows} - {""}


SHARED_GPU_NOTE = "parallel.shared_gpu: host"  # in the message of a point whose ranks shared GPUs


def rank_word(rows, plural=True):
    """'GPU(s)' when every point ran on cuda with a GPU a rank, else 'rank(s)' (CPU points, ranks that
    shared GPUs (parallel.shared_gpu: host), or a summary that does not say)."""
    shared = any(SHARED_GPU_NOTE in str(r.get("message", "")) for r in rows)
    word = "GPU" if devices(rows) == {"cuda"} and not shared else "rank"
    return word + ("s" if plural else "")


def coinciding(curves, tolerance):
    """Clusters of curves that a reader cannot tell apart.

    curves: [(steps, values)] (numpy arrays). Two curves coincide when they have the same steps and
    differ nowhere by more than `tolerance`. Returns [(member indices, largest difference)], in order of
    first member; a curve alone is a cluster of one with difference 0.
    """
    clusters = []
    for i, (steps, values) in enumerate(curves):
        for members, worst in clusters:
            s0, v0 = curves[members[0]]
            if len(s0) == len(steps) and np.array_equal(s0, steps):
                diff = np.abs(np.asarray(v0, float) - np.asarray(values, float))
                both_nan = np.isnan(diff) & np.isnan(v0) & np.isnan(values)
                diff = np.where(both_nan, 0.0, diff)
                d = float(np.max(diff)) if len(diff) else 0.0
                if not math.isnan(d) and d <= tolerance:
                    members.append(i)
                    worst[0] = max(worst[0], d)
                    break
        else:
            clusters.append(([i], [0.0]))
    return [(members, worst[0]) for members, worst in clusters]


def coincide_note(n_members, difference):
    """What to say in a legend of n curves drawn as one."""
    if n_members < 2:
        return ""
    if difference == 0:
        return f" ({n_members} identical curves)"
    return f" ({n_members} curves, at most {difference:.2g} apart)"
