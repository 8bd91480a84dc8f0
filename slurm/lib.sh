# shellcheck shell=bash
# Shared by the Slurm scripts (sourced, not run): site settings and the signal-forwarding launcher.
#
# Site settings. Each one can be overridden from the environment of `sbatch` / `bash slurm/sweep.sh`
# (Slurm passes the submitting environment on to the job, so an override reaches every job it submits).
# Partition, account and QOS: use Slurm's own SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_QOS; sbatch reads
# them for every job, including those that sweep.sh submits.
: "${GPUS_PER_NODE:=8}"           # GPUs on one node of the partition
: "${GPUS_PER_POINT:=1}"          # GPUs (= MPI ranks) per sweep point; 0 runs a point on the CPU
: "${RANKS_PER_POINT:=}"          # ranks per sweep point (default: GPUS_PER_POINT, at least 1)
: "${NODES_PER_POINT:=}"          # nodes of a CPU sweep point (default 1; GPU points: GPUS_PER_POINT / GPUS_PER_NODE)
: "${CPUS_PER_TASK:=8}"           # CPU cores per rank
: "${MEM_PER_POINT:=}"            # --mem for a sweep point (empty: the partition's default)
: "${POINT_TIME:=04:00:00}"       # time limit of one sweep point
: "${POINT_SIGNAL_S:=300}"        # a point gets USR1 this many seconds before its time limit
: "${MAX_PARALLEL:=}"             # run at most this many sweep points at once (empty: no limit)
: "${SUMMARY_TIME:=00:30:00}"     # time limit of the summary job
: "${LAUNCHER:=srun}"             # srun | mpirun: what starts the ranks inside a job
: "${SRUN_MPI:=pmix}"             # srun --mpi= (what the site's MPI speaks: pmix, pmi2, ...)
: "${SRUN_ARGS:=}"                # extra srun arguments
: "${MPIRUN_ARGS:=}"              # extra mpirun arguments (e.g. --allow-run-as-root)
: "${MPIRUN_KILL_WAIT_S:=15}"     # mpirun: seconds from a TERM/INT it gets itself to the ranks' SIGTERM, and again to SIGKILL
: "${MODULES:=}"                  # environment modules to load in every job, space separated
: "${EXTRA_SBATCH_ARGS:=}"        # extra sbatch arguments for the jobs this code submits
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}   # NVLink SHARP multicast off (needs fabric manager support)

# REPO_DIR (the checkout holding ./train and slurm/) is set by the script that sources this file.
: "${TRAIN_BIN:=${REPO_DIR:?REPO_DIR must be set before sourcing lib.sh}/train}"
# the Python for summaries and plots: the checkout's environment (scripts/setup.sh made it), else python3
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x $REPO_DIR/.venv/bin/python3 ]] && PYTHON=$REPO_DIR/.venv/bin/python3
fi

log() { echo "[$(date '+%F %T')] ${SLURM_JOB_ID:+job $SLURM_JOB_ID: }$*" >&2; }

load_site() {
    if [[ -n "$MODULES" ]]; then
        if ! command -v module >/dev/null 2>&1; then  # batch shells do not always read the profile
            local f
            for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do
                # shellcheck disable=SC1090
                [[ -f "$f" ]] && source "$f" && break
            done
        fi
        # shellcheck disable=SC2086
        module load $MODULES || { log "module load $MODULES failed"; return 1; }
    fi
}

# Extra sbatch options for the jobs this code submits, one word a line.
site_sbatch_args() {
    local a=()
    # shellcheck disable=SC2206
    [[ -n "$EXTRA_SBATCH_ARGS" ]] && a+=($EXTRA_SBATCH_ARGS)
    (( ${#a[@]} == 0 )) || printf '%s\n' "${a[@]}"
}

# The command that starts the ranks of this job (one per task of the allocation), as words.
launcher_cmd() {
    case "$LAUNCHER" in
        srun)
            local a=(srun "--mpi=$SRUN_MPI" --kill-on-bad-exit=1)
            # srun of Slurm 22.05-23.02 does not inherit --cpus-per-task from the batch job; pass it on.
            [[ -n "${SLURM_CPUS_PER_TASK:-}" ]] && a+=("--cpus-per-task=$SLURM_CPUS_PER_TASK")
            # shellcheck disable=SC2206
            [[ -n "$SRUN_ARGS" ]] && a+=($SRUN_ARGS)
            printf '%s\n' "${a[@]}"
            ;;
        mpirun)
            # OpenMPI's mpirun reads the Slurm allocation: one rank per task, spread over the nodes. It starts
            # its daemons on the other nodes with srun, which passes them this environment; -x names what the
            # ranks must see wherever mpirun starts them some other way (ssh): threads and every NCCL_* setting.
            local a=(mpirun -np "${SLURM_NTASKS:-1}" -x OMP_NUM_THREADS) v
            for v in $(compgen -e | grep '^NCCL_'); do a+=(-x "$v"); done
            # shellcheck disable=SC2206
            [[ -n "$MPIRUN_ARGS" ]] && a+=($MPIRUN_ARGS)
            printf '%s\n' "${a[@]}"
            ;;
        *) log "LAUNCHER must be srun or mpirun, not '$LAUNCHER'"; return 1 ;;
    esac
}

# run_forwarding CMD...: runs CMD in the background and waits for it; a USR1, TERM or INT that reaches this
# shell (sbatch --signal=B:USR1@T, `scancel --batch --signal=USR1`, preemption) is passed on to CMD as USR1,
# which srun and mpirun forward to every rank: each finishes its step, checkpoints and exits 75, and so
# does the launcher. USR1, not the TERM or INT that came: OpenMPI's mpirun takes those as an order to abort,
# exits 1 whatever the ranks do, and passes the ranks SIGTERM only to SIGKILL them soon after
# (docs/FORMATS.md, "Exit status"). Returns CMD's exit status.
run_forwarding() {
    local pid="" rc rc2 sig resender=""
    STOP_SIGNAL=""
    # The traps go in before CMD starts: a signal that found none would end this shell (or, an INT while it
    # waits for a command, be dropped) and the run would go on. One that comes before $pid is set waits for it.
    for sig in USR1 TERM INT; do
        # shellcheck disable=SC2064
        trap "forward_stop $sig" "$sig"
        # bash cannot trap a signal that was ignored when it started (SIGINT in a background job of a shell
        # without job control), and says nothing: say it here.
        [[ $(trap -p "$sig") == *forward_stop* ]] ||
            log "warning: SIG$sig was ignored when this shell started: it cannot be trapped, and will not stop the run"
    done
    "$@" &
    pid=$!
    if [[ -n "$STOP_SIGNAL" ]]; then
        # The signal came while CMD was being started. A USR1 sent at once is mostly lost: until it execs, CMD
        # is a fork of this shell and has its traps. mpirun also drops one that comes before it has started the
        # ranks. So send it now and again for a while (a rank it reaches before its handler dies of it: 138).
        # No output: a sleep it leaves behind holds no pipe of the job's.
        (for s in 0 0.1 0.2 0.4 0.8 1.6 3.2 6.4; do
            sleep "$s"
            kill -USR1 "$pid" 2>/dev/null || exit 0
        done) >/dev/null 2>&1 &
        resender=$!
    fi
    while :; do
        wait "$pid"
        rc=$?
        # A trap interrupts `wait` with a status above 128 while CMD still runs: keep waiting.
        if (( rc > 128 )) && kill -0 "$pid" 2>/dev/null; then continue; fi
        # CMD ended while the trap ran: its own status is still on record for a second `wait`.
        if (( rc > 128 )); then
            wait "$pid" 2>/dev/null
            rc2=$?
            (( rc2 != 127 )) && rc=$rc2
        fi
        break
    done
    if [[ -n "$resender" ]]; then
        kill "$resender" 2>/dev/null
        wait "$resender" 2>/dev/null
    fi
    trap - USR1 TERM INT
    return "$rc"
}

# The trap of run_forwarding for SIG$1: notes it, and passes it on as USR1 once CMD has been started
# ($pid: run_forwarding's own, empty until then).
forward_stop() {
    STOP_SIGNAL=$1
    log "got SIG$1: asking the run to checkpoint"
    if [[ -n "${pid:-}" ]]; then kill -USR1 "$pid" 2>/dev/null; fi
}

# run_train ARGS...: runs ./train ARGS on the job's ranks with signal forwarding; 75 (checkpointed) after a
# USR1 requeues the job so it continues later with --resume. A forwarded signal can also reach a rank before
# it has installed its handler (Slurm may send the time-limit warning up to 60 s early, so just as the job
# starts); it then dies of it, status 128 + 10. That is during start-up, before any step: the latest
# checkpoint stands, and the run is stopped as if it had exited 75. Returns 0 when the run finished or
# stopped, else its status.
run_train() {
    local launch rc
    [[ "$LAUNCHER" == srun || "$LAUNCHER" == mpirun ]] || { log "LAUNCHER must be srun or mpirun, not '$LAUNCHER'"; return 1; }
    # One OpenMP thread per allocated core of a rank, unless set by hand.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    # A TERM that Slurm sends every process of the job (scancel, preemption) also reaches mpirun itself: it
    # then SIGTERMs the ranks after odls_base_sigkill_timeout seconds and SIGKILLs them as long again later,
    # 1 s by default, too short for a checkpoint. The price: mpirun waits as long after any rank exits
    # non-zero (75 too) before it ends. (Set in the environment: another MPI ignores it.)
    if [[ "$LAUNCHER" == mpirun ]]; then
        export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-$MPIRUN_KILL_WAIT_S}
    fi
    mapfile -t launch < <(launcher_cmd)
    log "running: ${launch[*]} $TRAIN_BIN $*"
    run_forwarding "${launch[@]}" "$TRAIN_BIN" "$@"
    rc=$?
    log "train exited $rc${STOP_SIGNAL:+ (after SIG$STOP_SIGNAL)}"
    if (( rc == 1 )) && [[ "$LAUNCHER" == mpirun && ( "$STOP_SIGNAL" == TERM || "$STOP_SIGNAL" == INT ) ]]; then
        log "mpirun exits 1 after a SIG$STOP_SIGNAL that reached it too, even when the ranks checkpointed: the run's log.h5 status says how it ended"
    fi
    local stopped="checkpointed"
    if (( rc == 138 )) && [[ -n "$STOP_SIGNAL" ]]; then
        stopped="stopped while starting, before any step (the latest checkpoint stands)"
        rc=75
    fi
    if (( rc == 75 )); then
        # USR1 (the time-limit warning, or sent by hand) means "continue later": requeue. TERM/INT mean the job
        # is being cancelled, killed at its limit, preempted or ended by a failed node: requeueing would undo
        # a scancel, and Slurm requeues a --requeue job by itself after a node failure or a preemption with
        # PreemptMode=REQUEUE.
        if [[ "$STOP_SIGNAL" == TERM || "$STOP_SIGNAL" == INT ]]; then
            log "$stopped after SIG$STOP_SIGNAL: not requeued by this script (resubmit to resume, unless Slurm requeues the job after a node failure or preemption)"
        else
            # Said first: a successful requeue cancels this job at once, often before this shell runs on.
            log "$stopped; job requeued, it will resume from the checkpoint"
            scontrol requeue "$SLURM_JOB_ID" ||
                log "scontrol requeue failed: the job was not requeued; resubmit it to resume"
        fi
        return 0
    fi
    return "$rc"
}
