#!/usr/bin/env python3
"""Check a Hugging Face export against this trainer's own forward pass and greedy generation.

Exports a run's newest checkpoint with `./train export --format hf`, computes the logits of every
position of a prompt with `./train sample --logits` and its greedy continuation with `./train sample
--temperature 0`, and compares both with those of the exported folder computed by transformers'
GPT2LMHeadModel (fp32, CPU; the continuation by `generate`), or by a NumPy transcription of GPT-2's
forward that reads the safetensors file as Hugging Face lays it out (Conv1D weights (in, out), tied lm
head). The continuations must be equal token for token, except after a near-tie: a position where the
reference's two best logits are within the logit tolerance, which fp32 rounding may order either way.

    python3 scripts/check_hf_export.py runs/quickstart                      # transformers if installed
    python3 scripts/check_hf_export.py runs/quickstart --reference numpy

Exit status: 0 the logits agree within the tolerance and the continuations match, 1 they do not (the
largest difference, or where the continuations part, is printed), 2 the export or the trainer failed, 3
--reference transformers was asked for and torch or transformers is not installed.
"""
import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("numpy", "h5py", "safetensors")
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def numpy_logits(folder, ids):
    """GPT-2's forward in float64 over a Hugging Face folder: (len(ids), vocab_size) logits."""
    from safetensors.numpy import load_file
    cfg = json.loads((Path(folder) / "config.json").read_text())
    raw = load_file(str(Path(folder) / "model.safetensors"))
    t = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in raw.items()}
    n, C, H, eps = len(ids), cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    x = t["wte.weight"][ids] + t["wpe.weight"][:n]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(cfg["n_layer"]):
        p = lambda name: t[f"h.{layer}.{name}"]  # noqa: E731
        h = _layer_norm(x, p("ln_1.weight"), p("ln_1.bias"), eps)
        q, k, v = np.split(h @ p("attn.c_attn.weight") + p("attn.c_attn.bias"), 3, axis=-1)
        q, k, v = (a.reshape(n, H, C // H).transpose(1, 0, 2) for a in (q, k, v))
        att = q @ k.transpose(0, 2, 1) / math.sqrt(C // H) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(n, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = _layer_norm(x, p("ln_2.weight"), p("ln_2.bias"), eps)
        x = x + _gelu_tanh(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")) @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = _layer_norm(x, t["ln_f.weight"], t["ln_f.bias"], eps)
    return x @ t.get("lm_head.weight", t["wte.weight"]).T  # the head: its own matrix when untied


def _fp32():
    """from_pretrained's keyword for fp32 weights: `dtype` from transformers 4.56 on (5 warns of
    `torch_dtype`), `torch_dtype` before."""
    import re
    import torch
    import transformers
    version = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return {"dtype" if version >= (4, 56) else "torch_dtype": torch.float32}


def transformers_logits(folder, ids):
    """The same logits from transformers.GPT2LMHeadModel.from_pretrained(folder), fp32 on the CPU."""
    import torch
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(str(folder), **_fp32()).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def transformers_greedy(folder, ids, n):
    """transformers' generate(do_sample=False) continuation of ids by n tokens, never stopping early."""
    import torch
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(str(folder), **_fp32()).eval()
    # `./train sample` does not stop at <|endoftext|>; generate would (generation_config.json), and it
    # fills unset values from the model's generation config, so the stop token goes there
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, num_beams=1, max_new_tokens=n, pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


def numpy_greedy(folder, ids, n):
    """The greedy continuation by numpy_logits, one whole forward per new token."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(np.argmax(numpy_logits(folder, seq)[-1])))
    return seq[len(ids):]


def have_transformers():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def trainer_greedy(train, ckpt, ids, n):
    """`./train sample --temperature 0`: the n tokens it generates after ids."""
    p = subprocess.run([str(train), "sample", "--ckpt", str(ckpt), "--prompt-ids", ",".join(map(str, ids)),
                        "--tokens", str(n), "--temperature", "0"], check=True, capture_output=True, text=True)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    prompt, _, generated = lines[-1].partition("|")  # the prompt's ids | the generated ones
    if [int(t) for t in prompt.split()] != list(ids):
        raise ValueError(f"train sample printed {lines[-1]!r}, which does not start with the prompt")
    return [int(t) for t in generated.split()]


def trainer_logits(train, ckpt, ids, out):
    subprocess.run([str(train), "sample", "--ckpt", str(ckpt), "--prompt-ids", ",".join(map(str, ids)),
                    "--tokens", "0", "--logits", str(out)], check=True, capture_output=True, text=True)
    import h5py
    with h5py.File(out, "r") as f:
        return f["logits"][()].astype(np.float64)


def compare(run, reference="auto", prompt_ids=None, train=ROOT / "train", rtol=1e-4, new_tokens=None):
    """(max abs difference of the prompt's logits, tolerance, reference used) for a run directory or
    checkpoint; with new_tokens also the greedy continuations: returns then a dict with those three and
    "ours", "theirs" (the continuations) and "parted" (None, or (position, the reference's top-2 logit gap
    there) where they first differ)."""
    if reference == "auto":
        reference = "transformers" if have_transformers() else "numpy"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "hf"
        subprocess.run([str(train), "export", "--ckpt", str(run), "--format", "hf", "--out", str(folder)],
                       check=True, capture_output=True, text=True)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        n_pos = json.loads((folder / "config.json").read_text())["n_positions"]
        ids = prompt_ids or [int(i) for i in np.random.default_rng(0).integers(0, vocab, size=min(16, n_pos // 2))]
        ours = trainer_logits(train, run, ids, Path(tmp) / "logits.h5")
        ref = transformers_logits(folder, ids) if reference == "transformers" else numpy_logits(folder, ids)
        diff = float(np.abs(ours - ref).max())
        # fp32 against a float64 (numpy) or fp32 (torch) computation of the same sums: relative to the logits' size
        tol = rtol * max(1.0, float(np.abs(ref).max()))
        if not new_tokens:
            return diff, tol, reference
        n = min(new_tokens, n_pos - len(ids))
        mine = trainer_greedy(train, run, ids, n)
        theirs = (transformers_greedy if reference == "transformers" else numpy_greedy)(folder, ids, n)
        parted = None
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                logits = (transformers_logits if reference == "transformers" else numpy_logits)(
                    folder, ids + theirs[:i])[-1]
                top = np.sort(logits)[-2:]
                parted = (i, float(top[1] - top[0]))
                break
        if parted is None and len(mine) != len(theirs):
            parted = (min(len(mine), len(theirs)), math.inf)
    return {"diff": diff, "tol": tol, "reference": reference, "ours": mine, "theirs": theirs,
            "parted": parted}


def generation_ok(result):
    """The continuations match, or part only at a near-tie of the reference (gap within the tolerance)."""
    return result["parted"] is None or result["parted"][1] <= result["tol"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run directory, its checkpoints/ folder, or a checkpoint folder")
    ap.add_argument("--reference", choices=("auto", "transformers", "numpy"), default="auto",
                    help="what computes the expected logits (auto: transformers when installed, else numpy)")
    ap.add_argument("--prompt-ids", help="comma-separated token ids (default: 16 random ids)")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens to compare (0: logits only)")
    ap.add_argument("--train", default=str(ROOT / "train"), help="the train binary")
    a = ap.parse_args(argv)
    if a.reference == "transformers" and not have_transformers():
        print("SKIP: torch or transformers is not installed (pip install torch transformers)")
        return 3
    ids = [int(i) for i in a.prompt_ids.split(",")] if a.prompt_ids else None
    try:
        r = compare(a.run, a.reference, ids, a.train, new_tokens=a.tokens or None)
    except subprocess.CalledProcessError as e:
        print(f"error: {' '.join(e.cmd)} exited {e.returncode}: {e.stderr.strip()}", file=sys.stderr)
        return 2
    if not a.tokens:
        r = dict(zip(("diff", "tol", "reference"), r))
    ok = r["diff"] <= r["tol"]
    print(f"{'ok' if ok else 'MISMATCH'}: largest logit difference {r['diff']:.3g} (tolerance {r['tol']:.3g}), "
          f"this trainer against {r['reference']}")
    if a.tokens:
        same = generation_ok(r)
        ok = ok and same
        if r["parted"] is None:
            print(f"ok: greedy continuation of {len(r['ours'])} tokens identical: {' '.join(map(str, r['ours']))}")
        else:
            at, gap = r["parted"]
            print(f"{'ok' if same else 'MISMATCH'}: greedy continuations part at new token {at} "
                  f"(the reference's two best logits {gap:.3g} apart{', a near-tie' if same else ''}): "
                  f"ours {r['ours']}, {r['reference']} {r['theirs']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
