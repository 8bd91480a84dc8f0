#!/usr/bin/env python3
"""Time to a loss on real text: one epoch of a token corpus, bf16 and each FP8 policy from one init.

Every policy trains the same model from the same seed (so the same initial weights) on the same tokens in
file order (data.shuffle false), evaluating on the whole validation shard every --eval-every steps. For each
it records the validation loss against training seconds (the sum of the logged step times: start-up and
evaluations, the same for every policy, are left out; the process's wall-clock seconds are in the JSON too)
and against tokens, then writes a table and a plot:

  - time to bf16's final validation loss: where each policy's validation loss first reaches it (linear
    between evaluations), and bf16's own time over it (the speed-up in wall-clock training seconds);
  - the training loss window by window (0-50, 50-200, 200-half, half-end steps), each within --tolerance
    (default 1%) of bf16's (the check), and every evaluation against bf16's (reported);
  - the epoch's training seconds against bf16's (the speed-up at equal tokens).

    python3 bench/convergence.py --data DIR --out OUT [--policies bf16,fp8,...] [--model d12] [--batch 32]
                                 [--ref-repeats N] [--lr 6e-4] [--deterministic]

The memory modes (optimizer state, master weights, recompute) against bf16 with fp32 state and master:
--policies bf16,state_bf16,state_int8,comp,int8_comp,fp8cls_int8_comp_r3. Another model's structure (the MLP's
activation, model.activation relu2; rotary position embeddings, model.pos_embedding rope): its first policy
in the list is reported against the reference, not checked (another model may well learn faster or slower),
and the later policies of that structure are checked against that first one: --policies
bf16,relu2,fp8cls,fp8cls_relu2 checks fp8 + classifier with relu2 against bf16 with relu2.

DIR holds the corpus's train and validation shards (`*_train.bin`, `*_val.bin`, or the same names with .xz,
unpacked into OUT first), for example ../shared/data/doctext. Writes OUT/convergence.json, OUT/convergence.md
and OUT/convergence.png; exits 1 if a run fails or a check fails (--target: the default FP8 policy's speed-up).
"""
import argparse
import json
import lzma
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# policy: (its name in the table, what follows `precision:` in the run's training map[, what follows the preset
# in the model map]); the first is the reference
POLICIES = {
    "bf16": ("bf16", "bf16"),
    "fp8cls": ("fp8 + classifier", "fp8, fp8_classifier: true"),
    "fp8": ("fp8, bf16 classifier", "fp8, fp8_classifier: false"),
    "fp8cls_fwdacc": ("fp8 + classifier, fast accumulation forward", "fp8, fp8_classifier: true, fp8_fast_accum: forward"),
    "fp8cls_allacc": ("fp8 + classifier, fast accumulation all", "fp8, fp8_classifier: true, fp8_fast_accum: all"),
    "fp8cls_epi": ("fp8 + classifier, GELU epilogue", "fp8, fp8_classifier: true, fp8_gelu_epilogue: true"),
    # the memory modes (training.optimizer_state, master_weights, recompute), each against bf16's fp32 state
    "state_bf16": ("bf16, bf16 state", "bf16, optimizer_state: bf16"),
    "state_int8": ("bf16, int8 state", "bf16, optimizer_state: int8"),
    "comp": ("bf16, compensated master", "bf16, master_weights: compensated"),
    "int8_comp": ("bf16, int8 state, compensated master", "bf16, optimizer_state: int8, master_weights: compensated"),
    "fp8cls_int8_comp_r3": ("fp8 + classifier, int8 state, compensated master, recompute 3",
                            "fp8, optimizer_state: int8, master_weights: compensated, recompute: 3"),
    # the MLP's activation (model.activation)
    "relu2": ("bf16, relu2", "bf16", ", activation: relu2"),
    "fp8cls_relu2": ("fp8 + classifier, relu2", "fp8, fp8_classifier: true", ", activation: relu2"),
    # how the model knows positions (model.pos_embedding): rotary embeddings in place of wpe
    "rope": ("bf16, rope", "bf16", ", pos_embedding: rope"),
    "fp8cls_rope": ("fp8 + classifier, rope", "fp8, fp8_classifier: true", ", pos_embedding: rope"),
}
PRECISIONS = "bf16,fp8cls,fp8,fp8cls_fwdacc,fp8cls_allacc,fp8cls_epi"  # --policies' default
MEMORY_MODES = "bf16,state_bf16,state_int8,comp,int8_comp,fp8cls_int8_comp_r3"  # --policies for the memory modes
DEFAULT_FP8 = "fp8 + classifier"  # what training.precision: fp8 runs by default
RUN = """run: {{name: {name}, out_dir: {out}, seed: 42}}
model: {{preset: {model}{model_keys}}}
data: {{train: "{train}", val: "{val}", shuffle: false}}
training: {{device: {device}, precision: {prec}, micro_batch: {batch}, seq_len: {seq}, steps: {steps}, lr: {lr},
           warmup_steps: {warmup}, min_lr_frac: 0.1, weight_decay: 0.1, grad_clip: 1.0,
           deterministic: {deterministic}}}
eval: {{every: {eval_every}, batches: all}}
log: {{every: 1, progress: false}}
checkpoint: {{every: 0}}
"""


def shard(data, kind, out):
    """The corpus's `kind` shard (train or val) in DIR, unpacked into OUT when it is .xz."""
    found = sorted(Path(data).glob(f"*_{kind}.bin")) or sorted(Path(data).glob(f"*_{kind}.bin.xz"))
    if not found:
        sys.exit(f"convergence: no *_{kind}.bin(.xz) in {data}")
    p = found[0]
    if p.suffix != ".xz":
        return p
    dst = out / "data" / p.stem
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".part")
        with lzma.open(p) as src, open(tmp, "wb") as f:
            shutil.copyfileobj(src, f, 1 << 24)
        tmp.rename(dst)
    return dst


def shard_tokens(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    if header[0] != 20240520:
        sys.exit(f"convergence: {path} is not a token shard (magic {header[0]})")
    return int(header[2])


def time_to_reach(seconds, losses, target):
    """The seconds at which `losses` (evaluated at `seconds`) first reach `target`, linear between two
    evaluations; None when they never do."""
    for i, (s, v) in enumerate(zip(seconds, losses)):
        if v <= target:
            if i == 0:
                return float(s)
            s0, v0 = seconds[i - 1], losses[i - 1]
            return float(s0 + (s - s0) * (v0 - target) / (v0 - v))
    return None


def windows(steps):
    """The training-loss windows for a run of `steps` steps: 0-50, 50-200, 200-half, half-end (those that
    exist), as (first step, last step) with steps counted from 1."""
    half = steps // 2
    edges = [0, 50, 200, half, steps]
    edges = sorted(set(e for e in edges if 0 <= e <= steps))
    return [(lo + 1, hi) for lo, hi in zip(edges, edges[1:]) if hi > lo]


REPEAT = "run"  # the reference policy run again: "<name> (run 2)"


def compare(logs, ref_name, tolerance, target=None, default=DEFAULT_FP8, structure=None):
    """Each policy against the reference: time to the reference's final validation loss, the window and
    evaluation checks. `structure` (name -> the model's structural keys, "" for the reference's model): a
    policy's windows and evaluations are checked against the first policy of its structure (logs' order);
    the first of another structure is compared with the reference and reported, not checked. Returns (rows,
    ok)."""
    structure = structure or {}
    ref = logs[ref_name]
    goal = float(ref["val_loss"][-1])
    ref_time = float(ref["eval_s"][-1])
    rows, ok = {}, True
    first_of = {}
    for name in logs:
        first_of.setdefault(structure.get(name, ""), name)
    for name, log in logs.items():
        shape = structure.get(name, "")
        if shape == structure.get(ref_name, ""):  # the reference's model: checked, but its own repeats
            base, checked = ref_name, REPEAT not in name
        elif first_of[shape] != name:  # another model's later policies: against its first
            base, checked = first_of[shape], True
        else:  # another model's first policy: against the reference, reported
            base, checked = ref_name, False
        cmp = logs[base]
        reach = time_to_reach(log["eval_s"], log["val_loss"], goal)
        row = {"ms": float(np.median(log["step_ms"][5:])) if len(log["step_ms"]) > 5 else float(np.median(log["step_ms"])),
               "train_s": float(log["eval_s"][-1]), "wall_s": log["wall_s"], "final_val": float(log["val_loss"][-1]),
               "reach_s": reach, "speedup": (ref_time / reach) if reach else None,
               "epoch_speedup": ref_time / float(log["eval_s"][-1]), "windows": [], "evals": []}
        if name != ref_name:
            row["against"], row["checked"] = base, checked
            for lo, hi in windows(len(cmp["loss"])):
                win = (cmp["step"] >= lo) & (cmp["step"] <= hi)
                rel = float(np.mean(log["loss"][win]) / np.mean(cmp["loss"][win]) - 1)
                good = abs(rel) <= tolerance
                ok &= good or not checked
                row["windows"].append({"steps": [lo, hi], "rel": rel, "ok": good})
            # each evaluation against its base's, reported: the check is the windows' (single evaluations
            # early in a run, where the loss falls fastest, move by more than a window's mean between two
            # runs of one policy)
            for s, a, b in zip(cmp["eval_step"], log["val_loss"], cmp["val_loss"]):
                rel = float(a / b - 1)
                row["evals"].append({"step": int(s), "rel": rel, "ok": abs(rel) <= tolerance})
        rows[name] = row
    if target is not None and default in rows:
        sp = rows[default]["speedup"]
        rows[default]["target"] = target
        ok &= sp is not None and sp >= target
    return rows, ok


def markdown(rows, ref_name, goal, tolerance):
    out = [f"Time to {ref_name}'s final validation loss ({goal:.4f}); training seconds (sum of step times)\n",
           "| policy | ms/step | train s | epoch speed-up | final val | reaches it at s | speed-up | against | "
           "worst window | worst eval |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for name, r in rows.items():
        ww = max(r["windows"], key=lambda w: abs(w["rel"]), default=None)
        we = max(r["evals"], key=lambda w: abs(w["rel"]), default=None)
        fmt = lambda w: "-" if w is None else f"{w['rel']:+.2%}" + ("" if w["ok"] else f" (> {tolerance:.0%})")
        against = "-" if "against" not in r else r["against"] + ("" if r["checked"] else " (reported)")
        reach = "never" if r["reach_s"] is None else f"{r['reach_s']:.1f}"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.3f}x"
        out.append(f"| {name} | {r['ms']:.1f} | {r['train_s']:.1f} | {r['epoch_speedup']:.3f}x | {r['final_val']:.4f} | "
                   f"{reach} | {speedup} | {against} | "
                   f"{fmt(ww)} | {fmt(we)} |")
    return "\n".join(out) + "\n"


def plot(logs, goal, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    for name, log in logs.items():
        a.plot(log["eval_s"], log["val_loss"], marker="o", ms=3, label=name)
        b.plot(log["eval_tokens"] / 1e6, log["val_loss"], marker="o", ms=3, label=name)
    for ax, x in ((a, "training seconds (sum of step times)"), (b, "tokens (millions)")):
        ax.axhline(goal, color="gray", lw=0.8, ls="--")
        ax.set_xlabel(x)
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
    a.set_title("validation loss against time")
    b.set_title("validation loss against tokens")
    a.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_log(path, wall_s):
    import h5py
    with h5py.File(path, "r") as f:
        tr = {k: f["train"][k][:] for k in ("step", "loss", "step_ms")}
        ev_step = f["eval/step"][:]
        val = f["eval/val_loss"][:]
        tokens_per_step = int(f.attrs["tokens_per_step"])
    cum = np.cumsum(tr["step_ms"]) / 1000.0
    at = {int(s): float(c) for s, c in zip(tr["step"], cum)}
    eval_s = np.array([at.get(int(s), 0.0) for s in ev_step])
    return tr | {"eval_step": ev_step, "val_loss": val, "eval_s": eval_s,
                 "eval_tokens": ev_step.astype(float) * tokens_per_step, "wall_s": wall_s}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder with *_train.bin and *_val.bin (or .xz)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", default=PRECISIONS,
                    help="comma-separated, from: " + ", ".join(f"{k} ({v[0]})" for k, v in POLICIES.items()))
    ap.add_argument("--model", default="d12")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=0, help="0: one epoch of the train shard")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--lr", type=float, default=6e-4, help="training.lr, the peak learning rate")
    ap.add_argument("--deterministic", action="store_true",
                    help="training.deterministic true: a policy run twice gives the same losses, so the windows "
                         "measure the policy alone (the default, false, is the fast mode)")
    ap.add_argument("--target", type=float, default=1.3, help="the default FP8 policy's speed-up to reach")
    ap.add_argument("--ref-repeats", type=int, default=1,
                    help="runs of the reference policy (the first); each repeat is a row against the first run: "
                         "the run-to-run spread (none under --deterministic), reported, not checked")
    a = ap.parse_args()
    names = [p.strip() for p in a.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        sys.exit(f"convergence: unknown policies {unknown}; known: {', '.join(POLICIES)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train, val = shard(a.data, "train", out), shard(a.data, "val", out)
    steps = a.steps or shard_tokens(train) // (a.batch * a.seq)
    logs, structure = {}, {}
    runs = [(names[0], 1)] + [(names[0], r) for r in range(2, a.ref_repeats + 1)] + [(k, 1) for k in names[1:]]
    for key, rep in runs:
        name, prec, model_keys = (POLICIES[key] + ("",))[:3]
        run = "conv_" + key + (f"_run{rep}" if rep > 1 else "")
        name += f" ({REPEAT} {rep})" if rep > 1 else ""
        y = out / f"{run}.yaml"
        y.write_text(RUN.format(name=run, out=out / "runs", model=a.model, model_keys=model_keys, train=train, val=val,
                                device=a.device, lr=a.lr, deterministic=str(a.deterministic).lower(),
                                prec=prec, batch=a.batch, seq=a.seq, steps=steps,
                                warmup=max(1, steps // 20), eval_every=a.eval_every))
        shutil.rmtree(out / "runs" / run, ignore_errors=True)
        cmd = [str(ROOT / "train"), "--yaml", str(y)]
        print("+", " ".join(cmd), flush=True)
        t0 = time.monotonic()
        with open(out / f"{run}.log", "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        wall = time.monotonic() - t0
        log = out / "runs" / run / "log.h5"
        if rc != 0 or not log.exists():
            print(f"{name}: exit {rc}; see {out / (run + '.log')}", flush=True)
            return 1
        logs[name] = read_log(log, wall)
        structure[name] = model_keys
    ref = POLICIES[names[0]][0]
    rows, ok = compare(logs, ref, a.tolerance, a.target if DEFAULT_FP8 in logs else None, structure=structure)
    goal = float(logs[ref]["val_loss"][-1])
    md = markdown(rows, ref, goal, a.tolerance)
    (out / "convergence.md").write_text(md)
    (out / "convergence.json").write_text(json.dumps(
        {"steps": steps, "tokens_per_step": a.batch * a.seq, "model": a.model, "goal": goal, "ok": bool(ok),
         "policies": rows,
         "curves": {n: {"eval_step": l["eval_step"].tolist(), "eval_s": l["eval_s"].tolist(),
                        "val_loss": l["val_loss"].tolist()} for n, l in logs.items()}}, indent=1))
    plot(logs, goal, out / "convergence.png")
    print(md)
    print("convergence checks:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
