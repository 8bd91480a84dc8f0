#!/usr/bin/env python3
"""Turn run logs (log.h5) into TensorBoard event files: one TensorBoard run per run or sweep point.

    python3 scripts/to_tensorboard.py runs/myrun                  # -> runs/myrun/tensorboard/
    python3 scripts/to_tensorboard.py runs/mysweep                # -> runs/mysweep/tensorboard/p000 .../
    python3 scripts/to_tensorboard.py runs/a runs/b -o tb         # -> tb/a/, tb/b/ (several, side by side)
    python3 scripts/to_tensorboard.py runs/myrun --follow         # keep adding steps while the run goes
    .venv/bin/tensorboard --logdir runs/myrun/tensorboard

Each /train and /eval dataset becomes a scalar tag (train/loss, train/lr, ..., eval/val_loss; NaN, such
as MFU on a CPU, is left out) at its step, with the wall time of /train/elapsed_s; the config
(config_yaml), the run's attributes and memory, and each evaluation's sample become text. A sweep point's
TensorBoard run is named by its folder and varied values (`p003_zero_stage-1_preset-d48`). A run still
going is converted as far as it has been flushed. Event files this tool wrote before into the same folder
are replaced, others left alone. A log that cannot be read (damaged) is an error naming it (exit 1), and
no event file is written for it.

--follow polls the runs and appends what is new until each has ended: its status is ok, failed or oom;
or it stopped (status checkpointed after a stop signal, or running with its .lock free: killed) and no
trainer has held its .lock for --grace seconds (default 600), since a requeued or resumed run continues
the same log (the steps it runs again replace those after its checkpoint). --until-stop ends at a stop
without waiting for a resume. Ctrl-C ends it earlier.
"""
import argparse
import math
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("h5py", "numpy", "yaml", "tensorboard")
import numpy as np  # noqa: E402
from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.compat.proto.event_pb2 import SessionLog  # noqa: E402
from tensorboard.plugins.text.summary_v2 import text_pb  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402

import h5log  # noqa: E402

# event files of this tool end so, and only those are replaced on a new conversion
SUFFIX = ".log_h5"
FINAL = ("ok", "failed", "oom")  # no resume follows these (a stop, "checkpointed", may be resumed)
ENDED = FINAL + ("checkpointed",)  # an outcome to write
SKIP_TRAIN = ("step",)
SKIP_EVAL = ("step", "sample_end")


def _md_table(pairs):
    lines = ["| key | value |", "| --- | --- |"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in pairs]
    return "\n".join(lines)


def _memory_text(memory):
    comps = memory["components"] + ["total"]
    pred, meas = memory.get("predicted", {}), memory.get("measured", {})
    lines = ["| component | predicted MiB | measured MiB |", "| --- | ---: | ---: |"]
    for c in comps:
        p = f"{pred[c] / 2**20:.2f}" if c in pred else "-"
        m = f"{meas[c] / 2**20:.2f}" if c in meas else "-"
        lines.append(f"| {c} | {p} | {m} |")
    for k in ("peak", "baseline"):
        if k in meas:
            lines.append(f"| measured {k} | | {meas[k] / 2**20:.2f} |")
    return "\n".join(lines)


class RunWriter:
    """One TensorBoard run from one log.h5: writes what the log holds beyond what it wrote before."""

    def __init__(self, log_path, out_dir):
        self.log_path = Path(log_path)
        self.out_dir = Path(out_dir)
        self.writer = None  # made at the first good read: a log that cannot be read leaves no event file
        self.train_rows = 0
        self.eval_rows = 0
        self.last_step = None  # the last train step written
        self.resumed = None  # the log's resumed_from_step when last read
        self.wrote_texts = False
        self.wrote_outcome = False
        self.t0 = None
        self.status = "running"
        self.free_since = None  # when the run's lock was first seen free while it had not ended

    def _open_writer(self):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for old in self.out_dir.glob("events.out.tfevents.*" + SUFFIX):
            old.unlink()
        self.writer = EventFileWriter(str(self.out_dir), filename_suffix=SUFFIX)

    def _resync(self, steps, evals, a):
        """A resumed run dropped its rows after the checkpoint's step and writes them again (a run that
        started over, its whole log): TensorBoard is told to forget the steps from there (a SessionLog
        START purges the events at and after its step) and this writer goes on from there."""
        resumed = a.get("resumed_from_step")
        since = None
        if resumed is not None and resumed != self.resumed and self.last_step is not None \
                and int(resumed) < self.last_step:
            since = int(resumed)
        elif len(steps) < self.train_rows:
            since = int(steps[-1]) if len(steps) else 0
        self.resumed = resumed
        if since is None:
            return
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=since + 1,
                                              session_log=SessionLog(status=SessionLog.START)))
        self.train_rows = int(np.searchsorted(steps, since, side="right"))
        self.eval_rows = int(np.searchsorted(np.asarray(evals), since, side="right"))
        self.last_step = since
        self.wrote_outcome = False

    def _emit(self, step, wall, values=(), texts=()):
        summary = summary_pb2.Summary()
        for tag, v in values:
            summary.value.add(tag=tag, simple_value=v)
        for tag, text in texts:
            summary.MergeFrom(text_pb(tag, text))
        if summary.value:
            self.writer.add_event(event_pb2.Event(wall_time=wall, step=int(step), summary=summary))

    def update(self):
        """Reads the log again and writes its new rows; returns the number of new train rows."""
        log = h5log.read_log(self.log_path)
        a = log["attrs"]
        self.status = a.get("status", "running")
        train, ev = log["train"], log["eval"]
        steps = np.asarray(train["step"])
        if self.writer is None:
            self._open_writer()
        self._resync(steps, ev["step"], a)
        elapsed = np.asarray(train.get("elapsed_s", np.zeros(0)), dtype=float)
        if self.t0 is None:  # the run's start: the log's last change less the time it had run by then
            last = float(elapsed[-1]) if len(elapsed) and np.isfinite(elapsed[-1]) else 0.0
            self.t0 = os.stat(self.log_path).st_mtime - last

        def wall(i):
            return self.t0 + (float(elapsed[i]) if i < len(elapsed) and np.isfinite(elapsed[i]) else 0.0)

        if not self.wrote_texts:
            first = int(steps[0]) if len(steps) else 0
            config = a.get("config_yaml", "")
            attrs = [(k, a[k]) for k in sorted(a) if k != "config_yaml"]
            self._emit(first, self.t0, texts=[("config", f"```\n{config}\n```"), ("run", _md_table(attrs))])
            self.wrote_texts = True
        # (read_log gives the series an older log lacks as empty arrays: those have no tag)
        names = [n for n in train if n not in SKIP_TRAIN and len(train[n]) == len(steps)]
        new = range(self.train_rows, len(steps))
        for i in new:
            values = [(f"train/{n}", float(train[n][i])) for n in names if math.isfinite(float(train[n][i]))]
            self._emit(steps[i], wall(i), values)
        self.train_rows = len(steps)
        if len(steps):
            self.last_step = int(steps[-1])
        enames = [n for n in ev if n not in SKIP_EVAL and len(ev[n]) == len(ev["step"])]
        for j in range(self.eval_rows, len(ev["step"])):
            step = int(ev["step"][j])
            # an evaluation's wall time: that of its step's train row (evaluations follow the step)
            rows = np.nonzero(steps == step)[0]
            w = wall(int(rows[-1])) if len(rows) else wall(len(steps) - 1) if len(steps) else self.t0
            values = [(f"eval/{n}", float(ev[n][j])) for n in enames if math.isfinite(float(ev[n][j]))]
            sample = log["samples"][j] if j < len(log["samples"]) else ""
            self._emit(step, w, values, [("eval/sample", sample)] if sample else [])
        self.eval_rows = len(ev["step"])
        if self.status in ENDED and not self.wrote_outcome:
            last = int(steps[-1]) if len(steps) else 0
            outcome = [("status", self.status), ("message", a.get("message", ""))]
            self._emit(last, wall(len(steps) - 1) if len(steps) else self.t0,
                       texts=[("outcome", _md_table(outcome)), ("memory", _memory_text(log["memory"]))])
            self.wrote_outcome = True
        self.writer.flush()
        return len(new)

    def ended(self, until_stop, grace):
        """Whether --follow is done with this run (see the module's doc)."""
        if self.status in FINAL:
            return True
        if h5log.run_is_live(self.log_path.parent):
            self.free_since = None
            return False
        if until_stop:
            return True
        if self.free_since is None:
            self.free_since = time.time()
        return time.time() - self.free_since >= grace

    def close(self):
        if self.writer is not None:
            self.writer.close()


def point_name(row, varied):
    """'p003_zero_stage-1_preset-d48': a sweep point's TensorBoard run (a folder name needing no quotes:
    letters, digits, '.', '-' and '_')."""
    parts = [row["dir"]] + [f"{k.split('.')[-1]}-{row.get(k, '')}" for k in varied]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts))


def targets(paths, out):
    """[(log.h5 path or None, out folder, label)]; None: a sweep point whose log does not exist yet."""
    found = []
    for path in paths:
        path = Path(path)
        base = Path(out) / path.name if out and len(paths) > 1 else Path(out) if out else path / "tensorboard"
        if path.is_dir() and not (path / "log.h5").is_file() and h5log.point_dirs(path):
            summary = h5log.read_summary(path, "logs")
            for row in summary["rows"]:
                log = path / row["dir"] / "log.h5"
                found.append((log, base / point_name(row, summary["varied"]), f"{path}/{row['dir']}"))
        else:
            log = h5log.find_log(path)
            found.append((log, base, str(path)))
    return found


def convert(paths, out=None, follow=False, interval=10.0, say=print, until_stop=False, grace=600.0):
    """Writes the event files; with follow, keeps polling until every run has ended. Returns the writers.
    A log that cannot be read is LogError; with follow, only once no trainer holds its run's lock (a
    resumed run replaces its log while holding it)."""
    todo = targets(paths, out)
    writers = {}
    waiting = set()  # runs told to be waiting for a resume
    try:
        while True:
            for log, folder, label in todo:
                if log in writers or not log.is_file():
                    continue  # a sweep point not started yet: picked up when its log appears
                writers[log] = RunWriter(log, folder)
            for log, w in writers.items():
                try:
                    n = w.update()
                except h5log.LogError as e:
                    if not follow or not h5log.run_is_live(log.parent):
                        raise
                    say(f"to_tensorboard: {e}; its run holds its lock: retrying")
                    continue
                if n or not follow:
                    say(f"{w.out_dir}: {w.train_rows} step(s), {w.eval_rows} evaluation(s), {w.status}")
            pending = [t for t in todo if t[0] not in writers]
            running = []
            for log, w in writers.items():
                if not w.ended(until_stop, grace):
                    running.append(w)
                    if w.free_since is not None and log not in waiting:
                        waiting.add(log)
                        say(f"{log}: stopped ({w.status}, no trainer holds its lock): waiting up to {grace:g} s "
                            "for a resume (--until-stop ends at a stop)")
                else:
                    waiting.discard(log)
            if not follow or (not running and not pending):
                break
            time.sleep(interval)
    finally:
        for w in writers.values():
            w.close()
    if not writers:
        raise h5log.LogError("no log.h5 to convert in " + ", ".join(map(str, paths)))
    return writers


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="run folders (or their log.h5) and sweep folders")
    ap.add_argument("-o", "--out-dir", help="TensorBoard's --logdir (default: PATH/tensorboard for one path)")
    ap.add_argument("--follow", action="store_true", help="keep converting until every run has ended")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between polls with --follow")
    ap.add_argument("--grace", type=float, default=600.0,
                    help="with --follow: seconds a stopped run (no trainer holding its lock) is followed for a "
                         "resume (default 600)")
    ap.add_argument("--until-stop", action="store_true",
                    help="with --follow: end when a run stops (signal, kill), not waiting for a resume")
    args = ap.parse_args(argv)
    if len(args.paths) > 1 and not args.out_dir:
        ap.error("several paths need -o OUT_DIR (each becomes OUT_DIR/<name>)")
    if args.out_dir and Path(args.out_dir).exists() and not Path(args.out_dir).is_dir():
        print(f"to_tensorboard: error: -o {args.out_dir} is a file: give a folder (TensorBoard's --logdir; it is "
              "made when missing)", file=sys.stderr)
        return 1
    try:
        convert(args.paths, args.out_dir, args.follow, args.interval, until_stop=args.until_stop, grace=args.grace)
    except h5log.LogError as e:
        print(f"to_tensorboard: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # an output folder that cannot be made or written
        print(f"to_tensorboard: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    logdir = args.out_dir or Path(args.paths[0]) / "tensorboard"
    print(f"view: .venv/bin/tensorboard --logdir {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
