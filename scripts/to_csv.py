#!/usr/bin/env python3
"""Write a run's /train and /eval series (docs/FORMATS.md) as CSV: train.csv and eval.csv.

    python3 scripts/to_csv.py runs/myrun [-o OUT_DIR]      # a run: one row per logged step / evaluation
    python3 scripts/to_csv.py runs/mysweep [-o OUT_DIR]    # a sweep: every point's rows, with its values

One column per dataset of the group, in the order of the trainer's own train.csv and eval.csv (log.csv:
step first, then as docs/FORMATS.md lists them, then any others), numbers as the trainer writes them:
the shortest text that reads back exactly (lr: as the float32 the optimizer used), a whole number
without ".0", NaN as an empty cell; eval.csv also has each evaluation's sample text. A sweep's files
start with `point` and one column per varied key. OUT_DIR defaults to the run (or sweep) folder; the
files are replaced whole. Works on a run still going (its log is read as far as it has been flushed),
but never writes into the folder of a live run (a trainer holds its .lock), whose train.csv and eval.csv
are the trainer's to append to: give -o OUT_DIR then. A damaged log is an error naming it (exit 1).
"""
import argparse
import csv
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("h5py", "numpy", "yaml")
import numpy as np  # noqa: E402

import h5log  # noqa: E402


def series_names(series, preferred):
    """The group's dataset names: step, then FORMATS.md's order, then the rest by name (read_log gives
    the series an older log lacks as empty arrays: those are left out)."""
    n = len(series["step"])
    names = [c for c in preferred if c in series and len(series[c]) == n]
    return names + sorted(c for c in series if c not in names and len(series[c]) == n)


# series the trainer computes in float32 (the learning rate the optimizer is given): their float32 text
FLOAT32_COLUMNS = ("lr",)


def cell(value, float32=False):
    """value as the trainer's CSV writes it (src/io/csv_log.cpp): the shortest text that reads back
    exactly, in Python's layout, a whole number without '.0', NaN empty."""
    if isinstance(value, str):
        return value
    if isinstance(value, (np.integer, int)):
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        return ""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(np.float32(value)) if float32 else repr(value)


def log_tables(log):
    """({"columns", "rows"} for train, the same for eval) of one read_log() result."""
    train = log["train"]
    tcols = series_names(train, h5log.TRAIN_FIELDS)
    trows = [[train[c][i] for c in tcols] for i in range(len(train["step"]))]
    ev = log["eval"]
    ecols = [c for c in series_names(ev, h5log.EVAL_FIELDS) if c != "sample_end"]
    erows = [[ev[c][i] for c in ecols] + [log["samples"][i] if i < len(log["samples"]) else ""]
             for i in range(len(ev["step"]))]
    return {"columns": tcols, "rows": trows}, {"columns": ecols + ["sample"], "rows": erows}


def sweep_tables(sweep_dir):
    """The points' tables one after another, each row led by its point folder and varied values."""
    summary = h5log.read_summary(sweep_dir, "logs")
    varied = summary["varied"]
    out = [None, None]
    for row in summary["rows"]:
        log = h5log.point_log(sweep_dir, row)
        if log is None:
            continue
        lead = [row["dir"]] + [str(row.get(k, "")) for k in varied]
        for i, table in enumerate(log_tables(log)):
            if out[i] is None:
                out[i] = {"columns": ["point"] + varied + table["columns"], "rows": []}
            cols = out[i]["columns"][1 + len(varied):]
            if table["columns"] != cols:  # a point that logs other series (an older build): by name
                index = {c: j for j, c in enumerate(table["columns"])}
                table = {"rows": [[r[index[c]] if c in index else math.nan for c in cols]
                                  for r in table["rows"]]}
            out[i]["rows"] += [lead + r for r in table["rows"]]
    if out[0] is None:
        raise h5log.LogError(f"{sweep_dir}: no point has a readable log.h5 yet")
    return out


def write_csv(path, table):
    """Replace path whole (a temp file renamed over it), so a reader never sees half a table."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(table["columns"])
            f32 = [c in FLOAT32_COLUMNS for c in table["columns"]]
            for r in table["rows"]:
                w.writerow([cell(v, f) for v, f in zip(r, f32)])
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def is_sweep(path):
    path = Path(path)
    return path.is_dir() and not (path / "log.h5").is_file() and bool(h5log.point_dirs(path))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="a run folder (or its log.h5), or a sweep folder")
    ap.add_argument("-o", "--out-dir", help="where train.csv and eval.csv go (default: the run or sweep folder)")
    args = ap.parse_args(argv)
    try:
        if is_sweep(args.path):
            tables = sweep_tables(args.path)
            default = Path(args.path)
        else:
            tables = log_tables(h5log.read_log(args.path))
            default = h5log.find_log(args.path).parent
        out = Path(args.out_dir) if args.out_dir else default
        if h5log.run_is_live(out):
            raise h5log.LogError(f"{out} is the folder of a live run (a trainer holds {out / '.lock'}): its "
                                 "train.csv and eval.csv are the trainer's (log.csv), not replaced; give -o "
                                 "OUT_DIR")
        if out.exists() and not out.is_dir():
            raise h5log.LogError(f"-o {out} is a file: give a folder (it is made when missing)")
        out.mkdir(parents=True, exist_ok=True)
        for name, table in zip(("train.csv", "eval.csv"), tables):
            write_csv(out / name, table)
            print(f"{out / name}: {len(table['rows'])} row(s)")
    except (h5log.LogError, OSError) as e:
        print(f"to_csv: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
