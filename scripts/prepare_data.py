#!/usr/bin/env python3
"""Turn a text file into llm.c token shards with the GPT-2 tokenizer.

The text is split into documents on blank lines (the separator "\\n\\n"); every document is
encoded with "\\n\\n" restored at its end and prefixed with <|endoftext|> (50256). The first
--val-tokens tokens form the val shard, the rest go to train shards of at most --shard-tokens
tokens each. This reproduces the reference tinyshakespeare shards token for token.

Shard format: int32[256] little-endian header ([0]=20240520, [1]=1, [2]=n_tokens), then
uint16[n_tokens]. Output names: PREFIX_val.bin, and PREFIX_train.bin when one train shard
suffices, else PREFIX_train_000000.bin, PREFIX_train_000001.bin, ...

    python3 scripts/prepare_data.py input.txt --vocab gpt2/vocab.json --merges gpt2/merges.txt \\
        --out-dir data/shakespeare --prefix tiny_shakespeare
"""
import argparse
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
EOT = 50256
DOC_SEPARATOR = "\n\n"
GPT2_URLS = {
    "vocab.json": "https://huggingface.co/openai-community/gpt2/resolve/main/vocab.json",
    "merges.txt": "https://huggingface.co/openai-community/gpt2/resolve/main/merges.txt",
}
# "First Citizen:" must encode to these ids with the real GPT-2 vocabulary.
SANITY_TEXT = "First Citizen:"
SANITY_IDS = [5962, 22307, 25]
READ_CHARS = 8 << 20  # text read per chunk; documents are encoded a chunk at a time


class PrepareError(Exception):
    """Bad input: the message says what is wrong."""


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
            f"pass --vocab and --merges with local GPT-2 files") from e
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, _file_mode())
    os.replace(tmp, dest)


def resolve_bpe_files(vocab, merges, cache_dir):
    """Return (vocab_path, merges_path), downloading into cache_dir when not given."""
    if (vocab is None) != (merges is None):
        raise PrepareError("give both --vocab and --merges, or neither (to download them)")
    if vocab is not None:
        for p, flag in ((vocab, "--vocab"), (merges, "--merges")):
            if not Path(p).is_file():
                raise PrepareError(f"{flag}: no such file: {p}")
        return Path(vocab), Path(merges)
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


def iter_documents(path):
    """Yield the documents of a text file (split on "\\n\\n"), reading it in chunks."""
    rest = ""
    with open(path, "r", encoding="utf-8") as f:
        while True:
            chunk = f.read(READ_CHARS)
            if not chunk:
                break
            parts = (rest + chunk).split(DOC_SEPARATOR)
            rest = parts.pop()  # may continue in the next chunk
            yield from parts
    yield rest


def iter_token_blocks(tok, path, docs_per_batch=4096):
    """Yield uint16 arrays of tokens: <|endoftext|> + document + "\\n\\n", in file order."""
    batch = []
    for doc in iter_documents(path):
        batch.append(doc + DOC_SEPARATOR)
        if len(batch) == docs_per_batch:
            yield encode_batch(tok, batch)
            batch = []
    if batch:
        yield encode_batch(tok, batch)


def encode_batch(tok, docs):
    out = []
    for enc in tok.encode_batch(docs):
        out.append(EOT)
        out.extend(enc.ids)
    return np.asarray(out, dtype=np.uint16)


def write_shard(path, tokens):
    """Write one shard atomically: a temp file in the same folder, then rename."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.tobytes())
            f.write(np.asarray(tokens, dtype="<u2").tobytes())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
    """Collects tokens: the first val_tokens go to the val shard, the rest to train shards."""

    def __init__(self, out_dir, prefix, val_tokens, shard_tokens):
        self.out_dir, self.prefix = out_dir, prefix
        self.val_tokens, self.shard_tokens = val_tokens, shard_tokens
        self.buf, self.buf_len = [], 0
        self.val_done = val_tokens == 0
        self.train_tmp = []  # finished train shards, named at the end when their count is known
        self.n_val = 0
        self.n_train = 0

    def add(self, tokens):
        while len(tokens):
            cap = self.val_tokens if not self.val_done else self.shard_tokens
            take = min(cap - self.buf_len, len(tokens))
            self.buf.append(tokens[:take])
            self.buf_len += take
            tokens = tokens[take:]
            if self.buf_len == cap:
                self._flush()

    def _flush(self):
        data = np.concatenate(self.buf) if self.buf else np.zeros(0, np.uint16)
        self.buf, self.buf_len = [], 0
        if not self.val_done:
            write_shard(self.out_dir / f"{self.prefix}_val.bin", data)
            self.n_val = len(data)
            self.val_done = True
            return
        fd, tmp = tempfile.mkstemp(dir=self.out_dir, prefix=f".{self.prefix}_train.", suffix=".tmp")
        os.close(fd)
        write_shard(Path(tmp), data)
        self.train_tmp.append(Path(tmp))
        self.n_train += len(data)

    def finish(self):
        """Write what is left and give the train shards their final names; return their paths."""
        if not self.val_done:
            raise PrepareError(f"the input has only {self.buf_len} tokens, not more than "
                               f"--val-tokens {self.val_tokens}; lower --val-tokens")
        if self.buf_len:
            self._flush()
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
        for tmp, name in zip(self.train_tmp, names):
            os.replace(tmp, name)
        self.train_tmp = []
        return names

    def cleanup(self):
        for tmp in self.train_tmp:
            if tmp.exists():
                tmp.unlink()


def prepare(input_path, out_dir, prefix, val_tokens, shard_tokens, tokenizer):
    """Tokenize input_path into shards under out_dir; return (val_path or None, train_paths)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(out_dir, prefix, val_tokens, shard_tokens)
    try:
        for block in iter_token_blocks(tokenizer, input_path):
            writer.add(block)
        train = writer.finish()
    except UnicodeDecodeError as e:
        raise PrepareError(f"{input_path}: not UTF-8 text ({e})") from e
    finally:
        writer.cleanup()
    val = out_dir / f"{prefix}_val.bin" if val_tokens else None
    return val, train, writer.n_val, writer.n_train


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="UTF-8 text file")
    ap.add_argument("--out-dir", help="output folder (default: data/<prefix>)")
    ap.add_argument("--prefix", help="shard name prefix (default: the input file's stem)")
    ap.add_argument("--val-tokens", type=int, default=32768, help="tokens in the val shard (0: none)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="max tokens per train shard")
    ap.add_argument("--vocab", help="GPT-2 vocab.json")
    ap.add_argument("--merges", help="GPT-2 merges.txt")
    ap.add_argument("--cache-dir", help=f"where downloaded vocab/merges go (default {default_cache_dir()})")
    args = ap.parse_args(argv)

    try:
        if not Path(args.input).is_file():
            raise PrepareError(f"input: no such file: {args.input}")
        if args.val_tokens < 0:
            raise PrepareError("--val-tokens must be >= 0")
        if args.shard_tokens <= 0:
            raise PrepareError("--shard-tokens must be > 0")
        prefix = args.prefix or re.sub(r"[^A-Za-z0-9_.-]", "_", Path(args.input).stem)
        out_dir = Path(args.out_dir) if args.out_dir else Path("data") / prefix
        vocab, merges = resolve_bpe_files(args.vocab, args.merges, args.cache_dir)
        tok = load_tokenizer(vocab, merges)
        val, train, n_val, n_train = prepare(args.input, out_dir, prefix, args.val_tokens,
                                             args.shard_tokens, tok)
    except PrepareError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 1
    if val:
        print(f"{val}: {n_val:,} tokens")
    print(f"{len(train)} train shard(s), {n_train:,} tokens: {', '.join(str(p) for p in train)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
