"""The sysfs source: the amdgpu kernel ABI read directly, under a configurable root.

One gpu_metrics read per device per cycle supplies most values (one SMU round trip instead of a
dozen hwmon reads); the files of table.py fill the rest, some every cycle, some on the slow
schedule (slow.py). pcie_bw is read by one background thread per device, never on the poll path.

All parsing is delegated to the pure modules gpu_metrics/ and textfiles.py; this package only
finds files, reads them, and assembles a Sample.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample
from exporter.sources.base import Source, SourceError
from exporter.sources.errors import FileErrors, collecting, record
from exporter.sources.gpu_metrics import GpuMetrics, GpuMetricsError, decode_gpu_metrics, decode_partition_metrics
from exporter.sources.identity import measures_package_power
from exporter.sources.sysfs.discovery import Card, Listing, assemble, identify, list_devices
from exporter.sources.sysfs.files import KeptFiles, read_file_bytes
from exporter.sources.sysfs.partitions import (
    PartitionFigures,
    PartitionLayout,
    partition_busy,
    partition_figures,
    partition_layouts,
    partition_memory,
    partition_modes_changed,
    residency_seconds,
    throttlers_active,
    xcc_below_host_limit_seconds,
)
from exporter.sources.sysfs.present import PresentFiles, probe
from exporter.sources.sysfs.slow import PcieBandwidthReader, read_slow_layer, read_static_layer
from exporter.sources.sysfs.table import (
    CYCLE_FILES,
    GPU_METRICS_FIELDS,
    MEMORY_POOLS,
    OPTIONAL_FIELDS,
    UNLESS_TOLD,
    RowPlan,
    SampleValues,
    plan_rows,
    read_planned,
)
from exporter.threads import DaemonPool

log = get_logger("exporter.sources.sysfs")

_MEM_BANKS = "mem_banks/properties"  # KFD's memory banks: where a partition's VRAM size comes from
# Seconds partition 0's gpu_metrics table serves the socket's other partitions: one poll cycle's reads.
_SOCKET_TABLE_MAX_AGE = 0.1
PARTITION_METRICS = "xcp/xcp_metrics"  # a partition's own table, below its device folder (newer drivers)


@dataclass(eq=False, slots=True)
class DeviceReadState:
    """What the source keeps between reads of one PCI device (a socket, with its partitions).

    Made by discovery, closed whole when discovery no longer finds the device (or finds another
    board in its slot). Its kept files are handed to one read at a time (`in_use`): a second,
    concurrent read of the device reads the ordinary way, so no descriptor is closed under a read,
    and a set closed while a read holds it is closed by that read when it is done.
    """

    unique_id: str
    present: PresentFiles = field(default_factory=PresentFiles)  # the files discovery found: no other is opened
    socket_dir: str = ""  # partition 0's device folder (the socket's gpu_metrics, for the other partitions)
    kept: KeptFiles = field(default_factory=KeptFiles)
    in_use: bool = False
    closed: bool = False
    plan: RowPlan | None = None  # the every-cycle rows planned for this identity, its files and the fields wanted
    slow: SampleValues | None = None  # the slow layer, never mutated once stored
    # The slow layer's static rows, read once after each discovery, with what they were read for
    # (the identity and the fields skipped); never mutated once stored.
    static: tuple[object, SampleValues] | None = None
    slow_due: float = 0.0  # monotonic time of its next refresh
    residency: Mapping[str, int] | None = None  # the last read's throttler residency counters
    layout: PartitionLayout | None = None  # how the socket is split now
    socket_table: tuple[float, GpuMetrics | None] | None = None  # (monotonic, table) for the partitions' reads
    stop: threading.Event = field(default_factory=threading.Event)  # ends the pcie_bw reader
    pcie: PcieBandwidthReader | None = None
    failing: dict[str, str] = field(default_factory=dict)  # file -> the reason it last failed: logged per change
    discovery_errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # counted by the next read

    def close(self) -> None:
        """Stop the pcie_bw reader (its thread ends once its current read returns) and close the
        kept files, unless a read holds them: that read closes them when it is done."""
        self.closed = True
        self.stop.set()
        if not self.in_use:
            self.kept.close()


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
        read_timeout: float = 2.0,
        wanted: frozenset[str] | None = None,
    ):
        self.root = str(sysfs_root)
        # The optional Sample fields not read (table.OPTIONAL_FIELDS no family shown reads: the
        # MI350-class board sensors, per-XCC detail, ...); without `wanted`, table.UNLESS_TOLD.
        self.skip: frozenset[str] = frozenset()
        self.want(wanted)
        self.slow_interval = slow_interval
        self.pcie_bw_interval = pcie_bw_interval
        self.read_timeout = read_timeout
        self._devices: dict[str, DeviceReadState] = {}  # BDF -> its state; made and dropped by discover()
        self._lock = threading.Lock()  # guards _devices and each state's in_use, closed, pcie and failing
        # Identity reads: one daemon thread per card at most; a card whose read hangs keeps its thread
        # and is not read again until that read returns (its late answer is used by the next discovery).
        self._identify_pool = DaemonPool(4, "identify")
        self._identifying: dict[str, concurrent.futures.Future[tuple[DeviceIdentity | None, FileErrors]]] = {}
        self._rediscover = threading.Event()  # a socket's partition mode changed since discovery

    def want(self, wanted: frozenset[str] | None) -> None:
        """Read only the optional fields of `wanted` (the Sample fields the shown families are made of)
        from the next read on; None: those of table.UNLESS_TOLD."""
        self.skip = OPTIONAL_FIELDS - (UNLESS_TOLD if wanted is None else wanted)

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
        for card in listing.cards:
            running = self._identifying.get(card.bdf)
            if running is None or running.done():
                running = self._identify_pool.submit(self._identify, card, listing)
            pending[card.bdf] = running
        concurrent.futures.wait(pending.values(), timeout=self.read_timeout)
        sockets: list[DeviceIdentity] = []
        incomplete: list[DeviceIdentity] = []
        errors_of: dict[str, FileErrors] = {}
        for card in listing.cards:
            future = pending[card.bdf]
            if not future.done():
                if future is not self._identifying.get(card.bdf):  # logged once per hang, not per discovery
                    log.warning("identify_timeout", card=card.name, pci_bus_id=card.bdf, timeout=self.read_timeout)
                incomplete.append(
                    DeviceIdentity(pci_bus_id=card.bdf, card=card.name, device_dir=card.device_dir, complete=False)
                )
                continue
            try:
                identity, errors_of[card.bdf] = future.result()
            except Exception as error:  # a bug or an unexpected OSError: the card is skipped this time
                log.warning("identify_failed", card=card.name, pci_bus_id=card.bdf, error=str(error))
                continue
            if identity is not None:
                sockets.append(identity)
        self._identifying = {bdf: future for bdf, future in pending.items() if not future.done()}
        found = assemble(sockets, listing)
        self._keep_states(found, {d.pci_bus_id for d in incomplete}, partition_layouts(self.root, found), errors_of)
        return sorted([*found, *incomplete], key=lambda d: (d.pci_bus_id, d.partition))

    def _keep_states(
        self,
        found: Sequence[DeviceIdentity],
        incomplete: set[str],
        layouts: Mapping[str, PartitionLayout],
        errors_of: Mapping[str, FileErrors],
    ) -> None:
        """A state for every device found, with the files it has; the states of devices gone (or
        replaced in their slot) closed."""
        partition_dirs: dict[str, list[str]] = {}
        for device in found:
            if device.partition > 0:
                partition_dirs.setdefault(device.pci_bus_id, []).append(device.device_dir)
        present = {
            device.pci_bus_id: probe(device, self.root, partition_dirs.get(device.pci_bus_id, ()))
            for device in found
            if device.partition == 0
        }
        with self._lock:
            states = {}
            for device in found:
                if device.partition > 0:
                    continue
                bdf = device.pci_bus_id
                state = self._devices.pop(bdf, None)
                if state is not None and device.unique_id and state.unique_id not in ("", device.unique_id):
                    state.close()  # another board in the same slot starts afresh
                    state = None
                if state is None:
                    state = DeviceReadState(device.unique_id)
                states[bdf] = state
                state.layout = layouts.get(bdf)
                state.present, state.socket_dir = present[bdf], device.device_dir
                state.static = None  # read again after each discovery
                if bdf in errors_of:
                    state.discovery_errors.update(errors_of[bdf].counts)
            for bdf in incomplete & self._devices.keys():  # not read until identified: kept as they are
                states[bdf] = self._devices.pop(bdf)
            for state in self._devices.values():
                state.close()
            self._devices = states

    @staticmethod
    def _identify(card: Card, listing: Listing) -> tuple[DeviceIdentity | None, FileErrors]:
        errors = FileErrors(card.device_dir)
        with collecting(errors):
            return identify(card, listing), errors

    def read(self, device: DeviceIdentity) -> Sample:
        state = self._devices.get(device.pci_bus_id)
        if state is None:
            raise SourceError("gone", f"{device.pci_bus_id} was not found by the last discovery")
        errors = FileErrors(device.device_dir, device.hwmon_dir)
        # Naming the files read fine is only needed to log a recovery, so only while something failed.
        errors.track_ok = bool(state.failing)
        try:
            with collecting(errors):
                read = self._read(device, state)
        except SourceError as error:
            error.file_errors = self._file_errors(device, state, errors)
            raise
        values, timestamp = read
        return values.sample(timestamp, self._file_errors(device, state, errors))  # built once, never copied

    def _file_errors(
        self, device: DeviceIdentity, state: DeviceReadState, errors: FileErrors
    ) -> dict[tuple[str, str], int]:
        """This read's (file, reason) counts (plus the last discovery's), logging each file's change of state."""
        if not errors.counts and not state.failing and not state.discovery_errors:
            return {}  # the common case: nothing failed now, nothing failing before, nothing pending
        with self._lock:
            # identity files, read at discovery only, are counted by the device's next read
            errors.counts = dict(Counter(errors.counts) + state.discovery_errors)
            state.discovery_errors = Counter()
            failing = state.failing
            for file, reason in errors.failed_files().items():
                if failing.get(file) != reason:
                    failing[file] = reason
                    log.warning(
                        "file_error",
                        pci_bus_id=device.pci_bus_id,
                        card=device.card,
                        file=file,
                        reason=reason,
                        error=errors.details.get((file, reason), ""),
                    )
            if failing:  # naming the files read fine costs more than the rest of this: only when one can recover
                for file in errors.ok_files():
                    if failing.pop(file, None) is not None:
                        log.info("file_recovered", pci_bus_id=device.pci_bus_id, card=device.card, file=file)
        return errors.counts

    def _read(self, device: DeviceIdentity, state: DeviceReadState) -> tuple[SampleValues, float]:
        """A device's (or partition's) values and the time the read finished."""
        if device.partition > 0:
            if not os.path.isdir(device.device_dir):
                raise SourceError("gone", f"{device.device_dir} no longer exists")
            return self._read_partition(device, state)
        with self._lock:
            holds = not (state.in_use or state.closed)
            state.in_use = state.in_use or holds
        try:
            return self._read_device(device, state, state.kept.read if holds else read_file_bytes)
        finally:
            if holds:
                with self._lock:
                    state.in_use = False
                    if state.closed:
                        state.kept.close()  # closed while this read ran: its files are closed here, after it

    def _read_device(
        self, device: DeviceIdentity, state: DeviceReadState, read: Callable[[str], bytes | None]
    ) -> tuple[SampleValues, float]:
        dev = device.device_dir
        present, skip = state.present, self.skip
        plan = state.plan
        if plan is None or plan.key != (device, present, skip):  # planned again when discovery refreshes the device
            rows = [row for row in CYCLE_FILES if row.field not in skip]
            plan = state.plan = plan_rows(rows, device, present.has, key=(device, present, skip))
        values = SampleValues.copy_of(self._slow_layer(device, state))
        table = os.path.join(dev, "gpu_metrics")
        metrics = _decode(read(table)) if present.has(table) else None
        layout = state.layout
        partitioned = layout is not None and layout.count > 1
        if partitioned:
            state.socket_table = (time.monotonic(), metrics)  # for the other partitions' reads this cycle
        if metrics is not None:
            values.override_from(metrics, GPU_METRICS_FIELDS)
            self._throttle_residency(state, metrics, values)
        own = None
        own_table = os.path.join(dev, PARTITION_METRICS)
        if present.has(own_table) and (layout is not None or (metrics is not None and metrics.partition_gfx_busy)):
            own = _decode(read(own_table), PARTITION_METRICS)
        figures = partition_figures(own, metrics, layout, 0)
        if figures is not None:
            origin = PARTITION_METRICS if own is not None else "gpu_metrics"
            if partitioned:
                # A partitioned socket: partition 0's gfx (and media) busy are its own, like every
                # partition's, where a table has per-partition data; the socket's otherwise.
                for engine, ratio in partition_busy(figures).items():
                    values.set("busy", engine, ratio, origin)
            self._xcc_values(figures, values, origin)
        for pool, size in partition_memory(layout, 0).items():
            values.set("memory_total_bytes", pool, size, _MEM_BANKS)
        # Without a usable gpu_metrics table, the per-value files fill in (more SMU trips).
        read_planned(plan, values, read)
        if not measures_package_power(device):
            # The second die of an MI250X reads 0 W and 0 J: the package is measured on die 0.
            values.set("power_watts", None, None)
            values.set("energy_joules", None, None)
        _check_memory(values)
        if values.scalars.get("pcie_bandwidth_bytes_per_second") is None:
            # No measured bandwidth (MI200): pcie_bw's estimate, under its own name (an upper bound).
            estimate = self._background_pcie_bandwidth(device, state)
            values.set("pcie_bandwidth_upper_bound_bytes_per_second", None, estimate, "pcie_bw")
        if not any(values.supplied(name) for name in ("temperatures", "busy", "memory_used_bytes", "power_watts")):
            # Asked only now, not before every read: a vanished device reads nothing (ENOENT is "absent").
            if not os.path.isdir(dev):
                raise SourceError("gone", f"{dev} no longer exists")
            raise SourceError("read_error", f"{device.card}: no value could be read from {dev}")
        return values, time.time()

    def _read_partition(self, device: DeviceIdentity, state: DeviceReadState) -> tuple[SampleValues, float]:
        """Partition 1..N-1: only its own values (busy of its XCCs and decoders); the socket-wide
        values live on partition 0. Read from the socket's table, shared with partition 0's read."""
        layout, present = state.layout, state.present
        own_table = os.path.join(device.device_dir, PARTITION_METRICS)
        own = _decode(read_file_bytes(own_table), PARTITION_METRICS) if present.has(own_table) else None
        metrics = None
        if own is None:  # no table of its own: its block of the socket's table
            shared = state.socket_table
            fresh = shared is not None and time.monotonic() - shared[0] <= _SOCKET_TABLE_MAX_AGE
            metrics = shared[1] if shared is not None and fresh else None
            socket_table = os.path.join(state.socket_dir, "gpu_metrics")
            if metrics is None and present.has(socket_table):
                metrics = _decode(read_file_bytes(socket_table))
                state.socket_table = (time.monotonic(), metrics)
        values = SampleValues()
        figures = partition_figures(own, metrics, layout, device.partition) if layout else None
        if figures is not None:
            origin = PARTITION_METRICS if own is not None else "gpu_metrics"
            for engine, ratio in partition_busy(figures).items():
                values.set("busy", engine, ratio, origin)
            self._xcc_values(figures, values, origin)
        for pool, size in partition_memory(layout, device.partition).items():
            values.set("memory_total_bytes", pool, size, _MEM_BANKS)
        return values, time.time()

    def _xcc_values(self, figures: PartitionFigures, values: SampleValues, origin: str) -> None:
        """Per-XCC busy, per-engine decoder busy and the host-limit counters, each unless skipped."""
        skip = self.skip
        if "xcc_busy" not in skip:
            for xcc, ratio in enumerate(figures.gfx_busy):
                values.set("xcc_busy", xcc, ratio, origin)
        if "media_engine_busy" not in skip:
            for engine, ratios in (("vcn", figures.vcn_busy), ("jpeg", figures.jpeg_busy)):
                for instance, ratio in enumerate(ratios):
                    values.set("media_engine_busy", (engine, instance), ratio, origin)
        if "xcc_below_host_limit_seconds" not in skip:
            for key, seconds in xcc_below_host_limit_seconds(figures).items():
                values.set("xcc_below_host_limit_seconds", key, seconds, origin)

    @staticmethod
    def _throttle_residency(state: DeviceReadState, metrics: GpuMetrics, values: SampleValues) -> None:
        """MI300 v1_6+: residency seconds per throttler; a throttler is active while its residency grows."""
        if not metrics.residency_acc:
            return
        for reason, seconds in residency_seconds(metrics).items():
            values.set("throttle_residency_seconds", reason, seconds, "gpu_metrics")
        previous, state.residency = state.residency, metrics.residency_acc
        if previous is not None:
            for reason, active in throttlers_active(previous, metrics.residency_acc).items():
                values.set("throttle", reason, active)

    def _slow_layer(self, device: DeviceIdentity, state: DeviceReadState) -> SampleValues:
        now = time.monotonic()
        if state.slow is not None and now < state.slow_due:
            return state.slow
        kept, key = state.static, (device, self.skip)
        if kept is not None and kept[0] == key:
            static = kept[1]
        else:
            static, complete = read_static_layer(device, state.present, self.skip)
            state.static = (key, static) if complete else None
        fresh = read_slow_layer(device, state.slow, self.root, present=state.present, skip=self.skip, static=static)
        if device.compute_partition and not self._rediscover.is_set() and partition_modes_changed(device):
            # SPX -> CPX (or back) re-enumerates the partitions: discovery must run, not wait its turn
            log.info("partition_mode_changed", pci_bus_id=device.pci_bus_id, was=device.compute_partition)
            self._rediscover.set()
        state.slow, state.slow_due = fresh, now + self.slow_interval
        log.debug(
            "slow_fields_read",
            pci_bus_id=device.pci_bus_id,
            seconds=round(time.monotonic() - now, 6),
            next_in=self.slow_interval,
        )
        return fresh

    def _background_pcie_bandwidth(self, device: DeviceIdentity, state: DeviceReadState) -> float | None:
        if state.pcie is None:
            path = os.path.join(device.device_dir, "pcie_bw")
            if not state.present.has(path):
                return None
            with self._lock:  # one reader per device, never one for a closed state
                if state.closed:
                    return None
                if state.pcie is None:
                    state.pcie = PcieBandwidthReader(path, self.pcie_bw_interval, state.stop)
                    state.pcie.start()
        state.pcie.take_errors()
        return state.pcie.bytes_per_second

    def needs_rediscovery(self) -> bool:
        """True when a socket's compute or memory partition mode changed since the last discovery
        (checked on the slow schedule): the poller then rediscovers at once."""
        return self._rediscover.is_set()

    def close(self) -> None:
        with self._lock:  # a read after this reads the ordinary way
            for state in self._devices.values():
                state.close()
        self._identify_pool.close()


def _decode(blob: bytes | None, file: str = "gpu_metrics") -> GpuMetrics | None:
    if blob is None:
        return None
    try:
        return decode_partition_metrics(blob) if file == PARTITION_METRICS else decode_gpu_metrics(blob)
    except GpuMetricsError as error:
        record(file, "parse", str(error))  # counted, and logged once per change of state
        return None


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
