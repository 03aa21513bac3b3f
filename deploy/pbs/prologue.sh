#!/bin/bash
# amdgpu-exporter PBS prologue (OpenPBS / PBS Professional; Torque alike): record which job holds
# each of this node's GPUs.
#
# pbs_mom runs $PBS_HOME/mom_priv/prologue as root on each node of the job before it starts, with
# the job id ("1234.server") as $1 and the user as $2. For every GPU the job holds here it writes one
# JSON file, atomically, to
#     $AMDGPU_EXPORTER_SLURM_STATE_DIR/<gpu index>.<the id's number>   (default /run/amdgpu-exporter/slurm)
# the folder `amdgpu-exporter --slurm.state-dir` reads (Slurm's, Flux's and PBS's records alike).
#
# The GPUs: AMDGPU_EXPORTER_JOB_GPUS if set ("0,2-3"; a cgroup hook can export it), else the
# GPU indices in $PBS_GPUFILE-style lines of $PBS_HOME/aux/<job id>.gpu (Torque: "<host>-gpu<N>"),
# else every GPU of the node (exclusive nodes, the usual GPU queue): the KFD's GPU nodes, counted in
# the order rocm-smi and the exporter's `gpu` label follow. It always exits 0 (a failing prologue
# requeues the job).

set -u
umask 022
state_dir="${AMDGPU_EXPORTER_SLURM_STATE_DIR:-/run/amdgpu-exporter/slurm}"
pbs_home="${PBS_HOME:-/var/spool/pbs}"
warn() {
    echo "amdgpu-exporter pbs prologue: $*" >&2
    command -v logger >/dev/null 2>&1 && logger -t amdgpu-exporter-prolog -- "$*"
    return 0
}
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

job_id="${1:-}"
user="${2:-}"
if [[ ! $job_id =~ ^([0-9]{1,20})[][0-9]*(\.[A-Za-z0-9._-]+)?$ ]]; then
    warn "no usable PBS job id (got '${job_id}'); nothing recorded"
    exit 0
fi
number=${BASH_REMATCH[1]}
gpus="${AMDGPU_EXPORTER_JOB_GPUS:-}"
if [ -z "$gpus" ] && [ -r "$pbs_home/aux/$job_id.gpu" ]; then
    gpus=$(grep -o 'gpu[0-9]\+$' "$pbs_home/aux/$job_id.gpu" | tr -dc '0-9\n' | paste -sd, -)
fi
if [ -z "$gpus" ]; then
    count=0
    for node in "${AMDGPU_EXPORTER_SYSFS:-/sys}"/class/kfd/kfd/topology/nodes/*/gpu_id; do
        [ "$(cat "$node" 2>/dev/null)" != 0 ] && [ -n "$(cat "$node" 2>/dev/null)" ] && count=$((count + 1))
    done
    [ "$count" -gt 0 ] && gpus="0-$((count - 1))"
fi
[ -n "$gpus" ] || exit 0
if ! mkdir -p -m 0755 -- "$state_dir" 2>/dev/null; then
    warn "cannot create $state_dir; job $job_id not recorded"
    exit 0
fi
if [ -L "$state_dir" ] || [ "$(stat -c %u -- "$state_dir" 2>/dev/null)" != "$(id -u)" ]; then
    warn "$state_dir is a symbolic link or not owned by uid $(id -u); job $job_id not recorded"
    exit 0
fi
queue="${PBS_QUEUE:-}"
started_at=$(date +%s)
while read -r index; do
    [ -n "$index" ] || continue
    body="{\"scheduler\": \"pbs\", \"job_id\": $(json_string "$job_id"),"
    body+=" \"job_user\": $(json_string "$user"), \"job_partition\": $(json_string "$queue"),"
    body+=" \"gpu_index\": $index, \"started_at\": $started_at}"
    if ! tmp=$(mktemp "$state_dir/.tmp.$number.XXXXXX" 2>/dev/null); then
        warn "cannot write in $state_dir; job $job_id GPU $index not recorded"
        continue
    fi
    if ! { printf '%s\n' "$body" >"$tmp" && chmod 0644 "$tmp" && mv -fT -- "$tmp" "$state_dir/$index.$number"; }; then
        rm -f -- "$tmp"
        warn "cannot write $state_dir/$index.$number"
    fi
done < <(expand_indices "$gpus")
exit 0
