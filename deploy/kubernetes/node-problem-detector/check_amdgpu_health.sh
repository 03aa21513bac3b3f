#!/bin/sh
# Node Problem Detector custom plugin: is every AMD GPU of this node fit?
#
# Reads amdgpu-exporter's health verdict (/api/v1/health, docs/api.md) and answers as NPD's custom
# plugin protocol asks: exit 0 = OK (condition AMDGPUUnhealthy False), 1 = NonOK (True: some GPU is
# not fit; the message names them and their failing checks), 2 = Unknown (no usable answer; NPD keeps
# the condition as it was). The exporter never acts itself: a site's remediation acts on the
# condition (or runs the taint the document suggests).
#
# Fails closed: "fit" (exit 0) only from a whole health document, parsed as JSON, whose `fit` is true
# and whose `unfit_gpus` is empty. Whatever answers on the port (anything while the exporter restarts)
# is read at most AMDGPU_HEALTH_MAX_BYTES (default 1 MiB; a node's document is a few kB) and for at
# most AMDGPU_HEALTH_TIMEOUT seconds (default 5), into a temporary file, never into a shell
# variable; more, slower, truncated or not JSON: exit 2.
#
# AMDGPU_HEALTH_URL: where the node's exporter answers (default http://127.0.0.1:9442/api/v1/health;
# the DaemonSet listens on the host network).
#
# Needs, besides coreutils (`timeout`, `head`, `mktemp`): curl, wget or python3 to fetch, and python3
# or jq to parse. NPD's own image (debian-base with bash and util-linux) has none of the four: use
# an image with python3 (or curl and jq), or mount static ones (README.md). Without them: exit 2, said.
url="${AMDGPU_HEALTH_URL:-http://127.0.0.1:9442/api/v1/health}"
max_bytes="${AMDGPU_HEALTH_MAX_BYTES:-1048576}"
seconds="${AMDGPU_HEALTH_TIMEOUT:-5}"

say() { printf '%s\n' "$1" | head -c 400; exit "$2"; }

case "$max_bytes$seconds" in *[!0-9]*|'') say "AMDGPU_HEALTH_MAX_BYTES and AMDGPU_HEALTH_TIMEOUT must be whole numbers" 2 ;; esac
command -v timeout >/dev/null 2>&1 || say "coreutils' timeout is not installed" 2

body=$(mktemp "${TMPDIR:-/tmp}/amdgpu-health.XXXXXX") || say "cannot create a temporary file" 2
trap 'rm -f "$body"' EXIT
trap 'exit 2' HUP INT TERM

# One byte more than allowed is read, so an answer that is too large is told from one that fits.
limit=$((max_bytes + 1))
if command -v curl >/dev/null 2>&1; then
    timeout -s KILL "$((seconds + 1))" curl -fsS --max-time "$seconds" --max-filesize "$max_bytes" \
        --proto =http,https "$url" 2>/dev/null | head -c "$limit" >"$body"
elif command -v wget >/dev/null 2>&1; then
    timeout -s KILL "$((seconds + 1))" wget -q -T "$seconds" -O - "$url" 2>/dev/null | head -c "$limit" >"$body"
elif command -v python3 >/dev/null 2>&1; then
    timeout -s KILL "$((seconds + 1))" python3 -c '
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as answer:
    sys.stdout.buffer.write(answer.read(int(sys.argv[3])))
 ' "$url" "$seconds" "$limit" >"$body" 2>/dev/null
else
    say "none of curl, wget or python3 is installed: cannot fetch $url" 2
fi
# A pipeline's status is head's: a failed fetch leaves an empty or partial file, caught below.
size=$(wc -c <"$body")
[ "$size" -gt 0 ] || say "amdgpu-exporter did not answer at $url" 2
[ "$size" -le "$max_bytes" ] || say "the answer at $url is larger than $max_bytes bytes: not a health document" 2

# The parser prints one line: "fit", "unfit GPUS CHECKS..." or "bad"; anything else is bad too.
if command -v python3 >/dev/null 2>&1; then
    verdict=$(timeout -s KILL "$seconds" python3 -c '
import json, sys
try:
    with open(sys.argv[1], "rb") as f:
        doc = json.loads(f.read().decode("utf-8"))
    fit, unfit, gpus = doc["fit"], doc["unfit_gpus"], doc["gpus"]
    assert isinstance(fit, bool) and isinstance(unfit, list) and isinstance(gpus, list) and gpus
    assert all(isinstance(g, int) and not isinstance(g, bool) for g in unfit)
    checks = sorted({str(c["check"]) for g in gpus for c in g["checks"]})
except Exception:
    print("bad")
else:
    if fit and not unfit:
        print("fit")
    else:
        print("unfit", ",".join(map(str, unfit)) or "?", " ".join(c for c in checks if c.replace("_", "").isalnum()))
' "$body" 2>/dev/null)
elif command -v jq >/dev/null 2>&1; then
    verdict=$(timeout -s KILL "$seconds" jq -r '
        if type == "object" and (.fit | type) == "boolean" and (.unfit_gpus | type) == "array"
           and (.gpus | type) == "array" and (.gpus | length) > 0
           and all(.unfit_gpus[]; type == "number")
        then (if .fit and (.unfit_gpus | length) == 0 then "fit"
              else "unfit " + ((.unfit_gpus | map(tostring) | join(",")) | if . == "" then "?" else . end) + " "
                   + ([.gpus[].checks[]?.check | strings | select(test("^[a-z0-9_]+$"))] | unique | join(" "))
              end)
        else "bad" end' "$body" 2>/dev/null)
else
    say "neither python3 nor jq is installed: cannot read the health document" 2
fi

case "$verdict" in
    fit)
        say "every AMD GPU on the node is fit" 0
        ;;
    "unfit "*)
        set -- $verdict
        gpus=$2
        shift 2
        say "AMD GPU(s) not fit: gpu $gpus; failing checks: $*" 1
        ;;
    *)
        say "amdgpu-exporter's answer at $url is not a whole health document" 2
        ;;
esac
