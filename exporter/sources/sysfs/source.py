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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample, SourceStats
from exporter.sources.base import SourceError
from exporter.sources.gpu_metrics import GpuMetrics, GpuMetricsError, decode_gpu_metrics
from exporter.sources.identity import measures_package_power
from exporter.sources.sysfs.discovery import discover_devices
from exporter.sources.sysfs.files import read_file_bytes
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

    def __init__(self, sysfs_root: str | Path = "/sys", *, slow_interval: float = 10.0, pcie_bw_interval: float = 30.0):
        self.root = str(sysfs_root)
        self.slow_interval = slow_interval
        self.pcie_bw_interval = pcie_bw_interval
        self._slow: dict[str, _SlowLayer] = {}
        self._slow_lock = threading.Lock()
        self._pcie_readers: dict[str, PcieBandwidthReader] = {}
        self._stop = threading.Event()
        self._warned: set[tuple[str, str]] = set()

    def discover(self) -> Sequence[DeviceIdentity]:
        return discover_devices(self.root)

    def read(self, device: DeviceIdentity) -> Sample:
        dev = device.device_dir
        if not os.path.isdir(dev):
            raise SourceError("gone", f"{dev} no longer exists")
        values = SampleValues()
        values.merge(self._slow_layer(device))
        metrics = self._read_gpu_metrics(device)
        if metrics is not None:
            values.override_from(metrics, GPU_METRICS_FIELDS)
        # Without a usable gpu_metrics table, the per-value files fill in (more SMU trips).
        read_rows(FAST_FILES, device, values)
        if not measures_package_power(device):
            # The second die of an MI250X reads 0 W and 0 J: the package is measured on die 0.
            values.set("power_watts", None, None)
            values.set("energy_joules", None, None)
        if not values.supplied("pcie_bandwidth_bytes_per_second"):
            values.set("pcie_bandwidth_bytes_per_second", None, self._background_pcie_bandwidth(device))
        if not any(values.supplied(name) for name in ("temperatures", "busy", "memory_used_bytes", "power_watts")):
            raise SourceError("read_error", f"{device.card}: no value could be read from {dev}")
        return values.sample(time.time())

    def _read_gpu_metrics(self, device: DeviceIdentity) -> GpuMetrics | None:
        blob = read_file_bytes(os.path.join(device.device_dir, "gpu_metrics"))
        if blob is None:
            return None
        try:
            return decode_gpu_metrics(blob)
        except GpuMetricsError as error:
            self._warn_once(device, "gpu_metrics", str(error))
            return None

    def _warn_once(self, device: DeviceIdentity, what: str, message: str) -> None:
        key = (device.pci_bus_id, what)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("unreadable_file", pci_bus_id=device.pci_bus_id, file=what, error=message)

    def _slow_layer(self, device: DeviceIdentity) -> SampleValues:
        now = time.monotonic()
        with self._slow_lock:
            current = self._slow.get(device.pci_bus_id)
        if current is not None and now < current.due:
            return current.values
        fresh = _SlowLayer(
            due=now + self.slow_interval,
            values=read_slow_layer(device, current.values if current is not None else None),
        )
        with self._slow_lock:
            self._slow[device.pci_bus_id] = fresh
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

    def stats(self) -> SourceStats:
        return SourceStats()  # no worker, nothing to count

    def close(self) -> None:
        self._stop.set()
