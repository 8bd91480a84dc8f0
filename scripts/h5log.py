"""Read the trainer's HDF5 output (docs/FORMATS.md) into plain dicts and numpy arrays.

    log = read_log("runs/myrun")            # a run folder or its log.h5
    log["attrs"]["status"], log["train"]["loss"], log["memory"]["predicted"]["total"]
    summary = read_summary("runs/mysweep")  # summary.h5, or the points' pNNN/log.h5 files

Files still being written (SWMR) are read as far as they have been flushed. A damaged file is LogError
naming it, within a second: no read waits on HDF5's retries (open_h5).
"""
import csv
import functools
import math
import os
import re
import sys
from pathlib import Path

import h5py
import numpy as np
import yaml

# The memory components of logs that predate the `components` attribute. Every newer log lists its own
# (the C++ table kMemoryComponents, src/base/memory.hpp) as that attribute of /memory/predicted and
# /memory/measured, and a summary names them in its pred_<component> columns: read_log and read_summary
# take those, so a new or renamed component needs no change here.
COMPONENTS = ("params", "grads", "master", "adam_m", "adam_v", "activations", "workspace", "comm", "snapshot")
# The /train and /eval series in the trainer's order (kTrainMetrics, kEvalMetrics: src/io/metrics.hpp), the
# order of its train.csv and eval.csv columns.
TRAIN_FIELDS = ("step", "loss", "lr", "grad_norm", "step_ms", "tokens_per_s", "mfu", "elapsed_s", "tokens",
                "fp8_saturated", "peak_memory", "gathered_bytes", "offload_ms", "offload_wait_ms")
EVAL_FIELDS = ("step", "val_loss", "hellaswag_acc", "hellaswag_acc_norm", "sample_end")
STATUSES = ("running", "ok", "failed", "oom", "checkpointed")
GIB = float(1 << 30)

# Summary columns around the varied keys, in file order (docs/FORMATS.md, "Sweep summary"): these, then
# the memory columns (memory_columns()); `device` and `meas_baseline` are absent from older summaries.
LEADING_COLUMNS = ("index", "dir")
BASE_COLUMNS = ("status", "message", "device", "world_size", "n_params", "flops_per_token", "median_step_ms",
                "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "final_train_loss", "final_val_loss", "micro_batch",
                "startup_s")
MEASURED_EXTRA = ("meas_peak", "meas_baseline")


def memory_columns(components):
    """pred_<c>..., pred_total, meas_<c>..., meas_total, meas_peak, meas_baseline for these components."""
    comps = [c for c in components if c != "total"]
    return (tuple("pred_" + c for c in comps + ["total"]) + tuple("meas_" + c for c in comps + ["total"])
            + MEASURED_EXTRA)


STRING_COLUMNS = ("dir", "status", "message", "device")
INT_COLUMNS = ("index", "world_size", "n_params", "micro_batch")


def is_known_column(name):
    """A column of the summary format (not a varied key): the fixed ones and every memory column."""
    return name in LEADING_COLUMNS or name in BASE_COLUMNS or name.startswith(("pred_", "meas_"))


def summary_components(columns):
    """The memory components a summary holds, in order, from its pred_<component> columns."""
    return [c[5:] for c in columns if c.startswith("pred_") and c != "pred_total"]
POINT_DIR = re.compile(r"^p(\d+)$")


class LogError(Exception):
    """A missing or malformed file; the message names it."""


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "OSU":
        return _text(value[()])
    return value


def _plain(value):
    """An HDF5 attribute value as str, int, float or numpy array."""
    value = _text(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OS":
            return [_text(v) for v in value.tolist()]
        return value
    return value


# Metadata read tries of a SWMR reader (the trainer's h5::kSwmrReadAttempts). HDF5's default, 100 tries
# with a sleep that doubles each time from 1 ns, never returns on a damaged file; 24 give up within ~20 ms.
SWMR_READ_ATTEMPTS = 24


@functools.lru_cache(maxsize=None)
def _hdf5_library():
    """ctypes handle of the HDF5 library h5py runs on (the one loaded in this process), or None."""
    import ctypes
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/libhdf5" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = Path(path).name
        if name.startswith("libhdf5") and not name.startswith("libhdf5_"):
            try:
                lib = ctypes.CDLL(path)
                lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
                lib.H5Pset_metadata_read_attempts.restype = ctypes.c_int
                return lib
            except (OSError, AttributeError):
                continue
    return None


def _open_swmr_bounded(path):
    """path opened as a SWMR reader whose metadata reads give up after SWMR_READ_ATTEMPTS tries."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    lib = _hdf5_library()
    if lib is None or lib.H5Pset_metadata_read_attempts(fapl.id, SWMR_READ_ATTEMPTS) < 0:
        raise OSError("cannot bound HDF5's SWMR read retries (the HDF5 library h5py uses was not found): "
                      "not opened as a SWMR reader, which could wait forever on a damaged file")
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
    return h5py.File(fid)


def open_h5(path):
    """Open an HDF5 file read-only; a damaged file is LogError at once, never a wait.

    A plain read comes first: it fails at once on a file a writer holds (or a killed writer left
    flagged), which is then opened as a SWMR reader with bounded retries, as far as it has been
    flushed. Last, a read without file locking (a writer that did not enable SWMR holds the file).
    """
    path = Path(path)
    if not path.is_file():
        raise LogError(f"{path}: no such file")
    errors = []
    for how, opener in (("plain", lambda: h5py.File(path, "r")),
                        ("as a SWMR reader", lambda: _open_swmr_bounded(path)),
                        ("without file locking", lambda: h5py.File(path, "r", locking=False))):
        try:
            return opener()
        except (OSError, TypeError, ValueError, KeyError, RuntimeError) as e:  # TypeError: h5py without `locking`
            errors.append(f"{how}: {e}")
    raise LogError(f"{path}: damaged or not an HDF5 file, cannot open it ({'; '.join(errors)})")


def run_is_live(run_dir):
    """True while a trainer holds the run folder's .lock: an exclusive flock it takes before writing
    anything there and holds until it exits, however it ends (src/io/run_dir.hpp). Probed with a shared
    flock let go at once; no .lock, or a filesystem without flock, is "not live"."""
    import fcntl
    try:
        fd = os.open(Path(run_dir) / ".lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # lets our lock go with it
    return False


def find_log(path):
    """A run folder or a log.h5 path -> the log.h5 path."""
    path = Path(path)
    if path.is_dir():
        path = path / "log.h5"
    if not path.is_file():
        raise LogError(f"{path}: no such file (expected a run folder with log.h5, or a log.h5)")
    return path


def _read_group(f, name, fields):
    """The 1-D datasets of a group, trimmed to a common length (a live writer appends them one by one)."""
    out = {}
    if name not in f:
        return {k: np.zeros(0) for k in fields}
    group = f[name]
    for key in group:
        ds = group[key]
        if isinstance(ds, h5py.Dataset):
            if hasattr(ds, "refresh"):
                try:
                    ds.refresh()
                except (OSError, ValueError, RuntimeError):
                    pass  # not opened as a SWMR reader
            out[key] = np.asarray(ds[()])
    n = min((len(v) for v in out.values()), default=0)
    out = {k: v[:n] for k, v in out.items()}
    for k in fields:
        out.setdefault(k, np.zeros(0))
    return out


def _read_attrs(obj):
    return {k: _plain(obj.attrs[k]) for k in obj.attrs}


def read_log(path):
    """Read a run's log.h5 (or the log.h5 in a run folder).

    Returns {"path", "attrs", "train", "eval", "samples", "memory": {"predicted", "measured"}}:
    attrs are str/int/float, train/eval map dataset names to numpy arrays of equal length (eval
    values not measured, or absent from an older log, are NaN), samples holds each evaluation's
    generated text ("" for none), memory groups map component names to bytes (int);
    memory["components"] lists them in order.
    """
    path = find_log(path)
    with open_h5(path) as f:
        try:
            attrs = _read_attrs(f)
            train = _read_group(f, "train", TRAIN_FIELDS)
            evals = _read_group(f, "eval", EVAL_FIELDS)
            n = len(evals["step"])
            for k in ("hellaswag_acc", "hellaswag_acc_norm"):
                if len(evals[k]) != n:
                    evals[k] = np.full(n, math.nan)
            samples = _samples(f, evals["sample_end"] if len(evals["sample_end"]) == n else np.zeros(n, int))
            memory = {"components": list(COMPONENTS)}
            for group in ("predicted", "measured"):
                name = "memory/" + group
                memory[group] = _read_attrs(f[name]) if name in f else {}
                listed = memory[group].pop("components", None)
                if listed:
                    memory["components"] = listed.split()
        except (KeyError, OSError, ValueError, RuntimeError, TypeError, UnicodeDecodeError) as e:
            raise LogError(f"{path}: damaged log, cannot read it ({type(e).__name__}: {e})") from e
    return {"path": str(path), "attrs": attrs, "train": train, "eval": evals, "samples": samples,
            "memory": memory}


def _samples(f, ends):
    """Each evaluation's sample text: /samples holds them one after another, /eval/sample_end says where
    each ends."""
    data = b""
    if "samples" in f:
        ds = f["samples"]
        if hasattr(ds, "refresh"):
            try:
                ds.refresh()
            except (OSError, ValueError, RuntimeError):
                pass
        data = bytes(np.asarray(ds[()], dtype=np.uint8))
    out, start = [], 0
    for end in np.asarray(ends, dtype=np.int64):
        out.append(data[start:end].decode("utf-8", "replace"))
        start = end
    return out


def parse_point_values(text):
    """'key=value' lines -> {key: value} (values stay strings), in order."""
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise LogError(f"point_values line {line!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def _config_int(config_yaml, section, key):
    """An integer config value from the resolved YAML, or None."""
    if not config_yaml:
        return None
    try:
        cfg = yaml.safe_load(config_yaml)
    except yaml.YAMLError as e:
        raise LogError(f"config_yaml is not valid YAML: {e}") from e
    value = cfg.get(section, {}).get(key) if isinstance(cfg, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def median_step_ms(step_ms):
    """Median step time, leaving out the first logged step (one-off setup) when there are more."""
    step_ms = np.asarray(step_ms, dtype=float)
    if len(step_ms) > 1:
        step_ms = step_ms[1:]
    step_ms = step_ms[np.isfinite(step_ms)]
    return float(np.median(step_ms)) if len(step_ms) else math.nan


def _last(values):
    values = np.asarray(values, dtype=float)
    return float(values[-1]) if len(values) else math.nan


def summary_row(log, index=None, dirname=None):
    """One summary row (docs/FORMATS.md columns) computed from a read_log() result."""
    a = log["attrs"]
    nan = math.nan
    index = a.get("point_index", -1) if index is None else index
    world = int(a.get("world_size", 1) or 1)
    ms = median_step_ms(log["train"]["step_ms"])
    tps = a.get("tokens_per_step", 0) / (ms / 1000.0) if ms > 0 and a.get("tokens_per_step") else nan
    peak = float(a.get("peak_flops", 0) or 0)
    fpt = float(a.get("flops_per_token", nan))
    row = {
        "index": int(index),
        "dir": dirname if dirname is not None else Path(log["path"]).parent.name,
        "status": a.get("status", ""),
        "message": a.get("message", ""),
        "device": a.get("device", ""),
        "world_size": world,
        "n_params": int(a.get("n_params", -1)),
        "flops_per_token": fpt,
        "median_step_ms": ms,
        "tokens_per_s": tps,
        "tokens_per_s_per_gpu": tps / world,
        "mfu": fpt * tps / world / peak if peak > 0 else nan,
        "final_train_loss": _last(log["train"]["loss"]),
        "final_val_loss": _last(log["eval"]["val_loss"]),
        "micro_batch": _micro_batch(a),
        "startup_s": float(a.get("startup_s", nan)),
    }
    for group, prefix in (("predicted", "pred_"), ("measured", "meas_")):
        mem = log["memory"].get(group, {})
        for c in log["memory"]["components"] + ["total"]:
            row[prefix + c] = float(mem[c]) if c in mem else nan
    for extra in MEASURED_EXTRA:
        row[extra] = float(log["memory"].get("measured", {}).get(extra[5:], nan))
    for key, value in parse_point_values(a.get("point_values", "")).items():
        row[key] = value
    return row


def _micro_batch(attrs):
    cfg = attrs.get("config_yaml", "")
    mb = _config_int(cfg, "training", "micro_batch")
    if mb is not None and mb > 0:
        return mb
    seq = _config_int(cfg, "training", "seq_len")
    accum = _config_int(cfg, "training", "grad_accum") or 1
    tps, world = attrs.get("tokens_per_step", 0), attrs.get("world_size", 1) or 1
    if seq and tps:
        return int(tps // (seq * accum * world))
    return -1


def point_dirs(sweep_dir):
    """[(index, path)] of the sweep's pNNN folders, by index."""
    out = []
    for p in Path(sweep_dir).iterdir():
        m = POINT_DIR.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def _memory_order(columns, header):
    """Memory columns in file order: as summary.csv's header has them, else pred_ before meas_, each
    group's components in the legacy order (others after them, by name), then total, peak, baseline."""
    if header:
        pos = {c: i for i, c in enumerate(header)}
        if all(c in pos for c in columns):
            return sorted(columns, key=pos.get)

    def key(c):
        group, comp = c.split("_", 1)
        if c in MEASURED_EXTRA:
            return (2, MEASURED_EXTRA.index(c), "")
        rank = COMPONENTS.index(comp) if comp in COMPONENTS else (len(COMPONENTS) + 1 if comp == "total"
                                                                   else len(COMPONENTS))
        return (0 if group == "pred" else 1, rank, comp)
    return sorted(columns, key=key)


def _order_columns(names, csv_path=None, varied_hint=()):
    """Columns in FORMATS.md order; varied keys in the order of varied_hint (the summary's
    varied_keys attribute), else of summary.csv's header, else as stored."""
    header = []
    if csv_path is not None and csv_path.is_file():
        with open(csv_path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
    hint = list(varied_hint) or header
    varied = [c for c in hint if c in names and not is_known_column(c)]
    varied += [c for c in names if not is_known_column(c) and c not in varied]
    lead = [c for c in LEADING_COLUMNS if c in names]
    base = [c for c in BASE_COLUMNS if c in names]
    memory = _memory_order([c for c in names if c.startswith(("pred_", "meas_"))], header)
    return lead + varied + base + memory, varied


def _to_int(value):
    """An integer column value (stored as int, float or text); NaN and empty text stay NaN."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return math.nan
    return int(f) if math.isfinite(f) else math.nan


def _summary_from_h5(path):
    try:
        return _read_summary_h5(path)
    except (KeyError, OSError, ValueError, RuntimeError, TypeError, UnicodeDecodeError) as e:
        raise LogError(f"{path}: damaged summary, cannot read it ({type(e).__name__}: {e})") from e


def _read_summary_h5(path):
    with open_h5(path) as f:
        if "points" not in f:
            raise LogError(f"{path}: no /points group")
        group = f["points"]
        for col in ("index", "status"):
            if col not in group:
                raise LogError(f"{path}: missing column /points/{col}")
        data = {}
        for name in group:
            ds = group[name]
            if ds.dtype.kind in "OS":
                data[name] = [_text(v) for v in ds[()].tolist()]
            else:
                data[name] = np.asarray(ds[()]).tolist()
        config = _text(f.attrs.get("config_yaml", None))
        varied_attr = _text(f.attrs.get("varied_keys", None))
    lengths = {len(v) for v in data.values()}
    if len(lengths) > 1:
        raise LogError(f"{path}: /points columns have different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    columns, varied = _order_columns(list(data), path.with_suffix(".csv"),
                                     (varied_attr or "").split())
    rows = []
    for i in range(n):
        row = {}
        for c in columns:
            v = data[c][i]
            if c in INT_COLUMNS:
                v = _to_int(v)
            elif c not in STRING_COLUMNS and c not in varied and isinstance(v, (int, float)):
                v = float(v)
            row[c] = v
        rows.append(row)
    return {"columns": columns, "varied": varied, "rows": rows, "config_yaml": config,
            "source": str(path)}


def _summary_from_logs(sweep_dir):
    rows, varied, components = [], [], []
    for index, pdir in point_dirs(sweep_dir):
        log_path = pdir / "log.h5"
        if not log_path.is_file():
            rows.append({"index": index, "dir": pdir.name, "status": "missing",
                         "message": "no log.h5 (point not run yet)"})
            continue
        try:
            log = read_log(log_path)
        except LogError as e:
            rows.append({"index": index, "dir": pdir.name, "status": "damaged", "message": str(e)})
            continue
        row = summary_row(log, index=index, dirname=pdir.name)
        components += [c for c in log["memory"]["components"] if c not in components]
        for key in parse_point_values(log["attrs"].get("point_values", "")):
            if key not in varied:
                varied.append(key)
        rows.append(row)
    if not rows:
        raise LogError(f"{sweep_dir}: no summary.h5 and no pNNN/ point folders")
    names = (list(LEADING_COLUMNS) + varied + list(BASE_COLUMNS)
             + list(memory_columns(components or list(COMPONENTS))))
    for row in rows:
        for c in names:
            if c not in row:
                row[c] = "" if c in STRING_COLUMNS or c in varied else (
                    -1 if c in INT_COLUMNS else math.nan)
    columns = [c for c in names]
    rows = [{c: row[c] for c in columns} for row in rows]
    return {"columns": columns, "varied": varied, "rows": rows, "config_yaml": None,
            "source": f"{sweep_dir}/p*/log.h5"}


def read_summary(sweep_dir, source="auto"):
    """A sweep's summary table.

    source: "summary" reads summary.h5, "logs" computes the rows from pNNN/log.h5,
    "auto" uses summary.h5 when present and the logs otherwise (a sweep still running).
    Returns {"columns", "varied", "rows": [dict per point], "config_yaml", "source", "components"
    (the memory components, in order)}.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise LogError(f"{sweep_dir}: no such folder")
    h5 = sweep_dir / "summary.h5"
    if source not in ("auto", "summary", "logs"):
        raise ValueError(f"source must be auto, summary or logs, not {source!r}")
    if source == "summary" or (source == "auto" and h5.is_file()):
        out = _summary_from_h5(h5)
    else:
        out = _summary_from_logs(sweep_dir)
    out["components"] = summary_components(out["columns"])
    return out


def point_log(sweep_dir, row):
    """The read_log() of a summary row's point, or None when it has no readable log (a damaged one is
    named in a warning on stderr)."""
    sweep_dir = Path(sweep_dir)
    d = str(row.get("dir", "") or "")
    candidates = []
    if d:
        candidates += [sweep_dir / d, Path(d), sweep_dir / Path(d).name]
    if isinstance(row.get("index"), int) and row["index"] >= 0:
        candidates.append(sweep_dir / f"p{row['index']:03d}")
    for c in candidates:
        if (c / "log.h5").is_file():
            try:
                return read_log(c)
            except LogError as e:
                print(f"warning: {e}: point left out", file=sys.stderr)
                return None
    return None


def is_missing(value):
    """True for NaN, None and empty strings."""
    if value is None or (isinstance(value, str) and value == ""):
        return True
    try:
        return math.isnan(value)
    except TypeError:
        return False
