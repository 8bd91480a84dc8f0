#!/usr/bin/env python3
"""Turn HellaSwag's JSONL into the token file the trainer scores (eval.hellaswag).

Each line of the input is one example with `ctx` (the context), `endings` (the candidate endings) and
`label` (the index of the right one), as in HellaSwag's hellaswag_val.jsonl. The context is encoded
as it is and each ending with a space before it, with the GPT-2 tokenizer, as GPT-2 evaluations do.

Output: llm.c's eval file format. int32[256] little-endian header ([0]=20240522, [1]=1,
[2]=examples, [3]=the longest example in bytes), then per example a run of uint16: 65535, the
example's size in bytes, its index (mod 65536), the label, the number of endings, the context's
length and tokens, then each ending's length and tokens.

    python3 scripts/prepare_hellaswag.py hellaswag_val.jsonl --out data/hellaswag_val.bin --vocab gpt2

GPT-2's vocabulary: --vocab FOLDER (holding vocab.json and merges.txt) or --vocab FILE --merges FILE, else
the one in the --out file's folder or the input's (prepare_data.py keeps the one it tokenized with beside
its shards), else prepare_data.py's download cache (downloaded when missing).
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import project_env  # noqa: E402

project_env.need("numpy", "tokenizers")
import numpy as np  # noqa: E402

import prepare_data  # noqa: E402
from prepare_data import PrepareError  # noqa: E402
from corpus import json_line  # noqa: E402

MAGIC = 20240522
VERSION = 1
START = 65535


def read_examples(path, limit=0):
    """[(context, endings, label)] of a HellaSwag JSONL file; a bad line is named by its number."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            ex = json_line(line, path, lineno)
            if ex is None:
                continue
            ctx, endings, label = ex.get("ctx"), ex.get("endings"), ex.get("label")
            if not isinstance(ctx, str) or not ctx:
                raise PrepareError(f"{path}:{lineno}: no context (a non-empty string 'ctx')")
            if not isinstance(endings, list) or not endings or not all(isinstance(e, str) and e for e in endings):
                raise PrepareError(f"{path}:{lineno}: 'endings' must be a list of non-empty strings")
            try:
                label = int(label)
            except (TypeError, ValueError):
                raise PrepareError(f"{path}:{lineno}: no label (HellaSwag's test split has none; use val)") from None
            if not 0 <= label < len(endings):
                raise PrepareError(f"{path}:{lineno}: label {label} but {len(endings)} endings")
            out.append((ctx, endings, label))
            if limit and len(out) == limit:
                break
    if not out:
        raise PrepareError(f"{path}: no examples")
    return out


def encode_example(tok, index, ctx, endings, label):
    """One example's uint16 run."""
    ctx_ids = tok.encode(ctx).ids
    words = [START, 0, index % 65536, label, len(endings), len(ctx_ids)] + ctx_ids
    for e in endings:
        ids = tok.encode(" " + e).ids
        words += [len(ids)] + ids
    if 2 * len(words) >= 65536:
        raise PrepareError(f"example {index} takes {2 * len(words)} bytes, more than the format's 65535")
    words[1] = 2 * len(words)
    return np.asarray(words, dtype="<u2")


def write_eval_file(path, runs):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, len(runs)
    header[3] = max(2 * len(r) for r in runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.tobytes())
            for r in runs:
                f.write(r.tobytes())
        os.chmod(tmp, prepare_data._file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="HellaSwag JSONL (e.g. hellaswag_val.jsonl)")
    ap.add_argument("--out", help="output file (default: the input's name with .bin)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N examples (0: all)")
    ap.add_argument("--vocab", help=prepare_data.VOCAB_HELP + " (default: the one in --out's folder or the input's, "
                    "else downloaded)")
    ap.add_argument("--merges", help=prepare_data.MERGES_HELP)
    ap.add_argument("--cache-dir", help="where downloaded vocab/merges go")
    args = ap.parse_args(argv)
    try:
        if not Path(args.input).is_file():
            raise PrepareError(f"input: no such file: {args.input}")
        if args.limit < 0:
            raise PrepareError("--limit must be >= 0")
        out = Path(args.out) if args.out else Path(args.input).with_suffix(".bin")
        examples = read_examples(args.input, args.limit)
        beside = [out.resolve().parent, Path(args.input).resolve().parent]
        vocab, merges = prepare_data.resolve_bpe_files(args.vocab, args.merges, args.cache_dir, look_in=beside)
        tok = prepare_data.load_tokenizer(vocab, merges)
        write_eval_file(out, [encode_example(tok, i, *ex) for i, ex in enumerate(examples)])
    except PrepareError as e:
        print(f"prepare_hellaswag: error: {e}", file=sys.stderr)
        return 1
    print(f"{out}: {len(examples):,} examples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
