#!/usr/bin/env python3
"""Two builds of `train`, one matrix of CPU runs, compared bit for bit: what a restructuring of the code
must not change.

    python3 bench/bit_identity.py --ref /path/to/old/train [--new ./train] --out DIR [--only NAME,...]
                                  [--device cuda]

Each case (precision fp32 / bf16 / fp8, one rank and two ranks at ZeRO stages 0-3, recompute 1 and 2,
gradient accumulation, no master weights) trains the same small model on the synthetic corpus with both
binaries, then compares the run logs' /train/loss, /train/grad_norm and /eval/val_loss as raw float64
bits, and the exported llm.c model files (the final parameters) byte for byte. Writes DIR/bit_identity.json
(one row per case) and prints a table; exit 1 when any case differs or fails.

--device cuda: the one-rank cases on the GPU, a wider model (every CUDA kernel on its fast paths) with
training.deterministic (cuBLASLt's first-choice algorithms, cuDNN's deterministic attention backward),
so that both builds' every op must produce the same bits.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """run: {{name: {name}, out_dir: {out}, seed: 11}}
model: {{n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}}
data: {{synthetic: true, synthetic_vocab: 64, synthetic_branching: 4}}
training: {{device: cpu, micro_batch: 4, seq_len: 16, steps: 12, lr: 1.0e-2, warmup_steps: 2,
           grad_clip: 1.0, weight_decay: 0.1}}
eval: {{every: 4, batches: 2}}
log: {{every: 1, progress: false}}
"""

CUDA_CONFIG = """run: {{name: {name}, out_dir: {out}, seed: 11}}
model: {{n_layer: 2, n_head: 4, n_embd: 256, vocab_size: 1000, max_seq_len: 128}}
data: {{synthetic: true, synthetic_vocab: 1000, synthetic_branching: 4}}
training: {{device: cuda, deterministic: true, micro_batch: 8, seq_len: 128, steps: 12, lr: 1.0e-3, warmup_steps: 2,
           grad_clip: 1.0, weight_decay: 0.1}}
eval: {{every: 4, batches: 2}}
log: {{every: 1, progress: false}}
"""

# name: (ranks, overrides)
CASES = {
    "fp32": (1, ["training.precision=fp32"]),
    "bf16": (1, ["training.precision=bf16"]),
    "fp8": (1, ["training.precision=fp8", "training.fp8_classifier=false"]),
    "fp8-e4m3": (1, ["training.precision=fp8", "training.fp8_classifier=false", "training.fp8_grad_format=e4m3"]),
    "recompute1": (1, ["training.recompute=1"]),
    "recompute2": (1, ["training.recompute=2"]),
    "fp8-recompute2": (1, ["training.precision=fp8", "training.fp8_classifier=false", "training.recompute=2"]),
    "accum3": (1, ["training.grad_accum=3"]),
    "fp8-accum2": (1, ["training.precision=fp8", "training.fp8_classifier=false", "training.grad_accum=2"]),
    "no-master": (1, ["training.master_weights=false"]),
    "no-clip": (1, ["training.grad_clip=0"]),
}
for stage in range(4):
    CASES[f"2ranks-zero{stage}"] = (2, [f"training.zero_stage={stage}"])
    CASES[f"2ranks-zero{stage}-fp8"] = (2, [f"training.zero_stage={stage}", "training.precision=fp8", "training.fp8_classifier=false"])
# the FP8 classifier (the default from the build that made it so; named here so both builds run it)
CASES["fp8-classifier"] = (1, ["training.precision=fp8", "training.fp8_classifier=true"])
CASES["2ranks-zero2-accum2-recompute2"] = (2, ["training.zero_stage=2", "training.grad_accum=2", "training.recompute=2"])
# the low-precision optimizer states (from the build that has training.optimizer_state), on 1 and 2 ranks
for state in ("bf16", "int8"):
    CASES[f"{state}-state"] = (1, [f"training.optimizer_state={state}"])
    CASES[f"2ranks-zero1-{state}-state"] = (2, ["training.zero_stage=1", f"training.optimizer_state={state}"])
# compensated master weights (bf16 parameters and residuals; the CPU's fp32 parameters keep no copy)
CASES["compensated"] = (1, ["training.master_weights=compensated"])
# Lion with fp32 and int8 state (its kernel's arithmetic names every operation, for offload's host twin)
CASES["lion"] = (1, ["training.optimizer=lion", "training.lr=3.0e-4"])
CASES["lion-int8-state"] = (1, ["training.optimizer=lion", "training.lr=3.0e-4", "training.optimizer_state=int8"])
CASES["fp8-recompute3"] = (1, ["training.precision=fp8", "training.fp8_classifier=false", "training.recompute=3"])
# Structures a GPT-2 model file cannot hold (their final state is compared in the checkpoint instead) and
# that older builds may lack: run only when named in --only.
NAMED_ONLY = {
    "rope": (1, ["model.pos_embedding=rope"]),
    "fp8-rope": (1, ["model.pos_embedding=rope", "training.precision=fp8"]),
    "nope": (1, ["model.pos_embedding=none"]),
}


def mpirun(n):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "-x", "OMP_NUM_THREADS=1",
            "-x", "OPENBLAS_NUM_THREADS=1"] if n > 1 else []


def run(binary, out, name, ranks, sets, extra=(), config=CONFIG, in_checkpoint=False):
    """One case's run: its series, and its final state as the exported llm.c model file, or with
    in_checkpoint (a model no GPT-2 file holds) as the checkpoint's tensors."""
    y = out / f"{name}.yaml"
    y.write_text(config.format(name=name, out=out))
    cmd = mpirun(ranks) + [str(binary), "--yaml", str(y)] + list(sets) + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
    with h5py.File(out / name / "log.h5", "r") as f:
        series = {k: f[k][:].astype(np.float64) for k in ("train/loss", "train/grad_norm", "eval/val_loss")}
    if in_checkpoint:
        ckpts = out / name / "checkpoints"
        series["model"] = checkpoint_bytes(ckpts / (ckpts / "latest").read_text().strip())
        return series, "" if series["model"] else "no checkpoint tensors"
    model = out / f"{name}.bin"
    e = subprocess.run([str(binary), "export", "--ckpt", str(out / name), "--out", str(model)],
                       capture_output=True, text=True)
    series["model"] = model.read_bytes() if e.returncode == 0 and model.exists() else None
    return series, "" if e.returncode == 0 else f"export exit {e.returncode}: {e.stderr.strip()[-200:]}"


def checkpoint_bytes(ckpt):
    """Every dataset of the checkpoint's rank files (parameters and optimizer state), in name order."""
    parts = []
    for rank_file in sorted(Path(ckpt).glob("rank_*.h5")):
        with h5py.File(rank_file, "r") as f:
            names = []
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            for n in sorted(names):
                v = np.asarray(f[n][()])
                parts.append(n.encode() + (repr(v.tolist()).encode() if v.dtype.kind == "O" else v.tobytes()))
    return b"".join(parts) or None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the old binary")
    ap.add_argument("--new", default=str(ROOT / "train"), help="the new binary (default ./train)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    config = CUDA_CONFIG if a.device == "cuda" else CONFIG
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    only = a.only.split(",") if a.only else []
    unknown = [n for n in only if n not in CASES and n not in NAMED_ONLY]
    if unknown:
        ap.error(f"unknown case {', '.join(unknown)}; cases: {', '.join([*CASES, *NAMED_ONLY])}")
    cases = {**CASES, **{n: NAMED_ONLY[n] for n in only if n in NAMED_ONLY}}
    names = [n for n in cases if (not only or n in only) and (a.device == "cpu" or cases[n][0] == 1)]
    for side in ("ref", "new"):
        (out / side).mkdir(exist_ok=True)
    rows, bad = [], 0
    for name in names:
        ranks, sets = cases[name]
        # checkpoints at the end so that export has the final state
        sets = sets + ["checkpoint.every=12"]
        ckpt = name in NAMED_ONLY
        ref, ref_err = run(a.ref, out / "ref", name, ranks, sets, config=config, in_checkpoint=ckpt)
        new, new_err = run(a.new, out / "new", name, ranks, sets, config=config, in_checkpoint=ckpt)
        row = {"case": name, "ranks": ranks, "overrides": sets}
        if ref is None or new is None:
            row["result"] = f"failed: ref {ref_err or 'ok'}; new {new_err or 'ok'}"
        else:
            diffs = []
            for k in ("train/loss", "train/grad_norm", "eval/val_loss"):
                r, n = ref[k], new[k]
                if r.shape != n.shape or r.tobytes() != n.tobytes():
                    diffs.append(f"{k} ({np.count_nonzero(r.view(np.uint64) != n.view(np.uint64)) if r.shape == n.shape else 'shape'})")
                    row.setdefault("series", {})[k] = {"ref": [float(x) for x in r], "new": [float(x) for x in n]}
            if ref["model"] is None or new["model"] is None or ref["model"] != new["model"]:
                diffs.append("final parameters" + (f" ({ref_err or new_err})" if ref_err or new_err else ""))
            row["steps"] = int(len(ref["train/loss"]))
            row["final_loss"] = float(ref["train/loss"][-1])
            row["result"] = "identical" if not diffs else "differs: " + ", ".join(diffs)
        bad += row["result"] != "identical"
        rows.append(row)
        print(f"{name:34s} {row['result']}", flush=True)
    (out / "bit_identity.json").write_text(json.dumps({"ref": a.ref, "new": a.new, "cases": rows}, indent=1))
    print(f"{len(rows) - bad} of {len(rows)} cases identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
