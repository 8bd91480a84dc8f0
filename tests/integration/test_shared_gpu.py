"""Ranks that share a GPU: refused at start-up unless parallel.shared_gpu: host, which runs the staged
communicator (collectives through host memory). Here on CPU ranks: the refusal through the testing hook
GPT2_TRAIN_GPU_ID (every rank reports that GPU as its own), and the staged communicator's logic over plain
copies, which must train exactly as the MPI communicator does (the same fp32 MPI collectives, staged).
The same on a GPU: tests/integration/test_gpu_shared.py."""
import csv
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT, TINY_SYNTH, mpirun_cmd, read_log, run_train, tiny_yaml, write_yaml
from test_checkpoint import LOSS_ATOL
from test_zero import checkpoint_state, latest_checkpoint

SHARED = "parallel: {shared_gpu: host}\n"
BUS_ID = "0000:19:00.0"


def run(tmp_path, name, ranks=2, sets=(), env=None, **kw):
    y = tiny_yaml(tmp_path, name=name, **kw)
    args = ["--yaml", y] + [a for kv in sets for a in ("--set", kv)]
    return run_train(args, ranks=ranks, timeout=120, env={"OMP_NUM_THREADS": "1", **(env or {})})


def test_staged_collectives_of_two_ranks():
    """The staged communicator's C++ tests (tests/cpu/test_comm_staged.cpp) on 2 ranks: bf16 sums rounded
    once from fp32, each rank's piece of a reduce-scatter and a gather, the copies each collective makes."""
    binary = ROOT / "build/tests/cpu/test_comm_staged"
    if not binary.exists():
        pytest.fail(f"{binary} is not built: run `make` first")
    p = subprocess.run(mpirun_cmd(2) + [str(binary)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.count("[  PASSED  ]") == 2, p.stdout[-3000:] + p.stderr[-3000:]


def test_ranks_on_one_gpu_are_refused_before_any_work(tmp_path, train_bin):
    p = run(tmp_path, "refused", env={"GPT2_TRAIN_GPU_ID": BUS_ID})
    assert p.returncode == 1, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, p.stderr  # said once, by rank 0
    assert errors[0].startswith(f"error: 2 ranks on node ") and \
        f"which has 1 GPU for them: ranks 0-1 share GPU {BUS_ID}. NCCL takes one GPU per rank: start at most " \
        "1 rank per node (mpirun -np 1 on one node), or set parallel.shared_gpu: host" in errors[0], errors[0]
    assert "memory" not in p.stdout, "the plan was printed before the refusal"
    assert not (tmp_path / "runs" / "refused").exists(), "the refused run left a run directory"


def test_one_rank_and_gpus_of_their_own_are_not_refused(tmp_path, train_bin):
    p = run(tmp_path, "alone", ranks=1, steps=2, env={"GPT2_TRAIN_GPU_ID": BUS_ID})
    assert p.returncode == 0, p.stderr
    p = run(tmp_path, "plain", steps=2)  # CPU ranks without the hook compare nothing
    assert p.returncode == 0, p.stderr
    assert read_log(tmp_path / "runs" / "plain" / "log.h5")["attrs"]["shared_gpu"] == 0


def test_shared_gpu_host_runs_them_and_marks_the_log(tmp_path, train_bin):
    p = run(tmp_path, "shared", steps=3, extra=SHARED, env={"GPT2_TRAIN_GPU_ID": BUS_ID})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    log = read_log(tmp_path / "runs" / "shared" / "log.h5")
    assert log["attrs"]["shared_gpu"] == 1 and log["attrs"]["world_size"] == 2
    assert len(log["loss"]) == 3


def test_shared_gpu_takes_refuse_or_host_only(tmp_path, train_bin):
    p = run(tmp_path, "bad", ranks=1, extra="parallel: {shared_gpu: yes}\n")
    assert p.returncode == 1
    assert "parallel.shared_gpu" in p.stderr and "refuse" in p.stderr and "host" in p.stderr, p.stderr


@pytest.mark.parametrize("ranks,accum", [(2, 1), (3, 2)])
def test_staged_collectives_train_exactly_as_mpi(tmp_path, train_bin, ranks, accum):
    """Stages 0-3 through the staged communicator: the same losses, gradient norms and checkpointed
    parameters and moments, to the bit, as through the MPI communicator (3 ranks: uneven shards)."""
    for stage in range(4):
        runs = {}
        for mode, extra in (("mpi", ""), ("staged", SHARED)):
            name = f"{mode}{stage}"
            p = run(tmp_path, name, ranks=ranks, stage=stage, accum=accum, steps=8, ckpt_every=8, extra=extra)
            assert p.returncode == 0, f"{name}: {p.stdout[-2000:]}{p.stderr[-2000:]}"
            runs[mode] = tmp_path / "runs" / name
        a, b = (read_log(runs[m] / "log.h5") for m in ("mpi", "staged"))
        assert b["attrs"]["zero_stage"] == stage
        for k in ("loss", "grad_norm", "val_loss"):
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"stage {stage}: {k}")
        for kind in ("param", "m", "v"):
            pa = checkpoint_state(latest_checkpoint(runs["mpi"]), kind)[0]
            pb = checkpoint_state(latest_checkpoint(runs["staged"]), kind)[0]
            for g in pa:
                np.testing.assert_array_equal(pa[g], pb[g], err_msg=f"stage {stage}: {kind} of {g}")


def test_staged_checkpoint_resumes_on_other_rank_counts(tmp_path, train_bin):
    """A checkpoint of 2 staged ranks at stage 3, resumed on 1 and 4 staged ranks at other stages (the
    same 8 sequences a step), continues as the uninterrupted run (test_checkpoint's resharding bound)."""
    p = run(tmp_path, "two", stage=3, steps=8, ckpt_every=4, extra=SHARED)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ref = read_log(tmp_path / "runs" / "two" / "log.h5")
    src = tmp_path / "runs" / "two" / "checkpoints" / "step_00000004"
    for ranks, stage, B in ((1, 0, 8), (4, 2, 2)):
        name = f"r{ranks}s{stage}"
        dst = tmp_path / "runs" / name / "checkpoints"
        dst.mkdir(parents=True)
        shutil.copytree(src, dst / src.name)
        (dst / "latest").write_text(src.name + "\n")
        y = tiny_yaml(tmp_path, name=name, steps=8, B=B, stage=stage, ckpt_every=4, extra=SHARED)
        p = run_train(["--yaml", y, "--resume"], ranks=ranks, timeout=120, env={"OMP_NUM_THREADS": "1"})
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        assert "resumed from step 4" in p.stdout, p.stdout[-2000:]
        got = read_log(tmp_path / "runs" / name / "log.h5")
        assert list(got["step"]) == [5, 6, 7, 8]
        diff = np.abs(got["loss"] - ref["loss"][4:])
        assert diff.max() <= LOSS_ATOL, f"{ranks} ranks stage {stage}: losses after resharding differ by {diff.max():.3g}"


def test_sweep_summary_notes_staged_throughput(tmp_path, train_bin):
    base = TINY_SYNTH.format(name="sw", out_dir=tmp_path / "runs", steps=2, B=4, stage=0, accum=1, ckpt_every=0)
    y = write_yaml(tmp_path / "sw.yaml", base + "sweep:\n  grid:\n    parallel.shared_gpu: [refuse, host]\n")
    p = run_train(["--yaml", y], ranks=2, timeout=120, env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    note = "throughput not representative: collectives staged through host memory (parallel.shared_gpu: host)"
    lines = {line.split()[0]: line for line in p.stdout.splitlines() if line.startswith("  p00")}
    assert note not in lines["p000"] and note in lines["p001"], lines
    with open(tmp_path / "runs" / "sw" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["parallel.shared_gpu"] for r in rows] == ["refuse", "host"]
    assert rows[0]["message"] == "" and rows[1]["message"] == note, rows
