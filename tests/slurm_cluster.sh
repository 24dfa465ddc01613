#!/usr/bin/env bash
# slurm_cluster.sh - a one-node Slurm cluster on localhost for the tests
# (munged, slurmctld, slurmd), everything under one directory.
#
#   tests/slurm_cluster.sh start DIR   # prints SLURM_CONF=DIR/slurm.conf on success
#   tests/slurm_cluster.sh stop DIR    # stops the daemons it started (by their pid files)
#   tests/slurm_cluster.sh kill-slurmd DIR   # SIGKILL slurmd (a node fault)
#   tests/slurm_cluster.sh forget DIR        # restart slurmctld with its job state cleared
#
# Needs root, Debian's slurmctld, slurmd, slurm-client and munge. What works
# in a container: proctrack/linuxproc, task/none, select/cons_tres, no GRES,
# jobcomp/filetxt for completions. Exit status 2 with a reason on stderr
# when the cluster cannot be started (the tests skip on it).
set -u
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop|kill-slurmd|forget DIR" >&2; exit 2; }

stop_pid() { # pid file
    [ -f "$1" ] || return 0
    local p
    p=$(cat "$1" 2>/dev/null)
    [ -n "$p" ] && kill "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
    rm -f "$1"
}

case "$cmd" in
stop)
    stop_pid "$dir/slurmd.pid"
    stop_pid "$dir/slurmctld.pid"
    stop_pid "$dir/munged.pid"
    exit 0
    ;;
kill-slurmd)
    p=$(cat "$dir/slurmd.pid" 2>/dev/null) && kill -9 "$p"
    rm -f "$dir/slurmd.pid"
    exit 0
    ;;
forget)
    stop_pid "$dir/slurmctld.pid"
    SLURM_CONF="$dir/slurm.conf" slurmctld -f "$dir/slurm.conf" -c -i 2>>"$dir/log/slurmctld.err" || exit 1
    for _ in $(seq 60); do
        SLURM_CONF="$dir/slurm.conf" sinfo -h >/dev/null 2>&1 && exit 0
        sleep 0.5
    done
    exit 1
    ;;
start) ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac

skip() { echo "slurm_cluster: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || skip "not root (slurmd runs jobs as other users only as root)"
for b in munged slurmctld slurmd sbatch squeue scontrol scancel; do
    command -v "$b" >/dev/null || skip "$b not installed (apt-get install slurmctld slurmd slurm-client munge)"
done

mkdir -p "$dir"/{spool,state,log}
dir=$(cd "$dir" && pwd)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ctl_port=$(free_port)
d_port=$(free_port)
node=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2/1024/2)}' /proc/meminfo)

# munge: a key of our own and a socket in DIR.
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2>/dev/null
chmod 0400 "$dir/munge.key"
munged --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge.seed" --force 2>"$dir/log/munged.err" ||
    skip "munged did not start: $(tail -3 "$dir/log/munged.err" "$dir/log/munged.log" 2>/dev/null | tr '\n' ' ')"

cat >"$dir/slurm.conf" <<EOF
ClusterName=actest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=600
MaxJobCount=10000
SchedulerParameters=sched_interval=1
${AC_SLURM_DEBUG:+SlurmctldDebug=$AC_SLURM_DEBUG}
${AC_SLURM_DEBUG:+SlurmdDebug=$AC_SLURM_DEBUG}
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$dir/slurm.conf" -i 2>"$dir/log/slurmctld.err" ||
    skip "slurmctld did not start: $(tail -3 "$dir/log/slurmctld.err" "$dir/log/slurmctld.log" | tr '\n' ' ')"
slurmd -f "$dir/slurm.conf" -N "$node" 2>"$dir/log/slurmd.err" ||
    skip "slurmd did not start: $(tail -3 "$dir/log/slurmd.err" "$dir/log/slurmd.log" | tr '\n' ' ')"
for _ in $(seq 60); do
    st=$(sinfo -h -N -o '%T' 2>/dev/null | head -1)
    case "$st" in idle*|mix*|alloc*) echo "SLURM_CONF=$dir/slurm.conf"; exit 0 ;; esac
    sleep 0.5
done
skip "the node did not become idle (state '${st:-none}'): $(tail -3 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" | tr '\n' ' ')"
