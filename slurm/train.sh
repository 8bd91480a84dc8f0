#!/bin/bash
# A long training run that outlives time limits and preemption:
#
#   sbatch slurm/train.sh experiments/long_run.yaml [--set key=value ...]
#   sbatch --nodes=4 --gpus-per-node=8 --ntasks-per-node=8 slurm/train.sh experiments/long_run.yaml
#
# Runs `./train --yaml YAML --resume [args]` on every task of the allocation (one rank per GPU: keep
# --ntasks-per-node equal to --gpus-per-node), on as many nodes as the job has; each rank takes the GPU of
# its local rank (SLURM_LOCALID). A node range (--nodes=2-4) lets a requeued job start on the nodes there
# are; it resumes resharded to its new rank count. Slurm sends USR1 to this shell 300 s (the --signal line
# below) before the time limit; the shell passes it to the ranks, which finish their step,
# checkpoint and exit 75; the job then requeues itself and, when it starts again, resumes from the checkpoint
# (the run log continues without duplicate rows). `scancel --batch --signal=USR1 JOBID` does the same by hand.
# Exit status: 0 when the run finished (or checkpointed and was requeued), else train's (docs/FORMATS.md).
# Launcher, modules and NCCL settings: slurm/lib.sh (overridable from the environment, e.g. LAUNCHER=mpirun).
# Partition, account and resources: #SBATCH lines below, overridden by the sbatch command line or SBATCH_*.
#SBATCH --job-name=train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-train-%j.out
set -uo pipefail

die() { echo "train.sh: $*" >&2; exit 1; }

# Slurm runs a spool copy of this script, so in a job its own path is no guide to the checkout.
find_repo() {
    local d
    for d in "${REPO_DIR:-}" "$(dirname "${BASH_SOURCE[0]}")/.." "${SLURM_SUBMIT_DIR:-}"; do
        [[ -n "$d" && -f "$d/slurm/lib.sh" ]] && { cd "$d" && pwd; return; }
    done
    [[ -n "${SLURM_JOB_ID:-}" ]] || return 1
    d=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
    d=$(dirname "$(dirname "$d")")
    [[ -f "$d/slurm/lib.sh" ]] && cd "$d" && pwd
}

[[ $# -ge 1 && "$1" != -* ]] || die "usage: sbatch slurm/train.sh RUN.yaml [train args, e.g. --set k=v]"
[[ -n "${SLURM_JOB_ID:-}" ]] || die "submit this with sbatch (it requeues itself with scontrol)"
REPO_DIR=$(find_repo) || die "cannot find the checkout (slurm/lib.sh): submit from it or set REPO_DIR"
export REPO_DIR
# shellcheck source=slurm/lib.sh
source "$REPO_DIR/slurm/lib.sh"
load_site || exit 1
[[ -f "$1" ]] || die "no such file: $1"
[[ -x "$TRAIN_BIN" ]] || die "$TRAIN_BIN is not built (or set TRAIN_BIN)"
gpn=${SLURM_GPUS_PER_NODE:-0}
gpn=${gpn##*:}  # the count of a typed request such as h100:8
if (( gpn > 0 )) && [[ -n "${SLURM_NTASKS_PER_NODE:-}" && "$gpn" != "$SLURM_NTASKS_PER_NODE" ]]; then
    log "warning: $SLURM_NTASKS_PER_NODE task(s) per node but --gpus-per-node=$SLURM_GPUS_PER_NODE (one rank per GPU is intended)"
fi

log "run $1 on $SLURM_JOB_NUM_NODES node(s) [$SLURM_JOB_NODELIST], ${SLURM_NTASKS:-1} rank(s) (per node: ${SLURM_TASKS_PER_NODE:-1}), restart ${SLURM_RESTART_COUNT:-0}"
run_train --yaml "$@" --resume
