#!/usr/bin/env python3
"""Print a sweep's summary as an aligned table or a Markdown table.

    python3 scripts/summarize.py runs/mysweep [--markdown] [--from-logs]

Reads summary.h5, or the points' pNNN/log.h5 files when there is none yet (a sweep still running).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("h5py", "numpy", "yaml")
import h5log  # noqa: E402

MISSING = "-"


def _num(fmt):
    def f(v):
        return MISSING if h5log.is_missing(v) else fmt.format(v)
    return f


def _gib(v):
    """Two decimals from 1 GiB up, three significant digits below (tiny models stay readable)."""
    if h5log.is_missing(v):
        return MISSING
    g = v / h5log.GIB
    return f"{g:.2f}" if abs(g) >= 1 else f"{g:.3g}"


def _pct(v):
    return MISSING if h5log.is_missing(v) else f"{100.0 * v:.1f}"


# (header, summary column, formatter); varied keys are inserted after "index".
FIXED = [
    ("status", "status", str),
    ("tokens/s", "tokens_per_s", _num("{:,.0f}")),
    ("tokens/s/GPU", "tokens_per_s_per_gpu", _num("{:,.0f}")),
    ("MFU %", "mfu", _pct),
    ("median ms", "median_step_ms", _num("{:.1f}")),
    ("pred GiB", "pred_total", _gib),
    ("meas GiB", "meas_peak", _gib),  # CPU: peak resident set, the process's libraries included
    ("train loss", "final_train_loss", _num("{:.4f}")),
    ("val loss", "final_val_loss", _num("{:.4f}")),
]
LEFT = {"status"}


def build_table(summary):
    """(headers, rows of strings, left-aligned flags) for a read_summary() result."""
    spec = [("index", "index", str)]
    spec += [(k, k, lambda v: MISSING if h5log.is_missing(v) else str(v)) for k in summary["varied"]]
    # GPUs when every point ran on cuda; ranks otherwise (CPU points, or a summary that does not say)
    devices = {r.get("device") for r in summary["rows"]} - {None, ""}
    unit = "GPU" if devices == {"cuda"} else "rank"
    spec += FIXED[:1] + [(unit + "s", "world_size", _num("{:d}"))]
    if "training.micro_batch" not in summary["varied"]:  # e.g. micro_batch: max, found per point
        spec += [("micro-batch", "micro_batch", _num("{:d}"))]
    spec += [(h.replace("/GPU", "/" + unit), c, f) for h, c, f in FIXED[1:]]
    headers = [s[0] for s in spec]
    left = [s[0] in LEFT or s[1] in summary["varied"] for s in spec]
    rows = []
    for row in summary["rows"]:
        rows.append([fmt(row.get(col, float("nan"))) for _, col, fmt in spec])
    return headers, rows, left


def format_terminal(headers, rows, left):
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.ljust(w) if l else c.rjust(w) for c, w, l in zip(cells, widths, left)).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def format_markdown(headers, rows, left):
    def esc(s):
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |",
           "| " + " | ".join(":---" if l else "---:" for l in left) + " |"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def problems(summary):
    """Lines naming the points that did not finish cleanly, with their messages."""
    out = []
    for row in summary["rows"]:
        status = row.get("status", "")
        if status not in ("ok", "running"):
            msg = row.get("message", "") or ""
            out.append(f"point {row.get('index')} ({row.get('dir', '')}): {status}"
                       + (f": {msg}" if msg else ""))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", help="the sweep's output folder")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--from-logs", action="store_true",
                    help="compute the rows from pNNN/log.h5 even when summary.h5 exists")
    args = ap.parse_args(argv)
    try:
        summary = h5log.read_summary(args.sweep_dir, "logs" if args.from_logs else "auto")
    except h5log.LogError as e:
        print(f"summarize: error: {e}", file=sys.stderr)
        return 1
    headers, rows, left = build_table(summary)
    if args.markdown:
        print(format_markdown(headers, rows, left))
        notes = problems(summary)
        if notes:
            print()
            for n in notes:
                print(f"- {n}")
    else:
        print(f"{args.sweep_dir}: {len(rows)} point(s), from {summary['source']}")
        print(format_terminal(headers, rows, left))
        for n in problems(summary):
            print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
