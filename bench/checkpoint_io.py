#!/usr/bin/env python3
"""Checkpoint I/O against the disk's own speed, in one invocation on one disk. First the raw sequential
bandwidth with dd (write with fsync, then read back after dropping the page cache), with one stream and
with --streams concurrent ones (the better counts as the disk's), then a checkpoint of the given config
written by ./train (the run's final checkpoint, which it waits for) and read by ./train --resume (caches
dropped again). Writes a JSON of GB/s side by side and prints it.

    python3 bench/checkpoint_io.py --dir /scratch/ckbench --out ckpt_io.json \\
        [--yaml experiments/x.yaml] [--set training.micro_batch=4 ...] [--raw-gb 8] [--ranks N] [--streams 4]

Without --yaml: a small CPU model (a few tens of MB of state), so the script runs anywhere. Dropping
caches needs root (echo 3 > /proc/sys/vm/drop_caches); without it the JSON says `caches_dropped: false`
and the read figures are the page cache's, not the disk's. Give --raw-gb about the checkpoint's size.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL = """
run: {{name: ck, out_dir: {out}, seed: 1}}
model: {{n_layer: 4, n_head: 4, n_embd: 256, vocab_size: 512, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 512}}
training: {{device: cpu, micro_batch: 2, seq_len: 32, steps: 1}}
eval: {{every: 0, batches: 1}}
log: {{every: 1, progress: false}}
checkpoint: {{every: 1, keep_last: 1}}
"""
WRITE = re.compile(r"checkpoint written at step \d+: ([\d.]+) GB in ([\d.]+) s .*snapshot (?:queued|copied) in ([\d.]+) s")
READ = re.compile(r"resumed from step \d+ of .*: ([\d.]+) GB in ([\d.]+) s")


def drop_caches():
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(cmd):
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - t0


def raw(dir_, gb, streams):
    """dd's write (fsync) and read GB/s with `streams` concurrent dd processes, each on its own file."""
    files = [Path(dir_) / f"raw_{i}.bin" for i in range(streams)]
    count = max(1, int(gb * 1e9 / (64 << 20) / streams))
    nbytes = streams * count * (64 << 20)

    def all_of(cmds):
        t0 = time.monotonic()
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
        for c, p in zip(cmds, procs):
            if p.wait() != 0:
                sys.exit(f"{' '.join(c)}: exit {p.returncode}: {p.stderr.read().decode()[-500:]}")
        return time.monotonic() - t0

    w = all_of([["dd", "if=/dev/zero", f"of={f}", "bs=64M", f"count={count}", "conv=fsync"] for f in files])
    dropped = drop_caches()
    r = all_of([["dd", f"if={f}", "of=/dev/null", "bs=64M"] for f in files])
    for f in files:
        f.unlink()
    return nbytes / 1e9 / w, nbytes / 1e9 / r, dropped


def train(args, extra, ranks):
    cmd = ([shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]
           if ranks > 1 else []) + [str(ROOT / "train")] + args + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a directory on the disk to measure (emptied first)")
    ap.add_argument("--out", default="checkpoint_io.json")
    ap.add_argument("--yaml", help="the config whose checkpoint is measured (default: a small CPU model)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE overrides, as ./train --set")
    ap.add_argument("--raw-gb", type=float, default=1.0, help="dd size in GB")
    ap.add_argument("--steps", type=int, default=1, help="training steps before the checkpoint")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--streams", type=int, default=4, help="concurrent dd streams: the run's checkpoint.threads")
    a = ap.parse_args()
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    # the disk's raw speed with one stream and with as many streams as the checkpoint uses threads; the
    # better of the two is what the checkpoint is held against
    threads = a.streams
    by_streams = {n: raw(d, a.raw_gb, n) for n in sorted({1, threads})}
    raw_w = max(x[0] for x in by_streams.values())
    raw_r = max(x[1] for x in by_streams.values())
    raw_dropped = all(x[2] for x in by_streams.values())
    y = Path(a.yaml) if a.yaml else d / "small.yaml"
    if not a.yaml:
        y.write_text(SMALL.format(out=d / "runs"))
    sets = [x for kv in a.set for x in ("--set", kv)]
    common = ["--set", f"run.out_dir={d / 'runs'}", "--set", "run.name=ck", "--set", f"training.steps={a.steps}",
              "--set", f"checkpoint.every={a.steps}", "--set", "checkpoint.keep_last=1"]
    out = train(["--yaml", str(y)] + sets + common + ["--set", "run.overwrite=true"], [], a.ranks)
    m = WRITE.findall(out)
    if not m:
        sys.exit("no checkpoint write reported:\n" + out[-2000:])
    gb, write_s, paused_s = map(float, m[-1])
    dropped = drop_caches()
    # one step more (a resume of the completed run would read nothing), without another checkpoint
    more = ["--set", f"training.steps={a.steps + 1}", "--set", "checkpoint.every=0"]
    out = train(["--yaml", str(y)] + sets + common + more + ["--resume"], [], a.ranks)
    r = READ.search(out)
    if not r:
        sys.exit("no checkpoint read reported:\n" + out[-2000:])
    _, read_s = map(float, r.groups())
    # the printed GB are rounded to MB: the files' own size instead
    ck = next((d / "runs/ck/checkpoints").glob("step_*"))
    gb = read_gb = sum(f.stat().st_size for f in ck.iterdir()) / 1e9
    res = {
        "checkpoint_gb": gb,
        "raw_write_gbps": raw_w, "checkpoint_write_gbps": gb / write_s if write_s else None,
        "raw_read_gbps": raw_r, "checkpoint_read_gbps": read_gb / read_s if read_s else None,
        "raw_by_streams": {str(n): {"write_gbps": x[0], "read_gbps": x[1]} for n, x in by_streams.items()},
        "checkpoint_threads": threads,
        "snapshot_queued_s": paused_s, "checkpoint_write_s": write_s, "checkpoint_read_s": read_s,
        "caches_dropped": dropped and raw_dropped, "ranks": a.ranks, "config": str(y), "set": a.set,
    }
    res["write_fraction_of_raw"] = res["checkpoint_write_gbps"] / raw_w if res["checkpoint_write_gbps"] else None
    res["read_fraction_of_raw"] = res["checkpoint_read_gbps"] / raw_r if res["checkpoint_read_gbps"] else None
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
