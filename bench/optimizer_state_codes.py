"""Which int8 code (and which bf16 rounding) keeps AdamW's update closest to fp32 state: a NumPy simulation
behind training.optimizer_state's design (docs/DESIGN.md, The optimizer; the trainer's codes are
src/optim/state.hpp). 64 blocks of 256 parameters whose gradients have per-element scales spread over about
three decades (lognormal, sigma 1.5) around a per-element mean, 300 steps, the second half quieter for half
the elements (so the second moment has to decay); the moments are kept exactly and, beside them, quantized
after every step as the trainer does. Printed: the relative L2 error of the bias-corrected update
m / (sqrt(v) + eps) against the exact state's, mean / last / largest over the steps.

    .venv/bin/python3 bench/optimizer_state_codes.py        (a few seconds on one core)
"""
import numpy as np

F = np.float32
B = 256


def geometric(n, floor):
    """n magnitudes from floor up to 1 by a float ratio applied by float products (ascending)."""
    r = F(floor ** (1.0 / (n - 1)))
    v = [F(1)]
    for _ in range(n - 1):
        v.append(F(v[-1] * r))
    return np.array(v[::-1], F)


def codes(kind, floor_m=0.0, floor_v=0.0):
    """(signed, unsigned) code values, ascending."""
    if kind == "linear":
        return np.linspace(-1, 1, 255).astype(F), np.linspace(0, 1, 256).astype(F)
    if kind == "log":
        pos = geometric(127, floor_m)
        return (np.concatenate([-pos[::-1], [F(0)], pos]).astype(F),
                np.concatenate([[F(0)], geometric(255, floor_v)]).astype(F))
    # "decades": 7 decades below 1, codes spaced linearly inside each, twice as many per decade going up
    def decades(counts):
        out = []
        for d, cnt in enumerate(counts):
            e = 10.0 ** (-(len(counts) - 1 - d))
            b = np.linspace(0.1, 1, cnt + 1)
            out += list(e * (b[:-1] + b[1:]) / 2)
        return np.array(sorted(out), F)
    sp = np.append(decades([1, 2, 4, 8, 16, 32, 64]), F(1))[-127:]
    up = decades([2, 4, 8, 16, 32, 64, 128])
    return (np.concatenate([-sp[::-1], [F(0)], sp]).astype(F),
            np.concatenate([[F(0)], up[-254:], [F(1)]]).astype(F))


def quantize(x, values, unsigned):
    x = x.reshape(-1, B)
    a = np.abs(x).max(1, keepdims=True).astype(F)
    inv = np.where(a > 0, F(1) / np.where(a > 0, a, F(1)), F(0)).astype(F)
    mid = ((values[1:] + values[:-1]) * F(0.5)).astype(F)
    c = np.searchsorted(mid, (x * inv).astype(F), side="left")
    if unsigned:
        c = np.where((c == 0) & (x > 0), 1, c)
    return (values[c] * a).astype(F).reshape(-1)


def bf16(x, stochastic, rng):
    u = x.astype(F).view(np.uint32).astype(np.uint64)
    if stochastic:
        u = (u + rng.integers(0, 1 << 16, size=u.shape, dtype=np.uint64)) & 0xFFFF0000
    else:
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(F)


def run(mode, b1, b2, steps=300, blocks=64, seed=0):
    rng = np.random.default_rng(seed)
    n = blocks * B
    scale = (np.exp(rng.normal(0, 1.5, n)) * 1e-3).astype(F)
    mu = rng.normal(0, 0.3, n).astype(F)
    m = np.zeros(n, F); v = np.zeros(n, F); mq = m.copy(); vq = v.copy()
    rr = np.random.default_rng(1)
    errs = []
    for t in range(1, steps + 1):
        g = (scale * (mu + rng.normal(0, 1, n))).astype(F)
        if t > steps // 2:
            g[rng.random(n) < 0.5] *= F(0.01)
        m = F(b1) * m + F(1 - b1) * g; v = F(b2) * v + F(1 - b2) * g * g
        mq = F(b1) * mq + F(1 - b1) * g; vq = F(b2) * vq + F(1 - b2) * g * g
        if mode[0] == "bf16":
            mq, vq = bf16(mq, mode[1], rr), bf16(vq, mode[1], rr)
        else:
            s, u = codes(*mode)
            mq, vq = quantize(mq, s, False), quantize(vq, u, True)
        c0, c1 = 1 - b1 ** t, 1 - b2 ** t
        up = (m / c0) / (np.sqrt(v / c1) + 1e-8)
        uq = (mq / c0) / (np.sqrt(vq / c1) + 1e-8)
        errs.append(np.linalg.norm(uq - up) / np.linalg.norm(up))
    return np.mean(errs), errs[-1], np.max(errs)


MODES = [("linear",), ("decades",), ("log", 1e-3, 1e-6), ("log", 1e-4, 1e-8), ("log", 1e-5, 1e-10),
         ("log", 1e-6, 1e-12), ("bf16", False), ("bf16", True)]

if __name__ == "__main__":
    for b1, b2 in ((0.9, 0.95), (0.9, 0.999)):
        for mode in MODES:
            mean, last, worst = run(mode, b1, b2)
            print(f"beta2 {b2:<6} {' '.join(map(str, mode)):22s} mean {mean:.4f}  last {last:.4f}  max {worst:.4f}",
                  flush=True)
