"""The optimizers against NumPy implementations written from their papers: AdamW (Loshchilov & Hutter,
decoupled weight decay, bias-corrected moments) and Lion (Chen et al. 2023, Algorithm 2). The C++
program build/tests/cpu/test_optim --dump runs five steps of each through the trainer's optimizer
interface on the CPU backend; every step's parameters and state must match NumPy's in float32."""
from pathlib import Path

import numpy as np
import pytest

from conftest import dump_of

ROOT = Path(__file__).resolve().parent.parent.parent
PROGRAM = ROOT / "build" / "tests" / "cpu" / "test_optim"
N, STEPS = 1000, 5
LR, WD, SCALE = np.float32(1e-2), np.float32(0.1), np.float32(0.5)


def adamw(p, g, s, t, decay, beta1, beta2, eps):
    b1, b2, eps = np.float32(beta1), np.float32(beta2), np.float32(eps)
    m, v = s
    g = g * SCALE
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat = m / (1 - b1 ** np.float32(t))
    vhat = v / (1 - b2 ** np.float32(t))
    wd = WD if decay else np.float32(0)
    p = p - LR * (mhat / (np.sqrt(vhat) + eps) + wd * p)
    return p, [m, v]


def lion(p, g, s, t, decay, beta1, beta2):
    b1, b2 = np.float32(beta1), np.float32(beta2)
    (m,) = s
    g = g * SCALE
    update = np.sign(b1 * m + (1 - b1) * g)
    wd = WD if decay else np.float32(0)
    p = p - LR * (update + wd * p)
    m = b2 * m + (1 - b2) * g
    return p, [m]


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    return dump_of(PROGRAM, tmp_path_factory.mktemp("optim"))


@pytest.mark.parametrize("name,rule,slots", [("adamw", adamw, 2), ("lion", lion, 1)])
def test_matches_numpy(dumped, name, rule, slots):
    x = np.fromfile(dumped / f"{name}.f32", dtype=np.float32)
    # the rule's hyperparameters as the program bound them (Lion's beta2 at 0.99, not its default)
    hypers = {k: float(v) for k, v in (line.split() for line in (dumped / f"{name}.hypers").read_text().splitlines())}
    assert name != "lion" or hypers["beta2"] == np.float32(0.99), hypers
    assert x.size == N + STEPS * N * (2 + slots)
    p = x[:N].copy()
    s = [np.zeros(N, np.float32) for _ in range(slots)]
    at = N
    for t in range(1, STEPS + 1):
        g = x[at:at + N]
        at += N
        p, s = rule(p, g, s, t, decay=t % 2 == 1, **hypers)
        got_p = x[at:at + N]
        at += N
        # float32 throughout; the bias corrections' powers may differ from the C library's in the last bit
        np.testing.assert_allclose(got_p, p, rtol=2e-6, atol=1e-7, err_msg=f"{name} parameters, step {t}")
        for k in range(slots):
            np.testing.assert_allclose(x[at:at + N], s[k], rtol=2e-6, atol=1e-9, err_msg=f"{name} slot {k}, step {t}")
            at += N
        p = got_p.copy()  # go on from the trainer's values, so that differences do not compound

