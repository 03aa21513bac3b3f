"""The metric table: every metric the exporter serves, declared once — the exporter's own included.

Adding a metric is adding one entry to METRICS. Rendering (render.py), the README's metric
reference (metrics_reference.py), the rules' vocabulary of watchable values (alerting/watch.py),
the naming test and the dashboards' coverage test all read this table; nothing else lists names.

An entry's getter reads one Published (snapshot + alerts + exporter stats) and yields
(label values, value) pairs; it yields nothing for what is not supplied (absent, never a fake zero).
The table is in /metrics order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from exporter import __version__
from exporter.model import STAGES, DeviceState, FastStats, Histogram, Published, Sample, WebStats

Kind = Literal["gauge", "counter", "histogram"]
LabelledValue = tuple[tuple[str, ...], float]
SampleGetter = Callable[[Sample], Iterable[LabelledValue]]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family.

    `name` is the family name without `_total` (prometheus-client appends it to counters);
    `unit` is the base unit the name ends in ("" for counts, widths, states and info series) —
    documentation only, never a `# UNIT` line; `labels` are all of the family's labels, in order.
    A per-device family read from each device's latest sample also keeps that `sample_getter`
    (labels after `gpu`), which alert rules read values through.
    """

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...]
    values: Callable[[Published], Iterable[LabelledValue]]
    sample_getter: SampleGetter | None = None
    histogram: Callable[[Published], Histogram] | None = None  # for kind "histogram" (values yields nothing)
    omit_when_empty: bool = False  # no family at all without series (it does not apply to this exporter)
    # With attribution on, a family whose first label is `gpu` gets the attribution labels (pod, ...,
    # job_id, ...) after its own; False for the families that carry them already.
    attributed: bool = True

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name


def device(
    name: str, kind: Kind, unit: str, help_text: str, labels: tuple[str, ...], getter: SampleGetter
) -> MetricSpec:
    """A family with one group of series per device that is up, read from its latest sample."""

    def values(published: Published) -> Iterator[LabelledValue]:
        for state in published.snapshot.devices:
            if state.up and state.sample is not None:
                gpu = str(state.gpu)
                for labels, value in getter(state.sample):
                    yield (gpu, *labels), value

    return MetricSpec(name, kind, unit, help_text, ("gpu", *labels), values, sample_getter=getter)


def _scalar(attr: str) -> SampleGetter:
    def values(sample: Sample) -> Iterable[LabelledValue]:
        value = getattr(sample, attr)
        if value is not None:
            yield (), float(value)

    return values


def _mapping(attr: str) -> SampleGetter:
    def values(sample: Sample) -> Iterable[LabelledValue]:
        for key, value in getattr(sample, attr).items():
            labels = tuple(str(k) for k in key) if isinstance(key, tuple) else (str(key),)
            yield labels, float(value)

    return values


def _pcie_naks(sample: Sample) -> Iterable[LabelledValue]:
    if sample.pcie_naks_sent is not None:
        yield ("sent",), float(sample.pcie_naks_sent)
    if sample.pcie_naks_received is not None:
        yield ("received",), float(sample.pcie_naks_received)


# --- the exporter's own families: getters over the whole Published ---------------------------------

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
    "partition",
    "vbios",
    "driver",
    "compute_partition",
    "memory_partition",
)


# The DeviceIdentity field of each label after `gpu`, in order.
_IDENTITY_FIELDS = tuple("driver_version" if label == "driver" else label for label in IDENTITY_LABELS[1:])


def _device_info(published: Published) -> Iterator[LabelledValue]:
    for state in published.snapshot.devices:
        yield (str(state.gpu), *(str(getattr(state.identity, name)) for name in _IDENTITY_FIELDS)), 1.0


def _per_state(get: Callable[[DeviceState], Iterable[LabelledValue]]) -> Callable[[Published], Iterator[LabelledValue]]:
    """Every device (up or not), `gpu` first."""

    def values(published: Published) -> Iterator[LabelledValue]:
        for state in published.snapshot.devices:
            for labels, value in get(state):
                yield (str(state.gpu), *labels), value

    return values


def _up(state: DeviceState) -> Iterable[LabelledValue]:
    yield (), 1.0 if state.up else 0.0


def _down_reason(state: DeviceState) -> Iterable[LabelledValue]:
    # A family of its own, not a label of amdgpu_up: a changing reason must not give amdgpu_up a new series.
    if not state.up:
        yield (state.down_reason or "unknown",), 1.0


def _sample_timestamp(state: DeviceState) -> Iterable[LabelledValue]:
    if state.sample is not None:
        yield (), state.sample.timestamp


def _firmware(state: DeviceState) -> Iterable[LabelledValue]:
    for block, version in sorted(state.identity.firmware.items()):
        yield (block, version), 1.0


def _topology(published: Published) -> Iterator[LabelledValue]:
    devices = published.snapshot.devices
    gpu_by_device = {(d.identity.pci_bus_id, d.identity.partition): str(d.gpu) for d in devices}
    for state in devices:
        if state.identity.partition > 0:
            continue
        for link in state.identity.topology:
            if link.peer_partition > 0 or (link.peer_pci_bus_id == state.identity.pci_bus_id):
                # KFD links every partition to every other one (64 x 63 on a CPX node): they share
                # their socket's links, so the socket's are exported once, from partition 0 to partition 0.
                continue
            peer = gpu_by_device.get(
                (link.peer_pci_bus_id, link.peer_partition),
                "cpu" if not link.peer_pci_bus_id else link.peer_pci_bus_id,
            )
            yield (str(state.gpu), peer, link.link_type, str(link.hops), str(link.weight)), 1.0


def _read_errors(state: DeviceState) -> Iterable[LabelledValue]:
    for reason, count in sorted(state.read_errors.items()):
        yield (reason,), float(count)


def _file_errors(state: DeviceState) -> Iterable[LabelledValue]:
    for (file, reason), count in sorted(state.file_errors.items()):
        yield (file, reason), float(count)


def _present(state: DeviceState) -> Iterable[LabelledValue]:
    yield (), 1.0 if state.present else 0.0


def _discoveries(published: Published) -> Iterator[LabelledValue]:
    yield ("failed",), float(published.snapshot.discovery_failures)
    yield ("ok",), float(published.snapshot.discoveries)


def _stage_failures(published: Published) -> Iterator[LabelledValue]:
    failures = published.stats.stage_failures
    for stage in STAGES:
        yield (stage,), float(failures.get(stage, 0))


def _read_timeouts(state: DeviceState) -> Iterable[LabelledValue]:
    yield (), float(state.read_timeouts)


def _alert_firing(published: Published) -> Iterator[LabelledValue]:
    for alert in published.alerts:
        yield (str(alert.gpu), alert.alert, alert.severity), 1.0 if alert.firing else 0.0


def _clock_down_ratio(published: Published) -> Iterator[LabelledValue]:
    # The largest suggested reduction of a device's alerts. Every device gets a series (0 when
    # nothing is suggested) so dashboards and alert expressions do not have to handle absence.
    ratio_by_gpu: dict[int, float] = {}
    for alert in published.alerts:
        if alert.clock_down_ratio > ratio_by_gpu.get(alert.gpu, 0.0):
            ratio_by_gpu[alert.gpu] = alert.clock_down_ratio
    for state in published.snapshot.devices:
        yield (str(state.gpu),), ratio_by_gpu.get(state.gpu, 0.0)


def _suggested_ceiling(published: Published) -> Iterator[LabelledValue]:
    # The lowest suggested gfx clock ceiling of a device's alerts; no series when none is suggested.
    ceiling_by_gpu: dict[int, float] = {}
    for alert in published.alerts:
        hertz = alert.suggested_gfx_clock_max_hertz
        if hertz is not None and (alert.gpu not in ceiling_by_gpu or hertz < ceiling_by_gpu[alert.gpu]):
            ceiling_by_gpu[alert.gpu] = hertz
    for gpu, hertz in sorted(ceiling_by_gpu.items()):
        yield (str(gpu),), hertz


def _build_info(published: Published) -> Iterator[LabelledValue]:
    yield (__version__, published.stats.source, published.stats.source_reason), 1.0


def _driver_info(published: Published) -> Iterator[LabelledValue]:
    host = published.stats.host
    if host is not None:
        yield (host.driver_version, host.driver_initstate, host.kernel_release, host.ppfeaturemask), 1.0


def _rocm_info(published: Published) -> Iterator[LabelledValue]:
    host = published.stats.host
    for path, version in host.rocm if host is not None else ():
        yield (version, path), 1.0


def _smi_library_info(published: Published) -> Iterator[LabelledValue]:
    host = published.stats.host
    for library, version in host.smi_libraries if host is not None else ():
        yield (library, version), 1.0


def _last_poll(published: Published) -> Iterator[LabelledValue]:
    yield (), published.snapshot.taken_at


def _worker_restarts(published: Published) -> Iterator[LabelledValue]:
    restarts = published.snapshot.source_stats.worker_restarts
    if restarts is not None:
        yield (), float(restarts)


def _alertmanager_notifications(published: Published) -> Iterator[LabelledValue]:
    stats = published.stats.alertmanager
    if stats is not None:
        yield ("failed",), float(stats.failed)
        yield ("sent",), float(stats.sent)


def _process(sample_name: str) -> Callable[[Published], Iterator[LabelledValue]]:
    def values(published: Published) -> Iterator[LabelledValue]:
        value = published.stats.process.values.get(sample_name)
        if value is not None:
            yield (), value

    return values


def _pcie_link_max(state: DeviceState) -> Iterable[LabelledValue]:
    if state.up and state.pcie_link_max_bytes_per_second is not None:
        yield (), state.pcie_link_max_bytes_per_second


_STATS = (("min", "minimum"), ("max", "maximum"), ("mean", "mean"))


def _window(family: str, keyed: bool) -> Callable[[Published], Iterator[LabelledValue]]:
    """One window family: every device's (family, key) stats from the snapshot's fast-sampler windows."""

    def values(published: Published) -> Iterator[LabelledValue]:
        windows = published.snapshot.windows
        if windows is None:
            return
        for device in windows.devices:
            gpu = str(device.gpu)
            for (stat_family, key), stat in device.stats.items():
                if stat_family != family:
                    continue
                for label, attr in _STATS:
                    labels = (gpu, key, label) if keyed else (gpu, label)
                    yield labels, getattr(stat, attr)

    return values


def _web(get: Callable[[WebStats], Iterable[LabelledValue]]) -> Callable[[Published], Iterator[LabelledValue]]:
    def values(published: Published) -> Iterator[LabelledValue]:
        if published.stats.web is not None:
            yield from get(published.stats.web)

    return values


def _allocations(published: Published) -> Iterator[LabelledValue]:
    seen: set[tuple[str, ...]] = set()
    for allocation in published.snapshot.attribution.allocations:
        if allocation.source == "kubernetes":
            holder = dict(allocation.labels)
            labels = (str(allocation.gpu), holder["pod"], holder["namespace"], holder["container"], allocation.resource)
            if labels not in seen:  # one series per holder, whatever number of its devices map to the GPU
                seen.add(labels)
                yield labels, 1.0


def _jobs(published: Published) -> Iterator[LabelledValue]:
    seen: set[tuple[str, ...]] = set()
    for allocation in published.snapshot.attribution.allocations:
        if allocation.source == "slurm":
            job = dict(allocation.labels)
            labels = (str(allocation.gpu), job["job_id"], job["job_user"], job["job_partition"])
            if labels not in seen:
                seen.add(labels)
                yield labels, 1.0


def _attribution_up(published: Published) -> Iterator[LabelledValue]:
    for source, up in sorted(published.snapshot.attribution.sources_up.items()):
        yield (source,), 1.0 if up else 0.0


def _process_value(attr: str) -> Callable[[Published], Iterator[LabelledValue]]:
    def values(published: Published) -> Iterator[LabelledValue]:
        for usage in published.snapshot.attribution.processes:
            value = getattr(usage, attr)
            if value is not None:
                yield (str(usage.gpu), str(usage.pid), usage.comm), float(value)

    return values


def _window_seconds(published: Published) -> Iterator[LabelledValue]:
    if published.snapshot.windows is not None:
        yield (), published.snapshot.windows.window_seconds


def _fast_samples(published: Published) -> Iterator[LabelledValue]:
    if published.snapshot.windows is not None:
        for gpu, count in sorted(published.snapshot.windows.stats.samples.items()):
            yield (str(gpu),), float(count)


def _fast_read_errors(published: Published) -> Iterator[LabelledValue]:
    if published.snapshot.windows is not None:
        for (gpu, reason), count in sorted(published.snapshot.windows.stats.read_errors.items()):
            yield (str(gpu), reason), float(count)


def _fast_cycle_durations(published: Published) -> Histogram:
    windows = published.snapshot.windows
    return windows.stats.cycle_durations if windows is not None else FastStats().cycle_durations


def _web_reloads(web: WebStats) -> Iterator[LabelledValue]:
    yield ("failure",), float(web.config_reload_failures)
    yield ("success",), float(web.config_reload_successes)


def _nothing(published: Published) -> Iterator[LabelledValue]:
    return iter(())


def _poll_durations(published: Published) -> Histogram:
    return published.stats.poll_durations


_POLL_NOTE = " Read by the exporter's poll loop, not at scrape time; see amdgpu_sample_timestamp_seconds for its age."

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "amdgpu_exporter_poll_duration_seconds",
        "histogram",
        "seconds",
        "Wall time of one poll cycle of all devices.",
        (),
        _nothing,
        histogram=_poll_durations,
    ),
    device(
        "amdgpu_temperature_celsius",
        "gauge",
        "celsius",
        "Temperature of a sensor: edge, junction (hotspot), memory, hbm0..3, vr_gfx, vr_soc, vr_mem." + _POLL_NOTE,
        ("sensor",),
        _mapping("temperatures"),
    ),
    device(
        "amdgpu_temperature_threshold_celsius",
        "gauge",
        "celsius",
        "The device's own temperature limit for a sensor (critical: throttling starts; emergency: shutdown).",
        ("sensor", "threshold"),
        _mapping("temperature_thresholds"),
    ),
    device(
        "amdgpu_power_watts",
        "gauge",
        "watts",
        "Socket power. MI250X: only die 0 measures the package; die 1 has no series." + _POLL_NOTE,
        (),
        _scalar("power_watts"),
    ),
    device("amdgpu_power_cap_watts", "gauge", "watts", "Current power cap (PPT).", (), _scalar("power_cap_watts")),
    device(
        "amdgpu_power_cap_max_watts",
        "gauge",
        "watts",
        "Highest power cap allowed.",
        (),
        _scalar("power_cap_max_watts"),
    ),
    device(
        "amdgpu_energy_joules",
        "counter",
        "joules",
        "Energy consumed, from the hardware accumulator at 2^-16 J per tick (resets on driver reload). "
        "MI250X: die 0 only.",
        (),
        _scalar("energy_joules"),
    ),
    device(
        "amdgpu_busy_ratio",
        "gauge",
        "ratio",
        "Fraction of time an engine was busy (0..1): gfx, memory, media. A compute partition reports its own "
        "gfx (and media) busy; memory busy is socket-wide, on partition 0." + _POLL_NOTE,
        ("engine",),
        _mapping("busy"),
    ),
    device(
        "amdgpu_memory_used_bytes",
        "gauge",
        "bytes",
        "Memory in use by pool: vram, visible_vram, gtt.",
        ("pool",),
        _mapping("memory_used_bytes"),
    ),
    device(
        "amdgpu_memory_total_bytes",
        "gauge",
        "bytes",
        "Memory size by pool: vram, visible_vram, gtt (socket-wide: partition 0 of a partitioned socket); "
        "partition_vram on each compute partition, the VRAM it allocates from (its NPS memory partition, the "
        "whole VRAM in NPS1: do not sum it over partitions).",
        ("pool",),
        _mapping("memory_total_bytes"),
    ),
    device(
        "amdgpu_clock_hertz",
        "gauge",
        "hertz",
        "Current clock by domain: gfx, memory, fabric, soc, video, decode.",
        ("domain",),
        _mapping("clocks_hertz"),
    ),
    device(
        "amdgpu_clock_max_hertz",
        "gauge",
        "hertz",
        "Highest DPM level of a clock domain (the ceiling a clock-down suggestion lowers).",
        ("domain",),
        _mapping("clocks_max_hertz"),
    ),
    device(
        "amdgpu_voltage_volts",
        "gauge",
        "volts",
        "Voltage by rail: gfx, soc, memory.",
        ("rail",),
        _mapping("voltages_volts"),
    ),
    device(
        "amdgpu_throttle_active",
        "gauge",
        "",
        "1 while the SMU reports this throttler active, else 0. MI200: the ASIC-independent SMU_THROTTLER "
        "reasons of gpu_metrics; MI300 (gpu_metrics v1_6+): prochot, ppt, socket_thermal, vr_thermal, "
        "hbm_thermal, active when its residency counter grew since the previous poll (no series on the first).",
        ("reason",),
        _mapping("throttle"),
    ),
    device(
        "amdgpu_throttle_residency_seconds",
        "counter",
        "seconds",
        "Time the firmware held the clocks back for a reason (MI300, gpu_metrics v1_6+ *_residency_acc "
        "counters at 1 ms per tick; u32, they wrap after ~49.7 days). Socket-wide: partition 0 only.",
        ("reason",),
        _mapping("throttle_residency_seconds"),
    ),
    device(
        "amdgpu_pcie_current_link_transfers_per_second",
        "gauge",
        "transfers_per_second",
        "Current PCIe link speed in transfers per second (16e9 = 16 GT/s).",
        (),
        _scalar("pcie_link_transfers_per_second"),
    ),
    device(
        "amdgpu_pcie_max_link_transfers_per_second",
        "gauge",
        "transfers_per_second",
        "Maximum PCIe link speed the device supports, in transfers per second.",
        (),
        _scalar("pcie_max_link_transfers_per_second"),
    ),
    device(
        "amdgpu_pcie_current_link_width",
        "gauge",
        "",
        "Current PCIe link width in lanes.",
        (),
        _scalar("pcie_link_width"),
    ),
    device(
        "amdgpu_pcie_max_link_width",
        "gauge",
        "",
        "Maximum PCIe link width in lanes.",
        (),
        _scalar("pcie_max_link_width"),
    ),
    device(
        "amdgpu_pcie_bandwidth_bytes_per_second",
        "gauge",
        "bytes_per_second",
        "PCIe bandwidth as the device measures it (MI300: pcie_bandwidth_inst in gpu_metrics). MI200 "
        "measures none: see amdgpu_pcie_bandwidth_upper_bound_bytes_per_second.",
        (),
        _scalar("pcie_bandwidth_bytes_per_second"),
    ),
    device(
        "amdgpu_pcie_bandwidth_upper_bound_bytes_per_second",
        "gauge",
        "bytes_per_second",
        "Upper bound of PCIe traffic where the device measures none (MI200): messages sent and received "
        "x the maximum payload size, from pcie_bw over the kernel's 1 s window, read in the background.",
        (),
        _scalar("pcie_bandwidth_upper_bound_bytes_per_second"),
    ),
    MetricSpec(
        "amdgpu_pcie_link_max_bytes_per_second",
        "gauge",
        "bytes_per_second",
        "Theoretical bandwidth of the PCIe link in one direction at its current speed and width: GT/s x "
        "lanes x the generation's line-code efficiency (8b/10b to 5 GT/s, 128b/130b to 32 GT/s, 242/256 "
        "FLIT at 64 GT/s) / 8. What 'PCIe bandwidth >= 80 % of theoretical' is measured against.",
        ("gpu",),
        _per_state(_pcie_link_max),
    ),
    device("amdgpu_pcie_replays", "counter", "", "PCIe replays (NAKs sent + received).", (), _scalar("pcie_replays")),
    device(
        "amdgpu_pcie_recoveries",
        "counter",
        "",
        "PCIe link transitions from L0 to recovery.",
        (),
        _scalar("pcie_recoveries"),
    ),
    device("amdgpu_pcie_naks", "counter", "", "PCIe NAKs by direction.", ("direction",), _pcie_naks),
    device("amdgpu_xgmi_link_width", "gauge", "", "XGMI link width in lanes.", (), _scalar("xgmi_link_width")),
    device(
        "amdgpu_xgmi_link_speed_bytes_per_second",
        "gauge",
        "bytes_per_second",
        "XGMI link rate in bytes per second: lane rate x width / 8 (the peak of one link).",
        (),
        _scalar("xgmi_link_speed_bytes_per_second"),
    ),
    device(
        "amdgpu_xgmi_link_up",
        "gauge",
        "",
        "1 when an XGMI link is up, 0 when down.",
        ("link",),
        _mapping("xgmi_link_up"),
    ),
    device(
        "amdgpu_xgmi_read_bytes",
        "counter",
        "bytes",
        "Data read over an XGMI link (MI300: cumulative counters in gpu_metrics).",
        ("link",),
        _mapping("xgmi_read_bytes"),
    ),
    device(
        "amdgpu_xgmi_write_bytes",
        "counter",
        "bytes",
        "Data written over an XGMI link.",
        ("link",),
        _mapping("xgmi_write_bytes"),
    ),
    device(
        "amdgpu_xgmi_error_events",
        "counter",
        "",
        "XGMI error events, accumulated by the exporter (the driver's xgmi_error file clears on read).",
        (),
        _scalar("xgmi_error_events"),
    ),
    device(
        "amdgpu_ecc_errors",
        "counter",
        "",
        "RAS error counts by block and type (correctable, uncorrectable, deferred) since driver load.",
        ("block", "type"),
        _mapping("ecc_errors"),
    ),
    device("amdgpu_ras_retired_pages", "gauge", "", "VRAM pages retired by RAS.", (), _scalar("ras_retired_pages")),
    MetricSpec(
        "amdgpu_temperature_window_celsius",
        "gauge",
        "celsius",
        "Temperature of a sensor over the sliding window (amdgpu_exporter_window_seconds) of fast samples: "
        "stat min, max or mean. A spike between two scrapes shows in max.",
        ("gpu", "sensor", "stat"),
        _window("temperature", keyed=True),
    ),
    MetricSpec(
        "amdgpu_power_window_watts",
        "gauge",
        "watts",
        "Socket power over the sliding window of fast samples: stat min, max or mean; the mean is the "
        "energy accumulator's change over the window, exact whatever the sampling. MI250X: die 0 only.",
        ("gpu", "stat"),
        _window("power", keyed=False),
    ),
    MetricSpec(
        "amdgpu_busy_window_ratio",
        "gauge",
        "ratio",
        "Busy ratio of an engine (gfx, memory) over the sliding window of fast samples: stat min, max or "
        "mean. MI300: the mean comes from the firmware's activity accumulators. Compute/communication "
        "alternation shows as max near 1 and min far below it.",
        ("gpu", "engine", "stat"),
        _window("busy", keyed=True),
    ),
    MetricSpec(
        "amdgpu_clock_window_hertz",
        "gauge",
        "hertz",
        "Current clock of a domain (gfx, memory, soc) over the sliding window of fast samples: stat min, max or mean.",
        ("gpu", "domain", "stat"),
        _window("clock", keyed=True),
    ),
    MetricSpec(
        "amdgpu_up",
        "gauge",
        "",
        "1 if the device's last read succeeded within its deadline, else 0.",
        ("gpu",),
        _per_state(_up),
    ),
    MetricSpec(
        "amdgpu_device_present",
        "gauge",
        "",
        "1 while discovery finds the device, 0 once it has vanished (it keeps its gpu index).",
        ("gpu",),
        _per_state(_present),
    ),
    MetricSpec(
        "amdgpu_device_down_info",
        "gauge",
        "",
        "Why a device is down (gone, timeout, stuck, read_error, ...); no series while it is up.",
        ("gpu", "reason"),
        _per_state(_down_reason),
    ),
    MetricSpec(
        "amdgpu_device_info",
        "gauge",
        "",
        "Identity of a device (always 1); join on gpu for labels. A compute partition of an MI300-class socket "
        "is its own device: partition 0..N-1, the socket's pci_bus_id and package; socket-wide values "
        "(power, energy, temperatures, memory, PCIe, XGMI, ECC) are on partition 0 only.",
        IDENTITY_LABELS,
        _device_info,
    ),
    MetricSpec(
        "amdgpu_sample_timestamp_seconds",
        "gauge",
        "seconds",
        "Unix time of the device's latest good sample.",
        ("gpu",),
        _per_state(_sample_timestamp),
    ),
    MetricSpec(
        "amdgpu_firmware_info",
        "gauge",
        "",
        "Firmware version of a block (always 1).",
        ("gpu", "block", "version"),
        _per_state(_firmware),
    ),
    MetricSpec(
        "amdgpu_topology_link_info",
        "gauge",
        "",
        "KFD io_link from a device to a peer (always 1). A partitioned MI300-class socket's links are "
        "exported once, between partition 0s: its other partitions share them (join on pci_bus_id).",
        ("gpu", "peer", "type", "hops", "weight"),
        _topology,
    ),
    MetricSpec(
        "amdgpu_exporter_read_errors",
        "counter",
        "",
        "Failed device reads by reason.",
        ("gpu", "reason"),
        _per_state(_read_errors),
    ),
    MetricSpec(
        "amdgpu_exporter_read_timeouts",
        "counter",
        "",
        "Device reads that missed their deadline.",
        ("gpu",),
        _per_state(_read_timeouts),
    ),
    MetricSpec(
        "amdgpu_exporter_file_errors",
        "counter",
        "",
        "Failed reads of one file and rejected values by reason (parse, implausible, too_large, eio, eperm, ...).",
        ("gpu", "file", "reason"),
        _per_state(_file_errors),
    ),
    MetricSpec(
        "amdgpu_alert_firing",
        "gauge",
        "",
        "1 while an in-daemon alert fires on a device.",
        ("gpu", "alert", "severity"),
        _alert_firing,
    ),
    MetricSpec(
        "amdgpu_clock_down_suggested_ratio",
        "gauge",
        "ratio",
        "Suggested gfx clock ceiling reduction (0..1).",
        ("gpu",),
        _clock_down_ratio,
    ),
    MetricSpec(
        "amdgpu_suggested_gfx_clock_max_hertz",
        "gauge",
        "hertz",
        "Suggested gfx clock ceiling.",
        ("gpu",),
        _suggested_ceiling,
    ),
    MetricSpec(
        "amdgpu_exporter_build_info",
        "gauge",
        "",
        "Exporter version and the source it reads (always 1).",
        ("version", "source", "source_reason"),
        _build_info,
    ),
    MetricSpec(
        "amdgpu_driver_info",
        "gauge",
        "",
        "The host's amdgpu driver (version, initstate), kernel release and ppfeaturemask (always 1).",
        ("version", "initstate", "kernel", "ppfeaturemask"),
        _driver_info,
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_rocm_info",
        "gauge",
        "",
        "A ROCm install found on the host: version and folder (always 1).",
        ("version", "path"),
        _rocm_info,
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_smi_library_info",
        "gauge",
        "",
        "An SMI library found on the host (librocm_smi64, libamd_smi) and the version it reports (always 1).",
        ("library", "version"),
        _smi_library_info,
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_exporter_last_poll_timestamp_seconds",
        "gauge",
        "seconds",
        "Unix time the last poll cycle finished.",
        (),
        _last_poll,
    ),
    MetricSpec(
        "amdgpu_exporter_window_seconds",
        "gauge",
        "seconds",
        "Length of the sliding window the *_window_* families cover (--window).",
        (),
        _window_seconds,
    ),
    MetricSpec(
        "amdgpu_exporter_fast_samples",
        "counter",
        "",
        "gpu_metrics reads by the fast sampler (--fast.interval) that gave a sample.",
        ("gpu",),
        _fast_samples,
    ),
    MetricSpec(
        "amdgpu_exporter_fast_read_errors",
        "counter",
        "",
        "Fast sampler reads that gave no sample, by reason (timeout, gone, read_error, unreadable_table).",
        ("gpu", "reason"),
        _fast_read_errors,
    ),
    MetricSpec(
        "amdgpu_exporter_fast_cycle_duration_seconds",
        "histogram",
        "seconds",
        "Wall time of one fast-sampler cycle: one gpu_metrics read of every device.",
        (),
        _nothing,
        histogram=_fast_cycle_durations,
    ),
    MetricSpec(
        "amdgpu_exporter_worker_restarts",
        "counter",
        "",
        "Restarts of the rocm-smi worker process.",
        (),
        _worker_restarts,
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_exporter_alertmanager_notifications",
        "counter",
        "",
        "Alert pushes to Alertmanager by result.",
        ("result",),
        _alertmanager_notifications,
    ),
    MetricSpec(
        "amdgpu_exporter_discoveries",
        "counter",
        "",
        "Device discoveries by result (ok, failed: an error or past its deadline).",
        ("result",),
        _discoveries,
    ),
    MetricSpec(
        "amdgpu_exporter_stage_failures",
        "counter",
        "",
        "Failures of a pipeline stage (rules, render, alertmanager); /readyz is 503 while one is failing.",
        ("stage",),
        _stage_failures,
    ),
    # The HTTP layer (exporter/web), only with --web.config.file.
    MetricSpec(
        "amdgpu_exporter_web_config_reloads",
        "counter",
        "",
        "Reloads of --web.config.file after a change, by result (failure: the last good one was kept).",
        ("result",),
        _web(_web_reloads),
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_exporter_web_config_last_reload_successful",
        "gauge",
        "",
        "1 if the web configuration on disk is the one in effect, 0 after an invalid edit.",
        (),
        _web(lambda web: [((), 1.0 if web.config_last_reload_ok else 0.0)]),
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_exporter_http_rejections",
        "counter",
        "",
        "Connections and requests refused by the HTTP layer, by reason.",
        ("reason",),
        _web(lambda web: [((reason,), float(count)) for reason, count in web.rejections]),
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_exporter_http_connections",
        "gauge",
        "",
        "Open HTTP connections (including TLS handshakes).",
        (),
        _web(lambda web: [((), float(web.open_connections))]),
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_exporter_http_max_connections",
        "gauge",
        "",
        "Cap on open HTTP connections (from the open-files budget).",
        (),
        _web(lambda web: [((), float(web.max_connections))]),
        omit_when_empty=True,
    ),
    # Attribution (--kubernetes, --slurm.state-dir, --collector.processes): no family when off.
    MetricSpec(
        "amdgpu_allocation_info",
        "gauge",
        "",
        "A Kubernetes container holding the device (always 1), from the kubelet's pod-resources API.",
        ("gpu", "pod", "namespace", "container", "resource"),
        _allocations,
        omit_when_empty=True,
        attributed=False,
    ),
    MetricSpec(
        "amdgpu_job_info",
        "gauge",
        "",
        "A Slurm job holding the device (always 1), from the prolog's state files.",
        ("gpu", "job_id", "job_user", "job_partition"),
        _jobs,
        omit_when_empty=True,
        attributed=False,
    ),
    MetricSpec(
        "amdgpu_exporter_attribution_up",
        "gauge",
        "",
        "1 if the attribution source's last read succeeded (kubernetes: within its deadline), else 0.",
        ("source",),
        _attribution_up,
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_process_memory_bytes",
        "gauge",
        "bytes",
        "VRAM a process has allocated on the device (KFD), for the top processes per device by VRAM.",
        ("gpu", "pid", "comm"),
        _process_value("vram_bytes"),
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_process_compute_unit_occupancy_ratio",
        "gauge",
        "ratio",
        "Share of the device's compute units the process's waves occupy now (KFD cu_occupancy / CUs, 0..1).",
        ("gpu", "pid", "comm"),
        _process_value("cu_occupancy_ratio"),
        omit_when_empty=True,
    ),
    MetricSpec(
        "amdgpu_process_sdma_seconds",
        "counter",
        "seconds",
        "Time the process's SDMA (copy engine) queues on the device have been busy (KFD).",
        ("gpu", "pid", "comm"),
        _process_value("sdma_seconds"),
        omit_when_empty=True,
    ),
    # The process collector's families under their conventional names (dashboards and alerts for
    # any Prometheus exporter use them); no series where /proc cannot be read.
    MetricSpec(
        "process_cpu_seconds",
        "counter",
        "seconds",
        "CPU time (user and system) the exporter process has used.",
        (),
        _process("process_cpu_seconds_total"),
        omit_when_empty=True,
    ),
    MetricSpec(
        "process_resident_memory_bytes",
        "gauge",
        "bytes",
        "Resident memory of the exporter process (what the systemd unit's MemoryMax limits).",
        (),
        _process("process_resident_memory_bytes"),
        omit_when_empty=True,
    ),
    MetricSpec(
        "process_virtual_memory_bytes",
        "gauge",
        "bytes",
        "Virtual memory of the exporter process.",
        (),
        _process("process_virtual_memory_bytes"),
        omit_when_empty=True,
    ),
    MetricSpec(
        "process_start_time_seconds",
        "gauge",
        "seconds",
        "Unix time the exporter process started.",
        (),
        _process("process_start_time_seconds"),
        omit_when_empty=True,
    ),
    MetricSpec(
        "process_open_fds",
        "gauge",
        "",
        "File descriptors the exporter process has open.",
        (),
        _process("process_open_fds"),
        omit_when_empty=True,
    ),
    MetricSpec(
        "process_max_fds",
        "gauge",
        "",
        "Limit on open file descriptors of the exporter process.",
        (),
        _process("process_max_fds"),
        omit_when_empty=True,
    ),
)

# The families read from each device's latest sample.
DEVICE_METRICS: tuple[MetricSpec, ...] = tuple(spec for spec in METRICS if spec.sample_getter is not None)
BY_NAME = {spec.name: spec for spec in METRICS}


def all_metric_names() -> list[str]:
    """Every family name /metrics can carry (counters with their _total suffix)."""
    return [spec.exposed_name for spec in METRICS]
