"""scripts/prepare_data.py: GPT-2 token shards that match the reference tinyshakespeare shards."""
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import prepare_data  # noqa: E402

SHARED = Path(os.environ.get("TEST_DATA_DIR") or REPO.parent / "shared" / "data")  # as in tests/conftest.py
VOCAB = SHARED / "gpt2" / "vocab.json"
MERGES = SHARED / "gpt2" / "merges.txt"
SHAKESPEARE = SHARED / "tinyshakespeare"


def require_shared():
    needed = [VOCAB, MERGES, SHAKESPEARE / "input.txt", SHAKESPEARE / "tiny_shakespeare_val.bin",
              SHAKESPEARE / "tiny_shakespeare_train.bin"]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        msg = f"reference data absent, test skipped: {', '.join(missing)}"
        warnings.warn(msg)
        pytest.skip(msg)


def reference_tokens(name):
    raw = (SHAKESPEARE / name).read_bytes()
    return np.frombuffer(raw[1024:], dtype="<u2")


def run_main(args, capsys):
    code = prepare_data.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_reproduces_reference_shards(tmp_path, capsys):
    require_shared()
    code, out, err = run_main([SHAKESPEARE / "input.txt", "--vocab", VOCAB, "--merges", MERGES,
                               "--out-dir", tmp_path, "--prefix", "ts"], capsys)
    assert code == 0, err
    val_path, train_path = tmp_path / "ts_val.bin", tmp_path / "ts_train.bin"
    # the shards, and the vocabulary they were made with (for eval.vocab and scripts/sample.py)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.txt", "ts_train.bin", "ts_val.bin", "vocab.json"]
    assert (tmp_path / "vocab.json").read_bytes() == VOCAB.read_bytes()
    assert (tmp_path / "merges.txt").read_bytes() == MERGES.read_bytes()

    header = np.frombuffer(val_path.read_bytes()[:1024], dtype="<i4")
    assert list(header[:3]) == [20240520, 1, 32768]
    assert not header[3:].any()
    assert val_path.stat().st_size == 1024 + 2 * 32768

    val = prepare_data.read_shard(val_path)
    ref_val = reference_tokens("tiny_shakespeare_val.bin")
    assert list(val[:4]) == [50256, 5962, 22307, 25]
    mismatch = np.nonzero(val[:1000] != ref_val[:1000])[0]
    assert len(mismatch) == 0, f"first mismatch at token {mismatch[:1]}: {val[mismatch[:5]]} vs {ref_val[mismatch[:5]]}"
    # The whole files match too (same bytes, header included).
    assert val_path.read_bytes() == (SHAKESPEARE / "tiny_shakespeare_val.bin").read_bytes()
    assert train_path.read_bytes() == (SHAKESPEARE / "tiny_shakespeare_train.bin").read_bytes()
    assert "32,768 tokens" in out


def test_tokenizer_known_ids():
    require_shared()
    tok = prepare_data.load_tokenizer(VOCAB, MERGES)
    assert tok.encode("First Citizen:").ids == [5962, 22307, 25]
    assert tok.encode("Hello world").ids == [15496, 995]


def test_split_into_val_and_several_train_shards(tmp_path, capsys):
    require_shared()
    docs = [f"Document number {i}.\nIt has two lines, the second one longer." for i in range(12)]
    text = "\n\n".join(docs)
    src = tmp_path / "docs.txt"
    src.write_text(text, encoding="utf-8")
    out_dir = tmp_path / "out"
    code, out, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", out_dir,
                               "--prefix", "d", "--val-tokens", "20", "--shard-tokens", "50"], capsys)
    assert code == 0, err

    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(str(VOCAB), str(MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    expected = []
    for d in docs:
        expected += [50256] + tok.encode(d + "\n\n").ids

    val = prepare_data.read_shard(out_dir / "d_val.bin")
    trains = sorted(out_dir.glob("d_train_*.bin"))
    assert len(val) == 20
    sizes = [len(prepare_data.read_shard(p)) for p in trains]
    assert all(s == 50 for s in sizes[:-1]) and 0 < sizes[-1] <= 50, sizes
    assert [p.name for p in trains] == [f"d_train_{i:06d}.bin" for i in range(len(trains))]
    # the summary, then the train shards one a line
    lines = out.splitlines()
    at = lines.index(f"{len(trains)} train shard(s), {sum(sizes):,} tokens:")
    assert lines[at + 1:] == [f"  {p}" for p in trains], out
    got = np.concatenate([val] + [prepare_data.read_shard(p) for p in trains])
    assert got.tolist() == expected
    assert not list(out_dir.glob("*.tmp")), "temporary files left behind"

    # A second run with one big shard replaces the numbered ones instead of leaving them stale.
    code, _, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", out_dir,
                             "--prefix", "d", "--val-tokens", "20"], capsys)
    assert code == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["d_train.bin", "d_val.bin", "merges.txt", "vocab.json"]
    assert "stale" in err


def test_input_smaller_than_val_shard(tmp_path, capsys):
    require_shared()
    src = tmp_path / "small.txt"
    src.write_text("Just a few words.", encoding="utf-8")
    code, _, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", tmp_path / "o"], capsys)
    assert code == 1
    assert "--val-tokens" in err


def test_missing_files_are_named(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("hello", encoding="utf-8")
    code, _, err = run_main([src, "--vocab", tmp_path / "nope.json", "--merges", tmp_path / "nope.txt"], capsys)
    assert code == 1
    assert "nope.json" in err
    code, _, err = run_main([tmp_path / "absent.txt", "--vocab", "v", "--merges", "m"], capsys)
    assert code == 1
    assert "absent.txt" in err
    code, _, err = run_main([src, "--vocab", tmp_path / "v.json"], capsys)
    assert code == 1
    assert "--merges" in err


def test_offline_without_vocab_is_a_clear_error(tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("hello", encoding="utf-8")
    # Port 9 on the loopback address: nothing listens, the download fails at once.
    monkeypatch.setattr(prepare_data, "GPT2_URLS", {"vocab.json": "http://127.0.0.1:9/vocab.json",
                                                    "merges.txt": "http://127.0.0.1:9/merges.txt"})
    code, _, err = run_main([src, "--cache-dir", tmp_path / "cache", "--out-dir", tmp_path / "o"], capsys)
    assert code == 1
    assert "--vocab" in err and "127.0.0.1:9" in err
    assert not (tmp_path / "cache" / "vocab.json").exists()


def test_read_shard_rejects_bad_header(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(np.zeros(256, dtype="<i4").tobytes())
    with pytest.raises(prepare_data.PrepareError, match="magic"):
        prepare_data.read_shard(bad)


# --- streaming corpora: several files and formats, worker processes, flat memory ---------------------

WORDS = ("the quick brown fox jumps over a lazy dog and runs far away into the forest where light "
         "falls softly upon green leaves while rivers sing").split()


def random_docs(n, seed, words_per_doc=60):
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=words_per_doc)) + f" ({seed}.{k})"
            for k in range(n)]


def gpt2():
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(str(VOCAB), str(MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def all_tokens(out_dir, prefix):
    """The val shard's tokens, then the train shards' in order."""
    shards = [out_dir / f"{prefix}_val.bin"] + sorted(out_dir.glob(f"{prefix}_train*.bin"))
    return np.concatenate([prepare_data.read_shard(p) for p in shards])


def write_corpus(folder):
    """A folder of JSONL (one gzipped), Parquet and text files; returns the documents in reading order
    (files sorted by path) as they must be encoded."""
    import gzip
    import json
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder.mkdir()
    expected = []
    for i in range(3):
        docs = random_docs(40, i)
        lines = "".join(json.dumps({"id": k, "text": d}) + "\n" for k, d in enumerate(docs))
        if i == 1:
            with gzip.open(folder / f"part_{i}.jsonl.gz", "wt", encoding="utf-8") as f:
                f.write(lines)
        else:
            (folder / f"part_{i}.jsonl").write_text(lines, encoding="utf-8")
        expected += docs
    docs = random_docs(50, 3)
    pq.write_table(pa.table({"text": docs, "n": list(range(50))}), folder / "part_3.parquet", row_group_size=16)
    expected += docs
    docs = random_docs(30, 4)
    (folder / "part_4.txt").write_text("\n\n".join(docs), encoding="utf-8")
    expected += [d + "\n\n" for d in docs]
    return expected


def test_corpus_folder_in_two_workers_gives_the_tokens_of_one(tmp_path, capsys):
    require_shared()
    expected_docs = write_corpus(tmp_path / "corpus")
    tok = gpt2()
    expected = []
    for d in expected_docs:
        expected += [50256] + tok.encode(d).ids
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        code, stdout, err = run_main([tmp_path / "corpus", "--vocab", VOCAB, "--merges", MERGES, "--out-dir", out,
                                      "--prefix", "c", "--val-tokens", "1000", "--shard-tokens", "4000",
                                      "--workers", workers], capsys)
        assert code == 0, err
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == sorted(p.name for p in outs[1].iterdir())
    assert len(names) > 3, names  # the val shard and several train shards
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    assert all_tokens(outs[0], "c").tolist() == expected
    assert not list(outs[1].glob("*.tmp")) and not list(outs[1].glob(".*"))


def test_jsonl_documents_and_bad_lines(tmp_path, capsys):
    require_shared()
    import json
    docs = random_docs(25, 7)
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": d, "text": d}) + "\n" for d in docs), encoding="utf-8")
    code, _, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", tmp_path / "o",
                             "--val-tokens", "64", "--workers", "1", "--text-field", "body"], capsys)
    assert code == 0, err
    tok = gpt2()
    expected = [t for d in docs for t in [50256] + tok.encode(d).ids]
    assert all_tokens(tmp_path / "o", "docs").tolist() == expected
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"title": "no text"}) + "\n", encoding="utf-8")
    code, _, err = run_main([bad, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", tmp_path / "b"], capsys)
    assert code == 1 and "bad.jsonl:2" in err and "'text'" in err
    bad.write_text('{"text": "cut', encoding="utf-8")
    code, _, err = run_main([bad, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", tmp_path / "b"], capsys)
    assert code == 1 and "bad.jsonl:1: not JSON" in err
    assert not list((tmp_path / "b").glob(".*.tmp")), "temporary shard left behind"


def test_parquet_without_the_column_is_named(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"content": ["a", "b"]}), src)
    code, _, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", tmp_path / "o"], capsys)
    if not VOCAB.is_file():
        pytest.skip("reference vocabulary absent")
    assert code == 1 and "t.parquet" in err and "'text'" in err and "content" in err


def test_parquet_text_column_of_another_type_is_named(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    src = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3], "body": ["a", "b", "c"]}), src)
    code, _, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", tmp_path / "o"], capsys)
    assert code == 1, err
    assert err.startswith("prepare_data: error: ") and len(err.strip().splitlines()) == 1, err
    assert "n.parquet" in err and "'text'" in err and "int64" in err and "body" in err
    assert not (tmp_path / "o").exists()


def damaged_parquet(path, docs, bad_group):
    """docs in row groups of 16, the dictionary page header of row group bad_group overwritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": docs}), path, row_group_size=16)
    col = pq.ParquetFile(path).metadata.row_group(bad_group).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[start:start + 8] = bytes(b ^ 0xFF for b in raw[start:start + 8])
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("workers", [1, 2])
def test_corrupt_parquet_row_group_leaves_the_earlier_shards_as_they_were(tmp_path, capsys, workers):
    require_shared()
    docs = random_docs(64, 9)
    out = tmp_path / "o"
    good = tmp_path / "c.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": docs}), good, row_group_size=16)
    args = ["--vocab", VOCAB, "--merges", MERGES, "--out-dir", out, "--prefix", "c", "--val-tokens", "50",
            "--shard-tokens", "400", "--workers", workers, "--no-progress"]
    code, _, err = run_main([good] + args, capsys)
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # row group 2 (rows 32-47) is damaged: the val shard and some train shards are made before it is read
    damaged_parquet(good, random_docs(64, 10), 2)
    code, _, err = run_main([good] + args, capsys)
    assert code == 1, err
    assert err.startswith("prepare_data: error: ") and len(err.strip().splitlines()) == 1, err
    assert "c.parquet: row group 2 (rows 32-47)" in err and "nothing was written" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "the earlier shards were touched"
    fresh = tmp_path / "fresh"
    code, _, err = run_main([good] + args[:5] + [fresh] + args[6:], capsys)
    assert code == 1 and not fresh.exists(), "a failed run left a folder behind"


@pytest.mark.parametrize("name", ["cut.txt.gz", "cut.jsonl.gz"])
def test_truncated_gzip_is_named_with_its_line(tmp_path, capsys, name):
    require_shared()
    import gzip
    import json
    import zlib
    docs = random_docs(400, 11)
    text = ("\n\n".join(docs) if name.endswith(".txt.gz") else "".join(json.dumps({"text": d}) + "\n" for d in docs))
    whole = gzip.compress(text.encode("utf-8"))
    cut = whole[: len(whole) // 2]
    (tmp_path / name).write_bytes(cut)
    # the lines that survive the cut: what a decompressor makes of the first half
    readable = zlib.decompressobj(wbits=31).decompress(cut).count(b"\n")
    out = tmp_path / "o"
    code, _, err = run_main([tmp_path / name, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", out,
                             "--val-tokens", "50", "--workers", "1", "--no-progress"], capsys)
    assert code == 1, err
    assert err.startswith("prepare_data: error: ") and len(err.strip().splitlines()) == 1, err
    assert f"{name}: the gzip data is truncated or corrupt at line {readable + 1}" in err, (readable, err)
    assert not out.exists()


PEAK_RSS = """
import resource, sys
sys.path.insert(0, sys.argv[1])
import prepare_data
code = prepare_data.main(sys.argv[2:])
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def peak_rss_bytes(tmp_path, src, name):
    import subprocess
    p = subprocess.run([sys.executable, "-c", PEAK_RSS, str(REPO / "scripts"), str(src), "--vocab", str(VOCAB),
                        "--merges", str(MERGES), "--out-dir", str(tmp_path / name), "--workers", "1",
                        "--no-progress"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split("PEAK_KB")[1]) * 1024


def test_memory_stays_flat_on_a_large_input(tmp_path):
    """A corpus three times larger than the bound on memory growth: the tokens go to the shard file as
    they come, and the text is read a megabyte at a time."""
    require_shared()
    bound = 8 << 20
    rng = np.random.default_rng(1)
    words = np.array(WORDS)
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    with open(large, "w", encoding="utf-8") as f:
        while f.tell() < 3 * bound:
            parts = words[rng.integers(0, len(words), size=100_000)]
            f.write("\n\n".join(" ".join(parts[i:i + 80]) for i in range(0, len(parts), 80)) + "\n\n")
    small.write_text(large.read_text(encoding="utf-8")[: 1 << 20], encoding="utf-8")
    base = peak_rss_bytes(tmp_path, small, "s")
    peak = peak_rss_bytes(tmp_path, large, "l")
    assert peak - base < bound, f"peak RSS grew by {(peak - base) / 2**20:.1f} MiB for a {3 * bound / 2**20:.0f} MiB input"
    assert len(prepare_data.read_shard(tmp_path / "l" / "large_train.bin")) > 4_000_000


# ---- the vocabulary: one rule for every script (a folder holding vocab.json and merges.txt, or the two files)
def test_vocab_is_a_folder_or_the_two_files_and_hellaswag_finds_the_shards_one(tmp_path, capsys, monkeypatch):
    require_shared()
    import prepare_hellaswag
    # nothing may be downloaded: the vocabulary must come from where it is said or kept
    monkeypatch.setattr(prepare_data, "GPT2_URLS", {"vocab.json": "http://127.0.0.1:9/vocab.json",
                                                    "merges.txt": "http://127.0.0.1:9/merges.txt"})
    src = tmp_path / "in.txt"
    src.write_text("First Citizen:\n\nBefore we proceed any further, hear me speak.\n", encoding="utf-8")
    shards = tmp_path / "data"
    code, _, err = run_main([src, "--vocab", VOCAB.parent, "--out-dir", shards, "--prefix", "d", "--val-tokens", "4",
                             "--cache-dir", tmp_path / "cache"], capsys)
    assert code == 0, err
    assert (shards / "vocab.json").read_bytes() == VOCAB.read_bytes()
    # the old form, and its mistakes named
    code, _, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", tmp_path / "d2",
                             "--val-tokens", "4"], capsys)
    assert code == 0, err
    for args, needle in (([VOCAB.parent, "--merges", MERGES], "is a folder, which holds merges.txt"),
                         ([tmp_path], "has no vocab.json and no merges.txt"),
                         ([VOCAB], "--vocab FILE needs --merges FILE")):
        code, _, err = run_main([src, "--vocab", *args, "--out-dir", tmp_path / "d3"], capsys)
        assert code == 1 and needle in err, err
    # prepare_hellaswag: a folder too, and without --vocab the one prepare_data.py kept beside the shards
    jsonl = tmp_path / "hs.jsonl"
    jsonl.write_text('{"ctx": "A man sits down.", "endings": ["He reads.", "It rains."], "label": 0}\n')
    for extra in (["--vocab", VOCAB.parent], []):
        out = shards / f"hs{len(extra)}.bin"
        code = prepare_hellaswag.main([str(jsonl), "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                                       *map(str, extra)])
        err = capsys.readouterr().err
        assert code == 0 and out.is_file(), err
    assert f"using GPT-2's vocabulary in {shards}" in err
    assert (shards / "hs0.bin").read_bytes() == (shards / "hs2.bin").read_bytes()
    assert not (tmp_path / "cache").exists()
