#!/bin/bash
# Submits a sweep as a Slurm job array (one task per point) plus a summary job that runs after all of them.
#
#   sbatch slurm/sweep.sh experiments/zero.yaml [--set key=value ...]    from a tiny batch job
#   bash slurm/sweep.sh experiments/zero.yaml [--set key=value ...]      directly from the login node
#
# Both do the same: count the points with `./train --yaml YAML --list`, check that the nodes (sinfo) can
# hold a point and plan every point with `./train --dry-run` (nothing is submitted when either fails), submit
# slurm/sweep_point.sbatch as `--array` over them, then slurm/summarize.sbatch with
# `--dependency=afterany:<array>` (summary.{h5,csv} and, where matplotlib is importable, the plots). Extra
# arguments go to every ./train call. A YAML without a sweep: section is a single run: slurm/train.sh.
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

# The partitions the points go to: SBATCH_PARTITION, else a -p/--partition of EXTRA_SBATCH_ARGS, else "" (the
# cluster's default partition). Slurm takes a comma-separated list.
point_partition() {
    local p=${SBATCH_PARTITION:-} prev="" a
    # shellcheck disable=SC2086
    for a in $EXTRA_SBATCH_ARGS; do
        case "$a" in
            --partition=*) p=${a#--partition=} ;;
            -p?*) p=${a#-p} ;;
            *) [[ "$prev" == -p || "$prev" == --partition ]] && p=$a ;;
        esac
        prev=$a
    done
    echo "$p"
}

# check_nodes_fit NODES TASKS GPUS: exits 1, saying which setting to change, unless the partition has NODES
# nodes of at least TASKS x CPUS_PER_TASK CPUs and GPUS GPUs (sinfo: CPUs and GRES per node). Slurm itself
# would refuse a point's GPUs with a gres error naming no setting, and leave a point wanting more CPUs
# than any node has pending for ever.
check_nodes_fit() {
    local want_nodes=$1 tasks=$2 want_gpus=$3 want_cpus=$(( $2 * CPUS_PER_TASK )) part where table max_cpus max_gpus fit
    part=$(point_partition)
    where=${part:+partition $part}
    where=${where:-the default partition}
    command -v sinfo >/dev/null || { echo "sweep.sh: warning: no sinfo here: the points' request is not checked against the nodes" >&2; return 0; }
    # "NODE CPUS GPUS", once per node of those partitions; GPUs summed over GRES entries such as
    # gpu:8, gpu:h100:4(S:0-1) and gpu:a100:2,gpu:v100:2; a partition name ending in * is the default.
    table=$(sinfo -h -N -o '%N %P %c %G' 2>&1) || { echo "sweep.sh: warning: sinfo failed ($table): the points' request is not checked against the nodes" >&2; return 0; }
    table=$(awk -v want="$part" '
        function gpus(g,   n, i, e, k, f, c) {
            gsub(/\([^)]*\)/, "", g)
            n = split(g, e, ",")
            for (i = 1; i <= n; i++) {
                if (e[i] !~ /^gpu(:|$)/) continue
                k = split(e[i], f, ":")
                c += (k > 1 && f[k] ~ /^[0-9]+$/) ? f[k] : 1
            }
            return c + 0
        }
        {
            p = $2
            is_default = sub(/\*$/, "", p)
            if ((want == "" ? is_default : index("," want ",", "," p ",") > 0) && !seen[$1]++)
                print $1, $3 + 0, gpus($4)
        }' <<< "$table")
    [[ -n "$table" ]] || die "sinfo lists no nodes in $where: set SBATCH_PARTITION to a partition that sinfo shows (nothing submitted)"
    read -r max_cpus max_gpus fit < <(awk -v c="$want_cpus" -v g="$want_gpus" '
        { if ($2 > mc) mc = $2; if ($3 > mg) mg = $3; if ($2 >= c && $3 >= g) fit++ }
        END { print mc + 0, mg + 0, fit + 0 }' <<< "$table")
    (( fit >= want_nodes )) && return 0
    if (( want_gpus > 0 && max_gpus == 0 )); then
        die "a point asks for $want_gpus GPU(s) per node (GPUS_PER_POINT=$GPUS_PER_POINT), but no node of $where has GPUs (sinfo shows no gpu GRES): set GPUS_PER_POINT=0 to run the points on CPUs, or SBATCH_PARTITION to a GPU partition (nothing submitted)"
    fi
    if (( want_gpus > max_gpus )); then
        die "a point asks for $want_gpus GPUs on one node, but the nodes of $where have at most $max_gpus: set GPUS_PER_NODE=$max_gpus (a point then spans nodes) or a smaller GPUS_PER_POINT (nothing submitted)"
    fi
    if (( want_cpus > max_cpus )); then
        local hint="set CPUS_PER_TASK=$(( max_cpus / tasks ))"
        (( max_cpus / tasks >= 1 )) || hint="at most $max_cpus rank(s) fit a node at CPUS_PER_TASK=1: lower RANKS_PER_POINT, or spread the ranks over nodes with NODES_PER_POINT"
        die "a point asks for $want_cpus CPUs on one node ($tasks rank(s) x CPUS_PER_TASK=$CPUS_PER_TASK), but the nodes of $where have at most $max_cpus: $hint (nothing submitted)"
    fi
    local gpu_text=""
    (( want_gpus > 0 )) && gpu_text=" and $want_gpus GPU(s)"
    die "a point needs $want_nodes node(s) with $want_cpus CPUs$gpu_text each, but $where has $fit such node(s): use fewer nodes per point (NODES_PER_POINT, GPUS_PER_POINT) or smaller ones (nothing submitted)"
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
# --list gives a sweep's points with their values, and a single run as one line with none: that is no sweep
# (no array, nothing to summarize); slurm/train.sh runs it, and requeues it as a sweep point would be.
if (( n == 1 )) && awk -F'\t' '$1 ~ /^[0-9]+$/ && $3 == "" {found = 1} END {exit !found}' <<< "$list"; then
    die "$YAML has no sweep: section, so it is a single run: submit it with \`sbatch slurm/train.sh $YAML\` (nothing submitted)"
fi

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
nodes=1 tasks_per_node=$ranks gpus_per_node=0
if (( GPUS_PER_POINT > 0 )); then
    [[ -z "$NODES_PER_POINT" ]] || die "NODES_PER_POINT is for CPU points; GPU points take GPUS_PER_POINT / GPUS_PER_NODE nodes"
    if (( GPUS_PER_POINT <= GPUS_PER_NODE )); then
        gpus_per_node=$GPUS_PER_POINT
        res+=(--nodes=1 "--ntasks-per-node=$ranks" "--gpus-per-node=$GPUS_PER_POINT")
    else
        (( GPUS_PER_POINT % GPUS_PER_NODE == 0 )) || die "GPUS_PER_POINT=$GPUS_PER_POINT is not a multiple of GPUS_PER_NODE=$GPUS_PER_NODE"
        nodes=$((GPUS_PER_POINT / GPUS_PER_NODE)) tasks_per_node=$GPUS_PER_NODE gpus_per_node=$GPUS_PER_NODE
        res+=("--nodes=$nodes" "--ntasks-per-node=$GPUS_PER_NODE" "--gpus-per-node=$GPUS_PER_NODE")
    fi
elif [[ -n "$NODES_PER_POINT" ]]; then
    [[ "$NODES_PER_POINT" =~ ^[1-9][0-9]*$ ]] && (( ranks % NODES_PER_POINT == 0 )) \
        || die "NODES_PER_POINT=$NODES_PER_POINT must be a whole number of nodes that divides the $ranks rank(s) of a point"
    nodes=$NODES_PER_POINT tasks_per_node=$((ranks / NODES_PER_POINT))
    res+=("--nodes=$NODES_PER_POINT" "--ntasks-per-node=$tasks_per_node")
else
    res+=(--nodes=1 "--ntasks=$ranks")
fi
res+=("--cpus-per-task=$CPUS_PER_TASK")
[[ -n "$MEM_PER_POINT" ]] && res+=("--mem=$MEM_PER_POINT")
check_nodes_fit "$nodes" "$tasks_per_node" "$gpus_per_node"

# Every point planned for its rank count (world size from srun's variables, as in a point's job): its config
# validated and the files it reads checked, so that a bad point is refused now rather than failing in the
# array. The launcher variables of a submit job (1 task) or of an mpirun around this script are left out.
plan_err=$(env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE \
    SLURM_PROCID=0 SLURM_STEP_NUM_TASKS="$((nodes * tasks_per_node))" \
    "$TRAIN_BIN" --yaml "$YAML" --dry-run "$@" 2>&1 >/dev/null) \
    || die "the dry run of every point on $((nodes * tasks_per_node)) rank(s) refused the sweep (nothing submitted): $TRAIN_BIN --yaml $YAML --dry-run${*:+ $*} says
$plan_err"

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
