"""What each device has: the files its reads may open, learnt once by listing its folders at discovery.

A device lacks many of the files the readers know (MI250X has no board/, a VF no AER files, a host
without debugfs no CPER ring, an older driver no xcp/xcp_metrics): asking for each of them on
every cycle costs an open that fails, hundreds a minute on a node. Discovery lists the folders the
readers read from (a listing opens no attribute, so it wakes no firmware), and the poll path and the
slow layer open only the files found there. A file that appears later is found by the next
discovery: the --discovery-interval schedule, or at once after a partition mode change.

The one file that comes and goes by nature, a reset's devcoredump, is looked up by the reader with
a stat (no open), as it is there for only 5 minutes after a reset.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.model import DeviceIdentity
from exporter.sources.sysfs.files import read_file_bytes


@dataclass(frozen=True, slots=True)
class PresentFiles:
    """The paths below a device's folders that existed at its last discovery."""

    paths: frozenset[str] = frozenset()
    listings: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (folder, its names in listing order)

    def has(self, path: str) -> bool:
        return path in self.paths

    def read(self, path: str) -> bytes | None:
        """read_file_bytes for a file known to exist; None, without opening anything, for one that is not."""
        return read_file_bytes(path) if path in self.paths else None

    def entries(self, folder: str) -> list[str]:
        """The names found in `folder` (what os.listdir gave at discovery)."""
        return list(next((names for found, names in self.listings if found == folder), ()))


def debugfs_dir(device: DeviceIdentity, root: str) -> str:
    """dri/<primary minor> under the root's kernel/debug (debugfs mounted at /sys/kernel/debug)."""
    minor = device.card.removeprefix("card")
    return os.path.join(root, "kernel", "debug", "dri", minor) if minor.isdigit() else ""


def module_parameters(root: str) -> str:
    return os.path.join(root, "module", "amdgpu", "parameters")


def folders_read(device: DeviceIdentity, root: str, partition_dirs: Iterable[str] = ()) -> list[str]:
    """Every folder a read of this PCI device (and of its partitions) opens files in."""
    dev = device.device_dir
    folders = [dev, f"{dev}/board", f"{dev}/ras", f"{dev}/xcp", os.path.dirname(dev), module_parameters(root)]
    if device.hwmon_dir:
        folders.append(device.hwmon_dir)
    debugfs = debugfs_dir(device, root)
    if debugfs:
        folders += [debugfs, f"{debugfs}/ras"]
    folders += [f"{folder}/xcp" for folder in partition_dirs]
    return folders


def probe(device: DeviceIdentity, root: str, partition_dirs: Iterable[str] = ()) -> PresentFiles:
    """List the folders a device's reads use (an absent folder lists as empty; debugfs's top folder,
    mode 0700, lists as empty unless root)."""
    listings = tuple((folder, tuple(_names(folder))) for folder in folders_read(device, root, partition_dirs))
    return PresentFiles(frozenset(f"{folder}/{name}" for folder, names in listings for name in names), listings)


def _names(folder: str) -> list[str]:
    """The folder's entries, sorted; none when it is absent or may not be listed (the reads then have
    nothing there). Sorted: the order a file system lists a folder in (tmpfs: newest first) must not
    decide the order of /metrics' series."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []
