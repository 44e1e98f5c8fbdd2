#!/usr/bin/env bash
# Stop what start_slurm.sh DIR started, and remove DIR.
#
#   tests/slurm/stop_slurm.sh [--keep] [DIR]    DIR defaults to /var/tmp/sea-slurm; --keep keeps DIR
#
# Cancels the jobs, shuts slurmctld and slurmd down (scontrol shutdown, then SIGTERM, then SIGKILL),
# kills job processes left behind by this DIR's slurmd, unmounts the per-job tmpfs, and stops munged
# only if start_slurm.sh started it. Touches only processes named by DIR's pid files or whose cwd is
# DIR. Idempotent: nothing running, nothing done.
set -uo pipefail
KEEP=0
if [ "${1:-}" = --keep ]; then KEEP=1; shift; fi
DIR=${1:-/var/tmp/sea-slurm}
[ -d "$DIR" ] || exit 0
DIR=$(cd "$DIR" && pwd -P)
export SLURM_CONF=$DIR/etc/slurm.conf
log() { echo "[stop_slurm] $*" >&2; }
alive() { local p; [ -s "$1" ] && p=$(cat "$1") && kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p" | cut -c1)" != Z ]; }
wait_gone() { for _ in $(seq $(($2 * 10))); do alive "$1" || return 0; sleep 0.1; done; ! alive "$1"; }

GRACE=0
if alive "$DIR/pids/slurmctld"; then
    # jobs first: with proctrack/linuxproc a job's processes outlive slurmd
    jobs=$(squeue -h -o %i 2>/dev/null)
    if [ -n "$jobs" ]; then
        log "cancelling jobs" $jobs
        scancel --full --quiet $jobs 2>/dev/null
        for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    fi
    scontrol shutdown 2>/dev/null && GRACE=10
fi
for d in slurmd slurmctld; do
    f=$DIR/pids/$d
    alive "$f" || continue
    wait_gone "$f" "$GRACE" || { log "$d: SIGTERM"; kill -TERM "$(cat "$f")"; wait_gone "$f" 5; } \
        || { log "$d: SIGKILL"; kill -KILL "$(cat "$f")"; wait_gone "$f" 2; }
done
rm -f "$DIR/pids/slurmctld" "$DIR/pids/slurmd"

# a slurmstepd left behind (and its job's processes): its cwd is slurmd's, which start_slurm.sh set to DIR
descendants() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; descendants "$c"; done; }
for p in $(pgrep -x slurmstepd); do
    [ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$DIR" ] || continue
    kids=$(descendants "$p")
    log "killing stray slurmstepd $p and its processes" $kids
    kill -STOP "$p" $kids 2>/dev/null   # freeze the tree first, so nothing forks away
    kill -KILL "$p" $kids 2>/dev/null
done

# job tmpfs whose Epilog did not run
findmnt -rn -o TARGET | grep -F "$DIR/jobtmp/" | sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done

if [ -f "$DIR/munged.started-by-us" ]; then
    if [ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
        kill -TERM "$(cat /run/munge/munged.pid)"
        for _ in $(seq 50); do [ -e /run/munge/munged.pid ] || break; sleep 0.1; done
    fi
    rm -f "$DIR/munged.started-by-us"
fi

# remove DIR only if start_slurm.sh made it and nothing is mounted in it any more
if [ "$KEEP" = 0 ] && grep -qs 'written by start_slurm.sh' "$DIR/etc/slurm.conf" && ! findmnt -rn -o TARGET | grep -qF "$DIR/"; then
    rm -rf "$DIR"
    log "stopped; removed $DIR"
else
    log "stopped; kept $DIR"
fi
