"""The sysfs source: the amdgpu kernel ABI read directly, under a configurable root.

One gpu_metrics read per device per cycle supplies most values (one SMU round trip instead of a
dozen hwmon reads); the files of table.py fill the rest, some every cycle, some on the slow
schedule (slow.py). pcie_bw is read by one background thread per device, never on the poll path.

All parsing is delegated to the pure modules gpu_metrics/ and textfiles.py; this package only
finds files, reads them, and assembles a Sample.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample, SourceStats, frozen_map
from exporter.sources.base import SourceError
from exporter.sources.gpu_metrics import GpuMetrics, GpuMetricsError
from exporter.sources.gpu_metrics.compiled import decode_gpu_metrics_compiled
from exporter.sources.identity import measures_package_power
from exporter.sources.sysfs.discovery import discover_devices
from exporter.sources.sysfs.files import read_file_bytes
from exporter.sources.sysfs.partitions import (
    PartitionLayout,
    SocketTables,
    partition_busy,
    partition_layouts,
    partition_memory,
    partition_modes_changed,
    residency_seconds,
    throttlers_active,
)
from exporter.sources.sysfs.slow import PcieBandwidthReader, read_slow_layer
from exporter.sources.sysfs.table import FAST_FILES, GPU_METRICS_FIELDS, SampleValues, read_rows

log = get_logger("exporter.sources.sysfs")


@dataclass(frozen=True, slots=True)
class _SlowLayer:
    due: float  # monotonic time of the next refresh
    values: SampleValues  # never mutated once stored


class SysfsSource:
    """Source over a sysfs root (default "/sys"; a simulator's folder in tests and the demo)."""

    name = "sysfs"

    def __init__(
        self,
        sysfs_root: str | Path = "/sys",
        *,
        slow_interval: float = 10.0,
        pcie_bw_interval: float = 30.0,
        socket_table_max_age: float = 0.1,
    ):
        self.root = str(sysfs_root)
        self.slow_interval = slow_interval
        self.pcie_bw_interval = pcie_bw_interval
        self._slow: dict[tuple[str, str, int], _SlowLayer] = {}
        self._slow_lock = threading.Lock()
        self._pcie_readers: dict[str, PcieBandwidthReader] = {}
        self._stop = threading.Event()
        self._warned: set[tuple[str, str]] = set()
        self._residency: dict[tuple[str, str, int], Mapping[str, int]] = {}
        self._sockets = SocketTables(socket_table_max_age)
        self._partitioning: dict[str, PartitionLayout] = {}  # BDF -> how its socket is split now
        self._rediscover = threading.Event()  # a socket's partition mode changed since discovery

    def discover(self) -> Sequence[DeviceIdentity]:
        self._rediscover.clear()
        found = discover_devices(self.root)
        self._partitioning = partition_layouts(self.root, found)
        return found

    def read(self, device: DeviceIdentity) -> Sample:
        dev = device.device_dir
        if not os.path.isdir(dev):
            raise SourceError("gone", f"{dev} no longer exists")
        if device.partition > 0:
            return self._read_partition(device)
        values = SampleValues()
        values.merge(self._slow_layer(device))
        metrics = self._read_gpu_metrics(device)
        if metrics is not None:
            values.override_from(metrics, GPU_METRICS_FIELDS)
            self._throttle_residency(device, metrics, values)
            layout = self._partitioning.get(device.pci_bus_id)
            if layout is not None and layout.count > 1:
                # A partitioned socket: partition 0's gfx (and media) busy are its own, like every
                # partition's, where the table has per-partition blocks; the socket's otherwise.
                values.mappings["busy"].update(partition_busy(metrics, layout, 0))
        layout = self._partitioning.get(device.pci_bus_id)
        values.mappings["memory_total_bytes"].update(partition_memory(layout, 0))
        # Without a usable gpu_metrics table, the per-value files fill in (more SMU trips).
        read_rows(FAST_FILES, device, values)
        if not measures_package_power(device):
            # The second die of an MI250X reads 0 W and 0 J: the package is measured on die 0.
            values.set("power_watts", None, None)
            values.set("energy_joules", None, None)
        if not values.supplied("pcie_bandwidth_bytes_per_second"):
            # No measured bandwidth (MI200): pcie_bw's estimate, under its own name (an upper bound).
            values.set("pcie_bandwidth_upper_bound_bytes_per_second", None, self._background_pcie_bandwidth(device))
        if not any(values.supplied(name) for name in ("temperatures", "busy", "memory_used_bytes", "power_watts")):
            raise SourceError("read_error", f"{device.card}: no value could be read from {dev}")
        return values.sample(time.time())

    def _read_partition(self, device: DeviceIdentity) -> Sample:
        """Partition 1..N-1: only its own values (busy of its XCCs and decoders); the socket-wide
        values live on partition 0. Read from the socket's table, shared with partition 0's read."""
        layout = self._partitioning.get(device.pci_bus_id)
        metrics = self._sockets.recent(device.pci_bus_id)
        if metrics is None:
            socket_dir = os.path.join(self.root, "bus", "pci", "devices", device.pci_bus_id)
            metrics = self._decode(device, read_file_bytes(os.path.join(socket_dir, "gpu_metrics")))
            self._sockets.store(device.pci_bus_id, metrics)
        busy = partition_busy(metrics, layout, device.partition) if metrics is not None and layout else {}
        memory = partition_memory(layout, device.partition)
        return Sample(timestamp=time.time(), busy=frozen_map(busy), memory_total_bytes=frozen_map(memory))

    def _read_gpu_metrics(self, device: DeviceIdentity) -> GpuMetrics | None:
        metrics = self._decode(device, read_file_bytes(os.path.join(device.device_dir, "gpu_metrics")))
        self._sockets.store(device.pci_bus_id, metrics)
        return metrics

    def _decode(self, device: DeviceIdentity, blob: bytes | None) -> GpuMetrics | None:
        if blob is None:
            return None
        try:
            # The per-layout compiled decoder: the same GpuMetrics as decode_gpu_metrics, at a fraction
            # of the poll's CPU (tests hold the two equal on every layout).
            return decode_gpu_metrics_compiled(blob)
        except GpuMetricsError as error:
            self._warn_once(device, "gpu_metrics", str(error))
            return None

    def _throttle_residency(self, device: DeviceIdentity, metrics: GpuMetrics, values: SampleValues) -> None:
        """MI300 v1_6+: residency seconds per throttler; a throttler is active while its residency grows."""
        if not metrics.residency_acc:
            return
        for reason, seconds in residency_seconds(metrics).items():
            values.set("throttle_residency_seconds", reason, seconds)
        previous = self._residency.get(device.key)
        self._residency[device.key] = metrics.residency_acc
        if previous is not None:
            for reason, active in throttlers_active(previous, metrics.residency_acc).items():
                values.set("throttle", reason, active)

    def _warn_once(self, device: DeviceIdentity, what: str, message: str) -> None:
        key = (device.pci_bus_id, what)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("unreadable_file", pci_bus_id=device.pci_bus_id, file=what, error=message)

    def _slow_layer(self, device: DeviceIdentity) -> SampleValues:
        now = time.monotonic()
        with self._slow_lock:
            current = self._slow.get(device.key)
        if current is not None and now < current.due:
            return current.values
        fresh = _SlowLayer(
            due=now + self.slow_interval,
            values=read_slow_layer(device, current.values if current is not None else None),
        )
        if device.compute_partition and not self._rediscover.is_set() and partition_modes_changed(device):
            # SPX -> CPX (or back) re-enumerates the partitions: discovery must run, not wait its turn
            log.info("partition_mode_changed", pci_bus_id=device.pci_bus_id, was=device.compute_partition)
            self._rediscover.set()
        with self._slow_lock:
            self._slow[device.key] = fresh
        log.debug(
            "slow_fields_read",
            pci_bus_id=device.pci_bus_id,
            seconds=round(time.monotonic() - now, 6),
            next_in=self.slow_interval,
        )
        return fresh.values

    def _background_pcie_bandwidth(self, device: DeviceIdentity) -> float | None:
        reader = self._pcie_readers.get(device.pci_bus_id)
        if reader is None:
            path = os.path.join(device.device_dir, "pcie_bw")
            if not os.path.exists(path) or self._stop.is_set():
                return None
            reader = PcieBandwidthReader(path, self.pcie_bw_interval, self._stop)
            self._pcie_readers[device.pci_bus_id] = reader
            reader.start()
        return reader.bytes_per_second

    def needs_rediscovery(self) -> bool:
        """True when a socket's compute or memory partition mode changed since the last discovery
        (checked on the slow schedule): the poller then rediscovers at once."""
        return self._rediscover.is_set()

    def stats(self) -> SourceStats:
        return SourceStats()  # no worker, nothing to count

    def close(self) -> None:
        self._stop.set()
