#!/usr/bin/env python3
"""GPT-2 throughput on one GPU: this trainer against the PyTorch baseline (bench/pytorch_gpt2.py), the
same configs in one invocation. Writes results.json and results.md to --out (again after every run, so a
run cut short keeps those before it) and prints the table.

    python3 bench/gpu_bench.py --out bench_out [--steps 15] [--configs d12:64,d48:16] [--variants 0,1,0det,0prof]
                               [--no-torch] [--no-torch-bf16] [--torch-fp8 tensorwise,rowwise] [--matmul-search S]

Variants of this trainer: the recompute level, then "fp8" for training.precision fp8 (bf16 without it),
"cls" after it for training.fp8_classifier true (the classifier's products in FP8 too, the default; without
"cls" an fp8 variant writes false: the block products only), "epi" after that for
training.fp8_gelu_epilogue true (GELU's FP8 output from fc's epilogue; "cast" writes false, the default), "fwdacc"
or "allacc" after fp8 for training.fp8_fast_accum forward or all (the default, dinp, is left unwritten), "det" for
training.deterministic (bit-reproducible steps) or "prof" for a run with log.op_profile whose per-op table
is kept (its step times include the profiler's events, so it does not count as a throughput figure), and
last the model's structure: "relu2" for model.activation relu2 (the squared ReLU in place of GELU), "rope"
for model.pos_embedding rope (rotary embeddings in place of wpe), e.g. 0, 1, 0fp8, 0fp8cls, 0fp8clsepi,
0fp8clsfwdacc, 0det, 0fp8prof, 0fp8clsprof, 0relu2, 0fp8clsrelu2, 0rope, 0fp8clsrelu2rope. --matmul-search S sets this
trainer's training.matmul_search_s (seconds per matmul shape for cuBLASLt configurations beyond the
heuristic's).

PyTorch: the bf16 baseline, and with --torch-fp8 one more run per torchao float8 recipe (pytorch_gpt2.py
--fp8 R: the blocks' Linear layers on FP8); --no-torch leaves out every PyTorch run, --no-torch-bf16 only
the bf16 one.

Both sides: bf16 (or FP8 products where the row says fp8), seq 1024, AdamW, clipping 1.0, random-ish
tokens, median step after warm-up steps. MFU as in shared BASELINES: FLOPs/token = 6 N + 6 L C T over
989.5 TFLOP/s, whatever the precision. Ratios, within the same preset and micro-batch: tokens/s and peak
memory against the PyTorch bf16 baseline ("x PyTorch"), tokens/s against this trainer's bf16 run at
recompute 0, variant "0" ("x this bf16"). In results.json this trainer's fp8 rows also hold fp8_saturated
(tensors whose values their FP8 scale clipped, summed over the steps).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import h5py

ROOT = Path(__file__).resolve().parent.parent
PEAK = 989.5e12


def run(cmd, log):
    print("+", " ".join(map(str, cmd)), flush=True)
    with open(log, "w") as f:
        p = subprocess.run(list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    return p.returncode


# a variant's last letters: the model's structure (model.<key>: value), in this order
STRUCTURE = {"relu2": ("activation", "relu2"), "rope": ("pos_embedding", "rope")}


def structure(variant):
    """The variant without its structural suffixes, and their model keys ({key: value})."""
    keys = {}
    for suffix in reversed(STRUCTURE):
        if variant.endswith(suffix):
            variant = variant.removesuffix(suffix)
            keys[STRUCTURE[suffix][0]] = STRUCTURE[suffix][1]
    return variant, keys


def check_variants(ap, variants):
    """--variants: each a recompute level followed by fp8 or fp8cls (then optionally epi or cast, fwdacc or
    allacc), det or prof (an argparse error otherwise)."""
    for v in variants.split(","):
        v = structure(v)[0]
        if (not v[:1].isdigit() or ("cls" in v and "fp8cls" not in v) or
                (("cast" in v or "epi" in v or "acc" in v) and "fp8" not in v) or ("cast" in v and "epi" in v) or
                ("fwdacc" in v and "allacc" in v) or v.count("acc") != ("fwdacc" in v) + ("allacc" in v)):
            ap.error(f"--variants: {v!r} is not a recompute level followed by fp8 or fp8cls (then epi or cast, "
                     "fwdacc or allacc), det or prof")


def ours(preset, mb, variant, steps, warmup, out, train, search=0.0):
    recompute = int(variant[0])
    det, prof, fp8, cls = "det" in variant, "prof" in variant, "fp8" in variant, "cls" in variant
    base, model_keys = structure(variant)
    cast, epi = "cast" in base, "epi" in base
    acc = "forward" if "fwdacc" in variant else "all" if "allacc" in variant else None
    # FP8 keys written only when the variant names them (builds that predate a key run the others)
    fp8_keys = ((f" fp8_gelu_epilogue: {str(epi).lower()}," if cast or epi else "") +
                (f" fp8_fast_accum: {acc}," if acc else ""))
    # the classifier's precision written out for every FP8 variant, so a row means the same whatever the default
    cls_key = f" fp8_classifier: {str(cls).lower()}," if fp8 else ""
    name = f"{preset}_b{mb}_r{variant}"
    yaml = out / f"{name}.yaml"
    yaml.write_text(f"""run: {{name: {name}, out_dir: {out}/runs}}
model: {{preset: {preset}{"".join(f", {k}: {v}" for k, v in model_keys.items())}}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: cuda, precision: {"fp8" if fp8 else "bf16"},{cls_key}{fp8_keys} micro_batch: {mb},
           seq_len: 1024, steps: {steps}, lr: 6.0e-4,
           warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0, recompute: {recompute},
           deterministic: {str(det).lower()}, matmul_search_s: {search}}}
eval: {{batches: 0}}
log: {{every: 1, progress: false, op_profile: {str(prof).lower()}}}
""")
    rc = run([train, "--yaml", yaml], out / f"{name}.log")
    impl = ("this" + (" fp8" if fp8 else "") + (" +classifier" if cls else "") + (" GELU cast" if cast else "") + (" GELU epilogue" if epi else "") +
            (f" fast accumulation {acc}" if acc else "") + (" (deterministic)" if det else "") +
            (" (op profile)" if prof else "") + "".join(f" {v}" for v in model_keys.values()))
    r = {"impl": impl, "variant": variant, "preset": preset, "micro_batch": mb, "recompute": recompute,
         "status": "ok" if rc == 0 else f"exit {rc}"}
    if prof:
        text = (out / f"{name}.log").read_text()
        table = text[text.find("op profile over"):]
        suffix = (("_fp8" if fp8 else "") + ("cls" if cls else "") + ("cast" if cast else "") + ("epi" if epi else "") +
                  ("fwdacc" if acc == "forward" else "allacc" if acc == "all" else "") + "".join(f"_{v}" for v in model_keys.values()))
        (out / f"op_profile_{preset}_b{mb}{suffix}.txt").write_text(table)
        print(table, flush=True)
    logp = out / "runs" / name / "log.h5"
    if rc != 0 or not logp.exists():  # a failed run: its status says so, its log may hold no step
        return r
    with h5py.File(logp, "r") as f:
        ms = list(f["train/step_ms"][:])
        tps_step = int(f.attrs["tokens_per_step"])
        fpt = float(f.attrs["flops_per_token"])
        r["peak_mem_bytes"] = int(f["memory/measured"].attrs["peak"])
        r["pred_mem_bytes"] = int(f["memory/predicted"].attrs["total"])
        r["final_loss"] = float(f["train/loss"][-1])
        r["message"] = f.attrs["message"]
        if fp8 and "train/fp8_saturated" in f:  # tensors whose values the FP8 scales clipped, all steps
            r["fp8_saturated"] = int(f["train/fp8_saturated"][:].sum())
    if len(ms) > warmup:
        med = statistics.median(ms[warmup:])
        r.update(median_step_ms=med, tokens_per_s=tps_step / (med / 1000), mfu=fpt * tps_step / (med / 1000) / PEAK)
    return r


def torch_side(preset, mb, steps, warmup, out, fp8="none"):
    tag = f"torch_{preset}_b{mb}" + ("" if fp8 == "none" else f"_fp8_{fp8}")
    j = out / f"{tag}.json"
    rc = run([sys.executable, ROOT / "bench/pytorch_gpt2.py", "--preset", preset, "--micro-batch", mb, "--steps", steps,
              "--warmup", warmup, "--json", j, *([] if fp8 == "none" else ["--fp8", fp8])], out / f"{tag}.log")
    r = {"impl": "pytorch" + ("" if fp8 == "none" else f" fp8 {fp8}"), "preset": preset, "micro_batch": mb,
         "recompute": "-", "status": "ok" if rc == 0 else f"exit {rc}"}
    if j.exists():
        d = json.loads(j.read_text())
        for k in ["median_step_ms", "tokens_per_s", "mfu", "peak_mem_bytes", "final_loss"]:
            r[k] = d.get(k)
    return r


def compare(rows):
    """Ratios against the PyTorch bf16 row and this trainer's bf16 recompute-0 row of the same preset and
    micro-batch; op-profile runs get none (the profiler slows them)."""
    def ref(r, pred):
        return next((x for x in rows if pred(x) and x["preset"] == r["preset"]
                     and x["micro_batch"] == r["micro_batch"] and x.get("tokens_per_s")), None)
    for r in rows:
        if "profile" in r["impl"] or not r.get("tokens_per_s"):
            continue
        t = ref(r, lambda x: x["impl"] == "pytorch")
        if t:
            r["vs_pytorch"] = r["tokens_per_s"] / t["tokens_per_s"]
            r["mem_vs_pytorch"] = r.get("peak_mem_bytes", 0) / t["peak_mem_bytes"] if t.get("peak_mem_bytes") else None
        b = ref(r, lambda x: x["impl"] == "this" and x.get("variant") == "0")
        if b:
            r["vs_this_bf16"] = r["tokens_per_s"] / b["tokens_per_s"]


def report(rows, out):
    compare(rows)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    gib = lambda b: f"{b / 2**30:.1f}" if b else "-"
    lines = ["| impl | model | micro-batch | recompute | ms/step | tokens/s | MFU | peak GiB | x PyTorch tok/s | "
             "x PyTorch mem | x this bf16 tok/s | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "-")
        lines.append(f"| {r['impl']} | {r['preset']} | {r['micro_batch']} | {r['recompute']} | {f('median_step_ms', '{:.1f}')} | "
                     f"{f('tokens_per_s', '{:,.0f}')} | {f('mfu', '{:.1%}')} | {gib(r.get('peak_mem_bytes'))} | "
                     f"{f('vs_pytorch', '{:.3f}')} | {f('mem_vs_pytorch', '{:.2f}')} | {f('vs_this_bf16', '{:.3f}')} | "
                     f"{r['status']} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--configs", default="d12:64,d48:16")
    ap.add_argument("--variants", default="0,1,0det,0prof")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-torch-bf16", action="store_true",
                    help="leave out the PyTorch bf16 baseline but keep the --torch-fp8 runs")
    ap.add_argument("--torch-fp8", default="none", help="comma-separated torchao float8 recipes for extra "
                    "PyTorch runs: tensorwise, rowwise (default none)")
    ap.add_argument("--train", default=str(ROOT / "train"))
    ap.add_argument("--matmul-search", type=float, default=0.0)
    a = ap.parse_args(argv)
    recipes = [x for x in a.torch_fp8.split(",") if x and x != "none"]
    for x in recipes:
        if x not in ("tensorwise", "rowwise"):
            ap.error(f"--torch-fp8: {x!r} is not one of tensorwise, rowwise")
    check_variants(ap, a.variants)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for cfg in a.configs.split(","):
        preset, mb = cfg.split(":")
        for v in a.variants.split(","):
            rows.append(ours(preset, int(mb), v, a.steps, a.warmup, out, a.train, a.matmul_search))
            report(rows, out)
        for fp8 in ([] if a.no_torch else ([] if a.no_torch_bf16 else ["none"]) + recipes):
            rows.append(torch_side(preset, int(mb), a.steps, a.warmup, out, fp8))
            report(rows, out)
    print("\n".join(report(rows, out)))


if __name__ == "__main__":
    main()
