#!/bin/sh
# SLURM Epilog (root, when the job ends): unmount and remove the job's tmpfs.
d="@DIR@/jobtmp/job_$SLURM_JOB_ID"
if mountpoint -q "$d"; then umount "$d" 2>/dev/null || umount -l "$d"; fi
rm -rf "$d"
exit 0
