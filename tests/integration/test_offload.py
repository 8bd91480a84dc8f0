"""training.offload: optimizer on CPU ranks: the optimizer's state in its own host buffers, updated by the
host loop after the gradients came down and the parameters went back up. Losses, gradient norms and every
checkpointed value are those of offload: none, bit for bit, on 1 and 2 ranks at ZeRO 0-2 and for every
optimizer state type; a run resumes under the other setting (the checkpoints are the same); ZeRO-3 is
refused; the memory prediction moves the state to the offload component and still matches what the engine
allocates; a node without the host memory is refused before any work."""
import h5py
import numpy as np
import pytest

from conftest import read_log, run_train, tiny_yaml, write_yaml
from test_zero import BUCKETS, checkpoint_state, latest_checkpoint, offsets

ENV = {"OMP_NUM_THREADS": "1"}
EXIT_BAD_INPUT, EXIT_OOM = 1, 3


def train(tmp_path, name, offload, ranks=1, steps=6, sets=(), resume=False, **kw):
    kw.setdefault("ckpt_every", 3)
    y = tiny_yaml(tmp_path, name=name, steps=steps, **kw)
    args = ["--yaml", y, "--set", f"training.offload={offload}", "--set", "training.schedule=constant"]
    args += [a for kv in sets for a in ("--set", kv)]
    if resume:
        args.append("--resume")
    p = run_train(args, ranks=ranks, timeout=180, env=ENV)
    assert p.returncode == 0, f"{name}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def state_of(run_dir, slots=("m", "v")):
    ckpt = latest_checkpoint(run_dir)
    return {k: checkpoint_state(ckpt, k)[0] for k in ("param",) + tuple(slots)}


def assert_same_run(a_dir, b_dir, what, slots=("m", "v")):
    a, b = read_log(a_dir / "log.h5"), read_log(b_dir / "log.h5")
    for k in ("loss", "grad_norm"):
        assert np.array_equal(a[k], b[k]), f"{what}: {k} {a[k]} vs {b[k]}"
    sa, sb = state_of(a_dir, slots), state_of(b_dir, slots)
    for kind in sa:
        assert sa[kind].keys() == sb[kind].keys()
        for g in sa[kind]:
            assert np.array_equal(sa[kind][g].view(np.uint32), sb[kind][g].view(np.uint32)), f"{what}: {kind} {g}"


@pytest.mark.parametrize("ranks,stage,state,optimizer", [
    (1, 0, "fp32", "adamw"), (2, 0, "fp32", "adamw"), (2, 1, "fp32", "adamw"), (2, 2, "fp32", "adamw"),
    (1, 0, "int8", "adamw"), (2, 2, "bf16", "adamw"), (2, 1, "int8", "lion"), (1, 0, "fp32", "lion")])
def test_offload_is_bit_identical(tmp_path, ranks, stage, state, optimizer):
    sets = [f"training.optimizer_state={state}", f"training.optimizer={optimizer}"]
    for off in ("none", "optimizer"):
        train(tmp_path, off, off, ranks=ranks, stage=stage, sets=sets)
    runs = tmp_path / "runs"
    slots = ("m",) if optimizer == "lion" else ("m", "v")
    assert_same_run(runs / "none", runs / "optimizer", f"{ranks} ranks ZeRO-{stage} {state} {optimizer}", slots)
    # the host's update time is logged with offload, and only then
    on, off = read_log(runs / "optimizer" / "log.h5"), read_log(runs / "none" / "log.h5")
    assert np.all(on["offload_ms"] > 0) and np.all(np.isfinite(on["offload_wait_ms"])), on["offload_ms"]
    assert np.all(np.isnan(off["offload_ms"])), off["offload_ms"]


def test_offload_with_gradient_accumulation(tmp_path):
    for off in ("none", "optimizer"):
        train(tmp_path, off, off, ranks=2, stage=2, accum=2)
    assert_same_run(tmp_path / "runs" / "none", tmp_path / "runs" / "optimizer", "grad_accum 2")


@pytest.mark.parametrize("first,then", [("optimizer", "optimizer"), ("optimizer", "none"), ("none", "optimizer")])
def test_resume_across_offload(tmp_path, first, then):
    # a: 6 steps straight without offload; b: 3 steps under `first`, resumed to 6 under `then`
    train(tmp_path, "a", "none", ranks=2, stage=1)
    train(tmp_path, "b", first, ranks=2, stage=1, steps=3)
    p = train(tmp_path, "b", then, ranks=2, stage=1, resume=True)
    assert "resumed from step 3" in p.stdout, p.stdout[-2000:]
    assert_same_run(tmp_path / "runs" / "a", tmp_path / "runs" / "b", f"{first} then {then}")


def test_stage3_is_refused(tmp_path):
    y = tiny_yaml(tmp_path, name="s3", stage=3)
    for extra in ([], ["--dry-run"]):
        p = run_train(["--yaml", y, "--set", "training.offload=optimizer"] + extra, env=ENV)
        assert p.returncode == EXIT_BAD_INPUT, f"exit {p.returncode}\n{p.stderr[-2000:]}"
        assert "training.offload" in p.stderr and "zero_stage 0, 1 or 2, not 3" in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists()
    p = run_train(["--yaml", y, "--set", "training.offload=disk"], env=ENV)
    assert p.returncode == EXIT_BAD_INPUT and "training.offload" in p.stderr, p.stderr


def expected_offload_bytes(stage, world, ring=3):
    """master (none on CPU) + AdamW's two fp32 slots + the transfer rings (gradients and parameters)."""
    sizes = [offsets(t)[1] for t in BUCKETS]
    shard = sizes if stage == 0 or world == 1 else [((s + world - 1) // world + 63) // 64 * 64 for s in sizes]
    return 2 * 4 * sum(shard) + 2 * ring * 4 * max(shard)


@pytest.mark.parametrize("ranks,stage", [(1, 0), (2, 1), (2, 2)])
def test_memory_prediction_moves_the_state(tmp_path, ranks, stage):
    train(tmp_path, "m", "optimizer", ranks=ranks, stage=stage, steps=1, ckpt_every=1)
    log = read_log(tmp_path / "runs" / "m" / "log.h5")
    comps = log["mem_pred"]["components"].split()
    assert "offload" in comps, comps
    for c in comps:
        assert int(log["mem_pred"][c]) == int(log["mem_meas"][c]), (c, log["mem_pred"], log["mem_meas"])
    assert int(log["mem_pred"]["optim"]) == int(log["mem_pred"]["master"]) == 0
    assert int(log["mem_pred"]["offload"]) == expected_offload_bytes(stage, ranks)
    p = run_train(["--yaml", tiny_yaml(tmp_path, name="d", stage=stage), "--set", "training.offload=optimizer",
                   "--dry-run"], env=ENV)
    assert p.returncode == 0, p.stderr
    kib = expected_offload_bytes(stage, 1) / 1024
    assert f"(offloaded to host: {kib:.2f} KiB per rank" in p.stdout, p.stdout[-3000:]


def expected_big_offload_bytes():
    """The model below: AdamW's two fp32 slots and the transfer rings (its largest bucket, the embedding)."""
    C, V, L, T = 4096, 50304, 48, 64
    layer = 12 * C * C + 13 * C  # every tensor's size a multiple of 64: no padding
    embedding = V * C + T * C
    total = embedding + L * layer + 2 * C
    return 2 * 4 * total + 2 * 3 * 4 * max(embedding, layer)


def test_host_memory_is_checked_before_work(tmp_path):
    # about 10 billion parameters: their optimizer state alone is more host memory than any node here has
    y = write_yaml(tmp_path / "big.yaml", f"""
run: {{name: big, out_dir: {tmp_path / 'runs'}}}
model: {{n_layer: 48, n_head: 32, n_embd: 4096, vocab_size: 50257, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 50257}}
training: {{device: cpu, micro_batch: 1, seq_len: 64, steps: 1, offload: optimizer}}
""")
    p = run_train(["--yaml", y], timeout=120, env=ENV)
    assert p.returncode == EXIT_OOM, f"exit {p.returncode}\n{p.stderr[-2000:]}"
    first = p.stderr.strip().splitlines()[0]
    assert first.startswith("error: out of host memory: ") and "training.offload's optimizer state, " in first, first
    assert f"({expected_big_offload_bytes()} B) per rank" in first, first
    assert not (tmp_path / "runs").exists()


# ---- the GPU (skipped with a message on machines without a CUDA device): bf16 parameters, the update on
# the host in the kernel's arithmetic. Run on the GPU machine:
#   OMP_NUM_THREADS=1 python3 -m pytest -v -rs tests/integration/test_offload.py -k gpu
from test_gpu_shared import has_gpu, run as gpu_run  # noqa: E402


@pytest.mark.skipif(not has_gpu(), reason="SKIP: no CUDA device on this machine (GPU tests run on the GPU machine)")
@pytest.mark.parametrize("ranks,stage,sets", [
    (1, 0, []), (1, 0, ["training.master_weights=compensated"]), (1, 0, ["training.master_weights=none"]),
    (1, 0, ["training.optimizer_state=int8"]), (1, 0, ["training.optimizer_state=bf16", "training.optimizer=lion"]),
    (1, 0, ["training.optimizer=lion"]), (1, 0, ["training.precision=fp32"]),
    (2, 1, []), (2, 2, ["training.optimizer_state=int8", "training.master_weights=compensated"])])
def test_gpu_offload_is_bit_identical(tmp_path, ranks, stage, sets):
    logs, dirs = {}, {}
    for off in ("none", "optimizer"):
        logs[off], dirs[off] = gpu_run(tmp_path, off, ranks, stage=stage, ckpt=5,
                                       sets=list(sets) + [f"training.offload={off}"])
    slots = ("m",) if "training.optimizer=lion" in sets else ("m", "v")
    assert_same_run(dirs["none"], dirs["optimizer"], f"GPU {ranks} ranks ZeRO-{stage} {sets}", slots)
    on = logs["optimizer"]
    for k in ("params", "grads", "master", "optim"):
        assert on["mem_pred"][k] == on["mem_meas"][k], (k, on["mem_pred"], on["mem_meas"])
    assert on["mem_pred"]["optim"] == 0 and on["mem_meas"]["optim"] == 0
    assert np.all(on["offload_ms"] > 0), on["offload_ms"]
