"""Slurm across nodes: slurm/train.sh and slurm/sweep.sh on a cluster of two nodes, as a user submits them.

The cluster is two slurmd daemons on this machine (nodes n1 and n2, each with its own port, spool folder and
hostname; `tests/slurm_cluster.sh start DIR 2`), so Slurm places tasks, steps and signals per node as on a
real cluster, and OpenMPI talks TCP between the nodes. Every job here has 2 ranks on each node:
- their losses equal those of 4 ranks on one machine, under srun (PMIx) and under mpirun; each rank's node
  and local rank (from SLURM_LOCALID / OMPI_COMM_WORLD_LOCAL_RANK) are in the log, every rank's checkpoint
  piece is in the one run folder;
- `scancel --signal=USR1` reaches all 4 ranks: checkpoint, requeue, resume, every step logged once;
- killing the ranks of one node ends the job within KillWait; its last checkpoint resumes on one node;
- sweep points of 2 nodes each.
Skipped when Slurm cannot be installed or the nodes cannot get hostnames of their own."""
import os
import re
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ROOT, TINY_SYNTH, mpirun_cmd, read_log, write_yaml
from test_slurm import FINAL, check_summary, last_step, started_cluster
from test_zero import checkpoint_state

TRAIN_SH = ROOT / "slurm" / "train.sh"
RANKS_PER_NODE = 2
# Resharding changes the order of the gradient sums (see test_checkpoint.py).
LOSS_ATOL = 1e-6
STEPS = 200  # 4 ranks on 2 cores: about 50 ms a step, 10 s a run
KILL_BOUND_S = 60  # the cluster's KillWait is 10 s: the ranks left are killed then


@pytest.fixture(scope="module")
def nodes2(train_bin):
    for cluster in started_cluster(2):
        # 4 ranks on 2 cores: a rank waiting in MPI gives its core up instead of spinning (mpirun does this
        # itself when it sees it oversubscribes; srun cannot tell).
        cluster.env.update(OMPI_MCA_mpi_yield_when_idle="1")
        yield cluster


def run_yaml(tmp_path, name, steps=STEPS, B=4, stage=2, ckpt_every=20):
    text = TINY_SYNTH.format(name=name, out_dir=tmp_path / "runs", steps=steps, B=B, stage=stage, accum=1,
                             ckpt_every=ckpt_every)
    return write_yaml(tmp_path / f"{name}.yaml", text)


def reference(y, out_dir, ranks=4):
    """The same run on `ranks` ranks of this machine, straight from mpirun: its log."""
    cmd = mpirun_cmd(ranks) + [str(ROOT / "train"), "--yaml", str(y), "--set", f"run.out_dir={out_dir}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return read_log(Path(out_dir) / Path(y).stem / "log.h5")


@pytest.fixture(scope="module")
def ref_losses(tmp_path_factory):
    """The losses of run_yaml's run uninterrupted on 4 ranks of this machine (the run name changes nothing)."""
    d = tmp_path_factory.mktemp("ref")
    return reference(run_yaml(d, "ref"), d / "out")["loss"]


def submit(cluster, cwd, y, nodes, *args, env=None):
    """`sbatch --nodes N slurm/train.sh YAML ARGS`, 2 ranks a node, no GPUs; returns (job id, output file)."""
    p = cluster.run(["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={RANKS_PER_NODE}",
                     "--gpus-per-node=0", "--cpus-per-task=1", TRAIN_SH, y, *args], cwd=cwd, env=env)
    jid = p.stdout.strip().split(";")[0]
    return jid, Path(cwd) / f"slurm-train-{jid}.out"


def text(out):
    return out.read_text(errors="replace") if out.exists() else ""


def wait_until(cluster, jid, out, cond, seconds, what):
    deadline = time.time() + seconds
    while not cond():
        assert time.time() < deadline, f"{what} within {seconds} s\n" + cluster.report([out])
        assert cluster.states(jid).get(jid) not in FINAL, f"the job ended before {what}\n" + cluster.report([out])
        time.sleep(0.3)


def ranks_of(log_path):
    with h5py.File(log_path, "r") as f:
        g = f["ranks"]
        return list(g["node"].asstr()[:]), list(g["local_rank"][:]), list(g["local_rank_from"].asstr()[:])


def job_train_pids(cluster, jid, node):
    """The ./train processes of job `jid` of this cluster on node `node` (from their environment)."""
    # Job ids of test clusters that other sessions run at the same time repeat: SLURM_CONF tells them apart.
    want = {f"SLURM_JOB_ID={jid}".encode(), f"SLURMD_NODENAME={node}".encode(),
            f"SLURM_CONF={cluster.env['SLURM_CONF']}".encode()}
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit() or (p / "comm").read_text().strip() != "train":
                continue
            if want <= set((p / "environ").read_bytes().split(b"\0")):
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_two_nodes_equal_one_machine(nodes2, tmp_path, launcher):
    """`sbatch --nodes 2 slurm/train.sh YAML`: 2 x 2 ranks with the losses of 4 ranks on one machine, each rank's
    local rank from its launcher (0 and 1 on each node), one log, every rank's piece in one checkpoint."""
    y = run_yaml(tmp_path, "two", steps=30, ckpt_every=15)
    env = {"LAUNCHER": launcher, "MPIRUN_ARGS": "--allow-run-as-root"}
    jid, out = submit(nodes2, tmp_path, y, 2, env=env)
    st = nodes2.wait([jid], 120, "the 2-node run")
    assert st == {jid: "COMPLETED"}, nodes2.report([out])
    from_var = {"srun": "SLURM_LOCALID", "mpirun": "OMPI_COMM_WORLD_LOCAL_RANK"}[launcher]
    assert f"4 ranks on 2 nodes: n1 (ranks 0-1), n2 (ranks 2-3); local rank from {from_var}" in text(out), text(out)

    log_path = tmp_path / "runs" / "two" / "log.h5"
    assert ranks_of(log_path) == (["n1", "n1", "n2", "n2"], [0, 1, 0, 1], [from_var] * 4)
    log = read_log(log_path)
    assert log["attrs"]["status"] == "ok" and log["attrs"]["world_size"] == 4
    ref = reference(y, tmp_path / "ref")
    np.testing.assert_array_equal(log["step"], np.arange(1, 31))
    # Same ranks, same sums in the same order: bit for bit, wherever the ranks run.
    np.testing.assert_array_equal(log["loss"], ref["loss"])

    ck = tmp_path / "runs" / "two" / "checkpoints" / "step_00000030"
    assert sorted(f.name for f in ck.glob("rank_*.h5")) == [f"rank_{r:05d}.h5" for r in range(4)]
    _, world, stage = checkpoint_state(ck)  # asserts the 4 pieces tile every bucket
    assert (world, stage) == (4, 2)


@pytest.mark.parametrize("launcher,scancel", [("srun", ["--signal=USR1"]), ("srun", ["--batch", "--signal=USR1"]),
                                              ("mpirun", ["--batch", "--signal=USR1"])],
                         ids=["srun-ranks", "srun-batch", "mpirun-batch"])
def test_usr1_reaches_every_rank_then_requeue_and_resume(nodes2, tmp_path, ref_losses, launcher, scancel):
    """USR1 sent to the ranks on both nodes (`scancel --signal=USR1`), or to the batch shell as the time-limit
    warning is (`--batch`), which passes it to srun or mpirun: all 4 ranks receive it, checkpoint and exit 75;
    the job requeues itself and resumes, with every step logged once and the uninterrupted losses."""
    y = run_yaml(tmp_path, "sig")
    jid, out = submit(nodes2, tmp_path, y, 2, env={"LAUNCHER": launcher, "MPIRUN_ARGS": "--allow-run-as-root"})
    wait_until(nodes2, jid, out, lambda: last_step(out) >= 15, 120, "no progress to step 15")
    nodes2.run(["scancel", *scancel, jid])
    st = nodes2.wait([jid], 240, "the requeued run")
    t = text(out)
    assert st == {jid: "COMPLETED"} and nodes2.job_field(jid, "Restarts") == "1", nodes2.report([out])

    m = re.search(r"stopped by a signal at step (\d+) \(received by (\d+) of 4 ranks\)", t)
    assert m and 15 <= int(m.group(1)) < STEPS, t[-4000:]
    assert m.group(2) == "4", f"USR1 reached {m.group(2)} of the 4 ranks\n" + t[-4000:]
    assert "train exited 75" in t and "job requeued" in t and f"resumed from step {m.group(1)}" in t, t[-4000:]
    assert t.count("4 ranks on 2 nodes: n1 (ranks 0-1), n2 (ranks 2-3)") == 2, t[-4000:]
    assert ("after SIGUSR1" in t) == ("--batch" in scancel), t[-4000:]
    log = read_log(tmp_path / "runs" / "sig" / "log.h5")
    assert log["attrs"]["status"] == "ok"
    np.testing.assert_array_equal(log["step"], np.arange(1, STEPS + 1))
    np.testing.assert_array_equal(log["loss"], ref_losses)


def test_dead_node_ends_the_job_and_its_checkpoint_resumes_on_one_node(nodes2, tmp_path):
    """kill -9 of node n2's ranks: srun ends the rest within KillWait and the job fails (no hang). Submitted
    again on one node (2 ranks, micro-batch doubled: the same tokens per step), the run resumes from the last
    complete checkpoint of the 2-node job, resharded from 4 ZeRO-2 pieces to 2, and ends where 4 ranks would.
    Micro-batches of 16: an idle machine ran the 200 steps of micro-batch 4 in 0.6 s, before the test could
    see a checkpoint and kill; 16 leaves it about four times as long."""
    (tmp_path / "ref").mkdir()
    ref_losses = reference(run_yaml(tmp_path / "ref", "dead", B=16), tmp_path / "ref" / "out")["loss"]
    y = run_yaml(tmp_path, "dead", B=16)
    jid, out = submit(nodes2, tmp_path, y, 2)
    latest = tmp_path / "runs" / "dead" / "checkpoints" / "latest"

    def past_a_checkpoint():
        return latest.exists() and last_step(out) >= int(latest.read_text().strip().split("_")[-1]) + 5

    wait_until(nodes2, jid, out, past_a_checkpoint, 120, "no checkpoint and 5 more steps")
    victims = job_train_pids(nodes2, jid, "n2")
    assert len(victims) == RANKS_PER_NODE, (victims, nodes2.report([out]))
    for pid in victims:
        os.kill(pid, 9)
    t0 = time.time()
    st = nodes2.wait([jid], KILL_BOUND_S, "the job after its n2 ranks were killed")
    print(f"job ended {time.time() - t0:.1f} s after the kill")
    assert st == {jid: "FAILED"}, nodes2.report([out])
    assert not job_train_pids(nodes2, jid, "n1"), "ranks of the failed job are still running on n1"
    assert "train exited 137" in text(out), text(out)[-4000:]

    resume_step = int(latest.read_text().strip().split("_")[-1])
    jid1, out1 = submit(nodes2, tmp_path, y, 1, "--set", "training.micro_batch=32")
    st = nodes2.wait([jid1], 120, "the 1-node resume")
    t = text(out1)
    assert st == {jid1: "COMPLETED"}, nodes2.report([out1])
    assert f"resumed from step {resume_step} " in t and "2 ranks on 1 node: n1 (ranks 0-1)" in t, t[-4000:]
    log_path = tmp_path / "runs" / "dead" / "log.h5"
    assert ranks_of(log_path) == (["n1", "n1"], [0, 1], ["SLURM_LOCALID"] * 2)
    log = read_log(log_path)
    assert log["attrs"]["status"] == "ok"
    np.testing.assert_array_equal(log["step"], np.arange(1, STEPS + 1))  # the killed job's extra rows dropped
    np.testing.assert_array_equal(log["loss"][:resume_step], ref_losses[:resume_step])
    diff = np.abs(log["loss"][resume_step:] - ref_losses[resume_step:]).max()
    assert diff <= LOSS_ATOL, f"losses after resuming on one node differ from 4 ranks' by {diff:.3g}"
    assert len(list((tmp_path / "runs" / "dead" / "checkpoints" / f"step_{STEPS:08d}").glob("rank_*.h5"))) == 2


def test_sweep_points_span_two_nodes(nodes2, tmp_path):
    """`bash slurm/sweep.sh` with RANKS_PER_POINT=4 NODES_PER_POINT=2: each array task runs on both nodes."""
    base = TINY_SYNTH.format(name="zn", out_dir=tmp_path / "runs", steps=10, B=4, stage=0, accum=1, ckpt_every=0)
    y = write_yaml(tmp_path / "zn.yaml", base + "sweep:\n  grid:\n    training.zero_stage: [0, 3]\n")
    env = {"GPUS_PER_POINT": "0", "RANKS_PER_POINT": "4", "NODES_PER_POINT": "2"}
    p = nodes2.run(["bash", ROOT / "slurm" / "sweep.sh", y], cwd=tmp_path, env=env)
    jobs = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    sweep_dir = Path(jobs["SWEEP_DIR"])
    st = nodes2.wait([jobs["ARRAY_JOB"], jobs["SUMMARY_JOB"]], 180, "the sweep")
    assert set(st.values()) == {"COMPLETED"}, nodes2.report(sorted((sweep_dir / "slurm").glob("*.out")))
    assert nodes2.job_field(f"{jobs['ARRAY_JOB']}_0", "NumNodes") == "2"
    check_summary(sweep_dir, 2, 4)
    for i in range(2):
        assert ranks_of(sweep_dir / f"p{i:03d}" / "log.h5")[:2] == (["n1", "n1", "n2", "n2"], [0, 1, 0, 1])
    p = nodes2.run(["bash", ROOT / "slurm" / "sweep.sh", y], cwd=tmp_path, check=False,
                   env=dict(env, NODES_PER_POINT="3"))
    assert p.returncode == 1 and "NODES_PER_POINT=3" in p.stderr, p.stderr


def test_failed_node_ends_the_job_and_slurm_requeues_it(nodes2, tmp_path, ref_losses):
    """A node that fails (set DOWN, as slurmctld does when its slurmd stops answering) ends the job: Slurm
    signals what is left, which checkpoints, and requeues the job itself (--requeue), though the batch shell
    does not. When the node is back the job resumes from that checkpoint, with every step logged once and the
    losses of an uninterrupted run."""
    y = run_yaml(tmp_path, "nf")
    jid, out = submit(nodes2, tmp_path, y, 2)
    try:
        wait_until(nodes2, jid, out, lambda: last_step(out) >= 15, 120, "no progress to step 15")
        nodes2.run(["scontrol", "update", "nodename=n2", "state=down", "reason=node failure test"])
        wait_until(nodes2, jid, out, lambda: nodes2.job_field(jid, "Restarts") == "1", 60, "no requeue")
    finally:
        # the node is back (ReturnToService=2 may have done it already, as its slurmd answers)
        nodes2.run(["scontrol", "update", "nodename=n2", "state=resume"], check=False)
    st = nodes2.wait([jid], 240, "the requeued job")
    t = text(out)
    assert st == {jid: "COMPLETED"} and nodes2.job_field(jid, "Restarts") == "1", nodes2.report([out])
    assert "got SIGTERM" in t and "not requeued by this script" in t, t[-4000:]
    m = re.search(r"stopped by a signal at step (\d+)", t)
    assert m and f"resumed from step {m.group(1)}" in t, t[-4000:]
    log = read_log(tmp_path / "runs" / "nf" / "log.h5")
    assert log["attrs"]["status"] == "ok"
    np.testing.assert_array_equal(log["step"], np.arange(1, STEPS + 1))
    np.testing.assert_array_equal(log["loss"], ref_losses)
