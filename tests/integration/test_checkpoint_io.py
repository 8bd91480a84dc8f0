"""How checkpoint bytes are checked: the MANIFEST's extents tile every file and are the datasets' own
ranges, a byte flipped in any rank's dataset is found by the single-pass read (and the previous checkpoint
used), and checkpoints of the previous format (version 2, a MANIFEST of whole-file hashes) still load."""
import ctypes
import ctypes.util
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import as_killed, flip_bit, read_log
from test_checkpoint import latest, params, run, yaml


def xxh3_lib():
    name = ctypes.util.find_library("xxhash")
    if not name:
        pytest.skip("SKIP: libxxhash not found (apt-get install libxxhash-dev)")
    lib = ctypes.CDLL(name)
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lambda data: lib.XXH3_64bits(data, len(data))


def read_manifest(ckpt):
    """{file name: (size, [(kind, offset, bytes, hash)])} of a version 2 MANIFEST."""
    lines = (Path(ckpt) / "MANIFEST").read_text().splitlines()
    assert lines[0] == "gpt2-train manifest 2", lines[0]
    files, cur = {}, None
    for line in lines[1:]:
        w = line.split()
        if w[0] == "file":
            cur = files[w[1]] = (int(w[2]), [])
        else:
            cur[1].append((w[0], int(w[1]), int(w[2]), int(w[3], 16)))
    return files


def dataset_ranges(path):
    """(offset, bytes) of every bucket dataset of a rank file."""
    out = []
    with h5py.File(path, "r") as f:
        for g in f:
            if not g.startswith("b"):
                continue
            for name, ds in f[g].items():
                if ds.size:
                    out.append((ds.id.get_offset(), ds.id.get_storage_size()))
    return sorted(out)


@pytest.mark.parametrize("ranks,stage", [(1, 0), (2, 1)])
def test_manifest_extents_tile_every_file_and_are_the_datasets(tmp_path, ranks, stage):
    xxh3 = xxh3_lib()
    y = yaml(tmp_path, "m", stage=stage, steps=2, ckpt_every=2)
    run(["--yaml", y], ranks=ranks)
    ck = latest(tmp_path / "runs/m")
    files = read_manifest(ck)
    assert sorted(files) == [f"rank_{r:05d}.h5" for r in range(ranks)]
    for name, (size, extents) in files.items():
        data = (ck / name).read_bytes()
        assert len(data) == size
        at = 0
        for kind, off, n, h in extents:
            assert off == at and 0 < n <= 64 << 20, (name, off, n)
            assert xxh3(data[off:off + n]) == h, f"{name}: extent at {off} hashes differently"
            at += n
        assert at == size
        # the data extents, merged, are exactly the datasets' bytes; everything else is metadata
        runs = []
        for kind, off, n, _ in extents:
            if kind == "d":
                if runs and runs[-1][0] + runs[-1][1] == off:
                    runs[-1] = (runs[-1][0], runs[-1][1] + n)
                else:
                    runs.append((off, n))
        merged = []
        for off, n in dataset_ranges(ck / name):
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((off, n))
        assert runs == merged, name
        assert {k for k, *_ in extents} == {"m", "d"}


@pytest.mark.parametrize("dataset,state", [("b0000/param", "fp32"), ("b0001/v", "fp32"), ("b0002/m", "fp32"),
                                           ("b0001/v", "int8"), ("b0002/m.scales", "int8")])
def test_a_flipped_byte_in_a_dataset_is_found_and_the_previous_checkpoint_used(tmp_path, dataset, state):
    """Two ranks at stage 1, each reading its own file: the damage is in rank 1's file, found by rank 1
    alone as the bytes arrive, and agreed by both. int8 state: in its codes, or in its blocks' scales."""
    y = yaml(tmp_path, "f", stage=1, steps=8, ckpt_every=4)
    y.write_text(y.read_text().replace("training: {", f"training: {{optimizer_state: {state}, ", 1))
    run(["--yaml", y], ranks=2)
    run_dir = tmp_path / "runs/f"
    ref = read_log(run_dir / "log.h5")
    victim = run_dir / "checkpoints/step_00000008/rank_00001.h5"
    with h5py.File(victim, "r") as f:
        ds = f[dataset]
        off = ds.id.get_offset() + ds.id.get_storage_size() - 3  # in the last extent, not at its start
    flip_bit(victim, off, 0x04)
    as_killed(run_dir)  # a completed run would be left as it is
    p = run(["--yaml", y, "--resume"], ranks=2)
    assert "falling back" in p.stderr and "checksum mismatch" in p.stderr, p.stderr[-3000:]
    assert "rank_00001.h5" in p.stderr and dataset in p.stderr, p.stderr[-3000:]
    assert "resumed from step 4" in p.stdout, p.stdout[-2000:]
    got = read_log(run_dir / "log.h5")
    assert list(got["step"]) == list(range(1, 9)) and np.array_equal(got["loss"], ref["loss"]), \
        "steps 5-8 again differ from the first time"


def to_version_2(ck, xxh3):
    """Rewrites a checkpoint as the previous format wrote it: a `checksum` attribute (XXH3-64, int64) on
    every bucket dataset, format_version 2, and a MANIFEST of version 1 (whole-file hashes)."""
    lines = ["gpt2-train manifest 1"]
    for path in sorted(Path(ck).glob("rank_*.h5")):
        raw = path.read_bytes()
        with h5py.File(path, "r+") as f:
            f.attrs["format_version"] = np.int64(2)
            for g in f:
                if g.startswith("b"):
                    for ds in f[g].values():
                        off, n = ds.id.get_offset() or 0, ds.id.get_storage_size()
                        h = xxh3(raw[off:off + n]) if n else xxh3(b"")
                        ds.attrs["checksum"] = np.int64(int.from_bytes(h.to_bytes(8, "little"), "little", signed=True))
        data = path.read_bytes()
        lines.append(f"{path.name} {len(data)} {xxh3(data):016x}")
    (Path(ck) / "MANIFEST").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_version_2_checkpoint_still_loads_and_is_still_checked(tmp_path, ranks):
    xxh3 = xxh3_lib()
    y = yaml(tmp_path, "o", stage=1 if ranks > 1 else 0, steps=8, ckpt_every=4)
    run(["--yaml", y], ranks=ranks)
    run_dir = tmp_path / "runs/o"
    ref = read_log(run_dir / "log.h5")
    old = run_dir / "checkpoints/step_00000004"
    before = params(old)
    to_version_2(old, xxh3)
    assert np.array_equal(params(old), before)
    (run_dir / "checkpoints/step_00000008").rename(run_dir / "checkpoints/set_aside")
    as_killed(run_dir)
    p = run(["--yaml", y, "--resume"], ranks=ranks)
    assert "resumed from step 4" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    got = read_log(run_dir / "log.h5")
    assert np.array_equal(got["loss"], ref["loss"]), "resuming from the version 2 checkpoint changed the run"
    # still checked: a flipped byte in a dataset of the old format is found before HDF5 opens the file
    for p_ in list((run_dir / "checkpoints").glob("step_*")):
        if p_.name != "step_00000004":
            p_.rename(run_dir / "checkpoints" / ("gone_" + p_.name))
    with h5py.File(old / "rank_00000.h5", "r") as f:
        off = f["b0001/m"].id.get_offset() + 5
    flip_bit(old / "rank_00000.h5", off, 0x04)
    p = run(["export", "--ckpt", old, "--out", tmp_path / "x.bin"], ok=(1,))
    assert "checksum mismatch" in p.stderr and "rank_00000.h5" in p.stderr, p.stderr[-2000:]


def test_snapshot_memory_is_taken_at_the_start(tmp_path):
    y = yaml(tmp_path, "s", steps=2, ckpt_every=1)
    p = run(["--yaml", y])
    assert re.search(r"set-up: .*checkpoint memory \d", p.stdout), p.stdout[-2000:]
    # without checkpoint.every there is none to take at the start
    p = run(["--yaml", yaml(tmp_path, "n", steps=2, ckpt_every=0)])
    assert "checkpoint memory" not in p.stdout
