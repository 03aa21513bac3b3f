"""Snapshot -> /metrics bytes, rendered once per poll cycle with prometheus-client.

A scrape then only sends bytes: its cost does not depend on how many GPUs there are or
whether one of them is hung (see DESIGN.md). Text, OpenMetrics and their gzip forms are all
rendered here, at the end of the cycle, so the HTTP layer never formats anything.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import __version__
from exporter.fastformat import format_families
from exporter.metrics_table import DEVICE_METRICS
from exporter.model import DeviceState, Snapshot

IDENTITY_LABELS = (
    "gpu",
    "card",
    "pci_bus_id",
    "unique_id",
    "serial",
    "product",
    "asic",
    "package",
    "die",
    "vbios",
    "driver",
    "compute_partition",
    "memory_partition",
)

# Exporter-level families (not read from a device sample); listed here so the metric reference
# and the coverage tests see every name the exporter can emit.
EXPORTER_METRICS: tuple[tuple[str, str, str, str], ...] = (  # name, type, labels, help
    ("amdgpu_up", "gauge", "gpu", "1 if the device's last read succeeded within its deadline, else 0."),
    (
        "amdgpu_device_info",
        "gauge",
        ", ".join(IDENTITY_LABELS),
        "Identity of a device (always 1); join on gpu for labels.",
    ),
    ("amdgpu_sample_timestamp_seconds", "gauge", "gpu", "Unix time of the device's latest good sample."),
    ("amdgpu_firmware_info", "gauge", "gpu, block, version", "Firmware version of a block (always 1)."),
    (
        "amdgpu_topology_link_info",
        "gauge",
        "gpu, peer, type, hops, weight",
        "KFD io_link from a device to a peer (always 1).",
    ),
    ("amdgpu_alert_firing", "gauge", "gpu, alert, severity", "1 while an in-daemon alert fires on a device."),
    ("amdgpu_clock_down_suggested_ratio", "gauge", "gpu", "Suggested gfx clock ceiling reduction (0..1)."),
    ("amdgpu_suggested_gfx_clock_max_hertz", "gauge", "gpu", "Suggested gfx clock ceiling."),
    (
        "amdgpu_exporter_build_info",
        "gauge",
        "version, source, source_reason",
        "Exporter version and the source it reads (always 1).",
    ),
    ("amdgpu_exporter_poll_duration_seconds", "histogram", "", "Wall time of one poll cycle of all devices."),
    ("amdgpu_exporter_last_poll_timestamp_seconds", "gauge", "", "Unix time the last poll cycle finished."),
    ("amdgpu_exporter_read_errors_total", "counter", "gpu, reason", "Failed device reads by reason."),
    ("amdgpu_exporter_read_timeouts_total", "counter", "gpu", "Device reads that missed their deadline."),
    ("amdgpu_exporter_worker_restarts_total", "counter", "", "Restarts of the rocm-smi worker process."),
    (
        "amdgpu_exporter_alertmanager_notifications_total",
        "counter",
        "result",
        "Alert pushes to Alertmanager by result.",
    ),
)


_HELP = {name: help_text for name, _, _, help_text in EXPORTER_METRICS}


def all_metric_names() -> list[str]:
    """Every family name /metrics can carry (counters with their _total suffix)."""
    return [spec.exposed_name for spec in DEVICE_METRICS] + [name for name, _, _, _ in EXPORTER_METRICS]


class RenderedMetrics:
    """The /metrics bytes of one snapshot, rendered at most once per format, on first request.

    Prometheus scrapes every 15-60 s while the poller produces a snapshot every second:
    rendering every snapshot eagerly (text and OpenMetrics, ~2,000 series) would spend most of the
    exporter's CPU on bytes nobody reads. A snapshot is rendered when the first scrape after it
    asks for a format, and every later scrape of that snapshot gets the same bytes.
    """

    def __init__(self, source: _SnapshotView) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._cache: dict[tuple[bool, bool], bytes] = {}

    def cached(self, openmetrics: bool, gzipped: bool) -> bytes | None:
        return self._cache.get((openmetrics, gzipped))

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        """The bytes for a format; renders them (blocking, tens of ms) if nobody has yet."""
        key = (openmetrics, gzipped)
        found = self._cache.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                return found
            plain = self._cache.get((openmetrics, False))
            if plain is None:
                plain = format_families(self._source.collect(), openmetrics)
                self._cache[(openmetrics, False)] = plain
            if gzipped:
                # Level 5: most of the size win at a fraction of level 9's CPU.
                self._cache[key] = gzip.compress(plain, compresslevel=5, mtime=0)
            return self._cache[key]

    @property
    def text(self) -> bytes:
        return self.body(False, False)

    @property
    def text_gzip(self) -> bytes:
        return self.body(False, True)

    @property
    def openmetrics(self) -> bytes:
        return self.body(True, False)

    @property
    def openmetrics_gzip(self) -> bytes:
        return self.body(True, True)


@dataclass(slots=True)
class ExporterInfo:
    """Process-level facts exposition needs besides the snapshot."""

    source: str = ""
    source_reason: str = ""
    worker_restarts: int | None = None  # None when the source has no worker
    alertmanager_results: dict[str, int] = field(default_factory=dict)  # result -> count


def _device_info_labels(state: DeviceState) -> list[str]:
    ident = state.identity
    return [
        str(state.gpu),
        ident.card,
        ident.pci_bus_id,
        ident.unique_id,
        ident.serial,
        ident.product,
        ident.asic,
        ident.package,
        str(ident.die),
        ident.vbios,
        ident.driver_version,
        ident.compute_partition,
        ident.memory_partition,
    ]


class _SnapshotView:
    """One snapshot as prometheus-client's generate_latest sees a registry: a collect() of families.

    Immutable per snapshot, so two snapshots can be rendered on different threads safely.
    """

    def __init__(self, snapshot: Snapshot, info: ExporterInfo, extra: CollectorRegistry) -> None:
        self.snapshot = snapshot
        # Copied: ExporterInfo is updated in place by the daemon after each cycle.
        self.info = dataclasses.replace(info, alertmanager_results=dict(info.alertmanager_results))
        # Collected now, not at render time: the poll histogram must describe the same cycles as
        # the snapshot, however late the first scrape renders it.
        self.extra = list(extra.collect())

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        yield from self.extra
        yield from self._device_families(snapshot.devices)
        yield from self._identity_families(snapshot.devices)
        yield from self._alert_families(snapshot)
        yield from self._exporter_families(snapshot)

    def _device_families(self, devices: Iterable[DeviceState]) -> Iterator[Metric]:
        live = [d for d in devices if d.up and d.sample is not None]
        for spec in DEVICE_METRICS:
            family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = family_type(spec.name, spec.help, labels=("gpu", *spec.labels))
            for state in live:
                assert state.sample is not None
                gpu = str(state.gpu)
                for labels, value in spec.values(state.sample):
                    family.add_metric([gpu, *labels], value)
            yield family

    def _identity_families(self, devices: tuple[DeviceState, ...]) -> Iterator[Metric]:
        up = GaugeMetricFamily("amdgpu_up", _HELP["amdgpu_up"], labels=("gpu",))
        info = GaugeMetricFamily("amdgpu_device_info", _HELP["amdgpu_device_info"], labels=IDENTITY_LABELS)
        stamp = GaugeMetricFamily(
            "amdgpu_sample_timestamp_seconds", _HELP["amdgpu_sample_timestamp_seconds"], labels=("gpu",)
        )
        firmware = GaugeMetricFamily(
            "amdgpu_firmware_info", _HELP["amdgpu_firmware_info"], labels=("gpu", "block", "version")
        )
        topology = GaugeMetricFamily(
            "amdgpu_topology_link_info",
            _HELP["amdgpu_topology_link_info"],
            labels=("gpu", "peer", "type", "hops", "weight"),
        )
        errors = CounterMetricFamily(
            "amdgpu_exporter_read_errors",
            _HELP["amdgpu_exporter_read_errors_total"],
            labels=("gpu", "reason"),
        )
        timeouts = CounterMetricFamily(
            "amdgpu_exporter_read_timeouts", _HELP["amdgpu_exporter_read_timeouts_total"], labels=("gpu",)
        )
        gpu_by_bdf = {d.identity.pci_bus_id: str(d.gpu) for d in devices}
        for state in devices:
            gpu = str(state.gpu)
            up.add_metric([gpu], 1.0 if state.up else 0.0)
            info.add_metric(_device_info_labels(state), 1.0)
            if state.sample is not None:
                stamp.add_metric([gpu], state.sample.timestamp)
            for block, version in sorted(state.identity.firmware.items()):
                firmware.add_metric([gpu, block, version], 1.0)
            for link in state.identity.topology:
                peer = gpu_by_bdf.get(link.peer_pci_bus_id, "cpu" if not link.peer_pci_bus_id else link.peer_pci_bus_id)
                topology.add_metric([gpu, peer, link.link_type, str(link.hops), str(link.weight)], 1.0)
            for reason, count in sorted(state.read_errors.items()):
                errors.add_metric([gpu, reason], float(count))
            timeouts.add_metric([gpu], float(state.read_timeouts))
        yield from (up, info, stamp, firmware, topology, errors, timeouts)

    def _alert_families(self, snapshot: Snapshot) -> Iterator[Metric]:
        firing = GaugeMetricFamily(
            "amdgpu_alert_firing", _HELP["amdgpu_alert_firing"], labels=("gpu", "alert", "severity")
        )
        ratio = GaugeMetricFamily(
            "amdgpu_clock_down_suggested_ratio", _HELP["amdgpu_clock_down_suggested_ratio"], labels=("gpu",)
        )
        ceiling = GaugeMetricFamily(
            "amdgpu_suggested_gfx_clock_max_hertz",
            _HELP["amdgpu_suggested_gfx_clock_max_hertz"],
            labels=("gpu",),
        )
        ratio_by_gpu: dict[int, float] = {}
        ceiling_by_gpu: dict[int, float] = {}
        for alert in snapshot.alerts:
            firing.add_metric([str(alert.gpu), alert.alert, alert.severity], 1.0 if alert.firing else 0.0)
            if alert.clock_down_ratio > ratio_by_gpu.get(alert.gpu, 0.0):
                ratio_by_gpu[alert.gpu] = alert.clock_down_ratio
            if alert.suggested_gfx_clock_max_hertz is not None:
                previous = ceiling_by_gpu.get(alert.gpu)
                if previous is None or alert.suggested_gfx_clock_max_hertz < previous:
                    ceiling_by_gpu[alert.gpu] = alert.suggested_gfx_clock_max_hertz
        # Every device gets a ratio series (0 when nothing is suggested) so dashboards and alert
        # expressions do not have to handle absence.
        for state in snapshot.devices:
            ratio.add_metric([str(state.gpu)], ratio_by_gpu.get(state.gpu, 0.0))
        for gpu, hertz in sorted(ceiling_by_gpu.items()):
            ceiling.add_metric([str(gpu)], hertz)
        yield from (firing, ratio, ceiling)

    def _exporter_families(self, snapshot: Snapshot) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            "amdgpu_exporter_build_info",
            _HELP["amdgpu_exporter_build_info"],
            labels=("version", "source", "source_reason"),
        )
        build.add_metric([__version__, self.info.source, self.info.source_reason], 1.0)
        yield build
        last = GaugeMetricFamily(
            "amdgpu_exporter_last_poll_timestamp_seconds",
            _HELP["amdgpu_exporter_last_poll_timestamp_seconds"],
        )
        last.add_metric([], snapshot.taken_at)
        yield last
        if self.info.worker_restarts is not None:
            restarts = CounterMetricFamily(
                "amdgpu_exporter_worker_restarts", _HELP["amdgpu_exporter_worker_restarts_total"]
            )
            restarts.add_metric([], float(self.info.worker_restarts))
            yield restarts
        notifications = CounterMetricFamily(
            "amdgpu_exporter_alertmanager_notifications",
            _HELP["amdgpu_exporter_alertmanager_notifications_total"],
            labels=("result",),
        )
        for result, count in sorted(self.info.alertmanager_results.items()):
            notifications.add_metric([result], float(count))
        yield notifications


class Exposition:
    """Owns the registry; `render(snapshot)` returns the bytes every scrape until the next cycle."""

    def __init__(self, info: ExporterInfo | None = None) -> None:
        self.info = info or ExporterInfo()
        # Live metrics kept by prometheus-client itself (the poll-duration histogram).
        self.registry = CollectorRegistry(auto_describe=False)
        self.poll_duration = Histogram(
            "amdgpu_exporter_poll_duration_seconds",
            _HELP["amdgpu_exporter_poll_duration_seconds"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )

    def render(self, snapshot: Snapshot) -> RenderedMetrics:
        """Cheap: freezes what the bytes will say; the bytes are made on first request."""
        return RenderedMetrics(_SnapshotView(snapshot, self.info, self.registry))
