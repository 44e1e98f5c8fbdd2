#!/usr/bin/env bash
# Start a real single-host SLURM (munged, slurmctld, slurmd) without systemd, as root, for tests.
#
#   tests/slurm/start_slurm.sh [DIR]      DIR defaults to /var/tmp/sea-slurm
#
# Idempotent: installs the Debian packages if missing, writes DIR/etc/slurm.conf and the job
# prolog/epilog (each job gets SLURM_TMPDIR=DIR/jobtmp/job_<id>, its own tmpfs), starts what is not
# running yet (restarts SLURM if the configuration changed), waits until the node is idle. Its last
# line, also in DIR/env.sh, is `export SLURM_CONF=DIR/etc/slurm.conf`. Stop with stop_slurm.sh DIR.
# Knobs: JOB_TMPFS_SIZE (1g), SLURMCTLD_PORT (6817), SLURMD_PORT (6818), START_TIMEOUT (60 s).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd -P)
DIR=${1:-/var/tmp/sea-slurm}
JOB_TMPFS_SIZE=${JOB_TMPFS_SIZE:-1g}
SLURMCTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
START_TIMEOUT=${START_TIMEOUT:-60}
STARTED=0
log() { echo "[start_slurm] $*" >&2; }
die() {  # leave nothing running after a failed start (DIR keeps the logs)
    echo "[start_slurm] ERROR: $*" >&2
    if [ "$STARTED" = 1 ]; then "$HERE/stop_slurm.sh" --keep "$DIR" >&2; fi
    exit 1
}
# running and not a zombie (without systemd, PID 1 may reap orphans late)
alive() { local p; [ -s "$1" ] && p=$(cat "$1") && kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p" | cut -c1)" != Z ]; }
[ "$(id -u)" = 0 ] || die "must run as root (slurmd starts jobs as their user, munged runs as munge)"

# 1. packages (--no-install-recommends: 8 packages instead of ~40)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null || die "apt-get install failed"
fi

# 2. configuration
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd -P)
ETC=$DIR/etc CONF=$DIR/etc/slurm.conf NODE=$(hostname -s)
export SLURM_CONF=$CONF
mkdir -p "$ETC" "$DIR/pids" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/jobtmp"
chmod 0755 "$DIR" "$DIR/jobtmp"
for f in prolog.sh epilog.sh task_prolog.sh; do
    sed -e "s|@DIR@|$DIR|g" -e "s|@JOB_TMPFS_SIZE@|$JOB_TMPFS_SIZE|g" "$HERE/$f" > "$ETC/$f"
    chmod 0755 "$ETC/$f"
done
# the layout slurmd itself detects, else the node is drained ("configuration differs from hardware")
HW=$(slurmd -C | head -1 | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*') || die "slurmd -C: $(slurmd -C 2>&1 | head -3)"
# the suite's tests submit at once (worker jobs, slurm.md's array): declared CPUs beyond the machine's
# (config_overrides) let them start together instead of queueing behind each other; memory still bounds them
CPUS=$(( $(nproc) * 4 ))
HW="CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1"
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
TMP_MB=$(df -Pm "$DIR/jobtmp" | awk 'NR == 2 {print int($4 / 2)}')   # what --tmp= may ask for
cat > "$CONF.new" <<EOF
# written by start_slurm.sh
ClusterName=seatest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# no cgroups: linuxproc finds a job's processes by parentage
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=100000
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without it a job that gives no --mem takes the whole node's memory
DefMemPerCPU=1000
ReturnToService=2
MinJobAge=30
KillWait=5
SlurmdParameters=config_overrides
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# SLURM_TMPDIR: a tmpfs per job (Prolog mounts it, TaskProlog exports it, Epilog removes it)
PrologFlags=Alloc
Prolog=$ETC/prolog.sh
Epilog=$ETC/epilog.sh
TaskProlog=$ETC/task_prolog.sh
NodeName=$NODE NodeAddr=127.0.0.1 $HW RealMemory=$MEM_MB TmpDisk=$TMP_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
if cmp -s "$CONF.new" "$CONF"; then
    rm "$CONF.new"
else
    mv "$CONF.new" "$CONF"
    if alive "$DIR/pids/slurmctld" || alive "$DIR/pids/slurmd"; then
        log "configuration changed: restarting"
        "$HERE/stop_slurm.sh" --keep "$DIR"
    fi
fi
echo "export SLURM_CONF=$CONF" > "$DIR/env.sh"

# 3. munge: without systemd nobody makes /run/munge (its RuntimeDirectory)
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [ ! -s /etc/munge/munge.key ]; then
        install -d -o munge -g munge -m 0700 /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge /var/lib/munge /var/log/munge
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged   # daemonizes; pid in /run/munge/munged.pid
    touch "$DIR/munged.started-by-us"
    STARTED=1
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
fi

# 4. slurmctld and slurmd, in the foreground (-D) of a detached session; our own pid files, since
# SLURM rewrites its pid files while starting. cwd=DIR: stop_slurm.sh finds stray slurmstepd by it.
port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
cd "$DIR"
if ! alive "$DIR/pids/slurmctld"; then
    port_busy "$SLURMCTLD_PORT" && die "port $SLURMCTLD_PORT is taken: $(ss -Hltnp "sport = :$SLURMCTLD_PORT")"
    log "starting slurmctld"
    STARTED=1
    setsid slurmctld -D -c -i -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 &   # -c -i: forget old jobs
    echo $! > "$DIR/pids/slurmctld"
fi
if ! alive "$DIR/pids/slurmd"; then
    port_busy "$SLURMD_PORT" && die "port $SLURMD_PORT is taken: $(ss -Hltnp "sport = :$SLURMD_PORT")"
    log "starting slurmd"
    STARTED=1
    setsid slurmd -D -N "$NODE" -f "$CONF" </dev/null >>"$DIR/log/slurmd.out" 2>&1 &
    echo $! > "$DIR/pids/slurmd"
fi

# 5. wait until the node takes jobs
state= deadline=$((SECONDS + START_TIMEOUT))
while [ $SECONDS -lt $deadline ]; do
    alive "$DIR/pids/slurmctld" || die "slurmctld exited: $(tail -n 5 "$DIR/log/slurmctld.out")"
    alive "$DIR/pids/slurmd" || die "slurmd exited: $(tail -n 5 "$DIR/log/slurmd.out")"
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    case $state in
    idle|mixed|allocated) break ;;
    drain*|down*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
done
case $state in idle|mixed|allocated) ;; *) die "node $NODE is '${state:-unknown}' after ${START_TIMEOUT}s" ;; esac
log "node $NODE is $state"
echo "export SLURM_CONF=$CONF"
