"""Compute partitions of MI300-class sockets: what each partition reports of its own.

A partitioned socket has one gpu_metrics table, on its PCI device (partition 0). It carries the
socket-wide values (power, energy, temperatures, HBM, PCIe, XGMI), which are exported on partition
0 only so that a sum over a node counts each socket once, and, from v1_6 on, one xcp_stats block
per partition with the busy ratio of that partition's XCCs and decoders. v1.9 tables carry one
device-wide per-XCC array instead; it is split by each partition's XCC count from KFD (num_xcc),
partitions owning consecutive XCCs in index order.

Newer drivers also give each partition its own table, xcp/xcp_metrics (amdgpu_partition_metrics
v1_0 fixed, v1_1 attribute-encoded), with that partition's XCCs and decoders from index 0: where it
is there it is read for the partition, and the socket table's blocks are the fallback.

Reading gpu_metrics costs an SMU round trip, so the partitions of one socket share the table read
for partition 0 in the same poll cycle (kept briefly in the socket's read state, source.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.model import DeviceIdentity
from exporter.sources import textfiles as tf
from exporter.sources.gpu_metrics import GpuMetrics
from exporter.sources.gpu_metrics.decoder import RESIDENCY_REASONS
from exporter.sources.labels import clean_label
from exporter.sources.sysfs.discovery import read_kfd_nodes
from exporter.sources.sysfs.files import listdir, read_parsed

# memory pool of a partition's own VRAM (KFD local memory: its NPS memory partition; in NPS1 every
# partition allocates from the whole VRAM, so this pool is not to be summed over partitions)
PARTITION_VRAM_POOL = "partition_vram"
# The firmware samples its throttlers once per accumulation tick (accumulation_counter): 1 ms.
RESIDENCY_TICK_SECONDS = 1e-3
_COUNTER_WRAP = 1 << 32  # the residency accumulators are u32
V1_9 = "1.9"  # the attribute-encoded table: per-XCC arrays are device-wide, not per partition
# Residency accumulator name -> the `reason` label of the throttle families (the firmware's "thm"
# spelled out: socket_thm -> socket_thermal).
RESIDENCY_LABELS: Mapping[str, str] = {name: name.replace("_thm", "_thermal") for name in RESIDENCY_REASONS}


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    """How one socket is split now: the XCC count of each partition, in partition order, and the
    VRAM each can allocate from (its KFD local memory banks: its NPS memory partition)."""

    xcc_counts: tuple[int, ...]
    memory_bytes: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.xcc_counts)


def partition_layouts(root: str, devices: Iterable[DeviceIdentity]) -> dict[str, PartitionLayout]:
    """BDF -> the layout of each partitionable socket found (from its KFD nodes' num_xcc)."""
    wanted = {d.pci_bus_id for d in devices if d.compute_partition}
    if not wanted:
        return {}
    found: dict[str, dict[int, tuple[int, int]]] = {}  # BDF -> partition -> (XCC count, VRAM bytes)
    for node in read_kfd_nodes(root).values():
        if node.pci_bus_id in wanted:
            found.setdefault(node.pci_bus_id, {})[node.partition] = (node.num_xcc, _local_memory(node.directory))
    layouts = {}
    for bdf, by_partition in found.items():
        parts = [by_partition[p] for p in range(len(by_partition)) if p in by_partition]
        if len(parts) == len(by_partition):  # partitions 0..N-1, none missing
            layouts[bdf] = PartitionLayout(tuple(x for x, _ in parts), tuple(m for _, m in parts))
    return layouts


_KFD_VRAM_HEAPS = (1, 2)  # HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC / _PRIVATE (0 is system memory)


def _local_memory(node_dir: str) -> int:
    """Bytes of a KFD node's VRAM banks."""
    banks = os.path.join(node_dir, "mem_banks")
    total = 0
    for bank in listdir(banks):
        props = read_parsed(os.path.join(banks, bank, "properties"), tf.parse_key_values) or {}
        if props.get("heap_type") in _KFD_VRAM_HEAPS:
            total += props.get("size_in_bytes", 0)
    return total


def partition_memory(layout: PartitionLayout | None, partition: int) -> dict[str, float]:
    """memory_total_bytes of a partitioned socket's partition: the VRAM it allocates from."""
    if layout is None or layout.count < 2 or partition >= len(layout.memory_bytes):
        return {}
    size = layout.memory_bytes[partition]
    return {PARTITION_VRAM_POOL: float(size)} if size else {}


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    """What one partition's tables say of its own XCCs and decoders, each array from its index 0."""

    gfx_busy: tuple[float, ...] = ()  # per XCC, ratio
    vcn_busy: tuple[float, ...] = ()
    jpeg_busy: tuple[float, ...] = ()
    # XCC_COUNTERS key -> per XCC, accumulation_counter ticks (v1_8+)
    xcc_counters: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def _block(metrics: GpuMetrics, index: int) -> PartitionFigures | None:
    """Partition block `index` of a fixed layout (or a partition's own table, index 0)."""
    if len(metrics.partition_gfx_busy) <= index:
        return None

    def at(blocks: tuple[Any, ...], empty: Any) -> Any:
        return blocks[index] if len(blocks) > index else empty

    return PartitionFigures(
        metrics.partition_gfx_busy[index],
        at(metrics.partition_vcn_busy, ()),
        at(metrics.partition_jpeg_busy, ()),
        at(metrics.partition_xcc_counters, {}),
    )


def partition_figures(
    own: GpuMetrics | None, socket: GpuMetrics | None, layout: PartitionLayout | None, partition: int
) -> PartitionFigures | None:
    """A partition's own figures: from its xcp_metrics (`own`) when read, else from the socket's
    gpu_metrics; None when neither has per-partition data (v1_4, v1_5)."""
    if own is not None and (found := _block(own, 0)) is not None:
        return found
    if socket is None:
        return None
    if socket.version != V1_9:
        return _block(socket, partition)
    # v1.9: one device-wide set of per-XCC arrays, the partitions' XCCs in order; its decoder arrays
    # cannot be split (which partition owns a shared decoder is not in the table): one partition only.
    xcc_counts = layout.xcc_counts if layout is not None else ()
    whole = socket.partition_gfx_busy[0] if socket.partition_gfx_busy else ()
    if not xcc_counts:  # not a partitionable socket's layout: the table is the device's own
        xcc_counts = (len(whole),)
    if not whole or partition >= len(xcc_counts) or len(whole) < sum(xcc_counts):
        return None
    first = sum(xcc_counts[:partition])
    span = slice(first, first + xcc_counts[partition])
    counters = socket.partition_xcc_counters[0] if socket.partition_xcc_counters else {}
    alone = len(xcc_counts) == 1
    return PartitionFigures(
        whole[span],
        socket.partition_vcn_busy[0] if alone and socket.partition_vcn_busy else (),
        socket.partition_jpeg_busy[0] if alone and socket.partition_jpeg_busy else (),
        {key: ticks[span] for key, ticks in counters.items() if len(ticks) >= sum(xcc_counts)},
    )


def partition_busy(figures: PartitionFigures | None) -> dict[str, float]:
    """A partition's own busy ratios: gfx (mean of its XCCs) and, where its table says, media (its
    busiest decoder)."""
    busy: dict[str, float] = {}
    if figures is None:
        return busy
    if figures.gfx_busy:
        busy["gfx"] = sum(figures.gfx_busy) / len(figures.gfx_busy)
    if figures.vcn_busy:
        busy["media"] = max(figures.vcn_busy)
    return busy


def xcc_below_host_limit_seconds(figures: PartitionFigures) -> dict[tuple[int, str], float]:
    """(XCC, reason) -> seconds below the host's clock limit: the counters count accumulation ticks (1 ms)."""
    return {
        (xcc, reason): ticks * RESIDENCY_TICK_SECONDS
        for reason, per_xcc in figures.xcc_counters.items()
        for xcc, ticks in enumerate(per_xcc)
    }


def residency_seconds(metrics: GpuMetrics) -> dict[str, float]:
    """Throttler residency counters as seconds (reason label -> seconds since the counters started)."""
    return {RESIDENCY_LABELS[name]: ticks * RESIDENCY_TICK_SECONDS for name, ticks in metrics.residency_acc.items()}


def throttlers_active(previous: Mapping[str, int], current: Mapping[str, int]) -> dict[str, bool]:
    """A throttler was active between two reads when its residency counter moved (u32, may wrap)."""
    return {
        RESIDENCY_LABELS[name]: (ticks - previous[name]) % _COUNTER_WRAP != 0
        for name, ticks in current.items()
        if name in previous
    }


def partition_modes_changed(device: DeviceIdentity) -> bool:
    """Whether the socket's current compute/memory partition files say otherwise than its identity
    (a file that cannot be read now, e.g. -EPERM during the switch, says nothing). Read as discovery
    reads them (clean_label): `SPX\x01` is the SPX discovery found, not a new mode every cycle."""
    known = {"current_compute_partition": device.compute_partition, "current_memory_partition": device.memory_partition}
    return any(
        (now := read_parsed(os.path.join(device.device_dir, name), _mode)) and now != mode
        for name, mode in known.items()
    )


def _mode(text: str) -> str:
    return clean_label(text)[0]
