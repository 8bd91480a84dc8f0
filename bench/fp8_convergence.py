#!/usr/bin/env python3
"""FP8 training against bf16 on one GPU, the checks of training.precision fp8 that need real models:

  1. GPT-2 124M, 300 steps on the tinyshakespeare shards, bf16 and fp8 from the same seed: the training
     loss (mean of the 10 steps up to each 50th step) within 2% at every 50th step, and the validation loss;
     the same with E4M3 gradients (training.fp8_grad_format e4m3) beside it, for the choice of format.
  2. The synthetic corpus (the quickstart's model) in fp8 reaches its floor (ln 4 = 1.386; bf16 ends near
     1.43 in 600 steps).
  3. GPT-2 1558M, 50 steps at micro-batch 16 in fp8: no NaN, and how many scaled tensors saturated.
  4. (part "policies") Every FP8 policy against bf16: GPT-2 124M, 200 steps on tinyshakespeare in file
     order, B=8, clip 1.0, the same seed (so the same initial weights): each policy's mean loss within 2%
     of bf16's in every window of steps (1-10, 11-50, 51-100, 101-200), its mean gradient norm 0.9-1.1
     times bf16's there, and its saturation count.

    python3 bench/fp8_convergence.py --data DIR --out OUT [--parts 124m,synthetic,1558m,policies]

DIR holds tiny_shakespeare_train.bin and tiny_shakespeare_val.bin. Writes OUT/fp8_convergence.json and
prints a table; exit 1 if a check fails.
"""
import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def train(out, name, yaml_text, sets=()):
    y = out / f"{name}.yaml"
    y.write_text(yaml_text.format(name=name, out=out / "runs"))
    cmd = [str(ROOT / "train"), "--yaml", str(y)] + [a for s in sets for a in ("--set", s)]
    print("+", " ".join(cmd), flush=True)
    with open(out / f"{name}.log", "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    log = out / "runs" / name / "log.h5"
    if rc != 0 or not log.exists():
        print(f"{name}: exit {rc}; see {out / (name + '.log')}", flush=True)
        return None
    with h5py.File(log, "r") as f:
        return {k: f["train"][k][:] for k in f["train"]} | {"val_loss": f["eval/val_loss"][:],
                                                              "eval_step": f["eval/step"][:],
                                                              "precision": str(f.attrs["precision"])}


GPT2_SHAKESPEARE = """run: {{name: {name}, out_dir: {out}, seed: 42}}
model: {{preset: d12}}
data: {{train: "{data}/tiny_shakespeare_train.bin", val: "{data}/tiny_shakespeare_val.bin"}}
training: {{device: cuda, precision: {prec}, micro_batch: 16, seq_len: 1024, steps: 300, lr: 3.0e-4,
           warmup_steps: 20, weight_decay: 0.1, grad_clip: 1.0, deterministic: true}}
eval: {{every: 50, batches: 4}}
log: {{every: 1, progress: false}}
"""
SYNTHETIC = """run: {{name: {name}, out_dir: {out}, seed: 1337}}
model: {{n_layer: 4, n_head: 4, n_embd: 128, vocab_size: 256, max_seq_len: 256}}
data: {{synthetic: true, synthetic_vocab: 256, synthetic_branching: 4}}
training: {{device: cuda, precision: fp8, micro_batch: 8, seq_len: 128, steps: 600, lr: 3.0e-3, warmup_steps: 20,
           min_lr_frac: 0.1, weight_decay: 0.0, grad_clip: 1.0}}
eval: {{every: 600, batches: 8}}
log: {{every: 1, progress: false}}
"""
POLICY_RUN = """run: {{name: {name}, out_dir: {out}, seed: 42}}
model: {{preset: d12}}
data: {{train: "{data}/tiny_shakespeare_train.bin", val: "{data}/tiny_shakespeare_val.bin", shuffle: false}}
training: {{device: cuda, precision: {prec}, micro_batch: 8, seq_len: 1024, steps: 200, lr: 3.0e-4,
           warmup_steps: 20, weight_decay: 0.1, grad_clip: 1.0, deterministic: true}}
eval: {{every: 100, batches: 4}}
log: {{every: 1, progress: false}}
"""
# policy name: what follows `precision:` in the run's training map
POLICIES = {"fp8": "fp8, fp8_classifier: false", "fp8 + classifier": "fp8, fp8_classifier: true",
            "fp8, e4m3 gradients": "fp8, fp8_classifier: false, fp8_grad_format: e4m3",
            "fp8, GELU epilogue": "fp8, fp8_classifier: false, fp8_gelu_epilogue: true",
            "fp8 + classifier, GELU epilogue": "fp8, fp8_classifier: true, fp8_gelu_epilogue: true",
            "fp8 + classifier, fast accumulation forward": "fp8, fp8_classifier: true, fp8_fast_accum: forward",
            "fp8 + classifier, fast accumulation all": "fp8, fp8_classifier: true, fp8_fast_accum: all"}
WINDOWS = ((1, 10), (11, 50), (51, 100), (101, 200))


def policies(out, data):
    """Part 4: every policy against bf16, window by window. Returns (result, ok)."""
    base = POLICY_RUN.replace("{data}", data)
    logs = {"bf16": train(out, "policy_bf16", base.replace("{prec}", "bf16"))}
    for name, prec in POLICIES.items():
        logs[name] = train(out, "policy_" + name.replace(" ", "").replace(",", "_").replace("+", "_"),
                           base.replace("{prec}", prec))
    if not all(logs.values()):
        return {"failed": [k for k, v in logs.items() if not v]}, False
    ok, res = True, {}
    ref = logs["bf16"]
    print(f"{'policy':44s} window    loss / bf16 - 1   grad norm / bf16   saturated")
    for name in POLICIES:
        log, rows = logs[name], []
        for lo, hi in WINDOWS:
            win = (ref["step"] >= lo) & (ref["step"] <= hi)
            rel = float(np.mean(log["loss"][win]) / np.mean(ref["loss"][win]) - 1)
            gn = float(np.mean(log["grad_norm"][win]) / np.mean(ref["grad_norm"][win]))
            sat = int(log["fp8_saturated"][win].sum())
            good = abs(rel) <= 0.02 and 0.9 <= gn <= 1.1
            ok &= good
            rows.append({"steps": [lo, hi], "loss_rel": rel, "grad_norm_ratio": gn, "saturated": sat, "ok": good})
            print(f"{name:44s} {lo:3d}-{hi:<3d}   {rel:+8.3%}          {gn:.3f}              {sat}"
                  + ("" if good else "   <- outside"))
        res[name] = {"windows": rows, "val_loss": log["val_loss"].tolist(),
                     "ms": float(np.median(log["step_ms"][5:])), "saturated_total": int(log["fp8_saturated"].sum())}
    res["bf16"] = {"val_loss": ref["val_loss"].tolist(), "ms": float(np.median(ref["step_ms"][5:]))}
    return res, ok


BIG = """run: {{name: {name}, out_dir: {out}}}
model: {{preset: d48}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: cuda, precision: fp8, micro_batch: 16, seq_len: 1024, steps: 50, lr: 1.5e-4, warmup_steps: 10,
           weight_decay: 0.1, grad_clip: 1.0}}
eval: {{batches: 0}}
log: {{every: 1, progress: false}}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="124m,synthetic,1558m,policies")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = a.parts.split(",")
    res, ok = {}, True
    if "124m" in parts:
        base = GPT2_SHAKESPEARE.replace("{data}", a.data)
        logs = {p: train(out, f"shakespeare_{p}", base.replace("{prec}", p)) for p in ("bf16", "fp8")}
        logs["fp8_e4m3"] = train(out, "shakespeare_fp8_e4m3", base.replace("{prec}", "fp8, fp8_grad_format: e4m3"))
        rows = []
        if all(logs.values()):
            for s in range(50, 301, 50):
                m = {p: float(np.mean(logs[p]["loss"][s - 10:s])) for p in logs}
                rel = m["fp8"] / m["bf16"] - 1
                rows.append({"step": s, "bf16": m["bf16"], "fp8": m["fp8"], "rel": rel, "fp8_e4m3": m["fp8_e4m3"],
                             "rel_e4m3": m["fp8_e4m3"] / m["bf16"] - 1})
                ok &= abs(rel) <= 0.02
            res["gpt2_124m_shakespeare"] = {
                "rows": rows, "val_bf16": logs["bf16"]["val_loss"].tolist(), "val_fp8": logs["fp8"]["val_loss"].tolist(),
                "val_fp8_e4m3": logs["fp8_e4m3"]["val_loss"].tolist(),
                "ms_bf16": float(np.median(logs["bf16"]["step_ms"][5:])), "ms_fp8": float(np.median(logs["fp8"]["step_ms"][5:])),
                "fp8_saturated_total": int(logs["fp8"]["fp8_saturated"].sum())}
            print("step  bf16 loss  fp8 loss  fp8/bf16-1  fp8 e4m3-grad loss  /bf16-1")
            for r in rows:
                print(f"{r['step']:4d}  {r['bf16']:.4f}    {r['fp8']:.4f}    {r['rel']:+.2%}      {r['fp8_e4m3']:.4f}"
                      f"            {r['rel_e4m3']:+.2%}")
            print("val bf16", logs["bf16"]["val_loss"], "val fp8", logs["fp8"]["val_loss"])
        else:
            ok = False
    if "synthetic" in parts:
        log = train(out, "synthetic_fp8", SYNTHETIC)
        if log:
            v = float(log["val_loss"][-1])
            res["synthetic_fp8"] = {"val_loss": v, "floor": math.log(4)}
            print(f"synthetic corpus, fp8: val loss {v:.4f} (floor {math.log(4):.4f})")
            ok &= v < math.log(4) + 0.1
        else:
            ok = False
    if "1558m" in parts:
        log = train(out, "gpt2_1558m_fp8", BIG)
        if log:
            loss = log["loss"]
            res["gpt2_1558m_fp8"] = {"loss_first": float(loss[0]), "loss_last": float(loss[-1]),
                                     "finite": bool(np.isfinite(loss).all()),
                                     "saturated_per_step": log["fp8_saturated"].tolist(),
                                     "median_ms": float(np.median(log["step_ms"][5:]))}
            print(f"1558M fp8: loss {loss[0]:.3f} -> {loss[-1]:.3f}, finite {np.isfinite(loss).all()}, "
                  f"saturated tensors per step (max) {int(log['fp8_saturated'].max())} of {48 * 12}")
            ok &= bool(np.isfinite(loss).all()) and loss[-1] < loss[0]
        else:
            ok = False
    if "policies" in parts:
        res["policies"], good = policies(out, a.data)
        ok &= good
    res["ok"] = bool(ok)
    (out / "fp8_convergence.json").write_text(json.dumps(res, indent=1))
    print("fp8 convergence checks:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
