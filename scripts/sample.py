#!/usr/bin/env python3
"""Generate text from a checkpoint: encodes the prompt with the GPT-2 tokenizer, runs
`./train sample` for the token ids, and decodes what comes back.

    python3 scripts/sample.py --ckpt runs/x --prompt "ROMEO:" --tokens 100

GPT-2's vocab.json and merges.txt are taken, without any download, from the first of: --vocab (a folder
holding both, or the file with --merges), the run's eval.vocab (with eval.merges: the two files), the folder of the run's data.train shards
(prepare_data.py puts the files it tokenized with there), and prepare_data.py's download cache. A model
of another vocabulary (the synthetic quickstart's 256 ids) has no text: its token ids are printed.
"""
import argparse
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prepare_data  # noqa: E402  (tokenizer loading lives there)

ROOT = Path(__file__).resolve().parent.parent
GPT2_VOCAB = prepare_data.EOT + 1


class SampleError(Exception):
    """Bad input: the message says what is wrong and what to do."""


def run_config(train, ckpt):
    """The config the checkpoint was trained with, as a dict of sections."""
    p = subprocess.run([str(train), "sample", "--ckpt", str(ckpt), "--print-config"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SampleError(p.stderr.strip().removeprefix("error: ") or f"{train} sample exited {p.returncode}")
    return yaml.safe_load(p.stdout) or {}


def bpe_candidates(cfg):
    """[(where, folder or None when not set)] to look in for vocab.json and merges.txt, in order; the run's
    eval.vocab with eval.merges is (where, (vocab.json, merges.txt)) instead, the two files themselves."""
    out = []
    ev = cfg.get("eval") or {}
    vocab, merges = ev.get("vocab") or "", ev.get("merges") or ""
    if vocab and merges:
        out.append(("the run's eval.vocab and eval.merges", (Path(vocab), Path(merges))))
    else:
        out.append(("the run's eval.vocab", Path(vocab) if vocab else None))
    train = (cfg.get("data") or {}).get("train") or ""
    out.append(("the folder of the run's data.train shards", Path(train).parent if train else None))
    out.append(("prepare_data.py's download cache", prepare_data.default_cache_dir()))
    return out


def find_bpe(args, cfg):
    """(vocab.json, merges.txt) paths, or (None, reasons) when none is found."""
    given = prepare_data.given_bpe_files(args.vocab, args.merges)
    if given is not None:
        return given, []
    looked = []
    for where, folder in bpe_candidates(cfg):
        if folder is None:
            looked.append(f"{where} (not set)")
        elif isinstance(folder, tuple):
            if all(f.is_file() for f in folder):
                return folder, []
            looked.append(f"{where} ({folder[0]}, {folder[1]}: not both files)")
        elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            return (folder / "vocab.json", folder / "merges.txt"), []
        else:
            looked.append(f"{where} ({folder}: no vocab.json and merges.txt)")
    if args.download:
        return prepare_data.resolve_bpe_files(None, None, prepare_data.default_cache_dir()), []
    return None, looked


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="a run directory (its newest checkpoint) or a checkpoint folder")
    ap.add_argument("--prompt", help="text to continue (default: the start of a document)")
    ap.add_argument("--prompt-ids", help="comma-separated token ids instead of text")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="sampling seed (default: %(default)s)")
    ap.add_argument("--vocab", help=prepare_data.VOCAB_HELP)
    ap.add_argument("--merges", help=prepare_data.MERGES_HELP)
    ap.add_argument("--download", action="store_true",
                    help="when no vocabulary is found, download GPT-2's into prepare_data.py's cache (needs internet)")
    ap.add_argument("--train", default=str(ROOT / "train"), help="the train binary")
    a = ap.parse_args(argv)
    try:
        if a.prompt is not None and a.prompt_ids is not None:
            raise SampleError("give --prompt (text) or --prompt-ids, not both")
        cfg = run_config(a.train, a.ckpt)
        n_vocab = int((cfg.get("model") or {}).get("vocab_size", 0))
        tok = None
        if n_vocab < GPT2_VOCAB:  # not GPT-2's vocabulary: no text to encode or decode
            if a.prompt is not None:
                raise SampleError(f"the model in {a.ckpt} has a vocabulary of {n_vocab} token ids, not GPT-2's "
                                  f"{GPT2_VOCAB}, so a text prompt cannot be encoded for it; give --prompt-ids "
                                  f"(0 to {n_vocab - 1}) or no prompt")
            print(f"(the model's vocabulary is {n_vocab} ids, not GPT-2's: printing token ids)", file=sys.stderr)
        else:
            files, looked = find_bpe(a, cfg)
            if files is None:
                missing = ("no GPT-2 vocabulary (vocab.json and merges.txt) was found; looked in: " +
                           "; ".join(looked) + ". Give --vocab FOLDER, or --download (needs internet)")
                if a.prompt is not None:
                    raise SampleError(missing + ", or --prompt-ids")
                print(f"({missing}; printing token ids)", file=sys.stderr)
            else:
                tok = prepare_data.load_tokenizer(*files)
        cmd = [a.train, "sample", "--ckpt", a.ckpt, "--tokens", str(a.tokens), "--temperature", str(a.temperature),
               "--seed", str(a.seed)]
        if a.prompt is not None:
            cmd += ["--prompt-ids", ",".join(map(str, [prepare_data.EOT] + tok.encode(a.prompt).ids))]
        elif a.prompt_ids is not None:
            cmd += ["--prompt-ids", a.prompt_ids]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SampleError(p.stderr.strip().removeprefix("error: ") or f"{a.train} sample exited {p.returncode}")
    except (SampleError, prepare_data.PrepareError) as e:
        sys.exit(f"error: {e}")
    out = [int(x) for x in p.stdout.replace("|", " ").split()]  # the prompt's ids | the generated ones
    if tok is None:
        print(" ".join(map(str, out)))
    else:  # without --prompt-ids the first id is <|endoftext|>, the start of a document: not text
        print(tok.decode(out if a.prompt_ids is not None else out[1:]))


if __name__ == "__main__":
    main()
