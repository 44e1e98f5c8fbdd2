#!/bin/sh
# SLURM TaskProlog (the job's user, before each task): the "export NAME=VALUE" lines it prints go
# into the task's environment. Plain SLURM sets no SLURM_TMPDIR; many sites do it this way.
echo "export SLURM_TMPDIR=@DIR@/jobtmp/job_$SLURM_JOB_ID"
