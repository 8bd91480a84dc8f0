#!/usr/bin/env python3
"""Generate text from a checkpoint: encodes the prompt with the GPT-2 tokenizer, runs
`./train sample` for the token ids, and decodes what comes back.

    python3 scripts/sample.py --ckpt runs/x --prompt "ROMEO:" --tokens 100
"""
import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prepare_data  # noqa: E402  (tokenizer loading lives there)

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="a run directory (its newest checkpoint) or a checkpoint folder")
    ap.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", help="GPT-2 vocab.json (downloaded when omitted and online)")
    ap.add_argument("--merges", help="GPT-2 merges.txt")
    ap.add_argument("--train", default=str(ROOT / "train"), help="the train binary")
    a = ap.parse_args(argv)
    try:
        vocab, merges = prepare_data.resolve_bpe_files(a.vocab, a.merges, prepare_data.default_cache_dir())
        tok = prepare_data.load_tokenizer(vocab, merges)
    except prepare_data.PrepareError as e:
        sys.exit(f"error: {e}")
    ids = [prepare_data.EOT] + tok.encode(a.prompt).ids
    cmd = [a.train, "sample", "--ckpt", a.ckpt, "--prompt-ids", ",".join(map(str, ids)), "--tokens", str(a.tokens),
           "--temperature", str(a.temperature), "--seed", str(a.seed)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(p.stderr.strip() or f"{a.train} sample exited {p.returncode}")
    out = [int(x) for x in p.stdout.split()]
    print(tok.decode(out[1:]))


if __name__ == "__main__":
    main()
