#!/bin/bash
# amdgpu-exporter Slurm epilog: forget the job's GPUs (see prolog.sh).
#
# slurmd runs it as root when the job ends. It removes every state file of this job
# ($AMDGPU_EXPORTER_SLURM_STATE_DIR/<gpu index>.<job id>, and any temporary file a killed prolog
# left), whichever GPUs they name: removal is atomic, and other jobs' files are never touched.
# Then it stores the job's GPU accounting record (below). It always exits 0: a failing epilog would
# drain the node.

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
held=0
for file in "$state_dir"/*."$job_id" "$state_dir"/.tmp."$job_id".*; do
    [[ $file == */.tmp.* ]] || held=1
    # A directory planted under a record's name is not ours to remove (rm -f refuses it anyway).
    rm -f -- "$file" || echo "amdgpu-exporter epilog: cannot remove $file" >&2
done

# The job's accounting record (docs/accounting.md): once the exporter has seen the job end (it reads
# the folder every --interval), its one-line record goes to syslog and, where the job's AdminComment
# is still empty, into AdminComment, which `sacct --format=JobID,AdminComment%200` shows. Set
# AMDGPU_EXPORTER_ACCOUNTING_RECORD=off to skip it; AMDGPU_EXPORTER_URL is the exporter to ask.
[ "$held" = 1 ] || exit 0
[ "${AMDGPU_EXPORTER_ACCOUNTING_RECORD:-on}" != off ] || exit 0
command -v amdgpu-exporter >/dev/null 2>&1 || exit 0
url="${AMDGPU_EXPORTER_URL:-http://127.0.0.1:9442}"
if ! record=$(timeout 20 amdgpu-exporter job-report "$job_id" --record --wait 12 --url "$url" 2>/dev/null); then
    echo "amdgpu-exporter epilog: no accounting record for job $job_id from $url" >&2
    exit 0
fi
[[ $record =~ ^[A-Za-z0-9_=.,+-]+$ ]] || exit 0 # one line of key=value pairs, nothing a shell or Slurm would parse
command -v logger >/dev/null 2>&1 && logger -t amdgpu-exporter-epilog -- "job $job_id $record"
command -v scontrol >/dev/null 2>&1 || exit 0
current=$(timeout 10 scontrol -o show job "$job_id" 2>/dev/null | grep -o 'AdminComment=[^ ]*' | head -n 1)
current=${current#AdminComment=}
if [ -z "$current" ] || [ "$current" = "(null)" ]; then
    timeout 10 scontrol update JobId="$job_id" AdminComment="$record" >/dev/null 2>&1 ||
        echo "amdgpu-exporter epilog: scontrol could not set job $job_id's AdminComment" >&2
else
    echo "amdgpu-exporter epilog: job $job_id has an AdminComment already; the record is in syslog only" >&2
fi
exit 0
