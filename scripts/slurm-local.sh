#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for trying and testing sweeps against the
# real sbatch, squeue and scontrol: munged, slurmctld and slurmd from Debian's slurm-wlm and
# munge packages (installed with apt-get when missing), with the configuration, state, logs
# and pid files under DIR.
#
#   eval "$(scripts/slurm-local.sh /tmp/slurm | tail -1)"   # start (or reuse) the cluster
#   sbatch --array=0-3 --wrap 'echo task $SLURM_ARRAY_TASK_ID' -o '/tmp/t-%a.out'
#   scripts/slurm-local.sh --stop /tmp/slurm                # stop it (scontrol shutdown)
#
# The node is `hostname -s` with `nproc` CPUs in one partition, `debug`. Cgroups are not
# used (proctrack/linuxproc, task/none) and accounting is off, so `sacct` is unavailable:
# use squeue and the jobs' own files. The daemons run as root (through sudo when the caller
# is not root). The controller and node ports are the first free pair from 6817, so the
# cluster starts beside another one. The last line on stdout is always the
# `export SLURM_CONF=...` line; progress and errors go to stderr.
#
# Environment: SLURM_LOCAL_TIMEOUT, the seconds to wait for the node to be idle (default 60).
set -euo pipefail

usage() {
    echo "usage: $0 DIR | --stop DIR" >&2
    exit 2
}

die() {
    echo "slurm-local: error: $*" >&2
    exit 1
}

log() {
    echo "slurm-local: $*" >&2
}

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

# The absolute form of a directory path, for slurm.conf.
absolute_dir() {
    (cd -- "$1" && pwd -P) || die "cannot enter directory $1"
}

# Whether the daemon whose id is in pid file $1 runs: a live process (not a zombie) named
# after the file (slurmctld.pid: slurmctld), so a stale file whose id was reused is not it.
pid_alive() {
    local pid name name_seen stat
    [ -f "$1" ] || return 1
    pid=$(cat -- "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] || return 1
    name=$(basename -- "$1" .pid)
    read -r name_seen stat < <(ps -o comm=,stat= -p "$pid" 2>/dev/null) || return 1
    [ "$name_seen" = "$name" ] && [ "${stat#Z}" = "$stat" ]
}

# Whether something listens on TCP port $1 on this machine.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Shows the end of the daemons' logs on stderr, for an error message.
show_logs() {
    local file
    for file in "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" /var/log/munge/munged.log; do
        if [ -f "$file" ]; then
            echo "---- last lines of $file" >&2
            $SUDO tail -n 30 -- "$file" >&2 || true
        fi
    done
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null ||
        die "slurmctld, slurmd, sbatch or munged is missing and apt-get is not available: install Slurm (slurm-wlm) and munge"
    log "apt-get install slurm-wlm munge"
    {
        $SUDO apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq slurm-wlm munge
    } >&2 || die "apt-get install slurm-wlm munge failed"
}

# Starts munged (Slurm's authentication) unless one already runs: one serves every cluster.
start_munged() {
    if pgrep -x munged >/dev/null; then
        return
    fi
    if ! $SUDO test -f /etc/munge/munge.key; then
        log "creating /etc/munge/munge.key"
        $SUDO mungekey --create >&2 || die "cannot create /etc/munge/munge.key (mungekey --create)"
        $SUDO chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    fi
    $SUDO mkdir -p /run/munge
    $SUDO chown munge:munge /run/munge 2>/dev/null || true
    log "starting munged"
    # munged runs as the munge user when it can; as root it needs --force.
    if ! $SUDO su -s /bin/sh munge -c /usr/sbin/munged 2>/dev/null; then
        $SUDO /usr/sbin/munged --force >&2 ||
            die "munged did not start (see /var/log/munge/munged.log)"
    fi
}

# The first pair of free ports (controller, node) from 6817 upward.
pick_ports() {
    local port=6817
    while port_in_use "$port" || port_in_use "$((port + 1))"; do
        port=$((port + 2))
        [ "$port" -lt 7817 ] || die "no free pair of TCP ports between 6817 and 7817"
    done
    CTLD_PORT=$port
    SLURMD_PORT=$((port + 1))
}

write_conf() {
    local host cpus mem_mib
    host=$(hostname -s)
    cpus=$(nproc)
    # All memory but 1 GiB is the node's to give (at least 1 MiB).
    mem_mib=$(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024))
    [ "$mem_mib" -ge 1 ] || mem_mib=1
    pick_ports
    cat >"$CONF" <<CONF
# A one-node cluster written by scripts/slurm-local.sh; state, logs and pids beside it.
ClusterName=local
SlurmctldHost=$host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    log "wrote $CONF (ports $CTLD_PORT, $SLURMD_PORT)"
}

# Starts slurmctld and slurmd unless they run (from this DIR's pid files).
start_daemons() {
    if pid_alive "$DIR/run/slurmctld.pid"; then
        log "slurmctld already runs (reusing the cluster in $DIR)"
    else
        log "starting slurmctld"
        $SUDO slurmctld -f "$CONF" >&2 || {
            show_logs
            die "slurmctld did not start"
        }
    fi
    if pid_alive "$DIR/run/slurmd.pid"; then
        log "slurmd already runs"
    else
        log "starting slurmd"
        $SUDO slurmd -f "$CONF" >&2 || {
            show_logs
            die "slurmd did not start"
        }
    fi
}

wait_idle() {
    local timeout=${SLURM_LOCAL_TIMEOUT:-60} waited=0 state=""
    while [ "$waited" -lt "$timeout" ]; do
        state=$(sinfo --noheader --format=%T 2>/dev/null | head -n 1 || true)
        case "$state" in
        idle* | mixed* | allocated*) return ;;
        esac
        sleep 1
        waited=$((waited + 1))
    done
    show_logs
    die "the node is not idle after ${timeout}s (state: '${state:-no answer from slurmctld}'); the daemons' logs are above"
}

stop_cluster() {
    [ -f "$CONF" ] || die "$CONF does not exist: no cluster was started in $DIR"
    if ! pid_alive "$DIR/run/slurmctld.pid" && ! pid_alive "$DIR/run/slurmd.pid"; then
        log "no daemon of the cluster in $DIR runs"
        return
    fi
    if pid_alive "$DIR/run/slurmctld.pid"; then
        $SUDO env SLURM_CONF="$CONF" scontrol shutdown >&2 || die "scontrol shutdown failed"
    fi
    local waited=0
    while pid_alive "$DIR/run/slurmctld.pid" || pid_alive "$DIR/run/slurmd.pid"; do
        # slurmd stops with slurmctld's shutdown; if the controller was already gone it
        # would not hear it, so it is told directly.
        if [ "$waited" -eq 5 ] && pid_alive "$DIR/run/slurmd.pid"; then
            $SUDO kill "$(cat -- "$DIR/run/slurmd.pid")" 2>/dev/null || true
        fi
        [ "$waited" -lt 30 ] || die "the daemons of $DIR still run 30s after scontrol shutdown"
        sleep 1
        waited=$((waited + 1))
    done
    log "stopped the cluster in $DIR"
}

STOP=0
case "${1:-}" in
--stop)
    STOP=1
    shift
    ;;
-h | --help) usage ;;
esac
[ $# -eq 1 ] && [ -n "$1" ] || usage
if [ "$STOP" -eq 0 ]; then
    mkdir -p -- "$1" || die "cannot create directory $1"
fi
[ -d "$1" ] || die "$1 is not a directory: no cluster was started there"
DIR=$(absolute_dir "$1")
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

if [ "$STOP" -eq 1 ]; then
    stop_cluster
    exit 0
fi

install_packages
mkdir -p "$DIR/spool" "$DIR/state" "$DIR/log" "$DIR/run"
if pid_alive "$DIR/run/slurmctld.pid" || pid_alive "$DIR/run/slurmd.pid"; then
    [ -f "$CONF" ] || die "daemons run from $DIR but $CONF is missing: stop them first"
else
    write_conf
fi
start_munged
start_daemons
wait_idle
sinfo >&2
printf 'export SLURM_CONF=%q\n' "$CONF"
