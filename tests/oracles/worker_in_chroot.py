"""Run the exporter's own library workers (rocm-smi, amd-smi) inside a test chroot, against a tree.

The daemon starts a worker as `<prefix> <python> -m <worker module> <fds...>`. The prefix built
here enters a private mount namespace, mounts the simulated tree over CHROOT/sys (plus a fresh
proc without the hypervisor flag, private /dev/shm and /tmp, plain files as /dev/dri nodes and,
for sid, the libdrm_amdgpu stand-in), makes our `exporter` package and pyrsmi visible under
CHROOT/mnt, and runs the module with the chroot's own python3 (the host interpreter given by the
daemon is dropped): the chroot's librocm_smi64 / libamd_smi is the one the worker loads. The
worker's pipes and shared memory descriptors pass through unshare and chroot unchanged.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyrsmi

from tests.oracles.runner import FAKE_LIBDRM_MOUNT, Chroot, cpuinfo_without_hypervisor
from tests.realtools import require_root, require_tool

REPO = Path(__file__).resolve().parents[2]
PYRSMI_DIR = Path(pyrsmi.__file__).resolve().parent
ROCM_SMI_IN_CHROOT = "/usr/lib/x86_64-linux-gnu/librocm_smi64.so.1"

# $1 chroot, $2 tree, $3 scratch, $4 exporter package, $5 pyrsmi, $6 libdrm stand-in or "";
# then the daemon's worker command line, whose first word (the host python) is replaced.
_SCRIPT = r"""
set -e
root=$1 tree=$2 scratch=$3 package=$4 pyrsmi=$5 libdrm=$6
shift 6
shift  # the host interpreter: the chroot's python3 runs the worker
mount -t tmpfs tmpfs "$scratch/overlay"
mkdir "$scratch/overlay/upper" "$scratch/overlay/work"
mount -t overlay overlay -o "lowerdir=$tree,upperdir=$scratch/overlay/upper,workdir=$scratch/overlay/work" "$root/sys"
for dir in class/net class/scsi_host devices/system/cpu bus/pci/devices; do mkdir -p "$root/sys/$dir"; done
mount -t proc proc "$root/proc"
mount --bind "$scratch/cpuinfo" "$root/proc/cpuinfo"
mount -t tmpfs tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mkdir -p "$root/dev/dri"
mount -t tmpfs tmpfs "$root/dev/dri"
for node in "$tree"/class/drm/card* "$tree"/class/drm/renderD*; do
  [ -e "$node" ] && : > "$root/dev/dri/${node##*/}"
done
mount -t tmpfs tmpfs "$root/mnt"
mkdir -p "$root/mnt/py/exporter" "$root/mnt/py/pyrsmi" "$root/mnt/rocm/lib" "$root/mnt/libdrm"
mount --bind "$package" "$root/mnt/py/exporter"
mount --bind "$pyrsmi" "$root/mnt/py/pyrsmi"
ln -s @ROCM_SMI@ "$root/mnt/rocm/lib/librocm_smi64.so"
ldpath=""
if [ -n "$libdrm" ]; then mount --bind "$libdrm" "$root/mnt/libdrm"; ldpath=/mnt/libdrm; fi
exec chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin LANG=C.UTF-8 HOME=/root PYTHONPATH=/mnt/py \
  PYTHONDONTWRITEBYTECODE=1 ROCM_PATH=/mnt/rocm LD_LIBRARY_PATH=$ldpath /usr/bin/python3 "$@"
""".replace("@ROCM_SMI@", ROCM_SMI_IN_CHROOT)

assert FAKE_LIBDRM_MOUNT  # the runner's stand-in folder; here it is mounted at /mnt/libdrm instead


class ChrootWorkerPrefix:
    """A worker prefix for one chroot and one tree; keeps its scratch folder until closed."""

    def __init__(self, chroot: Chroot, tree: Path) -> None:
        require_root()
        self._scratch = tempfile.TemporaryDirectory(prefix="worker-chroot-")
        scratch = Path(self._scratch.name)
        (scratch / "overlay").mkdir()
        (scratch / "cpuinfo").write_text(cpuinfo_without_hypervisor(Path("/proc/cpuinfo").read_text()))
        self.argv = [
            require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c", _SCRIPT, "worker-chroot",
            str(chroot.root), str(tree.resolve()), str(scratch), str(REPO / "exporter"), str(PYRSMI_DIR),
            str(chroot.fake_libdrm or ""),
        ]  # fmt: skip

    def close(self) -> None:
        self._scratch.cleanup()
