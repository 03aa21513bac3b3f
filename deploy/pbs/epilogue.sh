#!/bin/bash
# amdgpu-exporter PBS epilogue: forget the job's GPUs (see prologue.sh), then print its GPU
# accounting record (docs/accounting.md) once the exporter has seen the job end: to syslog and to
# the epilogue's output, which PBS appends to the job's own output file.
#
# pbs_mom runs $PBS_HOME/mom_priv/epilogue as root after the job, with the job id as $1. It removes
# every state file of this job and never another job's. It always exits 0.

set -u
state_dir="${AMDGPU_EXPORTER_SLURM_STATE_DIR:-/run/amdgpu-exporter/slurm}"
job_id="${1:-}"
if [[ ! $job_id =~ ^([0-9]{1,20})[][0-9]*(\.[A-Za-z0-9._-]+)?$ ]]; then
    echo "amdgpu-exporter pbs epilogue: no usable PBS job id (got '${job_id}'); nothing removed" >&2
    exit 0
fi
number=${BASH_REMATCH[1]}
[ -d "$state_dir" ] || exit 0
if [ -L "$state_dir" ] || [ "$(stat -c %u -- "$state_dir" 2>/dev/null)" != "$(id -u)" ]; then
    echo "amdgpu-exporter pbs epilogue: $state_dir is a symbolic link or not owned by uid $(id -u)" >&2
    exit 0
fi
shopt -s nullglob
held=0
for file in "$state_dir"/*."$number" "$state_dir"/.tmp."$number".*; do
    [[ $file == */.tmp.* ]] || held=1
    rm -f -- "$file" || echo "amdgpu-exporter pbs epilogue: cannot remove $file" >&2
done
[ "$held" = 1 ] && [ "${AMDGPU_EXPORTER_ACCOUNTING_RECORD:-on}" != off ] || exit 0
command -v amdgpu-exporter >/dev/null 2>&1 || exit 0
url="${AMDGPU_EXPORTER_URL:-http://127.0.0.1:9442}"
record=$(timeout 20 amdgpu-exporter job-report "$job_id" --record --wait 12 --url "$url" 2>/dev/null) || exit 0
[[ $record =~ ^[A-Za-z0-9_=.,+-]+$ ]] || exit 0
command -v logger >/dev/null 2>&1 && logger -t amdgpu-exporter-epilog -- "pbs job $job_id $record"
echo "amdgpu-exporter: GPU accounting for job $job_id: $record"
exit 0
