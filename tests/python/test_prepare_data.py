"""scripts/prepare_data.py: GPT-2 token shards that match the reference tinyshakespeare shards."""
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import prepare_data  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ts_train.bin", "ts_val.bin"]

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
    got = np.concatenate([val] + [prepare_data.read_shard(p) for p in trains])
    assert got.tolist() == expected
    assert not list(out_dir.glob("*.tmp")), "temporary files left behind"

    # A second run with one big shard replaces the numbered ones instead of leaving them stale.
    code, _, err = run_main([src, "--vocab", VOCAB, "--merges", MERGES, "--out-dir", out_dir,
                             "--prefix", "d", "--val-tokens", "20"], capsys)
    assert code == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["d_train.bin", "d_val.bin"]
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
