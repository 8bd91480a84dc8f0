#!/bin/bash
# Submits a sweep as a Slurm job array (one task per point) plus a summary job that runs after all of them.
#
#   sbatch slurm/sweep.sh experiments/zero.yaml [--set key=value ...]    from a tiny batch job
#   bash slurm/sweep.sh experiments/zero.yaml [--set key=value ...]      directly from the login node
#
# Both do the same: count the points with `./train --yaml YAML --list`, submit slurm/sweep_point.sbatch as
# `--array` over them, then slurm/summarize.sbatch with `--dependency=afterany:<array>` (summary.{h5,csv}
# and, where matplotlib is importable, the plots). Extra arguments go to every ./train call.
# Run it from the checkout (or set REPO_DIR); relative paths in the YAML are relative to where it is run.
# Site settings (GPUs per point, launcher, modules, ...): slurm/lib.sh, overridable from the environment,
# e.g. `GPUS_PER_POINT=2 SBATCH_PARTITION=gpu sbatch slurm/sweep.sh experiments/zero.yaml`.
# Points are requeued after a time-limit warning or preemption and resume from their checkpoints.
#SBATCH --job-name=sweep-submit
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:15:00
#SBATCH --output=slurm-sweep-submit-%j.out
set -uo pipefail

die() { echo "sweep.sh: $*" >&2; exit 1; }

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

[[ $# -ge 1 && "$1" != -* ]] || die "usage: [sbatch|bash] slurm/sweep.sh SWEEP.yaml [train args, e.g. --set k=v]"
REPO_DIR=$(find_repo) || die "cannot find the checkout (slurm/lib.sh): run from it or set REPO_DIR"
export REPO_DIR
# shellcheck source=slurm/lib.sh
source "$REPO_DIR/slurm/lib.sh"
load_site || exit 1

YAML=$(realpath "$1") || die "no such file: $1"
shift
[[ -f "$YAML" ]] || die "no such file: $YAML"
[[ -x "$TRAIN_BIN" ]] || die "$TRAIN_BIN is not built (or set TRAIN_BIN)"

list=$("$TRAIN_BIN" --yaml "$YAML" --list "$@") || die "$TRAIN_BIN --yaml $YAML --list failed"
mapfile -t indices < <(awk -F'\t' 'NF >= 2 && $1 ~ /^[0-9]+$/ {print $1}' <<< "$list")
n=${#indices[@]}
(( n > 0 )) || die "$YAML has no sweep points (a sweep needs a sweep: section)"

# The sweep folder <out_dir>/<name>, from the resolved config of the first point. The device is forced to
# the CPU so that this works on a node without GPUs; it does not change the paths.
dry=$("$TRAIN_BIN" --yaml "$YAML" --dry-run --index "${indices[0]}" "$@" --set training.device=cpu 2>/dev/null)
field() { sed -n "s/^| $1 *\"\(.*\)\"\$/\1/p" <<< "$dry" | head -n 1; }
out_dir=$(field run.out_dir)
point_name=$(field run.name)
[[ -n "$out_dir" && -n "$point_name" ]] || die "cannot read run.out_dir / run.name from --dry-run of point ${indices[0]}"
[[ "$out_dir" = /* ]] || out_dir="$PWD/$out_dir"
SWEEP_DIR=$(dirname "$out_dir/$point_name")
LOG_DIR="$SWEEP_DIR/slurm"
mkdir -p "$LOG_DIR" || die "cannot create $LOG_DIR"
name=$(basename "$SWEEP_DIR")

# Array spec: a range when the indices are 0..n-1, else the list; %MAX_PARALLEL caps concurrent points.
if [[ "${indices[0]}" == 0 && "${indices[n - 1]}" == $((n - 1)) ]]; then
    array="0-$((n - 1))"
else
    array=$(IFS=,; echo "${indices[*]}")
fi
[[ -n "$MAX_PARALLEL" ]] && array+="%$MAX_PARALLEL"

# Resources of one point: one rank per GPU, whole nodes of GPUS_PER_NODE when a point needs more than one;
# CPU points on NODES_PER_POINT nodes (default 1), the same number of ranks on each.
ranks=${RANKS_PER_POINT:-$(( GPUS_PER_POINT > 0 ? GPUS_PER_POINT : 1 ))}
res=()
if (( GPUS_PER_POINT > 0 )); then
    [[ -z "$NODES_PER_POINT" ]] || die "NODES_PER_POINT is for CPU points; GPU points take GPUS_PER_POINT / GPUS_PER_NODE nodes"
    if (( GPUS_PER_POINT <= GPUS_PER_NODE )); then
        res+=(--nodes=1 "--ntasks-per-node=$ranks" "--gpus-per-node=$GPUS_PER_POINT")
    else
        (( GPUS_PER_POINT % GPUS_PER_NODE == 0 )) || die "GPUS_PER_POINT=$GPUS_PER_POINT is not a multiple of GPUS_PER_NODE=$GPUS_PER_NODE"
        res+=("--nodes=$((GPUS_PER_POINT / GPUS_PER_NODE))" "--ntasks-per-node=$GPUS_PER_NODE" "--gpus-per-node=$GPUS_PER_NODE")
    fi
elif [[ -n "$NODES_PER_POINT" ]]; then
    [[ "$NODES_PER_POINT" =~ ^[1-9][0-9]*$ ]] && (( ranks % NODES_PER_POINT == 0 )) \
        || die "NODES_PER_POINT=$NODES_PER_POINT must be a whole number of nodes that divides the $ranks rank(s) of a point"
    res+=("--nodes=$NODES_PER_POINT" "--ntasks-per-node=$((ranks / NODES_PER_POINT))")
else
    res+=(--nodes=1 "--ntasks=$ranks")
fi
res+=("--cpus-per-task=$CPUS_PER_TASK")
[[ -n "$MEM_PER_POINT" ]] && res+=("--mem=$MEM_PER_POINT")
mapfile -t site < <(site_sbatch_args)
# Inside the submit job, its own SLURM_* variables (task counts, memory, ...) would leak into the jobs it
# submits and confuse their srun; keep only the cluster's address.
if [[ -n "${SLURM_JOB_ID:-}" ]]; then
    for v in $(compgen -e | grep '^SLURM_'); do
        [[ "$v" == SLURM_CONF ]] || unset "$v"
    done
fi

export SWEEP_DIR  # sweep_point.sbatch reads its point's log there
array_out=$(sbatch --parsable "${site[@]}" "${res[@]}" --array="$array" --job-name="$name" \
    --time="$POINT_TIME" --signal="B:USR1@$POINT_SIGNAL_S" --requeue --open-mode=append \
    --output="$LOG_DIR/p%a-%A.out" \
    "$REPO_DIR/slurm/sweep_point.sbatch" "$YAML" "$@") \
    || { rmdir "$LOG_DIR" "$SWEEP_DIR" 2>/dev/null; die "sbatch of the point array failed"; }
array_id=${array_out%%;*}

summary_out=$(sbatch --parsable "${site[@]}" --dependency="afterany:$array_id" \
    --job-name="$name-summary" --nodes=1 --ntasks=1 --cpus-per-task=1 --time="$SUMMARY_TIME" \
    --output="$LOG_DIR/summary-%j.out" \
    "$REPO_DIR/slurm/summarize.sbatch" "$YAML" "$SWEEP_DIR" "$@") || die "sbatch of the summary job failed"
summary_id=${summary_out%%;*}

printf 'ARRAY_JOB=%s\nSUMMARY_JOB=%s\nPOINTS=%s\nSWEEP_DIR=%s\n' "$array_id" "$summary_id" "$n" "$SWEEP_DIR" \
    | tee "$LOG_DIR/jobs-$array_id.txt"
echo "sweep $name: $n point(s) as array job $array_id ($array), summary job $summary_id; logs in $LOG_DIR" >&2
