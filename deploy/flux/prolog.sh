#!/bin/bash
# amdgpu-exporter Flux prolog: record which job holds each of this node's GPUs.
#
# flux-core's job-manager runs it as root on every node of a job before the job starts (the perilog
# plugin: [job-manager.prolog] command = ["flux-imp", "run", "prolog"], with the IMP's [run.prolog]
# path pointing here), with FLUX_JOB_ID and FLUX_JOB_USERID in its environment. For every GPU the job
# holds on this node it writes one JSON file, atomically (a temporary file in the same directory,
# renamed over the name), to
#     $AMDGPU_EXPORTER_SLURM_STATE_DIR/<gpu index>.<decimal job id>   (default /run/amdgpu-exporter/slurm)
# the folder `amdgpu-exporter --slurm.state-dir` reads (it reads Slurm's, Flux's and PBS's records
# alike; each says its scheduler). The epilog removes the job's files.
#
# The GPUs: AMDGPU_EXPORTER_JOB_GPUS if set ("0,2-3"), else this rank's gpu ids in the job's R
# (`flux job info ID R`, R_lite), which Flux numbers as rocm-smi does, as is the `gpu` label.
# It always exits 0: a failing prolog would drain the node. Problems go to stderr and syslog.

set -u
umask 022

state_dir="${AMDGPU_EXPORTER_SLURM_STATE_DIR:-/run/amdgpu-exporter/slurm}"
warn() {
    echo "amdgpu-exporter flux prolog: $*" >&2
    command -v logger >/dev/null 2>&1 && logger -t amdgpu-exporter-prolog -- "$*"
    return 0
}
# A JSON string: backslash and quote escaped, control characters dropped, non-UTF-8 bytes as U+FFFD.
json_string() {
    local text=$1
    if ! printf '%s' "$text" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1; then
        local LC_ALL=C
        text=${text//[$'\200'-$'\377']/$'\357\277\275'}
    fi
    text=${text//\\/\\\\}
    text=${text//\"/\\\"}
    text=${text//[$'\001'-$'\037']/}
    printf '"%s"' "$text"
}
# "0,2-3" -> one index per line; at most 1024 per range.
expand_indices() {
    local list=${1//[][ ]/} part low high i
    local -a parts
    IFS=',' read -ra parts <<<"$list"
    for part in "${parts[@]}"; do
        if [[ $part =~ ^([0-9]{1,4})-([0-9]{1,4})$ ]]; then
            low=$((10#${BASH_REMATCH[1]}))
            high=$((10#${BASH_REMATCH[2]}))
            for ((i = low; i <= high && i - low < 1024; i++)); do echo "$i"; done
        elif [[ $part =~ ^[0-9]{1,4}$ ]]; then
            echo $((10#$part))
        fi
    done
}

job_id="${FLUX_JOB_ID:-}"
[[ $job_id =~ ^[0-9]+$ ]] || job_id=$(flux job id --to=dec "$job_id" 2>/dev/null)
if [[ ! $job_id =~ ^[0-9]{1,20}$ ]]; then
    warn "no usable FLUX_JOB_ID (got '${FLUX_JOB_ID:-}'); nothing recorded"
    exit 0
fi
user=$(getent passwd "${FLUX_JOB_USERID:-}" 2>/dev/null | cut -d: -f1)
[ -n "$user" ] || user="${FLUX_JOB_USERID:-}"
queue=$(flux job info "$job_id" jobspec 2>/dev/null | grep -o '"queue": *"[^"]*"' | head -n 1 | sed 's/.*"\([^"]*\)"$/\1/')

gpus="${AMDGPU_EXPORTER_JOB_GPUS:-}"
if [ -z "$gpus" ] && command -v flux >/dev/null 2>&1; then
    rank=$(flux getattr rank 2>/dev/null)
    gpus=$(flux job info "$job_id" R 2>/dev/null | flux python -c '
import json, sys
from flux.idset import IDset
rank = int(sys.argv[1])
for entry in json.load(sys.stdin)["execution"]["R_lite"]:
    if rank in IDset(entry["rank"]):
        print(entry["children"].get("gpu", ""))
' "${rank:-0}" 2>/dev/null)
fi
[ -n "$gpus" ] || exit 0 # a job without GPUs on this node

if ! mkdir -p -m 0755 -- "$state_dir" 2>/dev/null; then
    warn "cannot create $state_dir; job $job_id not recorded"
    exit 0
fi
if [ -L "$state_dir" ] || [ "$(stat -c %u -- "$state_dir" 2>/dev/null)" != "$(id -u)" ]; then
    warn "$state_dir is a symbolic link or not owned by uid $(id -u); job $job_id not recorded"
    exit 0
fi
started_at=$(date +%s)
while read -r index; do
    [ -n "$index" ] || continue
    body="{\"scheduler\": \"flux\", \"job_id\": $(json_string "$job_id"),"
    body+=" \"job_user\": $(json_string "$user"), \"job_partition\": $(json_string "$queue"),"
    body+=" \"FLUX_JOB_USERID\": $(json_string "${FLUX_JOB_USERID:-}"),"
    body+=" \"gpu_index\": $index, \"started_at\": $started_at}"
    if ! tmp=$(mktemp "$state_dir/.tmp.$job_id.XXXXXX" 2>/dev/null); then
        warn "cannot write in $state_dir; job $job_id GPU $index not recorded"
        continue
    fi
    if ! { printf '%s\n' "$body" >"$tmp" && chmod 0644 "$tmp" && mv -fT -- "$tmp" "$state_dir/$index.$job_id"; }; then
        rm -f -- "$tmp"
        warn "cannot write $state_dir/$index.$job_id"
    fi
done < <(expand_indices "$gpus")
exit 0
