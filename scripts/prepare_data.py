#!/usr/bin/env python3
"""Turn a corpus into llm.c token shards with the GPT-2 tokenizer, streaming.

Inputs are files or folders (searched for *.txt, *.jsonl, *.parquet, also gzipped: *.txt.gz,
*.jsonl.gz), read in order and never whole: a text file is split into documents on blank lines
(the separator "\n\n"), each encoded with "\n\n" restored at its end; a JSONL file holds one
document per line and a Parquet file one per row, in the --text-field field. Every document is
prefixed with <|endoftext|> (50256). Worker processes (--workers) tokenize batches of documents
while the main process writes the tokens in input order, so any number of workers writes the same
shards. The first --val-tokens tokens form the val shard, the rest go to train shards of at most
--shard-tokens tokens each. A text file alone reproduces the reference tinyshakespeare shards token
for token.

Shard format: int32[256] little-endian header ([0]=20240520, [1]=1, [2]=n_tokens), then
uint16[n_tokens]. Output names: PREFIX_val.bin, and PREFIX_train.bin when one train shard
suffices, else PREFIX_train_000000.bin, PREFIX_train_000001.bin, ...

GPT-2's vocabulary: --vocab FOLDER (holding vocab.json and merges.txt) or --vocab FILE --merges FILE
(the rule of every script, `./train export --vocab` and eval.vocab), else the one an earlier run left in
--out-dir, else downloaded into a cache. The files are kept beside the shards, where eval.vocab,
scripts/sample.py and scripts/prepare_hellaswag.py find them.

    python3 scripts/prepare_data.py input.txt --vocab gpt2 --out-dir data/shakespeare --prefix tiny_shakespeare
    python3 scripts/prepare_data.py fineweb-edu/sample/10BT --out-dir data/edu_fineweb10B \\
        --prefix edufineweb --shard-tokens 100000000 --val-tokens 100000000 --workers 16
"""
import argparse
import collections
import multiprocessing
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import project_env

project_env.need("numpy", "tokenizers", "tqdm")
import numpy as np  # noqa: E402

import corpus  # noqa: E402
from corpus import PrepareError, check_inputs, input_files, read_batches

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
EOT = 50256
DOC_SEPARATOR = corpus.DOC_SEPARATOR
GPT2_URLS = {
    "vocab.json": "https://huggingface.co/openai-community/gpt2/resolve/main/vocab.json",
    "merges.txt": "https://huggingface.co/openai-community/gpt2/resolve/main/merges.txt",
}
# "First Citizen:" must encode to these ids with the real GPT-2 vocabulary.
SANITY_TEXT = "First Citizen:"
SANITY_IDS = [5962, 22307, 25]


def _file_mode():
    """0o666 less the umask: what open() would give, since mkstemp creates files 0o600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpt2-bpe"


def download(url, dest):
    """Fetch url into dest atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            data = resp.read()
    except (urllib.error.URLError, OSError) as e:
        raise PrepareError(
            f"cannot download {url} ({e}); this machine looks offline: "
            f"pass --vocab with a local folder of GPT-2's vocab.json and merges.txt") from e
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, _file_mode())
    os.replace(tmp, dest)


VOCAB_HELP = "GPT-2's vocabulary: a folder holding vocab.json and merges.txt, or vocab.json (with --merges)"
MERGES_HELP = "GPT-2's merges.txt, when --vocab is the vocab.json file"


def bpe_folder(folder):
    """(folder/vocab.json, folder/merges.txt) when the folder holds both, else None."""
    v, m = Path(folder) / "vocab.json", Path(folder) / "merges.txt"
    return (v, m) if v.is_file() and m.is_file() else None


def given_bpe_files(vocab, merges):
    """(vocab.json, merges.txt) from --vocab and --merges, the one rule of every script, `./train export
    --vocab` and eval.vocab: --vocab a folder holding both files, or --vocab FILE --merges FILE. None
    when neither is given."""
    if vocab is None and merges is None:
        return None
    if vocab is None:
        raise PrepareError("--merges needs --vocab (the vocab.json file), or give --vocab a folder holding "
                           "vocab.json and merges.txt")
    if Path(vocab).is_dir():
        if merges is not None:
            raise PrepareError(f"--vocab {vocab} is a folder, which holds merges.txt: give no --merges with it")
        found = bpe_folder(vocab)
        if found is None:
            missing = [n for n in ("vocab.json", "merges.txt") if not (Path(vocab) / n).is_file()]
            raise PrepareError(f"--vocab: the folder {vocab} has no {' and no '.join(missing)}")
        return found
    if merges is None:
        raise PrepareError("--vocab FILE needs --merges FILE (or give --vocab a folder holding vocab.json and "
                           "merges.txt)")
    for p, flag in ((vocab, "--vocab"), (merges, "--merges")):
        if not Path(p).is_file():
            raise PrepareError(f"{flag}: no such file: {p}")
    return Path(vocab), Path(merges)


def resolve_bpe_files(vocab, merges, cache_dir, look_in=()):
    """Return (vocab_path, merges_path): those given (given_bpe_files), else those of the first folder of
    look_in that holds both, else the download cache's (downloaded when missing)."""
    given = given_bpe_files(vocab, merges)
    if given is not None:
        return given
    for folder in look_in:
        found = bpe_folder(folder) if folder else None
        if found is not None:
            print(f"using GPT-2's vocabulary in {folder}", file=sys.stderr)
            return found
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    paths = []
    for name, url in GPT2_URLS.items():
        path = cache / name
        if not path.is_file():
            print(f"downloading {url} -> {path}", file=sys.stderr)
            download(url, path)
        paths.append(path)
    return paths[0], paths[1]


def load_tokenizer(vocab_path, merges_path):
    """GPT-2 byte-level BPE from vocab.json + merges.txt, checked against known ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    try:
        bpe = models.BPE.from_file(str(vocab_path), str(merges_path))
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise PrepareError(f"cannot load BPE from {vocab_path} and {merges_path}: {e}") from e
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 split pattern
    tok.decoder = decoders.ByteLevel()
    if tok.token_to_id("<|endoftext|>") != EOT:
        raise PrepareError(f"{vocab_path}: <|endoftext|> is not id {EOT}; not the GPT-2 vocabulary")
    got = tok.encode(SANITY_TEXT).ids
    if got != SANITY_IDS:
        raise PrepareError(f"{vocab_path}/{merges_path}: {SANITY_TEXT!r} encodes to {got}, "
                           f"expected {SANITY_IDS}; not the GPT-2 vocabulary and merges")
    if tok.get_vocab_size() > 65536:
        raise PrepareError(f"vocabulary of {tok.get_vocab_size()} does not fit uint16 tokens")
    return tok


def encode_batch(tok, docs):
    """<|endoftext|> + document, for each, as one uint16 array."""
    out = []
    for enc in tok.encode_batch(docs):
        out.append(EOT)
        out.extend(enc.ids)
    return np.asarray(out, dtype=np.uint16)


_WORKER_TOKENIZER = None


def _worker_init(vocab, merges):
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _WORKER_TOKENIZER = load_tokenizer(vocab, merges)


def _worker_encode(docs):
    return encode_batch(_WORKER_TOKENIZER, docs)


def token_blocks(files, field, workers, bpe_files, tok, progress):
    """Yield the uint16 token arrays of every document of every file, in input order; workers > 1
    tokenize in that many processes with a bounded number of batches in flight (memory stays flat)."""
    batches = ((docs, nbytes) for path, fmt in files for docs, nbytes in read_batches(path, fmt, field))
    if workers <= 1:
        for docs, nbytes in batches:
            yield encode_batch(tok, docs)
            progress.update(nbytes)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds tokenizer threads
    with ctx.Pool(workers, initializer=_worker_init, initargs=tuple(str(p) for p in bpe_files)) as pool:
        pending = collections.deque()
        for docs, nbytes in batches:
            pending.append((pool.apply_async(_worker_encode, (docs,)), nbytes))
            while len(pending) > 2 * workers:
                result, n = pending.popleft()
                yield result.get()
                progress.update(n)
        while pending:
            result, n = pending.popleft()
            yield result.get()
            progress.update(n)


class ShardFile:
    """One shard written as its tokens arrive, so no shard is held in memory: a temp file in the
    output folder whose header gets the token count when it is closed."""

    def __init__(self, out_dir, prefix):
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{prefix}.", suffix=".tmp")
        self.path, self.f, self.n = Path(tmp), os.fdopen(fd, "wb"), 0
        self.f.write(np.zeros(HEADER_INTS, dtype="<i4").tobytes())

    def write(self, tokens):
        self.f.write(np.asarray(tokens, dtype="<u2").tobytes())
        self.n += len(tokens)

    def close(self):
        header = np.zeros(HEADER_INTS, dtype="<i4")
        header[0], header[1], header[2] = MAGIC, VERSION, self.n
        self.f.seek(0)
        self.f.write(header.tobytes())
        self.f.close()
        os.chmod(self.path, _file_mode())
        return self.path

    def discard(self):
        if not self.f.closed:
            self.f.close()
        if self.path.exists():
            self.path.unlink()


def read_shard(path):
    """Return the uint16 tokens of an llm.c shard, checking its header."""
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < 4 * HEADER_INTS:
        raise PrepareError(f"{path}: {len(raw)} bytes, shorter than the 1024-byte header")
    header = np.frombuffer(raw[:4 * HEADER_INTS], dtype="<i4")
    if header[0] != MAGIC or header[1] != VERSION:
        raise PrepareError(f"{path}: header magic/version {header[0]}/{header[1]}, "
                           f"expected {MAGIC}/{VERSION}")
    n = int(header[2])
    if len(raw) != 4 * HEADER_INTS + 2 * n:
        raise PrepareError(f"{path}: {len(raw)} bytes, expected {4 * HEADER_INTS + 2 * n} for {n} tokens")
    return np.frombuffer(raw[4 * HEADER_INTS:], dtype="<u2")


class ShardWriter:
    """Takes tokens in order: the first val_tokens go to the val shard, the rest to train shards. Every
    shard is written aside and named only by finish(), so an input that fails half-way leaves no partial
    output, and the shards of an earlier run stay as they were."""

    def __init__(self, out_dir, prefix, val_tokens, shard_tokens):
        self.out_dir, self.prefix = out_dir, prefix
        self.val_tokens, self.shard_tokens = val_tokens, shard_tokens
        self.current = None  # the ShardFile being written
        self.val_done = val_tokens == 0
        self.val_tmp = None  # the finished val shard
        self.train_tmp = []  # finished train shards, named at the end when their count is known
        self.n_val = 0
        self.n_train = 0

    def add(self, tokens):
        while len(tokens):
            if self.current is None:
                self.current = ShardFile(self.out_dir, f"{self.prefix}_{'train' if self.val_done else 'val'}")
            cap = self.val_tokens if not self.val_done else self.shard_tokens
            take = min(cap - self.current.n, len(tokens))
            self.current.write(tokens[:take])
            tokens = tokens[take:]
            if self.current.n == cap:
                self._close()

    def _close(self):
        shard, self.current = self.current, None
        path = shard.close()
        if not self.val_done:
            self.val_tmp = path
            self.n_val = shard.n
            self.val_done = True
            return
        self.train_tmp.append(path)
        self.n_train += shard.n

    def finish(self):
        """Close what is left and give the train shards their final names; return their paths."""
        if not self.val_done:
            n = self.current.n if self.current else 0
            raise PrepareError(f"the input has only {n} tokens, not more than "
                               f"--val-tokens {self.val_tokens}; lower --val-tokens")
        if self.current is not None:
            self._close()
        if not self.train_tmp:
            raise PrepareError("no tokens left for the train shard after the val shard; "
                               "lower --val-tokens")
        if len(self.train_tmp) == 1:
            names = [self.out_dir / f"{self.prefix}_train.bin"]
        else:
            names = [self.out_dir / f"{self.prefix}_train_{i:06d}.bin" for i in range(len(self.train_tmp))]
        pattern = re.compile(re.escape(self.prefix) + r"_train(_\d{6})?\.bin$")
        for old in self.out_dir.iterdir():
            if pattern.match(old.name) and old not in names:
                print(f"removing stale shard {old}", file=sys.stderr)
                old.unlink()
        if self.val_tmp is not None:
            os.replace(self.val_tmp, self.out_dir / f"{self.prefix}_val.bin")
            self.val_tmp = None
        for tmp, name in zip(self.train_tmp, names):
            os.replace(tmp, name)
        self.train_tmp = []
        return names

    def cleanup(self):
        if self.current is not None:
            self.current.discard()
        for tmp in self.train_tmp + ([self.val_tmp] if self.val_tmp else []):
            if tmp.exists():
                tmp.unlink()


def keep_vocab(bpe_files, out_dir):
    """Copies the vocab.json and merges.txt the shards were made with next to them: the folder then names
    its own tokenizer (eval.vocab can point at it, and scripts/sample.py finds it there), also on nodes
    that cannot download one."""
    for src, name in zip(map(Path, bpe_files), ("vocab.json", "merges.txt")):
        dest = out_dir / name
        if dest.is_file() and (dest.samefile(src) or dest.read_bytes() == src.read_bytes()):
            continue
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(src.read_bytes())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, dest)


def prepare(files, out_dir, prefix, val_tokens, shard_tokens, tokenizer, bpe_files, workers=1, field="text",
            progress=True):
    """Tokenize the [(path, format)] files into shards under out_dir;
    return (val_path or None, train_paths, val tokens, train tokens)."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(out_dir, prefix, val_tokens, shard_tokens)
    total = sum(p.stat().st_size for p, _ in files)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not progress, file=sys.stderr)
    try:
        for block in token_blocks(files, field, workers, bpe_files, tokenizer, bar):
            writer.add(block)
            bar.set_postfix_str(f"{writer.n_val + writer.n_train + (writer.current.n if writer.current else 0):,} tokens",
                                refresh=False)
        train = writer.finish()
        keep_vocab(bpe_files, out_dir)
    except BaseException:
        writer.cleanup()
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed run leaves nothing, not even the folder it made
        raise
    finally:
        bar.close()
        writer.cleanup()
    val = out_dir / f"{prefix}_val.bin" if val_tokens else None
    return val, train, writer.n_val, writer.n_train


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", nargs="+", help="UTF-8 text, JSONL or Parquet files (optionally .gz), or folders of them")
    ap.add_argument("--out-dir", help="output folder (default: data/<prefix>)")
    ap.add_argument("--prefix", help="shard name prefix (default: the first input's stem)")
    ap.add_argument("--val-tokens", type=int, default=32768, help="tokens in the val shard (0: none)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="max tokens per train shard")
    ap.add_argument("--format", choices=["auto", "text", "jsonl", "parquet"], default="auto",
                    help="input type (default: from each file's name)")
    ap.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text (default text)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="tokenizer processes (default: one per CPU; the shards do not depend on it)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--vocab", help=VOCAB_HELP + " (default: the --out-dir's, else downloaded)")
    ap.add_argument("--merges", help=MERGES_HELP)
    ap.add_argument("--cache-dir", help=f"where downloaded vocab/merges go (default {default_cache_dir()})")
    args = ap.parse_args(argv)

    try:
        files = input_files(args.input, args.format)
        check_inputs(files, args.text_field)
        if args.val_tokens < 0:
            raise PrepareError("--val-tokens must be >= 0")
        if args.shard_tokens <= 0:
            raise PrepareError("--shard-tokens must be > 0")
        if args.workers < 1:
            raise PrepareError("--workers must be >= 1")
        first = Path(args.input[0])
        stem = Path(first.name[:-3] if first.name.endswith(".gz") else first.name).stem if first.is_file() else first.name
        prefix = args.prefix or re.sub(r"[^A-Za-z0-9_.-]", "_", stem)
        out_dir = Path(args.out_dir) if args.out_dir else Path("data") / prefix
        vocab, merges = resolve_bpe_files(args.vocab, args.merges, args.cache_dir, look_in=[out_dir])
        tok = load_tokenizer(vocab, merges)
    except PrepareError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 1
    try:
        val, train, n_val, n_train = prepare(files, out_dir, prefix, args.val_tokens, args.shard_tokens, tok,
                                             (vocab, merges), args.workers, args.text_field,
                                             progress=not args.no_progress)
    except PrepareError as e:
        print(f"prepare_data: error: {e}; nothing was written to {out_dir}", file=sys.stderr)
        return 1
    if val:
        print(f"{val}: {n_val:,} tokens")
    print(f"{len(train)} train shard(s), {n_train:,} tokens:")
    for p in train:  # one a line: a corpus has hundreds
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
