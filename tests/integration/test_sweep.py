"""Sweeps: expansion, --list/--index, a CPU sweep end to end with its summary and plots, failures."""
import csv
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, TINY_SYNTH, read_log, run_train, tiny_yaml, write_yaml


def sweep_yaml(tmp_path, sweep, name="sw", steps=6):
    base = TINY_SYNTH.format(name=name, out_dir=tmp_path / "runs", steps=steps, B=4, stage=0, accum=1, ckpt_every=0)
    return write_yaml(tmp_path / f"{name}.yaml", base + sweep)


def listed(p):
    return [line.split("\t") for line in p.stdout.strip().splitlines()]


def test_grid_times_zip_expansion_and_list(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, """
sweep:
  grid:
    training.zero_stage: [0, 1, 2]
    training.lr: [0.001, 0.002]
  zip:
    training.micro_batch: [2, 4]
    training.seq_len: [8, 16]
""")
    p = run_train(["--yaml", y, "--list"], check=True)
    rows = listed(p)
    assert len(rows) == 3 * 2 * 2
    assert [r[0] for r in rows] == [str(i) for i in range(12)]
    assert rows[0][1] == "p000" and rows[11][1] == "p011"
    combos = {r[2] for r in rows}
    assert len(combos) == 12
    # zip keys vary together, never crossed
    for r in rows:
        kv = dict(x.split("=") for x in r[2].split())
        assert (kv["training.micro_batch"], kv["training.seq_len"]) in {("2", "8"), ("4", "16")}
        assert set(kv) == {"training.zero_stage", "training.lr", "training.micro_batch", "training.seq_len"}
    assert not (tmp_path / "runs").exists()


def test_unequal_zip_and_unknown_key_are_named_errors(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, "sweep:\n  zip:\n    training.micro_batch: [2, 4]\n    training.seq_len: [8, 16, 32]\n")
    p = run_train(["--yaml", y, "--list"])
    assert p.returncode == 1 and "equal lengths" in p.stderr and "training.seq_len" in p.stderr
    y = sweep_yaml(tmp_path, "sweep:\n  grid:\n    training.warp_speed: [1, 2]\n")
    p = run_train(["--yaml", y, "--list"])
    assert p.returncode == 1 and "training.warp_speed" in p.stderr
    y = sweep_yaml(tmp_path, "sweep:\n  grid:\n    training.lr: []\n")
    p = run_train(["--yaml", y, "--list"])
    assert p.returncode == 1 and "non-empty list" in p.stderr
    y = sweep_yaml(tmp_path, "sweep:\n  grid:\n    training.lr: [0.1]\n")
    p = run_train(["--yaml", y, "--index", "5"])
    assert p.returncode == 1 and "out of range" in p.stderr


def test_cpu_sweep_end_to_end_with_summary_and_plots(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, """
sweep:
  grid:
    training.zero_stage: [0, 1]
  zip:
    training.micro_batch: [2, 4]
    training.lr: [0.01, 0.02]
""", name="e2e")
    # run point 1 alone first (as an array task would), then the whole sweep
    p = run_train(["--yaml", y, "--index", "1"], check=True)
    assert (tmp_path / "runs/e2e/p001/log.h5").exists() and not (tmp_path / "runs/e2e/p000").exists()
    # the whole sweep then: point 1's directory holds a run, which only --resume may continue
    p = run_train(["--yaml", y], timeout=900)
    assert p.returncode == 1 and "p001' already holds a run" in p.stderr, p.stderr
    assert not (tmp_path / "runs/e2e/p000").exists()
    p = run_train(["--yaml", y, "--resume"], check=True, timeout=900)
    root = tmp_path / "runs/e2e"
    with open(root / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        log = read_log(root / r["dir"] / "log.h5")
        assert float(r["final_train_loss"]) == pytest.approx(log["loss"][-1], rel=1e-9)
        med = float(np.median(log["step_ms"][1:]))
        assert float(r["median_step_ms"]) == pytest.approx(med, rel=1e-9)
        assert float(r["tokens_per_s"]) == pytest.approx(log["attrs"]["tokens_per_step"] / (med / 1000), rel=1e-9)
        assert int(float(r["micro_batch"])) == int(r["training.micro_batch"])
        assert float(r["pred_total"]) == log["mem_pred"]["total"]
        assert float(r["meas_params"]) == log["mem_meas"]["params"]
        assert float(r["final_val_loss"]) == pytest.approx(log["val_loss"][-1], rel=1e-9)
    with h5py.File(root / "summary.h5", "r") as f:
        assert list(f["points/status"].asstr()[:]) == ["ok"] * 4
        np.testing.assert_allclose(f["points/final_train_loss"][:], [float(r["final_train_loss"]) for r in rows])
    out = tmp_path / "plots"
    subprocess.run([sys.executable, ROOT / "scripts/plot_sweep.py", root, "-o", out], check=True, capture_output=True)
    for name in ["throughput.png", "memory.png"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    t = subprocess.run([sys.executable, ROOT / "scripts/summarize.py", root, "--markdown"], check=True,
                       capture_output=True, text=True).stdout
    assert t.count("\n|") >= 5


def test_memory_frontier_of_a_cpu_sweep_over_optimizer_state_recompute_and_micro_batch(tmp_path, train_bin):
    """A sweep as one over a large model's memory axes, on the tiny model: optimizer state x recompute x
    micro-batch, gradient accumulation keeping one global batch. frontier.png is drawn, and the frontier it
    draws is exactly the points that no other beats in both memory and tokens/s."""
    y = tiny_yaml(tmp_path, name="fr", steps=3, extra="""
training: {total_batch_tokens: 128}
sweep:
  grid:
    training.optimizer_state: [fp32, int8]
    training.recompute: [0, 3]
    training.micro_batch: [2, 4]
""")
    run_train(["--yaml", y], check=True, timeout=900)
    root = tmp_path / "runs/fr"
    for d in sorted(root.glob("p0*")):  # micro-batch 2 or 4 of 16 tokens: 4 or 2 micro-steps of one batch
        assert read_log(d / "log.h5")["attrs"]["tokens_per_step"] == 128, d
    out = tmp_path / "plots"
    p = subprocess.run([sys.executable, ROOT / "scripts/plot_sweep.py", root, "-o", out], check=True,
                       capture_output=True, text=True)
    assert p.stdout.split() == [str(out / n) for n in ("throughput.png", "memory.png", "loss.png", "frontier.png")]
    data = (out / "frontier.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    sys.path.insert(0, str(ROOT / "scripts"))
    import h5log
    import plot_sweep
    drawn = plot_sweep.plot_frontier(h5log.read_summary(root), root, tmp_path / "f.png")
    with open(root / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    # memory as memory.png has it on CPUs: the peak resident set above the process's baseline
    mem = [(float(r["meas_peak"]) - float(r["meas_baseline"])) / (1 << 20) for r in rows]
    speed = [float(r["tokens_per_s_per_gpu"]) for r in rows]
    labels = [f"{r['training.optimizer_state']} r{r['training.recompute']} mb{r['training.micro_batch']}" for r in rows]
    beaten = [any(mem[j] <= mem[i] and speed[j] >= speed[i] and (mem[j], speed[j]) != (mem[i], speed[i])
                  for j in range(len(rows))) for i in range(len(rows))]
    assert drawn["frontier"] == [labels[i] for i in sorted(range(len(rows)), key=lambda i: (mem[i], i)) if not beaten[i]]
    assert [(d[0], d[4]) for d in drawn["points"]] == [(lab, "off" if b else "frontier") for lab, b in zip(labels, beaten)]
    assert [d[1] for d in drawn["points"]] == pytest.approx(mem, rel=1e-9)
    assert [b[0] for b in drawn["bars"]] == drawn["frontier"]  # the frontier's memory, by memory
    assert drawn["unit"] == "MiB" and drawn["cards"] == []
    assert "n_layer 2, n_embd 32" in drawn["title"] and "global batch 128 tokens" in drawn["title"]


def test_failing_points_are_recorded_and_the_sweep_goes_on(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, """
sweep:
  zip:
    training.lr: [0.01, 1.0e+30, 0.01]
""", name="bad")
    p = run_train(["--yaml", y], timeout=900)
    assert p.returncode == 2  # not every point succeeded
    with open(tmp_path / "runs/bad/summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert "diverged" in rows[1]["message"]
    assert float(rows[0]["final_train_loss"]) > 0 and float(rows[2]["final_train_loss"]) > 0


def test_a_bad_value_in_any_point_fails_before_any_work(tmp_path, train_bin):
    y = sweep_yaml(tmp_path, """
sweep:
  zip:
    training.lr: [0.01, 0.01, 0.01]
    training.seq_len: [16, 16, 64]
""", name="bad")
    p = run_train(["--yaml", y], timeout=900)
    assert p.returncode == 1
    assert "sweep point 2" in p.stderr and "max_seq_len" in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").rglob("*"))


MAXB = """
run: {{name: {name}, out_dir: {out}}}
model: {{n_layer: 2, n_head: 4, n_embd: 128, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 1000}}
training: {{device: cpu, micro_batch: {B}, seq_len: 64, steps: 1, zero_stage: {stage}, memory_limit_gb: 0.35}}
eval: {{batches: 0}}
log: {{progress: false}}
"""


def found_micro_batch(log_path):
    import yaml
    with h5py.File(log_path, "r") as f:
        cfg = yaml.safe_load(f.attrs["config_yaml"])
        return cfg["training"]["micro_batch"], int(f["memory/predicted"].attrs["total"])


def test_micro_batch_max_finds_the_largest_that_fits_and_zero1_raises_it(tmp_path, train_bin):
    cap = 0.35 * 2**30
    y = write_yaml(tmp_path / "m0.yaml", MAXB.format(name="m0", out=tmp_path, B="max", stage=0))
    run_train(["--yaml", y], check=True, env={"OMP_NUM_THREADS": "1"})
    b0, total0 = found_micro_batch(tmp_path / "m0/log.h5")
    assert isinstance(b0, int) and b0 >= 1 and total0 <= cap
    # one more sequence would not fit
    y1 = write_yaml(tmp_path / "m1.yaml", MAXB.format(name="m1", out=tmp_path, B=b0 + 1, stage=0))
    run_train(["--yaml", y1], check=True, env={"OMP_NUM_THREADS": "1"})
    assert found_micro_batch(tmp_path / "m1/log.h5")[1] > cap
    # ZeRO-1 on 2 ranks shards master/optimizer state, which leaves room for more sequences
    y2 = write_yaml(tmp_path / "z1.yaml", MAXB.format(name="z1", out=tmp_path, B="max", stage=1))
    run_train(["--yaml", y2], ranks=2, check=True)
    b1, total1 = found_micro_batch(tmp_path / "z1/log.h5")
    print(f"micro_batch max: stage 0 -> {b0}, stage 1 on 2 ranks -> {b1}")
    assert b1 > b0 and total1 <= cap


def test_micro_batch_max_on_cpu_needs_a_limit(tmp_path, train_bin):
    y = write_yaml(tmp_path / "m.yaml", MAXB.format(name="m", out=tmp_path, B="max", stage=0).replace(", memory_limit_gb: 0.35", ""))
    p = run_train(["--yaml", y])
    assert p.returncode == 1 and "memory_limit_gb" in p.stderr


def test_every_point_of_a_cpu_sweep_measures_its_own_memory(tmp_path, train_bin):
    """The points of a sweep run one after another in one process: each measures the resident memory it
    added above what the process held before it, also a point after a larger one (whose freed heap it could
    reuse without a new resident page: measured 0 before)."""
    y = write_yaml(tmp_path / "m.yaml", f"""
run: {{name: mem, out_dir: {tmp_path / 'runs'}}}
model: {{n_head: 4, vocab_size: 256, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 256}}
training: {{device: cpu, seq_len: 64, steps: 3, warmup_steps: 1}}
eval: {{batches: 0}}
log: {{every: 1, progress: false}}
sweep:
  grid: {{training.lr: [0.001, 0.002, 0.003]}}
  zip: {{model.n_layer: [2, 4], model.n_embd: [64, 128], training.micro_batch: [8, 4]}}
""")
    run_train(["--yaml", y], ranks=2, check=True)
    with h5py.File(tmp_path / "runs/mem/summary.h5", "r") as f:
        peak, pred = f["points/meas_total"][:], f["points/pred_total"][:]
    assert np.all(peak > 0.5 * pred), (peak, pred)
    # the same model measures about the same, whatever ran before it
    assert np.all(np.abs(peak[2::2] / peak[0] - 1) < 0.3) and np.all(np.abs(peak[3::2] / peak[1] - 1) < 0.3), peak
