#!/bin/bash
# amdgpu-exporter Slurm epilog: forget the job's GPUs (see prolog.sh).
#
# slurmd runs it as root when the job ends. It removes every state file of this job
# ($AMDGPU_EXPORTER_SLURM_STATE_DIR/<gpu index>.<job id>, and any temporary file a killed prolog
# left), whichever GPUs they name: removal is atomic, and other jobs' files are never touched.
# It always exits 0: a failing epilog would drain the node.

set -u

state_dir="${AMDGPU_EXPORTER_SLURM_STATE_DIR:-/run/amdgpu-exporter/slurm}"
job_id="${SLURM_JOB_ID:-${SLURM_JOBID:-}}"

if [[ ! $job_id =~ ^[0-9]+$ ]]; then
    echo "amdgpu-exporter epilog: no numeric SLURM_JOB_ID (got '${job_id}'); nothing removed" >&2
    exit 0
fi
[ -d "$state_dir" ] || exit 0
if [ -L "$state_dir" ] || [ "$(stat -c %u -- "$state_dir" 2>/dev/null)" != "$(id -u)" ]; then
    echo "amdgpu-exporter epilog: $state_dir is a symbolic link or not owned by uid $(id -u); nothing removed" >&2
    exit 0
fi

shopt -s nullglob
for file in "$state_dir"/*."$job_id" "$state_dir"/.tmp."$job_id".*; do
    # A directory planted under a record's name is not ours to remove (rm -f refuses it anyway).
    rm -f -- "$file" || echo "amdgpu-exporter epilog: cannot remove $file" >&2
done
exit 0
