"""The optimizer's low-precision state (training.optimizer_state, src/optim/state.hpp) against NumPy: the
int8 codes and block scales and the bf16 stochastic rounding written from their definitions in docs/DESIGN.md
(The optimizer). build/tests/cpu/test_optim_state --dump runs one step of each optimizer with each state type
through the trainer's optimizer interface on the CPU backend, with betas 0 so that the new moments are the
gradient (m) and its square (v) exactly; the bytes it writes must be NumPy's, every one."""
from pathlib import Path

import numpy as np
import pytest

from conftest import dump_of, int8_code as code

ROOT = Path(__file__).resolve().parent.parent.parent
PROGRAM = ROOT / "build" / "tests" / "cpu" / "test_optim_state"
N, BLOCK = 1000, 256
SEED = 0x0123456789abcdef
F = np.float32


def quantize(x, signed):
    """int8 codes and fp32 block scales of x: scale = the block's absolute maximum, code = the number of
    midpoints between neighbouring code values below x * (1 / scale); unsigned codes keep a positive x off 0."""
    values = code(signed)
    mid = ((values[:-1] + values[1:]) * F(0.5)).astype(F)
    codes = np.empty(x.size, np.uint8)
    scales = []
    for b in range(0, x.size, BLOCK):
        blk = x[b:b + BLOCK]
        amax = F(np.max(np.abs(blk)))
        inv = F(F(1) / amax) if amax > 0 else F(0)
        c = np.searchsorted(mid, (blk * inv).astype(F), side="left")
        if not signed:
            c = np.where((c == 0) & (blk > 0), 1, c)
        codes[b:b + BLOCK] = c
        scales.append(amax)
    return codes, np.array(scales, F)


def splitmix_hash(x):
    x = (x + np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def bf16_stochastic(x, slot):
    """bf16 bits of x: 16 random bits from the hash of (seed ^ index ^ (slot + 1) << 48) added below the kept
    bits, then truncated."""
    i = np.arange(x.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        rnd = splitmix_hash(np.uint64(SEED) ^ i ^ (np.uint64(slot + 1) << np.uint64(48)))
    bits = x.astype(F).view(np.uint32).astype(np.uint64)
    return (((bits + (rnd & np.uint32(0xFFFF)).astype(np.uint64)) & np.uint64(0xFFFF0000)) >> np.uint64(16)).astype(np.uint16)


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    return dump_of(PROGRAM, tmp_path_factory.mktemp("optim_state"))


@pytest.mark.parametrize("name,signed", [("adamw", [True, False]), ("lion", [True])])
def test_int8_codes_and_scales_match_numpy(dumped, name, signed):
    raw = (dumped / f"{name}_int8.bin").read_bytes()
    g = np.frombuffer(raw[:4 * N], F)
    nb = (N + BLOCK - 1) // BLOCK
    assert len(raw) == 4 * N + len(signed) * (N + 4 * nb)
    at = 4 * N
    for k, sig in enumerate(signed):
        codes = np.frombuffer(raw[at:at + N], np.uint8)
        scales = np.frombuffer(raw[at + N:at + N + 4 * nb], F)
        at += N + 4 * nb
        x = g if k == 0 else (g * g).astype(F)  # m = g, v = g^2 (betas 0)
        want_codes, want_scales = quantize(x, sig)
        assert np.array_equal(scales.view(np.uint32), want_scales.view(np.uint32)), (name, k, scales, want_scales)
        bad = np.nonzero(codes != want_codes)[0]
        assert bad.size == 0, f"{name} slot {k}: codes differ at {bad[:10]}: {codes[bad[:10]]} vs {want_codes[bad[:10]]}"
        # what the codes stand for: within half a code step of the value (4.7% signed, 4.6% unsigned), and
        # the block of zeros all zero
        back = code(sig)[codes] * np.repeat(scales, BLOCK)[:N]
        big = np.abs(x) > 1e-3 * np.repeat(scales, BLOCK)[:N]
        assert np.all(np.abs(back[big] - x[big]) <= 0.05 * np.abs(x[big]))
        assert np.all(codes[512:768] == (127 if sig else 0)) and scales[2] == 0
    # the edge cases the gradient holds: a value below the unsigned code's floor keeps its smallest step
    if name == "adamw":
        v_codes = np.frombuffer(raw[4 * N + N + 4 * nb:4 * N + 2 * N + 4 * nb], np.uint8)
        assert v_codes[300] == 1 and v_codes[3] == 0


@pytest.mark.parametrize("name,slots", [("adamw", 2), ("lion", 1)])
def test_bf16_stochastic_rounding_matches_numpy(dumped, name, slots):
    raw = (dumped / f"{name}_bf16.bin").read_bytes()
    g = np.frombuffer(raw[:4 * N], F)
    assert len(raw) == 4 * N + slots * 2 * N
    for k in range(slots):
        got = np.frombuffer(raw[4 * N + 2 * N * k:4 * N + 2 * N * (k + 1)], np.uint16)
        x = g if k == 0 else (g * g).astype(F)
        want = bf16_stochastic(x, k)
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, f"{name} slot {k}: bf16 bits differ at {bad[:10]}"
        # unbiased and within one bf16 step: each value lies between its truncations down and up
        back = (got.astype(np.uint32) << 16).view(F)
        assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -7)
