#!/bin/sh
# Node Problem Detector custom plugin: is every AMD GPU of this node fit?
#
# Reads amdgpu-exporter's health verdict (/api/v1/health, docs/api.md) and answers as NPD's custom
# plugin protocol asks: exit 0 = OK (condition AMDGPUUnhealthy False), 1 = NonOK (True: some GPU is
# not fit; the message names them and their failing checks), 2 = Unknown (the exporter did not answer;
# NPD keeps the condition as it was). The exporter never acts itself: a site's remediation acts on the
# condition (or runs the taint the document suggests).
#
# AMDGPU_HEALTH_URL: where the node's exporter answers (default http://127.0.0.1:9442/api/v1/health;
# the DaemonSet listens on the host network). Needs curl or wget (NPD's image has neither by
# default: use one with curl, or mount a static one).
url="${AMDGPU_HEALTH_URL:-http://127.0.0.1:9442/api/v1/health}"

if command -v curl >/dev/null 2>&1; then
    body=$(curl -fsS --max-time 5 "$url" 2>&1) || { echo "amdgpu-exporter did not answer at $url: $body"; exit 2; }
elif command -v wget >/dev/null 2>&1; then
    body=$(wget -q -T 5 -O - "$url" 2>&1) || { echo "amdgpu-exporter did not answer at $url"; exit 2; }
else
    echo "neither curl nor wget is installed"
    exit 2
fi

# The document is compact JSON: "fit":true|false at the top level, "unfit_gpus":[1,3].
case "$body" in
    *'"fit":false,"unfit_gpus"'*)
        gpus=$(printf '%s' "$body" | sed -n 's/.*"unfit_gpus":\[\([0-9,]*\)\].*/\1/p')
        checks=$(printf '%s' "$body" | grep -o '"check":"[a-z_]*"' | sed 's/"check":"\([a-z_]*\)"/\1/' | sort -u | tr '\n' ' ')
        echo "AMD GPU(s) not fit: gpu ${gpus:-?}; failing checks: ${checks% }"
        exit 1
        ;;
    *'"fit":true,'*)
        echo "every AMD GPU on the node is fit"
        exit 0
        ;;
    *)
        echo "amdgpu-exporter's answer at $url is not a health document"
        exit 2
        ;;
esac
