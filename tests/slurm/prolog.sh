#!/bin/sh
# SLURM Prolog (root, at allocation: PrologFlags=Alloc); written to DIR/etc by start_slurm.sh.
# Gives each job its own filesystem, a tmpfs at DIR/jobtmp/job_<id>, as sites give node-local
# disk: Sea skips a tier on the home's filesystem. A non-zero exit would drain the node.
d="@DIR@/jobtmp/job_$SLURM_JOB_ID"
mkdir -p "$d" || exit 1
mount -t tmpfs -o "size=@JOB_TMPFS_SIZE@,mode=0700,uid=$SLURM_JOB_UID" tmpfs "$d" 2>>"@DIR@/log/prolog.log" \
    || echo "job $SLURM_JOB_ID: tmpfs mount failed, plain directory" >>"@DIR@/log/prolog.log"
chown "$SLURM_JOB_UID" "$d" && chmod 0700 "$d"
exit 0
