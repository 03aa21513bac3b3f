"""The sysfs source: the amdgpu kernel ABI read directly, under a configurable root.

One gpu_metrics read per device per cycle supplies most values (one SMU round trip instead of a
dozen hwmon reads); the files of table.py fill the rest, some every cycle, some on the slow
schedule (slow.py). pcie_bw is read by one background thread per device, never on the poll path.

All parsing is delegated to the pure modules gpu_metrics/ and textfiles.py; this package only
finds files, reads them, and assembles a Sample.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample, SourceStats, TopologyLink, frozen_map
from exporter.sources.base import SourceError
from exporter.sources.errors import FileErrors, collecting, record
from exporter.sources.gpu_metrics import GpuMetrics, GpuMetricsError, decode_gpu_metrics
from exporter.sources.identity import assign_packages, measures_package_power
from exporter.sources.sysfs.discovery import Card, identify, list_cards, read_driver_version, read_kfd_topology
from exporter.sources.sysfs.files import read_file_bytes
from exporter.sources.sysfs.slow import PcieBandwidthReader, read_slow_layer
from exporter.sources.sysfs.table import FAST_FILES, GPU_METRICS_FIELDS, MEMORY_POOLS, SampleValues, read_rows
from exporter.threads import DaemonPool

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
        read_timeout: float = 2.0,
    ):
        self.root = str(sysfs_root)
        self.slow_interval = slow_interval
        self.pcie_bw_interval = pcie_bw_interval
        self.read_timeout = read_timeout
        self._slow: dict[str, _SlowLayer] = {}
        self._slow_lock = threading.Lock()
        self._pcie_readers: dict[str, PcieBandwidthReader] = {}
        self._stop = threading.Event()
        # (bdf, file) -> the reason it last failed: logged once per change of state, never per cycle
        self._file_state: dict[tuple[str, str], str] = {}
        self._file_state_lock = threading.Lock()
        # Identity reads: one daemon thread per card at most; a card whose read hangs keeps its thread
        # and is not read again until that read returns (its late answer is used by the next discovery).
        self._identify_pool = DaemonPool(4, "identify")
        self._identifying: dict[str, concurrent.futures.Future[tuple[DeviceIdentity | None, FileErrors]]] = {}
        self._discovery_errors: dict[str, dict[tuple[str, str], int]] = {}  # bdf -> counted on its next read

    def discover(self) -> Sequence[DeviceIdentity]:
        """Every amdgpu card, each identified against the read deadline.

        A card whose identity read does not finish in time (a hung SMU blocks hwmon and gpu_metrics
        reads) is returned with complete=False and only what listing told (BDF, card): the poller
        marks it down instead of reading it, and a later discovery completes it.
        """
        kfd = read_kfd_topology(self.root)
        driver_version = read_driver_version(self.root)
        cards = list_cards(self.root)
        self._identify_pool.resize(len(cards) + 2)
        pending: dict[str, concurrent.futures.Future[tuple[DeviceIdentity | None, FileErrors]]] = {}
        stuck_before: set[str] = set()
        for card in cards:
            running = self._identifying.get(card.bdf)
            if running is None or running.done():
                running = self._identify_pool.submit(self._identify, card, driver_version, kfd)
                self._identifying[card.bdf] = running
            else:
                stuck_before.add(card.bdf)  # still in the read that hung last time: not read again
            pending[card.bdf] = running
        concurrent.futures.wait(pending.values(), timeout=self.read_timeout)
        found: list[DeviceIdentity] = []
        for card in cards:
            future = pending[card.bdf]
            if not future.done():
                if card.bdf not in stuck_before:  # logged once per hang, not once per discovery
                    log.warning("identify_timeout", card=card.name, pci_bus_id=card.bdf, timeout=self.read_timeout)
                found.append(
                    DeviceIdentity(pci_bus_id=card.bdf, card=card.name, device_dir=card.device_dir, complete=False)
                )
                continue
            del self._identifying[card.bdf]
            try:
                identity, errors = future.result()
            except Exception as error:  # a bug or an unexpected OSError: the card is skipped this time
                log.warning("identify_failed", card=card.name, pci_bus_id=card.bdf, error=str(error))
                continue
            if errors.counts:
                with self._file_state_lock:
                    pending_errors = self._discovery_errors.setdefault(card.bdf, {})
                    for key, count in errors.counts.items():
                        pending_errors[key] = pending_errors.get(key, 0) + count
            if identity is not None:
                found.append(identity)
        complete = assign_packages(sorted((d for d in found if d.complete), key=lambda d: d.pci_bus_id))
        return sorted([*complete, *(d for d in found if not d.complete)], key=lambda d: d.pci_bus_id)

    @staticmethod
    def _identify(
        card: Card, driver_version: str, kfd: dict[str, tuple[TopologyLink, ...]]
    ) -> tuple[DeviceIdentity | None, FileErrors]:
        errors = FileErrors(card.device_dir)
        with collecting(errors):
            return identify(card, driver_version, kfd), errors

    def read(self, device: DeviceIdentity) -> Sample:
        dev = device.device_dir
        errors = FileErrors(dev, device.hwmon_dir)
        try:
            with collecting(errors):
                sample = self._read(device)
        except SourceError as error:
            error.file_errors = self._file_errors(device, errors)
            raise
        return dataclasses.replace(sample, file_errors=frozen_map(self._file_errors(device, errors)))

    def _read(self, device: DeviceIdentity) -> Sample:
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
        _check_memory(values)
        if not values.supplied("pcie_bandwidth_bytes_per_second"):
            values.set("pcie_bandwidth_bytes_per_second", None, self._background_pcie_bandwidth(device))
        if not any(values.supplied(name) for name in ("temperatures", "busy", "memory_used_bytes", "power_watts")):
            raise SourceError("read_error", f"{device.card}: no value could be read from {dev}")
        return values.sample(time.time())

    def _file_errors(self, device: DeviceIdentity, errors: FileErrors) -> dict[tuple[str, str], int]:
        """This read's (file, reason) counts (plus the last discovery's), logging each file's change of state."""
        bdf = device.pci_bus_id
        failed = errors.failed_files()
        with self._file_state_lock:
            for file, reason in failed.items():
                if self._file_state.get((bdf, file)) != reason:
                    self._file_state[(bdf, file)] = reason
                    detail = errors.details.get((file, reason), "")
                    log.warning("file_error", pci_bus_id=bdf, card=device.card, file=file, reason=reason, error=detail)
            for file in errors.ok_files():
                if self._file_state.pop((bdf, file), None) is not None:
                    log.info("file_recovered", pci_bus_id=bdf, card=device.card, file=file)
            counts = dict(errors.counts)
            for (file, reason), count in self._discovery_errors.pop(bdf, {}).items():
                counts[(file, reason)] = counts.get((file, reason), 0) + count
                if self._file_state.get((bdf, file)) != reason:  # identity files: read at discovery only
                    self._file_state[(bdf, file)] = reason
                    log.warning("file_error", pci_bus_id=bdf, card=device.card, file=file, reason=reason, error="")
        return counts

    def _read_gpu_metrics(self, device: DeviceIdentity) -> GpuMetrics | None:
        path = os.path.join(device.device_dir, "gpu_metrics")
        blob = read_file_bytes(path)
        if blob is None:
            return None
        try:
            return decode_gpu_metrics(blob)
        except GpuMetricsError as error:
            record(path, "parse", str(error))
            return None

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
        reader.take_errors()
        return reader.bytes_per_second

    def stats(self) -> SourceStats:
        return SourceStats()  # no worker, nothing to count

    def close(self) -> None:
        self._stop.set()
        self._identify_pool.close()


def _check_memory(values: SampleValues) -> None:
    """A pool cannot use more than it holds: such a reading (2^64-1 in mem_info_vram_used) is rejected."""
    for pool, prefix in MEMORY_POOLS:
        used = values.mappings["memory_used_bytes"].get(pool)
        total = values.mappings["memory_total_bytes"].get(pool)
        if used is not None and total is not None and used > total:
            del values.mappings["memory_used_bytes"][pool]
            record(f"{prefix}_used", "implausible", f"{used:g} B used of {total:g} B")
