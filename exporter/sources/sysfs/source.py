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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample, SourceStats, frozen_map
from exporter.sources.base import Source, SourceError
from exporter.sources.errors import FileErrors, collecting, record
from exporter.sources.gpu_metrics import GpuMetrics, GpuMetricsError
from exporter.sources.gpu_metrics.compiled import decode_gpu_metrics_compiled
from exporter.sources.identity import measures_package_power
from exporter.sources.sysfs.discovery import Card, Listing, assemble, identify, list_devices
from exporter.sources.sysfs.files import KeptFiles, read_file_bytes
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
from exporter.sources.sysfs.table import (
    FAST_FILES,
    GPU_METRICS_NAMES,
    MEMORY_POOLS,
    RowPlan,
    SampleValues,
    plan_rows,
    read_planned,
)
from exporter.threads import DaemonPool

log = get_logger("exporter.sources.sysfs")

_MEM_BANKS = "mem_banks/properties"  # KFD's memory banks: where a partition's VRAM size comes from


@dataclass(frozen=True, slots=True)
class _SlowLayer:
    due: float  # monotonic time of the next refresh
    values: SampleValues  # never mutated once stored


class _DevicePlan:
    """What a device's every read needs that its identity alone decides: computed once per identity."""

    __slots__ = ("fast_rows", "gpu_metrics", "identity")

    def __init__(self, identity: DeviceIdentity) -> None:
        self.identity = identity
        self.gpu_metrics = os.path.join(identity.device_dir, "gpu_metrics")
        self.fast_rows: RowPlan = plan_rows(FAST_FILES, identity)


class SysfsSource(Source):
    """Source over a sysfs root (default "/sys"; a simulator's folder in tests and the demo)."""

    name = "sysfs"
    # Every value is checked against plausible.py as it is read, and a rejected one is counted
    # against the file it came from: the poller need not judge these samples again.
    values_checked = True

    def __init__(
        self,
        sysfs_root: str | Path = "/sys",
        *,
        slow_interval: float = 10.0,
        pcie_bw_interval: float = 30.0,
        socket_table_max_age: float = 0.1,
        read_timeout: float = 2.0,
    ):
        self.root = str(sysfs_root)
        self.slow_interval = slow_interval
        self.pcie_bw_interval = pcie_bw_interval
        self._slow: dict[tuple[str, str, int], _SlowLayer] = {}
        self._slow_lock = threading.Lock()
        self._pcie_readers: dict[str, PcieBandwidthReader] = {}
        self._stop = threading.Event()
        self.read_timeout = read_timeout
        # (bdf, file) -> the reason it last failed: logged once per change of state, never per cycle
        self._file_state: dict[tuple[str, str], str] = {}
        self._file_state_lock = threading.Lock()
        # Identity reads: one daemon thread per card at most; a card whose read hangs keeps its thread
        # and is not read again until that read returns (its late answer is used by the next discovery).
        self._identify_pool = DaemonPool(4, "identify")
        self._identifying: dict[str, concurrent.futures.Future[tuple[DeviceIdentity | None, FileErrors]]] = {}
        self._discovery_errors: dict[str, dict[tuple[str, str], int]] = {}  # bdf -> counted on its next read
        self._residency: dict[tuple[str, str, int], Mapping[str, int]] = {}
        self._sockets = SocketTables(socket_table_max_age)
        self._partitioning: dict[str, PartitionLayout] = {}  # BDF -> how its socket is split now
        self._rediscover = threading.Event()  # a socket's partition mode changed since discovery
        # Per device: its every-cycle files kept open (files.KeptFiles). A set is handed to one read at
        # a time; close() closes the idle ones and leaves a set in use to the read that holds it.
        self._kept: dict[tuple[str, str, int], KeptFiles] = {}
        self._kept_in_use: set[tuple[str, str, int]] = set()
        self._kept_lock = threading.Lock()
        self._plans: dict[tuple[str, str, int], _DevicePlan] = {}

    def discover(self) -> Sequence[DeviceIdentity]:
        """Every amdgpu device, each PCI card identified against the read deadline.

        A card whose identity read does not finish in time (a hung SMU blocks hwmon and gpu_metrics
        reads) is returned with complete=False and only what listing told (BDF, card): the poller
        marks it down instead of reading it, and a later discovery completes it.
        """
        self._rediscover.clear()
        listing = list_devices(self.root)
        self._identify_pool.resize(len(listing.cards) + 2)
        pending: dict[str, concurrent.futures.Future[tuple[DeviceIdentity | None, FileErrors]]] = {}
        stuck_before: set[str] = set()
        for card in listing.cards:
            running = self._identifying.get(card.bdf)
            if running is None or running.done():
                running = self._identify_pool.submit(self._identify, card, listing)
                self._identifying[card.bdf] = running
            else:
                stuck_before.add(card.bdf)  # still in the read that hung last time: not read again
            pending[card.bdf] = running
        concurrent.futures.wait(pending.values(), timeout=self.read_timeout)
        sockets: list[DeviceIdentity] = []
        incomplete: list[DeviceIdentity] = []
        for card in listing.cards:
            future = pending[card.bdf]
            if not future.done():
                if card.bdf not in stuck_before:  # logged once per hang, not once per discovery
                    log.warning("identify_timeout", card=card.name, pci_bus_id=card.bdf, timeout=self.read_timeout)
                incomplete.append(
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
                sockets.append(identity)
        found = assemble(sockets, listing)
        self._partitioning = partition_layouts(self.root, found)
        self._forget_kept({d.key for d in found} | {d.key for d in incomplete})
        return sorted([*found, *incomplete], key=lambda d: (d.pci_bus_id, d.partition))

    @staticmethod
    def _identify(card: Card, listing: Listing) -> tuple[DeviceIdentity | None, FileErrors]:
        errors = FileErrors(card.device_dir)
        with collecting(errors):
            return identify(card, listing), errors

    def read(self, device: DeviceIdentity) -> Sample:
        errors = FileErrors(device.device_dir, device.hwmon_dir)
        # Naming the files read fine is only needed to log a recovery, so only while something failed.
        errors.track_ok = bool(self._file_state)
        try:
            with collecting(errors):
                read = self._read(device)
        except SourceError as error:
            error.file_errors = self._file_errors(device, errors)
            raise
        file_errors = frozen_map(self._file_errors(device, errors))
        if isinstance(read, Sample):
            return dataclasses.replace(read, file_errors=file_errors)
        values, timestamp = read
        return values.sample(timestamp, file_errors)  # built once: no copy of a finished Sample

    def _file_errors(self, device: DeviceIdentity, errors: FileErrors) -> dict[tuple[str, str], int]:
        """This read's (file, reason) counts (plus the last discovery's), logging each file's change of state."""
        bdf = device.pci_bus_id
        if not errors.counts and not self._file_state and not self._discovery_errors:
            return {}  # the common case: nothing failed now, nothing failing before, nothing pending
        failed = errors.failed_files()
        with self._file_state_lock:
            for file, reason in failed.items():
                if self._file_state.get((bdf, file)) != reason:
                    self._file_state[(bdf, file)] = reason
                    detail = errors.details.get((file, reason), "")
                    log.warning("file_error", pci_bus_id=bdf, card=device.card, file=file, reason=reason, error=detail)
            # Naming the files read fine costs more than the rest of this: only done when one can recover.
            if any(key[0] == bdf for key in self._file_state):
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

    def _read(self, device: DeviceIdentity) -> Sample | tuple[SampleValues, float]:
        """A partition's Sample, or a device's values and the time the read finished."""
        if device.partition > 0:
            if not os.path.isdir(device.device_dir):
                raise SourceError("gone", f"{device.device_dir} no longer exists")
            return self._read_partition(device)
        kept = self._check_out(device)
        try:
            return self._read_device(device, kept)
        finally:
            self._check_in(device, kept)

    def _check_out(self, device: DeviceIdentity) -> KeptFiles | None:
        """This device's kept files for one read; None (read the ordinary way) once the source is
        closed, or while another read of the same device holds them: a set is never shared, so a
        descriptor is never closed under a read in another thread."""
        with self._kept_lock:
            if self._stop.is_set() or device.key in self._kept_in_use:
                return None
            kept = self._kept.get(device.key)
            if kept is None:
                kept = self._kept[device.key] = KeptFiles()
            self._kept_in_use.add(device.key)
            return kept

    def _forget_kept(self, keys: set[tuple[str, str, int]]) -> None:
        """Close the kept files of devices discovery no longer finds (not those a read holds), and drop their plans."""
        with self._kept_lock:
            for key in [k for k in self._kept if k not in keys and k not in self._kept_in_use]:
                self._kept.pop(key).close()
            for key in list(self._plans):  # readers add plans without the lock: iterate a copy
                if key not in keys:
                    self._plans.pop(key, None)

    def _check_in(self, device: DeviceIdentity, kept: KeptFiles | None) -> None:
        if kept is None:
            return  # read the ordinary way: nothing was checked out
        with self._kept_lock:
            self._kept_in_use.discard(device.key)
            if self._stop.is_set():
                kept.close()  # closed while this read ran: its files are closed here, after it

    def _read_device(self, device: DeviceIdentity, kept: KeptFiles | None) -> tuple[SampleValues, float]:
        dev = device.device_dir
        read = kept.read if kept is not None else read_file_bytes
        plan = self._plans.get(device.key)
        if plan is None or plan.identity is not device:  # planned again when discovery refreshes the identity
            plan = self._plans[device.key] = _DevicePlan(device)
        values = SampleValues.copy_of(self._slow_layer(device))
        metrics = self._decode(device, read(plan.gpu_metrics))
        layout = self._partitioning.get(device.pci_bus_id)
        partitioned = layout is not None and layout.count > 1
        if partitioned:
            self._sockets.store(device.pci_bus_id, metrics)  # for the other partitions' reads this cycle
        if metrics is not None:
            values.override_from(metrics, GPU_METRICS_NAMES)
            self._throttle_residency(device, metrics, values)
            if partitioned:
                # A partitioned socket: partition 0's gfx (and media) busy are its own, like every
                # partition's, where the table has per-partition blocks; the socket's otherwise.
                for engine, ratio in partition_busy(metrics, layout, 0).items():
                    values.set("busy", engine, ratio, "gpu_metrics")
        if layout is not None:
            for pool, size in partition_memory(layout, 0).items():
                values.set("memory_total_bytes", pool, size, _MEM_BANKS)
        # Without a usable gpu_metrics table, the per-value files fill in (more SMU trips).
        read_planned(plan.fast_rows, values, read)
        if not measures_package_power(device):
            # The second die of an MI250X reads 0 W and 0 J: the package is measured on die 0.
            values.set("power_watts", None, None)
            values.set("energy_joules", None, None)
        _check_memory(values)
        if values.scalars.get("pcie_bandwidth_bytes_per_second") is None:
            # No measured bandwidth (MI200): pcie_bw's estimate, under its own name (an upper bound).
            estimate = self._background_pcie_bandwidth(device)
            values.set("pcie_bandwidth_upper_bound_bytes_per_second", None, estimate, "pcie_bw")
        mappings = values.mappings
        if not (
            mappings.get("temperatures")
            or mappings.get("busy")
            or mappings.get("memory_used_bytes")
            or values.scalars.get("power_watts") is not None
        ):
            # Asked only now, not before every read: a vanished device reads nothing (ENOENT is "absent").
            if not os.path.isdir(dev):
                raise SourceError("gone", f"{dev} no longer exists")
            raise SourceError("read_error", f"{device.card}: no value could be read from {dev}")
        return values, time.time()

    def _read_partition(self, device: DeviceIdentity) -> Sample:
        """Partition 1..N-1: only its own values (busy of its XCCs and decoders); the socket-wide
        values live on partition 0. Read from the socket's table, shared with partition 0's read."""
        layout = self._partitioning.get(device.pci_bus_id)
        metrics = self._sockets.recent(device.pci_bus_id)
        if metrics is None:
            socket_dir = os.path.join(self.root, "bus", "pci", "devices", device.pci_bus_id)
            metrics = self._decode(device, read_file_bytes(os.path.join(socket_dir, "gpu_metrics")))
            self._sockets.store(device.pci_bus_id, metrics)
        values = SampleValues()
        for engine, ratio in (partition_busy(metrics, layout, device.partition) if metrics and layout else {}).items():
            values.set("busy", engine, ratio, "gpu_metrics")
        for pool, size in partition_memory(layout, device.partition).items():
            values.set("memory_total_bytes", pool, size, _MEM_BANKS)
        return values.sample(time.time())

    def _decode(self, device: DeviceIdentity, blob: bytes | None) -> GpuMetrics | None:
        if blob is None:
            return None
        try:
            # The per-layout compiled decoder: the same GpuMetrics as decode_gpu_metrics, at a fraction
            # of the poll's CPU (tests hold the two equal on every layout).
            return decode_gpu_metrics_compiled(blob)
        except GpuMetricsError as error:
            record("gpu_metrics", "parse", str(error))  # counted, and logged once per change of state
            return None

    def _throttle_residency(self, device: DeviceIdentity, metrics: GpuMetrics, values: SampleValues) -> None:
        """MI300 v1_6+: residency seconds per throttler; a throttler is active while its residency grows."""
        if not metrics.residency_acc:
            return
        for reason, seconds in residency_seconds(metrics).items():
            values.set("throttle_residency_seconds", reason, seconds, "gpu_metrics")
        previous = self._residency.get(device.key)
        self._residency[device.key] = metrics.residency_acc
        if previous is not None:
            for reason, active in throttlers_active(previous, metrics.residency_acc).items():
                values.set("throttle", reason, active)

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
        reader.take_errors()
        return reader.bytes_per_second

    def needs_rediscovery(self) -> bool:
        """True when a socket's compute or memory partition mode changed since the last discovery
        (checked on the slow schedule): the poller then rediscovers at once."""
        return self._rediscover.is_set()

    def stats(self) -> SourceStats:
        return SourceStats()  # no worker, nothing to count

    def close(self) -> None:
        with self._kept_lock:
            self._stop.set()
            for key, kept in self._kept.items():
                if key not in self._kept_in_use:
                    kept.close()
        self._identify_pool.close()


def _check_memory(values: SampleValues) -> None:
    """A pool cannot use more than it holds: such a reading (2^64-1 in mem_info_vram_used) is rejected."""
    used_bytes, total_bytes = values.mappings.get("memory_used_bytes"), values.mappings.get("memory_total_bytes")
    if not used_bytes or not total_bytes:
        return
    for pool, prefix in MEMORY_POOLS:
        used = used_bytes.get(pool)
        total = total_bytes.get(pool)
        if used is not None and total is not None and used > total:
            del used_bytes[pool]
            record(f"{prefix}_used", "implausible", f"{used:g} B used of {total:g} B")
