#!/bin/bash
# amdgpu-exporter Slurm prolog: record which job holds each of this node's GPUs.
#
# slurmd runs it as root at allocation time (slurm.conf: PrologFlags=Alloc) with the job's
# environment. For every GPU of the job it writes one JSON file, atomically (write a temporary file
# in the same directory, then rename over the name, never into a directory or link planted there), to
#     $AMDGPU_EXPORTER_SLURM_STATE_DIR/<gpu index>.<job id>      (default /run/amdgpu-exporter/slurm)
# which `amdgpu-exporter --slurm.state-dir` reads. The epilog removes the job's files.
#
# GPU indices: SLURM_JOB_GPUS (gres indices, in rocm-smi's order with AutoDetect=rsmi: the exporter's
# `gpu` label), as a list with ranges ("0,2-3"); else ROCR_VISIBLE_DEVICES, else GPU_DEVICE_ORDINAL.
# Entries that are not indices (GPU UUIDs) are skipped.
#
# Bounded: at most MAX_GPUS files a job (the first indices listed, duplicates once), each field at
# most MAX_FIELD_CHARS characters (a 120 kB cluster name is cut, not written whole into a file the
# exporter would refuse as too large); what is cut is logged.
#
# It always exits 0: a failing prolog would drain the node, and a missing label is not worth that.
# Problems go to stderr and, where logger(1) exists, to syslog.

set -u
umask 022

state_dir="${AMDGPU_EXPORTER_SLURM_STATE_DIR:-/run/amdgpu-exporter/slurm}"
MAX_GPUS=128         # a node's GPUs, partitions included (8 MI300X in CPX mode are 64)
MAX_FIELD_CHARS=256  # a user, account, partition or cluster name; SLURM_JOB_GPUS gets 4x
MAX_FILE_BYTES=16384 # the exporter reads state files up to 64 KiB

warn() {
    echo "amdgpu-exporter prolog: $*" >&2
    command -v logger >/dev/null 2>&1 && logger -t amdgpu-exporter-prolog -- "$*"
    return 0
}

# A JSON string: backslash and quote escaped, control characters dropped, at most $3 characters
# (default MAX_FIELD_CHARS; what is cut is logged, naming field $2). A value that is not UTF-8 (a
# partition or account name in another encoding) has every non-ASCII byte replaced by U+FFFD, so
# the file stays valid UTF-8 JSON (and without iconv every non-ASCII byte is).
json_string() {
    local text=$1 name=${2:-value} limit=${3:-$MAX_FIELD_CHARS}
    if ! printf '%s' "$text" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1; then
        local LC_ALL=C
        text=${text//[$'\200'-$'\377']/$'\357\277\275'}
    fi
    local LC_ALL=C.UTF-8 2>/dev/null # characters are counted and cut whole (slurmd's locale may be C)
    if [ "${#text}" -gt "$limit" ]; then
        warn "job $job_id: $name is ${#text} characters; recorded are its first $limit"
        text=${text:0:$limit}
    fi
    text=${text//\\/\\\\}
    text=${text//\"/\\\"}
    text=${text//[$'\001'-$'\037']/}
    printf '"%s"' "$text"
}

# "0,2-3" / "[0-1],5" -> one index per line; at most 1024 per range.
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

job_id="${SLURM_JOB_ID:-${SLURM_JOBID:-}}"
if [[ ! $job_id =~ ^[0-9]+$ ]]; then
    warn "no numeric SLURM_JOB_ID (got '${job_id}'); nothing recorded"
    exit 0
fi

gpus="${SLURM_JOB_GPUS:-}"
[ -n "$gpus" ] || gpus="${ROCR_VISIBLE_DEVICES:-}"
[ -n "$gpus" ] || gpus="${GPU_DEVICE_ORDINAL:-}"
[ -n "$gpus" ] || exit 0 # a job without GPUs on this node

if ! mkdir -p -m 0755 -- "$state_dir" 2>/dev/null; then
    warn "cannot create $state_dir; job $job_id not recorded"
    exit 0
fi
# The directory must be our own, not a link planted by someone who could write its parent: root's
# rename would otherwise put the record wherever the link points.
if [ -L "$state_dir" ] || [ "$(stat -c %u -- "$state_dir" 2>/dev/null)" != "$(id -u)" ]; then
    warn "$state_dir is a symbolic link or not owned by uid $(id -u); job $job_id not recorded"
    exit 0
fi

started_at=$(date +%s)
# The job's part of every file, made (and its fields cut) once.
common="{\"SLURM_JOB_ID\": $(json_string "$job_id" SLURM_JOB_ID),"
common+=" \"SLURM_JOB_USER\": $(json_string "${SLURM_JOB_USER:-}" SLURM_JOB_USER),"
common+=" \"SLURM_JOB_UID\": $(json_string "${SLURM_JOB_UID:-}" SLURM_JOB_UID),"
common+=" \"SLURM_JOB_PARTITION\": $(json_string "${SLURM_JOB_PARTITION:-}" SLURM_JOB_PARTITION),"
common+=" \"SLURM_JOB_ACCOUNT\": $(json_string "${SLURM_JOB_ACCOUNT:-}" SLURM_JOB_ACCOUNT),"
common+=" \"SLURM_CLUSTER_NAME\": $(json_string "${SLURM_CLUSTER_NAME:-}" SLURM_CLUSTER_NAME),"
common+=" \"SLURM_JOB_GPUS\": $(json_string "$gpus" SLURM_JOB_GPUS $((4 * MAX_FIELD_CHARS))),"
if [ "$(LC_ALL=C; echo "${#common}")" -gt "$MAX_FILE_BYTES" ]; then
    warn "job $job_id: its record is over $MAX_FILE_BYTES bytes even with every field cut; not recorded"
    exit 0
fi
mapfile -t indices < <(expand_indices "$gpus" | awk '!seen[$0]++')
if [ "${#indices[@]}" -gt "$MAX_GPUS" ]; then
    warn "job $job_id: SLURM_JOB_GPUS lists ${#indices[@]} GPUs; recorded are the first $MAX_GPUS"
    indices=("${indices[@]:0:$MAX_GPUS}")
fi
for index in "${indices[@]}"; do
    [ -n "$index" ] || continue
    body="$common \"gpu_index\": $index, \"started_at\": $started_at}"
    if ! tmp=$(mktemp "$state_dir/.tmp.$job_id.XXXXXX" 2>/dev/null); then
        warn "cannot write in $state_dir; job $job_id GPU $index not recorded"
        continue
    fi
    if printf '%s\n' "$body" >"$tmp" && chmod 0644 "$tmp" && mv -fT -- "$tmp" "$state_dir/$index.$job_id"; then
        :
    else
        rm -f -- "$tmp"
        warn "cannot write $state_dir/$index.$job_id"
    fi
done
exit 0
