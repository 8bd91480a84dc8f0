"""Shuffled token shards in whole runs on CPU: a run resumed in mid-epoch repeats the uninterrupted one
bit for bit, 2 ranks train as 1 rank with twice the micro-batch, data.shuffle changes what is read, and
a checkpoint of one order does not resume in the other."""
import shutil

import numpy as np

from conftest import as_killed, read_log, run_train, write_yaml

ENV = {"OMP_NUM_THREADS": "1"}


def write_shards(folder, sizes, seed=0):
    """Token shards of random ids below 64 (a Markov-free corpus is enough: the order is under test)."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i, n in enumerate(sizes):
        header = np.zeros(256, dtype="<i4")
        header[:3] = [20240520, 1, n]
        (folder / f"part_{i:02d}.bin").write_bytes(header.tobytes() + rng.integers(0, 64, n).astype("<u2").tobytes())
    return folder / "part_*.bin"


def shard_yaml(tmp_path, name, glob, B=4, steps=20, ckpt_every=0, shuffle=True, seed=7):
    return write_yaml(tmp_path / f"{name}.yaml", f"""
run: {{name: {name}, out_dir: {tmp_path / 'runs'}, seed: {seed}}}
model: {{n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}}
data: {{train: "{glob}", shuffle: {str(shuffle).lower()}}}
training: {{device: cpu, micro_batch: {B}, seq_len: 16, steps: {steps}, lr: 1.0e-2, warmup_steps: 2}}
eval: {{batches: 0}}
log: {{every: 1, progress: false}}
checkpoint: {{every: {ckpt_every}, keep_last: 3}}
""")


# 3 shards of 5, 3 and 4 global micro-batches (of 4 x 16 tokens) and some tail: an epoch is 12 steps
SIZES = [5 * 64 + 20, 3 * 64 + 1, 4 * 64 + 40]


def losses(tmp_path, name):
    return read_log(tmp_path / f"runs/{name}/log.h5")["loss"]


def test_resume_in_mid_epoch_is_bit_exact(tmp_path, train_bin):
    glob = write_shards(tmp_path / "data", SIZES)
    run_train(["--yaml", shard_yaml(tmp_path, "straight", glob, steps=20)], env=ENV, check=True)
    y = shard_yaml(tmp_path, "cut", glob, steps=20, ckpt_every=7)
    run_train(["--yaml", y], env=ENV, check=True)
    # back to step 7 (inside epoch 0's second shard), then on through epoch 1 into epoch 2
    ckpts = tmp_path / "runs/cut/checkpoints"
    for later in ("step_00000014", "step_00000020"):  # 20: the run's final checkpoint
        shutil.rmtree(ckpts / later)
    (ckpts / "latest").write_text("step_00000007\n")
    as_killed(tmp_path / "runs/cut")  # a completed run would be left as it is
    p = run_train(["--yaml", y, "--resume"], env=ENV, check=True)
    assert "resumed from step 7" in p.stdout
    a, b = losses(tmp_path, "straight"), losses(tmp_path, "cut")
    assert len(a) == len(b) == 20
    assert np.array_equal(a, b), np.nonzero(a != b)[0]
    # the same run in file order is another run; resuming the shuffled checkpoint in file order is refused
    run_train(["--yaml", shard_yaml(tmp_path, "plain", glob, steps=20, shuffle=False)], env=ENV, check=True)
    assert not np.array_equal(losses(tmp_path, "plain"), a)
    p = run_train(["--yaml", y, "--resume", "--set", "data.shuffle=false", "--set", "training.steps=25"], env=ENV)
    assert p.returncode == 1 and "data.shuffle" in p.stderr, p.stderr[-2000:]


def test_two_ranks_train_as_one_with_twice_the_micro_batch(tmp_path, train_bin):
    glob = write_shards(tmp_path / "data", [10 * 64 + 3, 7 * 64 + 50])  # global micro-batches of 8 x 16
    run_train(["--yaml", shard_yaml(tmp_path, "one", glob, B=8, steps=14)], env=ENV, check=True)
    run_train(["--yaml", shard_yaml(tmp_path, "two", glob, B=4, steps=14)], ranks=2, env=ENV, check=True)
    a, b = losses(tmp_path, "one"), losses(tmp_path, "two")
    # the gradient sums differ in order only (as in test_zero.py)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
