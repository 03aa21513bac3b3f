"""Run a tool from a chroot on a simulated sysfs tree, in a private mount and PID namespace.

What the namespace gives the tool, and why:
- /sys: the tree, through an overlay whose upper layer is a private tmpfs, so the folders the
  tree does not have but amd-smi lists (class/net, class/scsi_host, devices/system/cpu, an empty
  bus/pci/devices when missing) can be added without touching the tree the exporter reads.
- /proc: a fresh proc for the new PID namespace, with /proc/cpuinfo replaced by a copy without
  the `hypervisor` flag (on a VM guest amd-smi otherwise hides power limits, energy and NUMA).
- /dev/shm and /tmp: private tmpfs (librocm_smi64 keeps process-shared mutexes in /dev/shm).
- /dev/dri: a tmpfs with a plain file per DRM node of the tree, and the libdrm_amdgpu stand-in
  first on LD_LIBRARY_PATH to answer the DRM calls the tools make on them.
Needs root for unshare and mount.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.realtools import require_root, require_tool

FAKE_LIBDRM_MOUNT = "/opt/fake-libdrm"
_EMPTY_SYSFS_DIRS = ("class/net", "class/scsi_host", "devices/system/cpu", "bus/pci/devices")

# $1 chroot, $2 tree, $3 private scratch folder, $4 stand-in library folder or "", then the command
_NAMESPACE_SCRIPT = r"""
set -e
root=$1 tree=$2 scratch=$3 libdrm=$4
shift 4
mount -t tmpfs tmpfs "$scratch/overlay"
mkdir "$scratch/overlay/upper" "$scratch/overlay/work"
mount -t overlay overlay -o "lowerdir=$tree,upperdir=$scratch/overlay/upper,workdir=$scratch/overlay/work" "$root/sys"
for dir in @EMPTY_DIRS@; do mkdir -p "$root/sys/$dir"; done
mount -t proc proc "$root/proc"
mount --bind "$scratch/cpuinfo" "$root/proc/cpuinfo"
mount -t tmpfs tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mkdir -p "$root/dev/dri" "$root@LIBDRM_MOUNT@"
mount -t tmpfs tmpfs "$root/dev/dri"
for node in "$tree"/class/drm/card* "$tree"/class/drm/renderD*; do
  [ -e "$node" ] && : > "$root/dev/dri/${node##*/}"
done
[ -n "$libdrm" ] && mount --bind "$libdrm" "$root@LIBDRM_MOUNT@"
exec chroot "$root" "$@"
""".replace("@EMPTY_DIRS@", " ".join(_EMPTY_SYSFS_DIRS)).replace("@LIBDRM_MOUNT@", FAKE_LIBDRM_MOUNT)

_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8", "HOME": "/root"}


@dataclass(frozen=True)
class Chroot:
    """A built chroot and, for the suites whose tools load libdrm_amdgpu, the stand-in for it."""

    root: Path
    fake_libdrm: Path | None = None


def cpuinfo_without_hypervisor(text: str) -> str:
    """/proc/cpuinfo as a bare-metal host shows it: the `hypervisor` CPU flag removed."""
    lines = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            line = f"{key}: " + " ".join(flag for flag in value.split() if flag != "hypervisor")
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_tool(
    chroot: Chroot, tree: Path, argv: Sequence[str], timeout: float = 120.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run argv (a path inside the chroot) with the tree as its /sys; output captured as text."""
    require_root()
    unshare = require_tool("unshare")
    full_env = dict(_BASE_ENV)
    if chroot.fake_libdrm is not None:
        full_env["LD_LIBRARY_PATH"] = FAKE_LIBDRM_MOUNT
    full_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="oracle-ns-") as scratch:
        (Path(scratch) / "overlay").mkdir()
        (Path(scratch) / "cpuinfo").write_text(cpuinfo_without_hypervisor(Path("/proc/cpuinfo").read_text()))
        command = [
            unshare, "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private",
            "sh", "-c", _NAMESPACE_SCRIPT, "oracle-namespace",
            str(chroot.root), str(tree.resolve()), scratch, str(chroot.fake_libdrm or ""),
            "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in full_env.items()), *argv,
        ]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


class ToolOutputError(AssertionError):
    pass


def parse_json_output(stdout: str) -> Any:
    """The JSON document in a tool's stdout, skipping lines some tools print ahead of it."""
    decoder = json.JSONDecoder()
    for index, char in enumerate(stdout):
        if char in "{[" and (index == 0 or stdout[index - 1] == "\n"):
            try:
                value, _ = decoder.raw_decode(stdout, index)
                return value
            except json.JSONDecodeError:
                continue
    raise ToolOutputError(f"no JSON document in the output: {stdout[:500]!r}")


def run_json(
    chroot: Chroot, tree: Path, argv: Sequence[str], timeout: float = 120.0, env: Mapping[str, str] | None = None
) -> Any:
    """Run a tool that prints JSON and return it parsed; fail with its stderr if it printed none."""
    result = run_tool(chroot, tree, argv, timeout=timeout, env=env)
    try:
        return parse_json_output(result.stdout)
    except ToolOutputError as error:
        command = " ".join(argv)[:120]
        raise ToolOutputError(
            f"{command} exited with {result.returncode} and printed no JSON; stderr: {result.stderr[-1500:]}"
        ) from error
