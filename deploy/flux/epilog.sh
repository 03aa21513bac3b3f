#!/bin/bash
# amdgpu-exporter Flux epilog: forget the job's GPUs (see prolog.sh), then log its GPU accounting
# record (docs/accounting.md) to syslog once the exporter has seen the job end.
#
# flux-core's job-manager runs it as root on every node of the job after it ends (perilog plugin,
# [job-manager.epilog], through `flux-imp run epilog`), with FLUX_JOB_ID. It removes every state file
# of this job, whichever GPUs they name, and never another job's. It always exits 0.

set -u
state_dir="${AMDGPU_EXPORTER_SLURM_STATE_DIR:-/run/amdgpu-exporter/slurm}"
job_id="${FLUX_JOB_ID:-}"
[[ $job_id =~ ^[0-9]+$ ]] || job_id=$(flux job id --to=dec "$job_id" 2>/dev/null)
if [[ ! $job_id =~ ^[0-9]{1,20}$ ]]; then
    echo "amdgpu-exporter flux epilog: no usable FLUX_JOB_ID (got '${FLUX_JOB_ID:-}'); nothing removed" >&2
    exit 0
fi
[ -d "$state_dir" ] || exit 0
if [ -L "$state_dir" ] || [ "$(stat -c %u -- "$state_dir" 2>/dev/null)" != "$(id -u)" ]; then
    echo "amdgpu-exporter flux epilog: $state_dir is a symbolic link or not owned by uid $(id -u)" >&2
    exit 0
fi
shopt -s nullglob
held=0
for file in "$state_dir"/*."$job_id" "$state_dir"/.tmp."$job_id".*; do
    [[ $file == */.tmp.* ]] || held=1
    rm -f -- "$file" || echo "amdgpu-exporter flux epilog: cannot remove $file" >&2
done
[ "$held" = 1 ] && [ "${AMDGPU_EXPORTER_ACCOUNTING_RECORD:-on}" != off ] || exit 0
command -v amdgpu-exporter >/dev/null 2>&1 || exit 0
url="${AMDGPU_EXPORTER_URL:-http://127.0.0.1:9442}"
record=$(timeout 20 amdgpu-exporter job-report "$job_id" --record --wait 12 --url "$url" 2>/dev/null) || exit 0
[[ $record =~ ^[A-Za-z0-9_=.,+-]+$ ]] || exit 0
command -v logger >/dev/null 2>&1 && logger -t amdgpu-exporter-epilog -- "flux job $job_id $record"
echo "amdgpu-exporter: flux job $job_id $record"
exit 0
