"""Slurm: a sweep as a job array with its summary job (slurm/sweep.sh), and a long run (slurm/train.sh) that is
sent USR1, checkpoints, requeues itself and resumes to the same final loss as an uninterrupted run.

The cluster is a private single-node Slurm (slurmctld + slurmd + munged, state under a temp folder) that
tests/slurm_cluster.sh installs if missing and starts; it is stopped after the module, also on failure.
Skipped only when Slurm cannot be installed or started for lack of root/apt."""
import csv
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ROOT, TINY_SYNTH, TRAIN, read_log, write_yaml

CLUSTER_SH = ROOT / "tests" / "slurm_cluster.sh"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}
# The cluster has the machine's cores (2 here); a sweep point uses 2 ranks when it can, to cover srun + PMIx.
RANKS = 2 if (os.cpu_count() or 1) >= 2 else 1


class Cluster:
    def __init__(self, path):
        self.dir = Path(path)
        # Everything the jobs need comes from the submitting environment (sbatch --export=ALL): this cluster,
        # the site settings of slurm/lib.sh for a CPU-only node, and nothing from a Slurm job we may run in.
        site = ("REPO_DIR", "TRAIN_BIN", "LAUNCHER", "SRUN_MPI", "SRUN_ARGS", "MPIRUN_ARGS", "MODULES",
                "EXTRA_SBATCH_ARGS", "MAX_PARALLEL", "RANKS_PER_POINT", "NODES_PER_POINT", "GPUS_PER_NODE",
                "MEM_PER_POINT", "POINT_SIGNAL_S", "PYTHON")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in site and not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        self.env.update(SLURM_CONF=str(self.dir / "slurm.conf"), TRAIN_BIN=str(TRAIN), OMP_NUM_THREADS="1",
                        GPUS_PER_POINT="0", CPUS_PER_TASK="1", POINT_TIME="10", SUMMARY_TIME="5")

    def run(self, args, cwd=None, check=True, timeout=60, env=None):
        p = subprocess.run([str(a) for a in args], cwd=cwd, env=dict(self.env, **(env or {})), capture_output=True,
                           text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}\n"
                                 + self.report())
        return p

    def states(self, job):
        """{job id (array tasks as A_i): state}, from squeue (completed jobs stay listed for MinJobAge)."""
        out = self.run(["squeue", "--states=all", "-h", "-j", job, "-o", "%i %T"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait(self, jobs, timeout, what="jobs"):
        """Waits until every job (and array task) in jobs is in a final state; returns {id: state}."""
        t0 = time.time()
        while True:
            st = {}
            for j in jobs:
                st.update(self.states(j))
            if st and all(s in FINAL for s in st.values()) and not any("[" in k for k in st):
                return st
            if time.time() - t0 > timeout:
                raise AssertionError(f"{what} not finished after {timeout} s: {st}\n" + self.report())
            time.sleep(1)

    def job_field(self, job, field):
        out = self.run(["scontrol", "show", "job", job], check=False).stdout
        m = re.search(rf"\b{field}=(\S*)", out)
        return m.group(1) if m else None

    def report(self, files=()):
        """What to read when something went wrong: the queue, the daemons' logs, the jobs' output."""
        parts = []
        for args in (["squeue", "--states=all", "-o", "%i %j %T %r %M %R"], ["sinfo", "-N", "-l"],
                     ["scontrol", "show", "job"]):
            p = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30)
            parts.append(f"$ {' '.join(args)}\n{p.stdout}{p.stderr}")
        p = subprocess.run(["bash", str(CLUSTER_SH), "logs", str(self.dir)], capture_output=True, text=True,
                           timeout=30)
        parts.append(p.stdout)
        for f in files:
            f = Path(f)
            if f.exists():
                parts.append(f"----- {f}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-60:]))
        return "\n".join(parts)


def started_cluster(nodes):
    """A generator for a module fixture: starts a cluster of `nodes` nodes, yields it, stops it."""
    # Not pytest's tmp_path: its folders are 0700 and munged runs as the munge user.
    d = Path(tempfile.mkdtemp(prefix="slurm-test-"))
    d.chmod(0o755)
    args = ["bash", str(CLUSTER_SH), "start", str(d), str(nodes)]
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        subprocess.run(["bash", str(CLUSTER_SH), "stop", str(d)], timeout=120)
        pytest.fail("tests/slurm_cluster.sh start did not return within 900 s")
    if p.returncode == 77:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip(f"SKIP: no Slurm cluster of {nodes} node(s) can be started here: {p.stderr.strip()}")
    if p.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.fail(f"tests/slurm_cluster.sh start failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    try:
        yield Cluster(d)
    finally:
        subprocess.run(["bash", str(CLUSTER_SH), "stop", str(d)], timeout=300)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(train_bin):
    yield from started_cluster(1)


def read_kv(path):
    return dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line)


def check_summary(sweep_dir, n_points, world_size):
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["index"]) for r in rows] == list(range(n_points)), rows
    for r in rows:
        assert r["status"] == "ok", r
        assert int(r["world_size"]) == world_size, r
        assert np.isfinite(float(r["final_train_loss"])), r
        assert read_log(sweep_dir / r["dir"] / "log.h5")["attrs"]["status"] == "ok"
    return rows


def test_sweep_as_job_array(slurm, tmp_path):
    """`sbatch slurm/sweep.sh SWEEP.yaml` from outside the checkout: a submit job, a 3-task array of 2-rank
    points started with srun, then the summary job (summary.csv, plots)."""
    t0 = time.time()
    base = TINY_SYNTH.format(name="zs", out_dir=tmp_path / "runs", steps=10, B=4, stage=0, accum=1, ckpt_every=0)
    y = write_yaml(tmp_path / "zs.yaml", base + "sweep:\n  grid:\n    training.zero_stage: [0, 1, 2]\n")
    env = {"RANKS_PER_POINT": str(RANKS)}
    jid = slurm.run(["sbatch", "--parsable", ROOT / "slurm" / "sweep.sh", y, "--set", "training.steps=12"],
                    cwd=tmp_path, env=env).stdout.strip().split(";")[0]
    submit_out = tmp_path / f"slurm-sweep-submit-{jid}.out"
    st = slurm.wait([jid], 120, "the submit job")
    assert st == {jid: "COMPLETED"}, slurm.report([submit_out])

    jobs = read_kv(submit_out)
    sweep_dir = Path(jobs["SWEEP_DIR"])
    assert sweep_dir == tmp_path / "runs" / "zs" and jobs["POINTS"] == "3", submit_out.read_text()
    st = slurm.wait([jobs["ARRAY_JOB"], jobs["SUMMARY_JOB"]], 240, "the sweep")
    assert st == {f"{jobs['ARRAY_JOB']}_{i}": "COMPLETED" for i in range(3)} | {jobs["SUMMARY_JOB"]: "COMPLETED"}, \
        slurm.report(sorted((sweep_dir / "slurm").glob("*.out")))

    rows = check_summary(sweep_dir, 3, RANKS)
    assert [r["training.zero_stage"] for r in rows] == ["0", "1", "2"]
    for i in range(3):  # the --set reached every point
        assert len(read_log(sweep_dir / f"p{i:03d}" / "log.h5")["step"]) == 12
    with h5py.File(sweep_dir / "summary.h5", "r") as f:
        assert list(f["points/status"].asstr()[:]) == ["ok"] * 3
    try:
        import matplotlib  # noqa: F401
        assert (sweep_dir / "throughput.png").exists(), slurm.report(sorted((sweep_dir / "slurm").glob("*.out")))
    except ImportError:
        pass
    print(f"sweep of 3 points through Slurm: {time.time() - t0:.1f} s")


def test_sweep_submitted_from_a_shell(slurm, tmp_path):
    """`bash slurm/sweep.sh` on the login node submits directly; MAX_PARALLEL caps the array. Points of one
    rank run two at a time and end together, so their summary writes collide (see sweep_point.sbatch)."""
    base = TINY_SYNTH.format(name="lr", out_dir=tmp_path / "runs", steps=6, B=4, stage=0, accum=1, ckpt_every=0)
    y = write_yaml(tmp_path / "lr.yaml", base + "sweep:\n  zip:\n    training.lr: [0.01, 0.02, 0.03, 0.04]\n")
    p = slurm.run(["bash", ROOT / "slurm" / "sweep.sh", y], cwd=tmp_path, env={"MAX_PARALLEL": "2"})
    jobs = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    assert slurm.job_field(f"{jobs['ARRAY_JOB']}_0", "ArrayTaskThrottle") == "2"
    sweep_dir = Path(jobs["SWEEP_DIR"])
    st = slurm.wait([jobs["ARRAY_JOB"], jobs["SUMMARY_JOB"]], 240, "the sweep")
    assert set(st.values()) == {"COMPLETED"}, slurm.report(sorted((sweep_dir / "slurm").glob("*.out")))
    check_summary(sweep_dir, 4, 1)


def test_sweep_refuses_before_submitting(slurm, tmp_path):
    """`bash slurm/sweep.sh` checks what it can before sbatch, and submits nothing (no job, no sweep folder)
    when a point could not run: a YAML without sweep: (a single run: slurm/train.sh), a point that the dry run
    of every point on the point's rank count refuses (point 1's total_batch_tokens fits 1 rank, not 2), more
    CPUs than a node has (the array would pend for ever), GPUs on a cluster without any (Slurm's gres error)."""
    base = TINY_SYNTH.format(name="chk", out_dir=tmp_path / "runs", steps=4, B=4, stage=0, accum=1, ckpt_every=0)
    single = write_yaml(tmp_path / "single.yaml", base)
    sweep = write_yaml(tmp_path / "sweep.yaml", base + "sweep:\n  grid:\n    training.zero_stage: [0, 1]\n")
    # micro_batch 4 x seq_len 16 x 2 ranks = 128 tokens: 192 is a whole number of steps on 1 rank only
    bad_point = write_yaml(tmp_path / "bad_point.yaml",
                           base + "sweep:\n  zip:\n    training.total_batch_tokens: [128, 192]\n")
    cpus = int(slurm.run(["sinfo", "-h", "-o", "%c"]).stdout.split()[0])
    cases = [
        (single, {}, ["has no sweep: section", "sbatch slurm/train.sh"]),
        (bad_point, {"RANKS_PER_POINT": "2"}, ["refused the sweep", "on 2 rank(s)", "training.total_batch_tokens",
                                               "192"]),
        (sweep, {"RANKS_PER_POINT": "2", "CPUS_PER_TASK": str(cpus)},
         [f"asks for {2 * cpus} CPUs on one node", f"at most {cpus}",
          f"CPUS_PER_TASK={cpus // 2}" if cpus >= 2 else "RANKS_PER_POINT"]),
        (sweep, {"GPUS_PER_POINT": "1"}, ["no node of the default partition has GPUs", "GPUS_PER_POINT=0"]),
    ]

    def jobs():
        return slurm.run(["squeue", "--states=all", "-h", "-o", "%i"]).stdout.split()

    before = jobs()
    for y, env, words in cases:
        p = slurm.run(["bash", ROOT / "slurm" / "sweep.sh", y], cwd=tmp_path, env=env, check=False)
        first = p.stderr.splitlines()[0] if p.stderr else ""
        assert p.returncode == 1 and first.startswith("sweep.sh: ") and "nothing submitted" in first, \
            (y.name, env, p.stdout, p.stderr)
        assert all(w in p.stderr for w in words), (y.name, env, words, p.stderr, slurm.report())
    assert jobs() == before, slurm.report()
    assert not (tmp_path / "runs").exists()
    # with CPUS_PER_TASK as the message says, the same sweep runs
    if cpus >= 2:
        p = slurm.run(["bash", ROOT / "slurm" / "sweep.sh", sweep], cwd=tmp_path,
                      env={"RANKS_PER_POINT": "2", "CPUS_PER_TASK": str(cpus // 2)})
        ids = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
        st = slurm.wait([ids["ARRAY_JOB"], ids["SUMMARY_JOB"]], 180, "the sweep")
        assert set(st.values()) == {"COMPLETED"}, slurm.report(sorted((tmp_path / "runs/chk/slurm").glob("*.out")))
        check_summary(tmp_path / "runs" / "chk", 2, 2)


SINFO_GPU_SITE = """cpu01 cpu* 4 (null)
cpu02 cpu* 4 (null)
gpu01 gpu 64 gpu:h100:8(S:0-1)
gpu02 gpu 64 gpu:h100:4(S:0),gpu:a100:2(S:1)
gpu01 all 64 gpu:h100:8(S:0-1)
"""


def test_sweep_checks_points_against_the_nodes_sinfo_lists(tmp_path, train_bin):
    """The request of a point against a site with a CPU partition (the default) and a GPU one, as sinfo
    lists them (stand-ins for sinfo and sbatch): GPUs summed over typed GRES entries, the partition from
    SBATCH_PARTITION or EXTRA_SBATCH_ARGS, each refusal naming the setting to change."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "sinfo").write_text(f"#!/bin/sh\ncat <<'EOF'\n{SINFO_GPU_SITE}EOF\n")
    (stubs / "sbatch").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'sbatch.calls'}\necho 7\n")
    for f in stubs.iterdir():
        f.chmod(0o755)
    base = TINY_SYNTH.format(name="g", out_dir=tmp_path / "runs", steps=4, B=4, stage=0, accum=1, ckpt_every=0)
    y = write_yaml(tmp_path / "g.yaml", base + "sweep:\n  grid:\n    training.zero_stage: [0, 1]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(PATH=f"{stubs}:{env['PATH']}", TRAIN_BIN=str(TRAIN), CPUS_PER_TASK="8")
    for k in ("GPUS_PER_POINT", "GPUS_PER_NODE", "EXTRA_SBATCH_ARGS", "RANKS_PER_POINT", "NODES_PER_POINT"):
        env.pop(k, None)

    def sweep(**settings):
        calls = tmp_path / "sbatch.calls"
        calls.unlink(missing_ok=True)
        p = subprocess.run(["bash", str(ROOT / "slurm" / "sweep.sh"), str(y)], cwd=tmp_path, env=dict(env, **settings),
                           capture_output=True, text=True, timeout=60)
        return p, calls.read_text().splitlines() if calls.exists() else []

    for settings, words in [
        ({}, ["no node of the default partition has GPUs", "GPUS_PER_POINT=0"]),
        ({"GPUS_PER_POINT": "0", "RANKS_PER_POINT": "2"}, ["16 CPUs", "at most 4", "CPUS_PER_TASK=2"]),
        ({"SBATCH_PARTITION": "gpu", "GPUS_PER_POINT": "16"}, ["2 node(s)", "partition gpu has 1 such"]),
        ({"SBATCH_PARTITION": "gpu", "GPUS_PER_POINT": "16", "GPUS_PER_NODE": "16"},
         ["16 GPUs on one node", "at most 8", "GPUS_PER_NODE=8"]),
        ({"SBATCH_PARTITION": "nope"}, ["no nodes in partition nope"]),
    ]:
        p, calls = sweep(**settings)
        assert p.returncode == 1 and all(w in p.stderr.splitlines()[0] for w in words), (settings, p.stderr)
        assert calls == [] and not (tmp_path / "runs").exists(), (settings, calls)
    for settings, request in [
        ({"SBATCH_PARTITION": "gpu", "GPUS_PER_POINT": "8"}, "--nodes=1 --ntasks-per-node=8 --gpus-per-node=8"),
        ({"EXTRA_SBATCH_ARGS": "-p all --qos=high", "GPUS_PER_POINT": "8"}, "-p all --qos=high --nodes=1"),
        ({"EXTRA_SBATCH_ARGS": "--partition=gpu", "GPUS_PER_POINT": "12", "GPUS_PER_NODE": "6"},  # gpu02: 4 + 2
         "--nodes=2 --ntasks-per-node=6 --gpus-per-node=6"),
        ({"SBATCH_PARTITION": "gpu,cpu", "GPUS_PER_POINT": "0", "RANKS_PER_POINT": "8"}, "--nodes=1 --ntasks=8"),
    ]:
        p, calls = sweep(**settings)
        assert p.returncode == 0 and len(calls) == 2, (settings, p.stderr)
        assert "--array=0-1" in calls[0] and request in calls[0], (settings, calls)
        shutil.rmtree(tmp_path / "runs")


LONG = """
run: {{name: long, out_dir: {out_dir}, seed: 11}}
model: {{n_layer: 2, n_head: 2, n_embd: 64, vocab_size: 64, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 64, synthetic_branching: 4}}
training: {{device: cpu, micro_batch: 8, seq_len: 64, steps: {steps}, lr: 1.0e-2, warmup_steps: 10,
           grad_clip: 1.0, weight_decay: 0.1}}
eval: {{every: 0, batches: 2}}
log: {{every: 1, progress: false}}
checkpoint: {{every: 25, keep_last: 2}}
"""
LONG_STEPS = 500  # 20-40 ms a step on one core: 10-20 s per run
SIGNAL_AFTER = 40  # steps the job shows before it gets USR1


def last_step(path):
    steps = re.findall(r"^step +(\d+)/", path.read_text(errors="replace"), re.M) if path.exists() else []
    return int(steps[-1]) if steps else 0


def test_long_run_checkpoints_requeues_and_resumes(slurm, tmp_path):
    """`scancel --batch --signal=USR1` reaches only the batch shell of slurm/train.sh; it forwards the signal,
    train checkpoints and exits 75, the job requeues itself and resumes to the uninterrupted run's loss."""
    t0 = time.time()
    y = write_yaml(tmp_path / "long.yaml", LONG.format(out_dir=tmp_path / "runs", steps=LONG_STEPS))
    # No GPUs in the test cluster: override train.sh's --gpus-per-node; one core for the one rank.
    jid = slurm.run(["sbatch", "--parsable", "--gpus-per-node=0", "--cpus-per-task=1", ROOT / "slurm" / "train.sh",
                     y], cwd=tmp_path).stdout.strip().split(";")[0]
    out = tmp_path / f"slurm-train-{jid}.out"
    # The uninterrupted reference, meanwhile, straight from ./train on the other core.
    ref_out = tmp_path / "ref.out"
    with open(ref_out, "w") as f:
        ref = subprocess.Popen([str(TRAIN), "--yaml", str(y), "--set", f"run.out_dir={tmp_path / 'ref'}"],
                               env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while last_step(out) < SIGNAL_AFTER:
            assert time.time() < deadline, f"no progress to step {SIGNAL_AFTER} in 120 s\n" + slurm.report([out])
            assert slurm.states(jid).get(jid) not in FINAL, "the job ended early\n" + slurm.report([out])
            time.sleep(0.5)
        slurm.run(["scancel", "--batch", "--signal=USR1", jid])

        # Checkpointed and requeued (Restarts=1), then it runs again and finishes.
        deadline = time.time() + 240
        while True:
            st = slurm.states(jid).get(jid)
            if st in FINAL:
                break
            assert time.time() < deadline, f"job not finished 240 s after USR1 ({st})\n" + slurm.report([out])
            time.sleep(1)
        assert st == "COMPLETED" and slurm.job_field(jid, "Restarts") == "1", slurm.report([out])
        assert ref.wait(timeout=240) == 0, ref_out.read_text()[-4000:]
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait()
    text = out.read_text(errors="replace")

    m = re.search(r"stopped by a signal at step (\d+)", text)
    assert m and SIGNAL_AFTER <= int(m.group(1)) < LONG_STEPS, text[-4000:]
    assert "got SIGUSR1" in text and "train exited 75" in text and "job requeued" in text, text[-4000:]
    assert f"resumed from step {m.group(1)}" in text, text[-4000:]
    assert slurm.job_field(jid, "ExitCode") == "0:0"

    log = read_log(tmp_path / "runs" / "long" / "log.h5")
    ref_log = read_log(tmp_path / "ref" / "long" / "log.h5")
    assert log["attrs"]["status"] == "ok"
    # One row per step, none twice, none missing, across the restart.
    np.testing.assert_array_equal(log["step"], np.arange(1, LONG_STEPS + 1))
    np.testing.assert_array_equal(ref_log["step"], log["step"])
    # Same thread count and rank count on both sides, so the resumed run is bit for bit the same.
    assert abs(log["loss"][-1] - ref_log["loss"][-1]) <= 1e-6, (log["loss"][-1], ref_log["loss"][-1])
    np.testing.assert_allclose(log["loss"], ref_log["loss"], rtol=0, atol=1e-6)
    print(f"long run through USR1 + requeue: {time.time() - t0:.1f} s (signal at step {m.group(1)})")


def test_time_limit_warning_requeues_and_scancel_does_not(slurm, tmp_path):
    """With --time=1 --signal=B:USR1@40 Slurm itself warns the batch shell, 0-40 s in (Slurm may send it up to 60 s
    early): the run checkpoints, or is stopped while starting, and the job requeues and resumes. A plain `scancel`
    (SIGTERM) then checkpoints too but cancels for good."""
    t0 = time.time()
    y = write_yaml(tmp_path / "long.yaml", LONG.format(out_dir=tmp_path / "runs", steps=100000))
    jid = slurm.run(["sbatch", "--parsable", "--gpus-per-node=0", "--cpus-per-task=1", "--time=1",
                     "--signal=B:USR1@40", ROOT / "slurm" / "train.sh", y], cwd=tmp_path).stdout.strip().split(";")[0]
    out = tmp_path / f"slurm-train-{jid}.out"

    def text():
        return out.read_text(errors="replace") if out.exists() else ""

    deadline = time.time() + 180
    while not re.search(r"resumed from step \d+", text()) or last_step(out) <= int(
            re.search(r"resumed from step (\d+)", text()).group(1)):
        assert time.time() < deadline, "no requeue and resume within 180 s\n" + slurm.report([out])
        assert slurm.states(jid).get(jid) not in FINAL, "the job ended early\n" + slurm.report([out])
        time.sleep(0.5)
    slurm.run(["scancel", jid])
    st = slurm.wait([jid], 60, "the cancelled job")
    t = text()
    restarts = int(slurm.job_field(jid, "Restarts") or 0)
    assert st == {jid: "CANCELLED"} and restarts >= 1, slurm.report([out])
    assert "got SIGUSR1" in t and t.count("job requeued") == restarts, t[-4000:]
    assert "got SIGTERM" in t and "not requeued" in t, t[-4000:]
    stops = [int(k) for k in re.findall(r"stopped by a signal at step (\d+)", t)]
    assert len(stops) == 2 and 0 < stops[0] < stops[1], t[-4000:]
    ckpts = [c.name for c in (tmp_path / "runs" / "long" / "checkpoints").iterdir()]
    assert stops[1] in [int(m.group(1)) for m in map(re.compile(r"(\d+)$").search, ckpts) if m], (stops, ckpts)
    log = read_log(tmp_path / "runs" / "long" / "log.h5")
    assert log["attrs"]["status"] == "checkpointed"
    np.testing.assert_array_equal(log["step"], np.arange(1, stops[1] + 1))
    print(f"time-limit requeue + scancel: {time.time() - t0:.1f} s (stops at steps {stops})")


def test_a_signal_before_the_ranks_can_catch_it_requeues(slurm, tmp_path):
    """A USR1 that reaches the ranks before they have installed their handler (as when Slurm's early warning
    comes just as the job starts) kills them, status 138. Nothing was lost, so the job requeues as after a
    checkpoint instead of failing. The stand-in for train has no handler at all."""
    stub = tmp_path / "no_handler.sh"
    stub.write_text("#!/bin/bash\nexec sleep 120\n")
    stub.chmod(0o755)
    y = write_yaml(tmp_path / "long.yaml", LONG.format(out_dir=tmp_path / "runs", steps=10))
    jid = slurm.run(["sbatch", "--parsable", "--gpus-per-node=0", "--cpus-per-task=1", ROOT / "slurm" / "train.sh", y],
                    cwd=tmp_path, env={"TRAIN_BIN": str(stub)}).stdout.strip().split(";")[0]
    out = tmp_path / f"slurm-train-{jid}.out"

    def text():
        return out.read_text(errors="replace") if out.exists() else ""

    def wait_for(cond, seconds, what):
        deadline = time.time() + seconds
        while not cond():
            assert time.time() < deadline, f"{what} within {seconds} s\n" + slurm.report([out])
            assert slurm.states(jid).get(jid) not in FINAL, "the job ended\n" + slurm.report([out])
            time.sleep(0.5)

    wait_for(lambda: "running: " in text(), 60, "no launch")
    time.sleep(2)  # srun has started the stand-in
    slurm.run(["scancel", "--batch", "--signal=USR1", jid])
    wait_for(lambda: slurm.job_field(jid, "Restarts") == "1" and text().count("running: ") == 2, 90,
             "no requeue and restart")
    t = text()
    assert "train exited 138 (after SIGUSR1)" in t and "stopped while starting" in t and "job requeued" in t, t
    slurm.run(["scancel", jid])
    assert slurm.wait([jid], 60, "the cancelled job") == {jid: "CANCELLED"}, slurm.report([out])
