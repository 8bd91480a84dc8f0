#!/usr/bin/env python3
"""Check a Hugging Face export against this trainer's own forward pass.

Exports a run's newest checkpoint with `./train export --format hf`, computes the logits of a prompt
with `./train sample --logits`, and compares them with the logits of the exported folder computed by
transformers' GPT2LMHeadModel (fp32, CPU), or by a NumPy transcription of GPT-2's forward that reads the
safetensors file as Hugging Face lays it out (Conv1D weights (in, out), tied lm head).

    python3 scripts/check_hf_export.py runs/quickstart                      # transformers if installed
    python3 scripts/check_hf_export.py runs/quickstart --reference numpy

Exit status: 0 the logits agree within the tolerance, 1 they do not (the largest difference is printed),
2 the export or the trainer failed, 3 --reference transformers was asked for and torch or transformers
is not installed.
"""
import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

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
    return x @ t["wte.weight"].T


def transformers_logits(folder, ids):
    """The same logits from transformers.GPT2LMHeadModel.from_pretrained(folder), fp32 on the CPU."""
    import torch
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(str(folder), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def have_transformers():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def trainer_logits(train, ckpt, ids, out):
    subprocess.run([str(train), "sample", "--ckpt", str(ckpt), "--prompt-ids", ",".join(map(str, ids)),
                    "--tokens", "0", "--logits", str(out)], check=True, capture_output=True, text=True)
    import h5py
    with h5py.File(out, "r") as f:
        return f["logits"][()].astype(np.float64)


def compare(run, reference="auto", prompt_ids=None, train=ROOT / "train", rtol=1e-4):
    """(max abs difference, tolerance, reference used) for a run directory or checkpoint."""
    if reference == "auto":
        reference = "transformers" if have_transformers() else "numpy"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "hf"
        subprocess.run([str(train), "export", "--ckpt", str(run), "--format", "hf", "--out", str(folder)],
                       check=True, capture_output=True, text=True)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        n_pos = json.loads((folder / "config.json").read_text())["n_positions"]
        ids = prompt_ids or [int(i) for i in np.random.default_rng(0).integers(0, vocab, size=min(16, n_pos))]
        ours = trainer_logits(train, run, ids, Path(tmp) / "logits.h5")
        ref = transformers_logits(folder, ids) if reference == "transformers" else numpy_logits(folder, ids)
    diff = float(np.abs(ours - ref).max())
    # fp32 against a float64 (numpy) or fp32 (torch) computation of the same sums: relative to the logits' size
    tol = rtol * max(1.0, float(np.abs(ref).max()))
    return diff, tol, reference


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run directory, its checkpoints/ folder, or a checkpoint folder")
    ap.add_argument("--reference", choices=("auto", "transformers", "numpy"), default="auto",
                    help="what computes the expected logits (auto: transformers when installed, else numpy)")
    ap.add_argument("--prompt-ids", help="comma-separated token ids (default: 16 random ids)")
    ap.add_argument("--train", default=str(ROOT / "train"), help="the train binary")
    a = ap.parse_args(argv)
    if a.reference == "transformers" and not have_transformers():
        print("SKIP: torch or transformers is not installed (pip install torch transformers)")
        return 3
    ids = [int(i) for i in a.prompt_ids.split(",")] if a.prompt_ids else None
    try:
        diff, tol, used = compare(a.run, a.reference, ids, a.train)
    except subprocess.CalledProcessError as e:
        print(f"error: {' '.join(e.cmd)} exited {e.returncode}: {e.stderr.strip()}", file=sys.stderr)
        return 2
    ok = diff <= tol
    print(f"{'ok' if ok else 'MISMATCH'}: largest logit difference {diff:.3g} (tolerance {tol:.3g}), "
          f"this trainer against {used}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
