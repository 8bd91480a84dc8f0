#!/usr/bin/env bash
# A private Slurm cluster on this machine, for the integration tests: one node, or several.
#
#   tests/slurm_cluster.sh start DIR [NODES]
#                                      installs Slurm + munge if missing (apt), starts munged, slurmctld and
#                                      slurmd with all their state, logs and sockets under DIR, waits until
#                                      every node is idle, and prints the line `SLURM_CONF=DIR/slurm.conf`
#   tests/slurm_cluster.sh stop DIR    cancels the cluster's jobs and stops every daemon `start` started
#   tests/slurm_cluster.sh logs DIR    prints the tails of the daemons' logs
#
# NODES (default 1) > 1 makes nodes n1..nNODES, each a slurmd of its own (`slurmd -N nI`, its own port,
# spool folder, pid file and log) with this machine's cores, all reached at 127.0.0.1: Slurm places tasks,
# steps and signals per node as on a real cluster, while the processes share one machine. Each slurmd runs
# in a UTS namespace of its own whose hostname is the node's name, so that what its tasks start sees
# nI as its host: OpenMPI then keeps each node's shared-memory segments apart (they are named by host and
# local rank) and talks TCP between nodes. (Debian's Slurm is built without --enable-multiple-slurmd,
# which also forbids two nodes with the same NodeHostname; each node's NodeHostname is its name.)
#
# Clients (sbatch, squeue, srun, ...) reach this cluster through SLURM_CONF=DIR/slurm.conf; nothing under
# /etc is written and the system's own munged (if any) is left alone: this munged has its own key and socket.
# Exit status of `start`: 0 running, 1 failed (logs printed), 77 Slurm cannot be installed here (no apt, not root)
# or, for NODES > 1, no UTS namespace can be made here (`unshare --uts`).
# Settings (environment): SLURM_TEST_CPUS (default: the cores of this machine), SLURM_TEST_PORT (slurmctld port; slurmd uses +1;
# default: two free ports), SLURM_TEST_START_TIMEOUT (seconds to wait for an idle node, default 120).
set -u

cmd=${1:-}
D=${2:-}
NODES=${3:-1}
if [[ -z "$cmd" || -z "$D" || ! "$NODES" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 start DIR [NODES] | stop DIR | logs DIR" >&2
    exit 2
fi
mkdir -p "$D"
D=$(cd "$D" && pwd)
CONF=$D/slurm.conf
export SLURM_CONF=$CONF

log_tails() {
    local f
    for f in "$D"/munge/munged.log "$D"/slurmctld.log "$D"/slurmd*.log; do
        [[ -f "$f" ]] && { echo "----- $f (last 40 lines)"; tail -n 40 "$f"; }
    done
}

# The pids this script started, one per line, in start order.
started_pids() { [[ -f "$D/pids" ]] && cat "$D/pids"; }

stop_pid() {
    local pid=$1
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null
}

stop_cluster() {
    if [[ -f "$CONF" ]] && command -v scancel >/dev/null; then
        scancel --user="$(id -un)" 2>/dev/null
        # Give the steps a moment to end cleanly before slurmd goes away.
        for _ in $(seq 1 30); do
            [[ -z "$(squeue -h -t running,completing 2>/dev/null)" ]] && break
            sleep 0.5
        done
    fi
    # Stop in reverse start order: slurmd, slurmctld, munged.
    local pids
    pids=$(started_pids | tac)
    for pid in $pids; do stop_pid "$pid"; done
    # slurmstepd daemons of this cluster's jobs outlive slurmd when a job was still ending.
    local p
    for p in $(pgrep -x slurmstepd 2>/dev/null); do
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_CONF=$CONF"; then
            stop_pid "$p"
        fi
    done
    rm -f "$D/pids"
}

install_slurm() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "slurm_cluster: Slurm is not installed and cannot be installed here (needs root and apt-get)" >&2
        return 77
    fi
    echo "slurm_cluster: installing slurm-wlm and munge with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -q slurm-wlm munge; } > "$D/apt.log" 2>&1; then
        tail -n 20 "$D/apt.log" >&2
        echo "slurm_cluster: apt-get install slurm-wlm munge failed" >&2
        return 77
    fi
}

free_ports() {  # free_ports N: the first of N consecutive free ports
    python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
step = 2 * ((n + 1) // 2)
start = random.randrange(20000, 40000, step)  # concurrent test sessions rarely pick the same ports
for p in list(range(start, 40000, step)) + list(range(20000, start, step)):
    ok = True
    for q in range(p, p + n):
        s = socket.socket()
        try:
            s.bind(("", q))
        except OSError:
            ok = False
        finally:
            s.close()
    if ok:
        print(p)
        break
EOF
}

write_conf() {
    local host cpus port mpi nodes i
    host=$(hostname -s)
    # (nproc counts OMP_NUM_THREADS as the cores there are: a suite run with OMP_NUM_THREADS=1 would make a
    # node of one CPU, where a point of 2 ranks waits for ever)
    cpus=${SLURM_TEST_CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
    port=${SLURM_TEST_PORT:-$(free_ports $((NODES + 1)))}
    # PMIx lets srun start OpenMPI ranks directly; fall back to none when the plugin is absent.
    mpi=none
    # (srun --mpi=list would wait for a controller, so look for the plugin file instead.)
    compgen -G "/usr/lib/*/slurm-wlm/mpi_pmix.so" >/dev/null || compgen -G "/usr/lib*/slurm/mpi_pmix.so" >/dev/null \
        && mpi=pmix
    mkdir -p "$D/state" "$D/spool" "$D/tmp"
    # TmpFS is where srun's PMIx plugin makes each step's folder (named by job and step id only): under DIR,
    # so that neither two clusters on this machine nor two nodes of this one share them.
    if (( NODES == 1 )); then
        nodes="SlurmdPort=$((port + 1))
TmpFS=$D/tmp
SlurmdSpoolDir=$D/spool
SlurmdPidFile=$D/slurmd.pid
SlurmdLogFile=$D/slurmd.log
NodeName=$host CPUs=$cpus State=UNKNOWN"
    else
        # %n: the node's name, so that every slurmd has its own spool folder, pid file and log.
        nodes="TmpFS=$D/tmp/%n
SlurmdSpoolDir=$D/spool/%n
SlurmdPidFile=$D/slurmd-%n.pid
SlurmdLogFile=$D/slurmd-%n.log"
        for ((i = 1; i <= NODES; i++)); do
            mkdir -p "$D/spool/n$i" "$D/tmp/n$i"
            nodes+="
NodeName=n$i NodeHostname=n$i NodeAddr=127.0.0.1 Port=$((port + i)) CPUs=$cpus State=UNKNOWN"
        done
    fi
    cat > "$CONF" <<EOF
# Generated by tests/slurm_cluster.sh: a test cluster of $NODES node(s) on $host.
ClusterName=testcluster
SlurmctldHost=$host
SlurmctldPort=$port
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$D/munge/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmctldPidFile=$D/slurmctld.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=$mpi
JobRequeue=1
MinJobAge=600
KillWait=10
SchedulerParameters=sched_interval=2
$nodes
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start_daemon() {  # start_daemon NAME CMD...: runs CMD in the background, records its pid
    local name=$1
    shift
    setsid "$@" > "$D/$name.out" 2>&1 < /dev/null &
    echo $! >> "$D/pids"
}

# "NAME STATE" for every node, one a line.
node_states() { sinfo -h -N -o '%N %t' 2>/dev/null; }

start_cluster() {
    install_slurm || return $?
    if (( NODES > 1 )) && ! unshare --uts true 2>/dev/null; then
        echo "slurm_cluster: $NODES nodes need a hostname each, and \`unshare --uts\` fails here (needs root)" >&2
        return 77
    fi
    [[ -n "$(started_pids)" ]] && stop_cluster
    : > "$D/pids"
    write_conf

    # munged: own key and socket, run as the munge user (it refuses to run as root).
    local muser=munge
    id "$muser" >/dev/null 2>&1 || muser=root
    mkdir -p "$D/munge"
    if [[ ! -f "$D/munge/munge.key" ]]; then
        dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
    fi
    chown -R "$muser" "$D/munge"
    chmod 755 "$D/munge"
    chmod 600 "$D/munge/munge.key"
    local force=()
    [[ "$muser" == root ]] && force=(--force)
    start_daemon munged runuser -u "$muser" -- /usr/sbin/munged --foreground "${force[@]}" \
        --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" --log-file="$D/munge/munged.log" \
        --pid-file="$D/munge/munged.pid" --seed-file="$D/munge/munged.seed"
    for _ in $(seq 1 50); do
        [[ -S "$D/munge/munge.socket" ]] && break
        sleep 0.2
    done
    if ! [[ -S "$D/munge/munge.socket" ]] \
        || ! timeout 10 munge -S "$D/munge/munge.socket" -n | timeout 10 unmunge -S "$D/munge/munge.socket" >/dev/null 2>&1; then
        echo "slurm_cluster: munged did not start" >&2
        cat "$D/munged.out" "$D/munge/munged.log" 2>/dev/null | tail -n 20 >&2
        stop_cluster
        return 1
    fi

    start_daemon slurmctld /usr/sbin/slurmctld -D -i -f "$CONF"
    local i
    if (( NODES == 1 )); then
        start_daemon slurmd /usr/sbin/slurmd -D -f "$CONF"
    else
        for ((i = 1; i <= NODES; i++)); do
            # shellcheck disable=SC2016
            start_daemon "slurmd-n$i" unshare --uts sh -c 'hostname "$1" && exec /usr/sbin/slurmd -D -N "$1" -f "$2"' \
                sh "n$i" "$CONF"
        done
    fi

    local timeout=${SLURM_TEST_START_TIMEOUT:-120} t0=$SECONDS st="" name state idle
    while (( SECONDS - t0 < timeout )); do
        st=$(node_states)
        idle=0
        while read -r name state; do
            case "$state" in
                idle) idle=$((idle + 1)) ;;
                down*|drain*|fail*) scontrol update nodename="$name" state=resume >/dev/null 2>&1 ;;
            esac
        done <<< "$st"
        if (( idle == NODES )); then echo "SLURM_CONF=$CONF"; return 0; fi
        for pid in $(started_pids); do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "slurm_cluster: a daemon (pid $pid) exited during start" >&2
                break 2
            fi
        done
        sleep 1
    done
    echo "slurm_cluster: nodes not idle after $((SECONDS - t0)) s (states: '${st//$'\n'/, }')" >&2
    sinfo -N -l >&2 2>&1
    for f in "$D"/*.out; do echo "----- $f" >&2; tail -n 20 "$f" >&2; done
    log_tails >&2
    stop_cluster
    return 1
}

case "$cmd" in
    start) start_cluster ;;
    stop) stop_cluster ;;
    logs) log_tails ;;
    *) echo "usage: $0 start DIR [NODES] | stop DIR | logs DIR" >&2; exit 2 ;;
esac
