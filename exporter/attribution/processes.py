"""Which processes use each GPU, and how much: the KFD's per-process files.

/sys/class/kfd/kfd/proc/<pid>/ holds, per GPU the process has opened (named by its KFD gpu_id):
`vram_<gpu_id>` (bytes of VRAM), `sdma_<gpu_id>` (SDMA engine time, microseconds, cumulative),
`stats_<gpu_id>/cu_occupancy` (compute units its waves occupy now) and `queues/<n>/gpuid`. A gpu_id
is matched to a device through the KFD topology: nodes/<n>/gpu_id and the node's properties
(`location_id` = partition << 28 | bus << 8 | device << 3 | function, and `domain`).

Off by default (--collector.processes): one series per process per GPU. Capped at the top N processes
per GPU by VRAM. `comm` comes from /proc/<pid>/comm, so a container needs the host's PID namespace
to name them (hostPID); without it `comm` is "".

The parsers are pure functions over names and bytes; `read_kfd_processes` is the I/O.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter import boundedfile
from exporter.attribution.matching import device_ref_matches
from exporter.attribution.schedule import Scheduled
from exporter.model import ByLocation, DeviceRef, ProcessUsage

SOURCE = "processes"
DEFAULT_TOP = 16
MAX_FILE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ProcessGpuUsage:
    """One process on one GPU (by KFD gpu_id), as its KFD files say."""

    pid: int
    gpu_id: int
    comm: str = ""
    vram_bytes: int | None = None
    sdma_seconds: float | None = None
    cu_occupancy: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessReport:
    up: bool
    usages: tuple[ProcessGpuUsage, ...] = ()
    locations: Mapping[int, ByLocation] | None = None  # gpu_id -> device, from the KFD topology
    compute_units: Mapping[int, int] | None = None  # gpu_id -> its CUs, from the KFD topology
    taken_at: float = 0.0
    error: str = ""


def parse_unsigned(data: bytes | None) -> int | None:
    """'1234\\n' -> 1234; None for a missing file or anything that is not one unsigned decimal integer."""
    if data is None:
        return None
    text = data.strip()
    if not text or len(text) > 20 or not text.isdigit():
        return None
    return int(text)


def parse_properties(data: bytes) -> dict[str, int]:
    """A KFD node's `properties` ('name value' lines) -> {name: value}; malformed lines skipped."""
    result: dict[str, int] = {}
    for line in data.decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit() and len(parts[1]) <= 21:
            result[parts[0]] = int(parts[1])
    return result


def compute_units_of_node(properties_file: bytes) -> int | None:
    """A KFD node's compute units: simd_count / simd_per_cu; None where either is missing or zero."""
    props = parse_properties(properties_file)
    simds, per_cu = props.get("simd_count", 0), props.get("simd_per_cu", 0)
    return simds // per_cu if simds > 0 and per_cu > 0 else None


def location_from_node(gpu_id_file: bytes, properties_file: bytes) -> tuple[int, ByLocation] | None:
    """A KFD topology node -> (gpu_id, the device it is); None for CPU nodes and malformed ones."""
    gpu_id = parse_unsigned(gpu_id_file)
    if not gpu_id:
        return None
    props = parse_properties(properties_file)
    location = props.get("location_id")
    if location is None or location < 0:
        return None
    domain = props.get("domain", 0)
    if not 0 <= domain <= 0xFFFF:
        return None
    bus, device, function = (location >> 8) & 0xFF, (location >> 3) & 0x1F, location & 0x7
    bdf = f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
    return gpu_id, ByLocation(bdf, (location >> 28) & 0xF)


def parse_process(pid: int, files: Mapping[str, bytes], comm: str = "") -> tuple[ProcessGpuUsage, ...]:
    """Pure: one kfd/proc/<pid>/ directory, as {relative path: content}, -> its usage per gpu_id.

    The driver gives a process vram_/sdma_/stats_ files for every GPU of the node once it opens
    /dev/kfd, so a GPU is the process's only if it has a queue there or VRAM allocated there. Values
    that do not parse are None (absent), never a fake zero.
    """
    gpu_ids: set[int] = set()
    for name, data in files.items():
        if name.startswith("vram_") and name[5:].isdigit() and parse_unsigned(data):
            gpu_ids.add(int(name[5:]))
        elif name.startswith("queues/") and name.endswith("/gpuid"):
            queue_gpu = parse_unsigned(data)
            if queue_gpu:
                gpu_ids.add(queue_gpu)
    return tuple(
        ProcessGpuUsage(
            pid,
            gpu_id,
            comm,
            parse_unsigned(files.get(f"vram_{gpu_id}")),
            sdma_us / 1e6 if (sdma_us := parse_unsigned(files.get(f"sdma_{gpu_id}"))) is not None else None,
            parse_unsigned(files.get(f"stats_{gpu_id}/cu_occupancy")),
        )
        for gpu_id in sorted(gpu_ids)
    )


def attribute(
    refs: Sequence[DeviceRef],
    usages: Iterable[ProcessGpuUsage],
    locations: Mapping[int, ByLocation],
    top: int = DEFAULT_TOP,
    compute_units: Mapping[int, int] | None = None,
) -> tuple[ProcessUsage, ...]:
    """Pure: usages matched to the snapshot's devices, the `top` largest by VRAM per device.

    Ties (and processes whose VRAM is unknown, ranked last) are broken by pid, so the choice is stable.
    """
    physical = sorted({ref.pci_bus_id for ref in refs})
    per_gpu: dict[int, list[ProcessUsage]] = {}
    for usage in usages:
        location = locations.get(usage.gpu_id)
        if location is None:
            continue
        cus = (compute_units or {}).get(usage.gpu_id)
        ratio = min(1.0, usage.cu_occupancy / cus) if usage.cu_occupancy is not None and cus else None
        for ref in refs:
            if device_ref_matches(ref, location, physical):
                per_gpu.setdefault(ref.gpu, []).append(
                    ProcessUsage(
                        ref.gpu, usage.pid, usage.comm, usage.vram_bytes, usage.sdma_seconds, usage.cu_occupancy, ratio
                    )
                )
    result: list[ProcessUsage] = []
    for gpu in sorted(per_gpu):
        ranked = sorted(per_gpu[gpu], key=lambda u: (-(u.vram_bytes if u.vram_bytes is not None else -1), u.pid))
        result.extend(ranked[: max(0, top)])
    return tuple(result)


def _read(path: str) -> bytes | None:
    try:
        return boundedfile.read_bytes(path, "KFD file", MAX_FILE_BYTES)
    except boundedfile.FileReadError:  # the process exited while being read, or not a regular file
        return None


def read_topology(sysfs_root: str) -> tuple[dict[int, ByLocation], dict[int, int]]:
    """gpu_id -> device and gpu_id -> compute units, from the KFD topology."""
    nodes_dir = os.path.join(sysfs_root, "class", "kfd", "kfd", "topology", "nodes")
    locations: dict[int, ByLocation] = {}
    compute_units: dict[int, int] = {}
    try:
        nodes = os.listdir(nodes_dir)
    except OSError:
        return locations, compute_units
    for node in nodes:
        gpu_id = _read(os.path.join(nodes_dir, node, "gpu_id"))
        props = _read(os.path.join(nodes_dir, node, "properties"))
        if gpu_id is not None and props is not None and (found := location_from_node(gpu_id, props)):
            locations[found[0]] = found[1]
            if (cus := compute_units_of_node(props)) is not None:
                compute_units[found[0]] = cus
    return locations, compute_units


def _process_files(proc_dir: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    try:
        names = os.listdir(proc_dir)
    except OSError:
        return files
    for name in names:
        if name.startswith(("vram_", "sdma_")):
            if (data := _read(os.path.join(proc_dir, name))) is not None:
                files[name] = data
        elif name.startswith("stats_"):
            if (data := _read(os.path.join(proc_dir, name, "cu_occupancy"))) is not None:
                files[f"{name}/cu_occupancy"] = data
        elif name == "queues":
            try:
                queues = os.listdir(os.path.join(proc_dir, name))
            except OSError:
                continue
            for queue in queues:
                if (data := _read(os.path.join(proc_dir, name, queue, "gpuid"))) is not None:
                    files[f"queues/{queue}/gpuid"] = data
    return files


def read_kfd_processes(sysfs_root: str, procfs_root: str = "/proc") -> tuple[ProcessGpuUsage, ...]:
    """Every process the KFD lists. Processes exiting while being read are skipped."""
    proc_root = os.path.join(sysfs_root, "class", "kfd", "kfd", "proc")
    usages: list[ProcessGpuUsage] = []
    for name in os.listdir(proc_root):  # OSError: the caller reports the source down
        if not name.isdigit():
            continue
        files = _process_files(os.path.join(proc_root, name))
        if not files:
            continue
        comm = (_read(os.path.join(procfs_root, name, "comm")) or b"").decode("utf-8", "replace").strip()
        usages.extend(parse_process(int(name), files, comm))
    return tuple(usages)


class ProcessCollector(Scheduled[ProcessReport]):
    """Reads kfd/proc on its own schedule (a thread); `report` is the latest ProcessReport."""

    def __init__(self, sysfs_root: str = "/sys", procfs_root: str = "/proc", interval: float = 5.0) -> None:
        first = ProcessReport(up=False, error="not read yet")
        super().__init__(SOURCE, interval, first, clock=time.time, describe=sysfs_root, deadline=5.0)
        self.sysfs_root = sysfs_root
        self.procfs_root = procfs_root

    def _take(self, now: float, previous: ProcessReport) -> ProcessReport:
        try:
            usages = read_kfd_processes(self.sysfs_root, self.procfs_root)
            locations, compute_units = read_topology(self.sysfs_root)
        except OSError as error:
            where = os.path.join(self.sysfs_root, "class/kfd/kfd/proc")
            return self._down(now, previous, f"cannot list {where}: {error.strerror}")
        return ProcessReport(True, usages, locations, compute_units, now)

    def _down(self, now: float, previous: ProcessReport, error: str) -> ProcessReport:
        return ProcessReport(False, taken_at=now, error=error)
