"""The metric table: every metric the exporter serves, declared once — the exporter's own included.

Adding a metric is adding one entry to METRICS. Rendering (render.py), the README's metric
reference (metrics_reference.py), the rules' vocabulary of watchable values (alerting/watch.py),
the naming test and the dashboards' coverage test all read this table; nothing else lists names.

An entry's getter reads one Published (snapshot + alerts + exporter stats) and yields
(label values, value) pairs; it yields nothing for what is not supplied (absent, never a fake zero).
The table is in /metrics order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from exporter import __version__
from exporter.model import (
    DEVICE_PLUGIN_METHODS,
    IDENTITY_FIELDS,
    STAGES,
    Allocation,
    DeviceState,
    Histogram,
    HostInfo,
    Published,
    Sample,
    SamplerStats,
    WebStats,
)

Kind = Literal["gauge", "counter", "histogram"]
LabelledValue = tuple[tuple[str, ...], float]
Labels = tuple[str, ...]
Values = Callable[[Published], Iterable[LabelledValue]]
SampleGetter = Callable[[Sample], Iterable[LabelledValue]]
# (key, value) pairs as the data holds them: a key is one label value, a tuple of them, or () for a
# family without labels; a None value is not supplied and gives no series.
Pairs = Iterable[tuple[Any, Any]]
T = TypeVar("T")
# collector -> (its families rendered without an error, seconds spent on them) in one render
CollectorOutcomes = Mapping[str, tuple[bool, float]]

# The base units a family name can end in; a name ending in none is unitless: counts, widths, states, info series.
_UNIT = re.compile(r"_(celsius|watts|joules|volts|hertz|ratio|bytes|seconds|bytes_per_second|transfers_per_second)$")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family.

    `name` is the family name without `_total` (prometheus-client appends it to counters); `labels`
    are all of the family's labels, in order. A per-device family read from each device's latest
    sample also keeps that `sample_getter` (labels after `gpu`), which alert rules read values through.
    """

    name: str
    help: str
    values: Values
    labels: Labels = ()
    kind: Kind = "gauge"
    sample_getter: SampleGetter | None = None
    histogram: Callable[[Published], Histogram] | None = None  # for kind "histogram" (values yields nothing)
    omit_when_empty: bool = False  # no family at all without series (the optional parts' families)
    # With attribution on, a family whose first label is `gpu` gets the attribution labels (pod, ...,
    # job_id, ...) after its own; False for the families that carry them already.
    attributed: bool = True
    # The collector the family belongs to (in_collector sets it): the unit --collector.NAME,
    # --no-collector.NAME and the config file's `collectors:` lists turn on and off, reads and all.
    collector: str = ""
    # The Sample fields the family is made of: a source reads an optional field only while a family
    # shown reads it (exposition/selection.py, read_fields).
    reads: tuple[str, ...] = ()
    # False for the families off unless asked for (docs/design.md, "The series budget").
    shown_by_default: bool = True
    # The collectors' own outcome families (success, duration): made from what rendering the others
    # took, not from the Published.
    outcome: Callable[[CollectorOutcomes], Iterable[LabelledValue]] | None = None

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name

    @property
    def unit(self) -> str:
        """The base unit the name ends in, "" for none: documentation only, never a `# UNIT` line."""
        match = _UNIT.search(self.name)
        return match.group(1) if match else ""


def _series(pairs: Pairs) -> Iterator[LabelledValue]:
    for key, value in pairs:
        if value is not None:
            yield (tuple(map(str, key)) if isinstance(key, tuple) else (str(key),)), float(value)


def _cycle(get: Callable[[Published], Pairs]) -> Values:
    """A family read from the whole cycle."""
    return lambda published: _series(get(published))


def _optional(part: Callable[[Published], T | None], get: Callable[[T], Pairs]) -> Values:
    """A family read from an optional part of the cycle (host facts, windows, ...): no series without it."""

    def values(published: Published) -> Iterator[LabelledValue]:
        found = part(published)
        return _series(get(found) if found is not None else ())

    return values


def _per_state(get: Callable[[DeviceState], Pairs]) -> Values:
    """Every device (up or not), `gpu` first."""

    def values(published: Published) -> Iterator[LabelledValue]:
        for state in published.snapshot.devices:
            gpu = str(state.gpu)
            for labels, value in _series(get(state)):
                yield (gpu, *labels), value

    return values


def per_device(
    name: str, help_text: str, get: Callable[[DeviceState], Pairs], labels: Labels = (), kind: Kind = "gauge"
) -> MetricSpec:
    """A family with one group of series per device, up or not; `labels` are those after `gpu`."""
    return MetricSpec(name, help_text, _per_state(get), ("gpu", *labels), kind)


def _sample_field(field: str, keyed: bool) -> Callable[[Sample], Pairs]:
    """A Sample field: a mapping of label value -> value when `keyed`, else one value."""
    if keyed:
        return lambda sample: getattr(sample, field).items()
    return lambda sample: [((), getattr(sample, field))]


def device(
    name: str, help_text: str, field: str | Callable[[Sample], Pairs], labels: Labels = (), kind: Kind = "gauge"
) -> MetricSpec:
    """A family with one group of series per device that is up, read from its latest sample: `field`
    names the Sample field (a mapping when the family has labels after `gpu`, else one value) or reads it."""
    read = _sample_field(field, keyed=bool(labels)) if isinstance(field, str) else field

    def getter(sample: Sample) -> Iterator[LabelledValue]:
        return _series(read(sample))

    values = _per_state(lambda state: read(state.sample) if state.up and state.sample is not None else ())
    reads = (field,) if isinstance(field, str) else ()
    return MetricSpec(name, help_text, values, ("gpu", *labels), kind, sample_getter=getter, reads=reads)


def in_collector(collector: str, *specs: MetricSpec) -> tuple[MetricSpec, ...]:
    """The families of one collector (a run of the table: the table is in /metrics order)."""
    return tuple(replace(spec, collector=collector) for spec in specs)


def off_by_default(spec: MetricSpec) -> MetricSpec:
    """A family shown only when asked for (its collector or its name included): static or per-link
    detail no shipped rule or dashboard reads, or tens of series per GPU."""
    return replace(spec, shown_by_default=False)


# --- the getters that are more than one expression -------------------------------------------------


def _cper_counts(sample: Sample) -> Pairs:
    counts: dict[str, int] = {}
    for record in sample.cper_records:
        counts[record.severity] = counts.get(record.severity, 0) + 1
    return counts.items()


def _cper_newest(sample: Sample) -> Pairs:
    newest: dict[str, float] = {}
    for record in sample.cper_records:
        newest[record.severity] = max(record.timestamp, newest.get(record.severity, record.timestamp))
    return newest.items()


IDENTITY_LABELS = tuple(IDENTITY_FIELDS)


def _topology(published: Published) -> Pairs:
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
            peer = gpu_by_device.get((link.peer_pci_bus_id, link.peer_partition), link.peer_pci_bus_id or "cpu")
            yield (state.gpu, peer, link.link_type, link.hops, link.weight), 1


def _firmware(published: Published) -> Pairs:
    # The dies of a package and the partitions of a socket run the same firmware: 14 series a GCD,
    # repeated on every partition of a CPX socket (64 x 9 on a node), are said once per package.
    first_of_package: dict[str, Mapping[str, str]] = {}
    for state in published.snapshot.devices:
        identity = state.identity
        package = identity.package or identity.pci_bus_id
        first = first_of_package.get(package)
        if first is None:
            first_of_package[package] = identity.firmware
        for block, version in sorted(identity.firmware.items()):
            if first is None or first.get(block) != version:
                yield (state.gpu, block, version), 1


def _clock_down_ratio(published: Published) -> Pairs:
    # The largest suggested reduction of a device's alerts. Every device gets a series (0 when
    # nothing is suggested) so dashboards and alert expressions do not have to handle absence.
    ratio_by_gpu: dict[int, float] = {}
    for alert in published.alerts:
        ratio_by_gpu[alert.gpu] = max(alert.clock_down_ratio, ratio_by_gpu.get(alert.gpu, 0.0))
    return [(state.gpu, ratio_by_gpu.get(state.gpu, 0.0)) for state in published.snapshot.devices]


def _suggested_ceiling(published: Published) -> Pairs:
    # The lowest suggested gfx clock ceiling of a device's alerts; no series when none is suggested.
    ceiling_by_gpu: dict[int, float] = {}
    for alert in published.alerts:
        hertz = alert.suggested_gfx_clock_max_hertz
        if hertz is not None:
            ceiling_by_gpu[alert.gpu] = min(hertz, ceiling_by_gpu.get(alert.gpu, hertz))
    return sorted(ceiling_by_gpu.items())


def _suggested_commands(published: Published) -> Pairs:
    # One series per firing alert with a command; a new step changes the command and so the series.
    for alert in published.alerts:
        if alert.firing and alert.suggested_command:
            yield (alert.gpu, alert.alert, alert.suggested_command, alert.undo_command), 1


def _health_suggestions(published: Published) -> Pairs:
    # Only while a GPU is unfit: the forwarded health alert reads the commands from here.
    verdict = published.health
    if verdict.drain_command:
        yield ("slurm", verdict.drain_command, verdict.resume_command), 1
    if verdict.taint_command:
        yield ("kubernetes", verdict.taint_command, verdict.untaint_command), 1


def _reloads(published: Published) -> Pairs:
    # config and rules always (a failed SIGHUP must be countable from zero), web_config with its file.
    for what in ("config", "rules"):
        yield from (
            ((what, result), published.stats.reloads.get((what, result), 0)) for result in ("failure", "success")
        )
    web = published.stats.web
    if web is not None:
        yield from (
            (("web_config", "failure"), web.config_reload_failures),
            (("web_config", "success"), web.config_reload_successes),
        )


_NODE_VALUES: list[Values] = []  # the getters _node made: NODE_FAMILIES is the families built on them


def _node(field: str, keyed: bool = False) -> Values:
    """A node-wide value (the MI350-class board/ group): every GPU of the node reads the same
    figure, so it is shown once, without a gpu label, from the first device (in gpu order) that is
    up and supplies it. One exporter serves one node."""

    def values(published: Published) -> Pairs:
        for state in published.snapshot.devices:
            if not state.up or state.sample is None:
                continue
            value = getattr(state.sample, field)
            if keyed and value:
                return sorted(value.items())
            if not keyed and value is not None:
                return [((), value)]
        return ()

    getter = _cycle(values)
    _NODE_VALUES.append(getter)
    return getter


def node_family(name: str, help_text: str, field: str, labels: Labels = ()) -> MetricSpec:
    """A node-wide family (no gpu label) of one Sample field: a mapping when it has labels, else one value."""
    return MetricSpec(name, help_text, _node(field, keyed=bool(labels)), labels, reads=(field,))


def _window(family: str, keyed: bool) -> Values:
    """One window family: every device's (family, key) stats from the snapshot's fast-sampler windows."""

    def values(published: Published) -> Pairs:
        windows = published.snapshot.windows
        for device in windows.devices if windows is not None else ():
            for (stat_family, key), stat in device.stats.items():
                if stat_family == family:
                    for label, value in (("min", stat.minimum), ("max", stat.maximum), ("mean", stat.mean)):
                        yield ((device.gpu, key, label) if keyed else (device.gpu, label)), value

    return _cycle(values)


def _holders(source: str, get: Callable[[Allocation, dict[str, str]], tuple[Any, ...]]) -> Values:
    """The holders of each device that one attribution source reports (`get`: an allocation and its labels
    -> the series' labels): one series per holder, whatever number of its devices map to the GPU."""

    def values(published: Published) -> Pairs:
        allocations = published.snapshot.attribution.allocations
        held = dict.fromkeys(get(a, dict(a.labels)) for a in allocations if a.source == source)
        return [(labels, 1) for labels in held]

    return _cycle(values)


def _process_usage(name: str, help_text: str, attr: str, kind: Kind = "gauge") -> MetricSpec:
    """A family of the top processes on each device (--collector.processes): their ProcessUsage `attr`."""
    values = _cycle(lambda p: [((u.gpu, u.pid, u.comm), getattr(u, attr)) for u in p.snapshot.attribution.processes])
    return MetricSpec(name, help_text, values, ("gpu", "pid", "comm"), kind, omit_when_empty=True)


def _web(
    name: str, help_text: str, get: Callable[[WebStats], Pairs], labels: Labels = (), kind: Kind = "gauge"
) -> MetricSpec:
    """A family of the HTTP layer's counters: only with --web.config.file."""
    return MetricSpec(name, help_text, _optional(lambda p: p.stats.web, get), labels, kind, omit_when_empty=True)


def _host(name: str, help_text: str, get: Callable[[HostInfo], Pairs], labels: Labels) -> MetricSpec:
    """A family of the host's software versions: none until they are read."""
    return MetricSpec(name, help_text, _optional(lambda p: p.stats.host, get), labels, omit_when_empty=True)


def _process(name: str, help_text: str, kind: Kind = "gauge") -> MetricSpec:
    """A family of the process collector, read from its sample of the same name."""
    sample_name = name + "_total" if kind == "counter" else name
    values = _cycle(lambda p: [((), p.stats.process.values.get(sample_name))])
    return MetricSpec(name, help_text, values, kind=kind, omit_when_empty=True)


def _fast_cycle_durations(published: Published) -> Histogram:
    windows = published.snapshot.windows
    return windows.stats.cycle_durations if windows is not None else SamplerStats().cycle_durations


def _job(name: str, help_text: str, field: str) -> MetricSpec:
    """A running job's accumulated figure, by job and scheduler (a counter: it only grows while the job runs)."""
    return MetricSpec(
        name,
        help_text,
        _cycle(lambda p: [((job.job_id, job.scheduler), getattr(job, field)) for job in p.jobs]),
        ("job_id", "scheduler"),
        kind="counter",
        omit_when_empty=True,
        attributed=False,
    )


def _histogram(name: str, help_text: str, get: Callable[[Published], Histogram]) -> MetricSpec:
    return MetricSpec(name, help_text, lambda _published: (), kind="histogram", histogram=get)


_POLL_NOTE = " Read by the exporter's poll loop, not at scrape time; see amdgpu_sample_timestamp_seconds for its age."

METRICS: tuple[MetricSpec, ...] = (
    *in_collector(
        "exporter",
        _histogram(
            "amdgpu_exporter_poll_duration_seconds",
            "Wall time of one poll cycle of all devices.",
            lambda published: published.stats.poll_durations,
        ),
    ),
    *in_collector(
        "temperature",
        device(
            "amdgpu_temperature_celsius",
            "Temperature of a sensor: edge, junction (hotspot), memory, hbm0..3, vr_gfx, vr_soc, vr_mem." + _POLL_NOTE,
            "temperatures",
            ("sensor",),
        ),
        device(
            "amdgpu_temperature_threshold_celsius",
            "The device's own temperature limit for a sensor (critical: throttling starts; emergency: shutdown).",
            "temperature_thresholds",
            ("sensor", "threshold"),
        ),
    ),
    *in_collector(
        "power",
        device(
            "amdgpu_power_watts",
            "Socket power. MI250X: only die 0 measures the package; die 1 has no series." + _POLL_NOTE,
            "power_watts",
        ),
        device("amdgpu_power_cap_watts", "Current power cap (PPT).", "power_cap_watts"),
        device("amdgpu_power_cap_max_watts", "Highest power cap allowed.", "power_cap_max_watts"),
    ),
    *in_collector(
        "board",
        off_by_default(
            device(
                "amdgpu_board_temperature_celsius",
                "Temperature of a sensor on the GPU's own board (MI350-class board/gpuboard_temp): retimer_x, "
                "oam_x_ibc, ... and the board's voltage regulators vddcr_vdd0, vddcr_soc_a, vdd_085_hbm, ... "
                "Off by default (19 series per GPU): --collector.board.",
                "board_temperatures",
                ("sensor",),
            )
        ),
        off_by_default(
            node_family(
                "amdgpu_baseboard_temperature_celsius",
                "Temperature of a sensor on the baseboard the node's GPUs share (MI350-class board/baseboard_temp: "
                "ubb_fpga, ubb_front, oam_0_1_hsc, ...). Node-wide: one series per sensor, no gpu label.",
                "baseboard_temperatures",
                ("sensor",),
            )
        ),
        node_family(
            "amdgpu_node_power_watts",
            "Power of the whole node as the baseboard measures it (MI350-class board/node_power). Node-wide: "
            "no gpu label (every GPU reports the same figure).",
            "node_power_watts",
        ),
        node_family(
            "amdgpu_node_power_limit_watts",
            "The node's current power limit (board/cur_node_power_limit). Node-wide.",
            "node_power_limit_watts",
        ),
        node_family(
            "amdgpu_node_power_limit_max_watts",
            "The highest node power limit the firmware allows (board/max_node_power_limit). Node-wide.",
            "node_power_limit_max_watts",
        ),
        node_family(
            "amdgpu_baseboard_power_watts",
            "Power the baseboard draws, its GPUs included (MI350-class board/baseboard_power). Node-wide.",
            "baseboard_power_watts",
        ),
        node_family(
            "amdgpu_baseboard_power_limit_watts",
            "The baseboard's power threshold (board/baseboard_power_limit). Node-wide.",
            "baseboard_power_limit_watts",
        ),
        node_family(
            "amdgpu_node_power_management_active",
            "1 while node power management (NPM) is on, else 0 (board/npm_status: on while node power reads "
            "non-zero). Node-wide.",
            "node_power_management_enabled",
        ),
    ),
    *in_collector(
        "power",
        device(
            "amdgpu_energy_joules",
            "Energy consumed, from the hardware accumulator at 2^-16 J per tick (resets on driver reload). "
            "MI250X: die 0 only.",
            "energy_joules",
            kind="counter",
        ),
    ),
    *in_collector(
        "busy",
        device(
            "amdgpu_busy_ratio",
            "Fraction of time an engine was busy (0..1): gfx, memory, media. A compute partition reports its own "
            "gfx (and media) busy; memory busy is socket-wide, on partition 0." + _POLL_NOTE,
            "busy",
            ("engine",),
        ),
    ),
    *in_collector(
        "xcc",
        device(
            "amdgpu_xcc_busy_ratio",
            "Instantaneous gfx busy (0..1) of each XCC (accelerator complex die) of an MI300-class device, "
            "numbered from 0 within the device (a compute partition's own XCCs); the mean over a device's XCCs "
            'is its amdgpu_busy_ratio{engine="gfx"}.',
            "xcc_busy",
            ("xcc",),
        ),
        off_by_default(
            replace(
                device(
                    "amdgpu_media_engine_busy_ratio",
                    "Busy (0..1) of each video decoder (engine vcn) and JPEG decoder ring (engine jpeg) of an "
                    "MI300-class device, numbered from 0 within the device (a compute partition's own). "
                    "With --collector.xcc.",
                    "media_engine_busy",
                    ("engine", "engine_index"),
                ),
                omit_when_empty=True,
            )
        ),
        off_by_default(
            replace(
                device(
                    "amdgpu_xcc_below_host_limit_seconds",
                    "Time each XCC's gfx clock sat below the host's limit, by reason: power (PPT), thermal, "
                    "low_utilization, and total (any reason; reasons overlap, do not sum them). MI300-class, "
                    "gpu_metrics v1_8+ or xcp_metrics, counters at 1 ms per accumulation tick. With --collector.xcc.",
                    "xcc_below_host_limit_seconds",
                    ("xcc", "reason"),
                    kind="counter",
                ),
                omit_when_empty=True,
            )
        ),
    ),
    *in_collector(
        "memory",
        device(
            "amdgpu_memory_used_bytes",
            "Memory in use by pool: vram, visible_vram, gtt.",
            "memory_used_bytes",
            ("pool",),
        ),
        device(
            "amdgpu_memory_total_bytes",
            "Memory size by pool: vram, visible_vram, gtt (socket-wide: partition 0 of a partitioned socket); "
            "partition_vram on each compute partition, the VRAM it allocates from (its NPS memory partition, the "
            "whole VRAM in NPS1: do not sum it over partitions).",
            "memory_total_bytes",
            ("pool",),
        ),
    ),
    *in_collector(
        "clock",
        device(
            "amdgpu_clock_hertz",
            "Current clock by domain: gfx, memory, fabric, soc, video, decode.",
            "clocks_hertz",
            ("domain",),
        ),
        device(
            "amdgpu_clock_average_hertz",
            "Average clock by domain over the SMU's averaging window: gfx, memory, soc, video, decode "
            "(MI200-class, gpu_metrics v1_0-v1_3 average_*clk_frequency; later tables have no average).",
            "clocks_average_hertz",
            ("domain",),
        ),
        off_by_default(
            device(
                "amdgpu_clock_max_hertz",
                "Highest DPM level of a clock domain (the ceiling a clock-down suggestion lowers).",
                "clocks_max_hertz",
                ("domain",),
            )
        ),
        off_by_default(
            device(
                "amdgpu_clock_min_hertz",
                "Lowest DPM level of a clock domain (the floor the power management can take it to).",
                "clocks_min_hertz",
                ("domain",),
            )
        ),
        device(
            "amdgpu_gfx_clock_lock_active",
            "1 while the gfx clock of an XCC is locked, else 0 (MI300-class, gpu_metrics v1_4+ gfxclk_lock_status: "
            "a bit per clock instance). Socket-wide: partition 0 only.",
            lambda sample: [((), None if sample.gfx_clock_lock_mask is None else sample.gfx_clock_lock_mask != 0)],
        ),
    ),
    *in_collector(
        "memory",
        device(
            "amdgpu_memory_max_bandwidth_bytes_per_second",
            "Peak VRAM bandwidth the firmware states (MI300-class, gpu_metrics v1_7+). Socket-wide: partition 0 only.",
            "memory_max_bandwidth_bytes_per_second",
        ),
    ),
    *in_collector(
        "clock",
        device("amdgpu_voltage_volts", "Voltage by rail: gfx, soc, memory.", "voltages_volts", ("rail",)),
    ),
    *in_collector(
        "throttle",
        device(
            "amdgpu_throttle_active",
            "1 while the SMU reports this throttler active, else 0. MI200: the ASIC-independent SMU_THROTTLER "
            "reasons of gpu_metrics; MI300 (gpu_metrics v1_6+): prochot, ppt, socket_thermal, vr_thermal, "
            "hbm_thermal, active when its residency counter grew since the previous poll (no series on the first).",
            "throttle",
            ("reason",),
        ),
        off_by_default(
            device(
                "amdgpu_throttle_residency_seconds",
                "Time the firmware held the clocks back for a reason (MI300, gpu_metrics v1_6+ *_residency_acc "
                "counters at 1 ms per tick; u32, they wrap after ~49.7 days). Socket-wide: partition 0 only.",
                "throttle_residency_seconds",
                ("reason",),
                kind="counter",
            )
        ),
    ),
    *in_collector(
        "pcie",
        device(
            "amdgpu_pcie_current_link_transfers_per_second",
            "Current PCIe link speed in transfers per second (16e9 = 16 GT/s).",
            "pcie_link_transfers_per_second",
        ),
        device(
            "amdgpu_pcie_max_link_transfers_per_second",
            "Maximum PCIe link speed the device supports, in transfers per second.",
            "pcie_max_link_transfers_per_second",
        ),
        device("amdgpu_pcie_current_link_width", "Current PCIe link width in lanes.", "pcie_link_width"),
        device("amdgpu_pcie_max_link_width", "Maximum PCIe link width in lanes.", "pcie_max_link_width"),
        device(
            "amdgpu_pcie_bandwidth_bytes_per_second",
            "PCIe bandwidth as the device measures it (MI300: pcie_bandwidth_inst in gpu_metrics). MI200 "
            "measures none: see amdgpu_pcie_bandwidth_upper_bound_bytes_per_second.",
            "pcie_bandwidth_bytes_per_second",
        ),
        device(
            "amdgpu_pcie_bandwidth_upper_bound_bytes_per_second",
            "Upper bound of PCIe traffic where the device measures none (MI200): messages sent and received "
            "x the maximum payload size, from pcie_bw over the kernel's 1 s window, read in the background.",
            "pcie_bandwidth_upper_bound_bytes_per_second",
        ),
        per_device(
            "amdgpu_pcie_link_max_bytes_per_second",
            "Theoretical bandwidth of the PCIe link in one direction at its current speed and width: GT/s x "
            "lanes x the generation's line-code efficiency (8b/10b to 5 GT/s, 128b/130b to 32 GT/s, 242/256 "
            "FLIT at 64 GT/s) / 8. What 'PCIe bandwidth >= 80 % of theoretical' is measured against.",
            lambda state: [((), state.pcie_link_max_bytes_per_second if state.up else None)],
        ),
        device("amdgpu_pcie_replays", "PCIe replays (NAKs sent + received).", "pcie_replays", kind="counter"),
        device(
            "amdgpu_pcie_recoveries", "PCIe link transitions from L0 to recovery.", "pcie_recoveries", kind="counter"
        ),
        device(
            "amdgpu_pcie_other_end_recoveries",
            "PCIe link recoveries the link partner started (MI300-class, gpu_metrics v1_6+).",
            "pcie_other_end_recoveries",
            kind="counter",
        ),
        device(
            "amdgpu_pcie_replay_rollovers",
            "Times the firmware's PCIe replay counter rolled over (MI300-class).",
            "pcie_replay_rollovers",
            kind="counter",
        ),
        device(
            "amdgpu_pcie_naks",
            "PCIe NAKs by direction.",
            lambda sample: [("sent", sample.pcie_naks_sent), ("received", sample.pcie_naks_received)],
            ("direction",),
            kind="counter",
        ),
    ),
    *in_collector(
        "xgmi",
        device("amdgpu_xgmi_link_width", "XGMI link width in lanes.", "xgmi_link_width"),
        device(
            "amdgpu_xgmi_link_speed_bytes_per_second",
            "XGMI link rate in bytes per second: lane rate x width / 8 (the peak of one link).",
            "xgmi_link_speed_bytes_per_second",
        ),
        device("amdgpu_xgmi_link_up", "1 when an XGMI link is up, 0 when down.", "xgmi_link_up", ("link",)),
        off_by_default(
            device(
                "amdgpu_xgmi_read_bytes",
                "Data read over an XGMI link (MI300: cumulative counters in gpu_metrics).",
                "xgmi_read_bytes",
                ("link",),
                kind="counter",
            )
        ),
        off_by_default(
            device(
                "amdgpu_xgmi_write_bytes",
                "Data written over an XGMI link.",
                "xgmi_write_bytes",
                ("link",),
                kind="counter",
            )
        ),
        device(
            "amdgpu_xgmi_error_events",
            "XGMI error events, accumulated by the exporter (the driver's xgmi_error file clears on read).",
            "xgmi_error_events",
            kind="counter",
        ),
    ),
    *in_collector(
        "ecc",
        device(
            "amdgpu_ecc_errors",
            "RAS error counts by block and type (correctable, uncorrectable, deferred) since driver load.",
            "ecc_errors",
            ("block", "type"),
            kind="counter",
        ),
        device("amdgpu_ras_retired_pages", "VRAM pages retired by RAS.", "ras_retired_pages"),
        device(
            "amdgpu_ras_pending_pages",
            "VRAM pages RAS found bad that are not retired yet (the driver retires them at the next GPU reset).",
            "ras_pending_pages",
        ),
        device(
            "amdgpu_ras_bad_page_threshold_pages",
            "Retired pages at which the driver declares the board's VRAM bad (the RMA point): debugfs's "
            "bad_page_cnt_threshold, else worked out from the bad_page_threshold module parameter as the "
            "driver does. No series when bad page retirement is off.",
            "ras_bad_page_threshold",
        ),
    ),
    *in_collector(
        "health",
        device(
            "amdgpu_cper_records",
            "Error records (UEFI CPER) in the driver's CPER ring now, by severity (fatal, nonfatal, corrected). "
            "Kernels 6.15+ on MI300-class, read from debugfs (root). No series for a severity with none.",
            _cper_counts,
            ("severity",),
        ),
        device(
            "amdgpu_cper_newest_record_timestamp_seconds",
            "Unix time of the newest CPER record of each severity in the driver's ring (its age: time() - this).",
            _cper_newest,
            ("severity",),
        ),
        device(
            "amdgpu_last_reset_timestamp_seconds",
            "Unix time of the GPU reset whose device coredump the driver still holds (devcoredump; the kernel "
            "drops it after 5 minutes). No series when there is none.",
            "last_reset_at",
        ),
    ),
    *in_collector(
        "pcie",
        device(
            "amdgpu_pcie_aer_errors",
            "PCIe AER errors since boot (aer_dev_* TOTAL_ERR_*) of the device (port=device) and of the switch "
            "or root port above it (port=upstream), by severity (correctable, nonfatal, fatal).",
            "pcie_aer_errors",
            ("port", "severity"),
            kind="counter",
        ),
    ),
    *in_collector(
        "windows",
        MetricSpec(
            "amdgpu_temperature_window_celsius",
            "Temperature of a sensor over the sliding window (amdgpu_exporter_window_seconds) of fast samples: "
            "stat min, max or mean. A spike between two scrapes shows in max.",
            _window("temperature", keyed=True),
            ("gpu", "sensor", "stat"),
        ),
        MetricSpec(
            "amdgpu_power_window_watts",
            "Socket power over the sliding window of fast samples: stat min, max or mean; the mean is the "
            "energy accumulator's change over the window, exact whatever the sampling. MI250X: die 0 only.",
            _window("power", keyed=False),
            ("gpu", "stat"),
        ),
        MetricSpec(
            "amdgpu_busy_window_ratio",
            "Busy ratio of an engine (gfx, memory) over the sliding window of fast samples: stat min, max or "
            "mean. MI300: the mean comes from the firmware's activity accumulators. Compute/communication "
            "alternation shows as max near 1 and min far below it.",
            _window("busy", keyed=True),
            ("gpu", "engine", "stat"),
        ),
        MetricSpec(
            "amdgpu_clock_window_hertz",
            "Current clock of a domain (gfx, memory, soc) over the sliding window of fast samples: "
            "stat min, max or mean.",
            _window("clock", keyed=True),
            ("gpu", "domain", "stat"),
        ),
    ),
    *in_collector(
        "device",
        per_device(
            "amdgpu_up",
            "1 if the device's last read succeeded within its deadline, else 0.",
            lambda state: [((), state.up)],
        ),
        per_device(
            "amdgpu_device_present",
            "1 while discovery finds the device, 0 once it has vanished (it keeps its gpu index).",
            lambda state: [((), state.present)],
        ),
        per_device(
            "amdgpu_device_down_info",
            "Why a device is down (gone, timeout, stuck, read_error, ...); no series while it is up.",
            # A family of its own, not a label of amdgpu_up: a changing reason must not give amdgpu_up a new series.
            lambda state: [] if state.up else [(state.down_reason or "unknown", 1)],
            ("reason",),
        ),
        per_device(
            "amdgpu_device_info",
            "Identity of a device (always 1); join on gpu for labels. A compute partition of an MI300-class socket "
            "is its own device: partition 0..N-1, the socket's pci_bus_id and package; socket-wide values "
            "(power, energy, temperatures, memory, PCIe, XGMI, ECC) are on partition 0 only. deployment: "
            "baremetal, or guest for an SR-IOV virtual function in a VM (which sees only part of the device); "
            "identity_source: unique_id, or pci_bus_id when the device has no unique id (a VF's is 0).",
            lambda state: [(tuple(getattr(state.identity, field) for field in IDENTITY_FIELDS.values()), 1)],
            IDENTITY_LABELS,
        ),
        per_device(
            "amdgpu_sample_timestamp_seconds",
            "Unix time of the device's latest good sample.",
            lambda state: [((), state.sample.timestamp if state.sample is not None else None)],
        ),
    ),
    *in_collector(
        "firmware",
        off_by_default(
            MetricSpec(
                "amdgpu_firmware_info",
                "Firmware version of a block (always 1), once per package: on its first device (die 0, partition 0); "
                "another device of the package has a series only for a block whose version differs. Join on package "
                "through amdgpu_device_info.",
                _cycle(_firmware),
                ("gpu", "block", "version"),
            )
        ),
    ),
    *in_collector(
        "topology",
        off_by_default(
            MetricSpec(
                "amdgpu_topology_link_info",
                "KFD io_link from a device to a peer (always 1). A partitioned MI300-class socket's links are "
                "exported once, between partition 0s: its other partitions share them (join on pci_bus_id).",
                _cycle(_topology),
                ("gpu", "peer", "type", "hops", "weight"),
            )
        ),
    ),
    *in_collector(
        "exporter",
        per_device(
            "amdgpu_exporter_read_errors",
            "Failed device reads by reason.",
            lambda state: sorted(state.read_errors.items()),
            ("reason",),
            kind="counter",
        ),
        per_device(
            "amdgpu_exporter_read_timeouts",
            "Device reads that missed their deadline.",
            lambda state: [((), state.read_timeouts)],
            kind="counter",
        ),
        per_device(
            "amdgpu_exporter_file_errors",
            "Failed reads of one file and rejected values by reason (parse, implausible, too_large, eio, eperm, ...).",
            lambda state: sorted(state.file_errors.items()),
            ("file", "reason"),
            kind="counter",
        ),
    ),
    *in_collector(
        "alerts",
        MetricSpec(
            "amdgpu_alert_firing",
            "1 while an in-daemon alert fires on a device.",
            _cycle(lambda p: [((alert.gpu, alert.alert, alert.severity), alert.firing) for alert in p.alerts]),
            ("gpu", "alert", "severity"),
        ),
        MetricSpec(
            "amdgpu_clock_down_suggested_ratio",
            "Suggested gfx clock ceiling reduction (0..1).",
            _cycle(_clock_down_ratio),
            ("gpu",),
        ),
        MetricSpec(
            "amdgpu_suggested_gfx_clock_max_hertz", "Suggested gfx clock ceiling.", _cycle(_suggested_ceiling), ("gpu",)
        ),
        MetricSpec(
            "amdgpu_alert_suggestion_info",
            "The command of a firing in-daemon alert's suggestion and the one command that undoes it.",
            _cycle(_suggested_commands),
            ("gpu", "alert", "suggested_command", "undo_command"),
            # Only while a suggestion with a command fires: Prometheus's forwarded alert reads it.
            omit_when_empty=True,
        ),
    ),
    *in_collector(
        "health",
        MetricSpec(
            "amdgpu_health_status",
            "1 while the GPU is fit to run a job (no health check fails), 0 while one fails or the GPU cannot be read.",
            _cycle(lambda p: [(gpu.gpu, gpu.fit) for gpu in p.health.gpus]),
            ("gpu",),
        ),
        MetricSpec(
            "amdgpu_health_check",
            "1 for each failing health check of a GPU (docs/health.md: what it reads, its threshold, when it clears).",
            _cycle(lambda p: [((gpu.gpu, c.check, c.severity), 1) for gpu in p.health.gpus for c in gpu.checks]),
            ("gpu", "check", "severity"),
        ),
        MetricSpec(
            "amdgpu_health_check_since_seconds",
            "How long a failing health check has been failing, as of the poll cycle.",
            _cycle(
                lambda p: [
                    ((gpu.gpu, c.check), max(0.0, p.health.taken_at - c.since))
                    for gpu in p.health.gpus
                    for c in gpu.checks
                ]
            ),
            ("gpu", "check"),
        ),
        MetricSpec(
            "amdgpu_health_suggestion_info",
            "What to run while a GPU is unfit: take the node out of service (Slurm, Kubernetes) and the undo.",
            _cycle(_health_suggestions),
            ("scheduler", "suggested_command", "undo_command"),
            omit_when_empty=True,
        ),
    ),
    *in_collector(
        "exporter",
        MetricSpec(
            "amdgpu_exporter_build_info",
            "Exporter version and the source it reads (always 1).",
            _cycle(lambda p: [((__version__, p.stats.source, p.stats.source_reason), 1)]),
            ("version", "source", "source_reason"),
        ),
    ),
    *in_collector(
        "host",
        _host(
            "amdgpu_driver_info",
            "The host's amdgpu driver (version, initstate), kernel release and ppfeaturemask (always 1).",
            lambda host: [((host.driver_version, host.driver_initstate, host.kernel_release, host.ppfeaturemask), 1)],
            ("version", "initstate", "kernel", "ppfeaturemask"),
        ),
        _host(
            "amdgpu_rocm_info",
            "A ROCm install found on the host: version and folder (always 1).",
            lambda host: [((version, path), 1) for path, version in host.rocm],
            ("version", "path"),
        ),
        _host(
            "amdgpu_smi_library_info",
            "An SMI library found on the host (librocm_smi64, libamd_smi) and the version it reports (always 1).",
            lambda host: [(library, 1) for library in host.smi_libraries],
            ("library", "version"),
        ),
    ),
    *in_collector(
        "exporter",
        MetricSpec(
            "amdgpu_exporter_last_poll_timestamp_seconds",
            "Unix time the last poll cycle finished.",
            _cycle(lambda p: [((), p.snapshot.taken_at)]),
        ),
    ),
    *in_collector(
        "windows",
        MetricSpec(
            "amdgpu_exporter_window_seconds",
            "Length of the sliding window the *_window_* families cover (--window).",
            _optional(lambda p: p.snapshot.windows, lambda windows: [((), windows.window_seconds)]),
        ),
        MetricSpec(
            "amdgpu_exporter_fast_samples",
            "gpu_metrics reads by the fast sampler (--fast.interval) that gave a sample.",
            _optional(lambda p: p.snapshot.windows, lambda windows: sorted(windows.stats.samples.items())),
            ("gpu",),
            kind="counter",
        ),
        MetricSpec(
            "amdgpu_exporter_fast_read_errors",
            "Fast sampler reads that gave no sample, by reason (timeout, gone, read_error, unreadable_table).",
            _optional(lambda p: p.snapshot.windows, lambda windows: sorted(windows.stats.read_errors.items())),
            ("gpu", "reason"),
            kind="counter",
        ),
        _histogram(
            "amdgpu_exporter_fast_cycle_duration_seconds",
            "Wall time of one fast-sampler cycle: one gpu_metrics read of every device.",
            _fast_cycle_durations,
        ),
    ),
    *in_collector(
        "exporter",
        MetricSpec(
            "amdgpu_exporter_worker_restarts",
            "Restarts of the rocm-smi worker process.",
            _cycle(lambda p: [((), p.snapshot.source_stats.worker_restarts)]),
            kind="counter",
            omit_when_empty=True,
        ),
        MetricSpec(
            "amdgpu_exporter_alertmanager_notifications",
            "Alert pushes to Alertmanager by result.",
            _optional(lambda p: p.stats.alertmanager, lambda stats: [("failed", stats.failed), ("sent", stats.sent)]),
            ("result",),
            kind="counter",
        ),
        MetricSpec(
            "amdgpu_exporter_actions",
            "Drains and resumes of this node the Slurm action mode (--action.slurm) ran or would have, by action "
            "and outcome (done, dry_run, refused_share, refused_foreign, rate_limited, failed); no series when "
            "the mode is off.",
            _optional(lambda p: p.stats.actions, lambda stats: sorted(stats.counts.items())),
            ("action", "outcome"),
            kind="counter",
            omit_when_empty=True,
        ),
        MetricSpec(
            "amdgpu_exporter_device_plugin_calls",
            "Calls of the device-plugin health service (--device-plugin.socket: DME's gRPC MetricsService, "
            "asked by ROCm's k8s-device-plugin) answered, by method (List, GetGPUState); no series when it is off.",
            _optional(
                lambda p: p.stats.device_plugin,
                lambda stats: [(method, stats.calls.get(method, 0)) for method in DEVICE_PLUGIN_METHODS],
            ),
            ("method",),
            kind="counter",
            omit_when_empty=True,
        ),
        MetricSpec(
            "amdgpu_exporter_discoveries",
            "Device discoveries by result (ok, failed: an error or past its deadline).",
            _cycle(lambda p: [("failed", p.snapshot.discovery_failures), ("ok", p.snapshot.discoveries)]),
            ("result",),
            kind="counter",
        ),
        MetricSpec(
            "amdgpu_exporter_stage_failures",
            "Failures of a pipeline stage (rules, health, render, alertmanager); /readyz is 503 while one is failing.",
            _cycle(lambda p: [(stage, p.stats.stage_failures.get(stage, 0)) for stage in STAGES]),
            ("stage",),
            kind="counter",
        ),
        MetricSpec(
            "amdgpu_exporter_reloads",
            "Re-reads of the config file and the rule file (SIGHUP) and of --web.config.file (on a change), by "
            "what and result (failure: what runs was kept, the log says why).",
            _cycle(_reloads),
            ("what", "result"),
            kind="counter",
        ),
        # The HTTP layer (exporter/web), only with --web.config.file (its reloads: amdgpu_exporter_reloads above).
        _web(
            "amdgpu_exporter_web_config_last_reload_successful",
            "1 if the web configuration on disk is the one in effect, 0 after an invalid edit.",
            lambda web: [((), web.config_last_reload_ok)],
        ),
        _web(
            "amdgpu_exporter_http_rejections",
            "Connections and requests refused by the HTTP layer, by reason.",
            lambda web: web.rejections,
            ("reason",),
            kind="counter",
        ),
        _web(
            "amdgpu_exporter_http_connections",
            "Open HTTP connections (including TLS handshakes).",
            lambda web: [((), web.open_connections)],
        ),
        _web(
            "amdgpu_exporter_http_max_connections",
            "Cap on open HTTP connections (from the open-files budget).",
            lambda web: [((), web.max_connections)],
        ),
    ),
    *in_collector(
        "attribution",
        # Attribution (--kubernetes, --slurm.state-dir, --collector.processes): no family when off.
        MetricSpec(
            "amdgpu_allocation_info",
            "A Kubernetes container holding the device (always 1), from the kubelet's pod-resources API.",
            _holders("kubernetes", lambda a, pod: (a.gpu, pod["pod"], pod["namespace"], pod["container"], a.resource)),
            ("gpu", "pod", "namespace", "container", "resource"),
            omit_when_empty=True,
            attributed=False,
        ),
        MetricSpec(
            "amdgpu_job_info",
            "A Slurm job holding the device (always 1), from the prolog's state files.",
            _holders("slurm", lambda a, job: (a.gpu, job["job_id"], job["job_user"], job["job_partition"])),
            ("gpu", "job_id", "job_user", "job_partition"),
            omit_when_empty=True,
            attributed=False,
        ),
        # Per-job accounting (exporter/accounting/): two series per running job, none once it ended.
        _job(
            "amdgpu_job_energy_joules",
            "Energy the running job or pod has used on this node so far (its share of each package's counter).",
            "energy_joules",
        ),
        _job(
            "amdgpu_job_gpu_seconds",
            "GPU-seconds the running job or pod has held on this node so far (a die or partition counts as one).",
            "gpu_seconds",
        ),
        MetricSpec(
            "amdgpu_exporter_attribution_up",
            "1 if the attribution source's last read succeeded (kubernetes: within its deadline), else 0.",
            _cycle(lambda p: sorted(p.snapshot.attribution.sources_up.items())),
            ("source",),
            omit_when_empty=True,
        ),
    ),
    *in_collector(
        "processes",
        off_by_default(
            _process_usage(
                "amdgpu_process_memory_bytes",
                "VRAM a process has allocated on the device (KFD), for the top processes per device by VRAM.",
                "vram_bytes",
            )
        ),
        off_by_default(
            _process_usage(
                "amdgpu_process_compute_unit_occupancy_ratio",
                "Share of the device's compute units the process's waves occupy now (KFD cu_occupancy / CUs, 0..1).",
                "cu_occupancy_ratio",
            )
        ),
        off_by_default(
            _process_usage(
                "amdgpu_process_sdma_seconds",
                "Time the process's SDMA (copy engine) queues on the device have been busy (KFD).",
                "sdma_seconds",
                kind="counter",
            )
        ),
    ),
    *in_collector(
        "exporter",
        # The process collector's families under their conventional names (dashboards and alerts for
        # any Prometheus exporter use them); no series where /proc cannot be read.
        _process("process_cpu_seconds", "CPU time (user and system) the exporter process has used.", "counter"),
        _process(
            "process_resident_memory_bytes",
            "Resident memory of the exporter process (what the systemd unit's MemoryMax limits).",
        ),
        _process("process_virtual_memory_bytes", "Virtual memory of the exporter process."),
        _process("process_start_time_seconds", "Unix time the exporter process started."),
        _process("process_open_fds", "File descriptors the exporter process has open."),
        _process("process_max_fds", "Limit on open file descriptors of the exporter process."),
        # Last: made from rendering every family above (node_exporter's scrape_collector_*). Off by
        # default: their 2 x 18 series a node take the 8-device MI300X and MI350X nodes past the
        # series budget; --collector.exporter (or families.include) shows them.
        off_by_default(
            MetricSpec(
                "amdgpu_exporter_collector_success",
                "1 if every family of a collector was made without an error in this render, else 0 (the log "
                "says which family and why).",
                lambda _published: (),
                ("collector",),
                outcome=lambda outcomes: [((name,), float(ok)) for name, (ok, _seconds) in outcomes.items()],
            )
        ),
        off_by_default(
            MetricSpec(
                "amdgpu_exporter_collector_duration_seconds",
                "Time spent making a collector's families in this render (its values were read by the poll loop).",
                lambda _published: (),
                ("collector",),
                outcome=lambda outcomes: [((name,), seconds) for name, (_ok, seconds) in outcomes.items()],
            )
        ),
    ),
)

# The families read from each device's latest sample.
DEVICE_METRICS: tuple[MetricSpec, ...] = tuple(spec for spec in METRICS if spec.sample_getter is not None)
BY_NAME = {spec.name: spec for spec in METRICS}
# The node-wide families (no gpu label): one value per node, from the first device that supplies it.
NODE_FAMILIES = frozenset(spec.name for spec in METRICS if spec.values in _NODE_VALUES)


# Families no Grafana panel draws, each with the reason (tests/integration/test_grafana_dashboards.py
# holds every other family to a panel that queries it): a new family is drawn by
# grafana/build_dashboards.py or named here, beside its entry's table.
NOT_ON_DASHBOARDS: Mapping[str, str] = {
    # The health verdict (docs/health.md): read by deploy/prometheus/amdgpu-health.rules.yml.
    "amdgpu_health_check_since_seconds": "health panels drawn by the fleet-dashboard work",
    "amdgpu_health_suggestion_info": "health panels drawn by the fleet-dashboard work",
    # Why a device is down: read by the rules (AMDGPUDeviceMissing / AMDGPUDeviceDown); the dashboards
    # show amdgpu_up.
    "amdgpu_device_down_info": "read by the alert rules; the dashboards show amdgpu_up",
    # The command and undo of a firing suggestion: AMDGPUDaemonAlert copies them into its annotations;
    # the dashboards show the alerts themselves (amdgpu_alert_firing).
    "amdgpu_alert_suggestion_info": "read by AMDGPUDaemonAlert for its annotations",
    # The MI350-class board/ group: no simulated or real tree the dashboards are checked against has
    # it yet (MI300X/MI325X have no board/), and the dashboards' JSON is edited in its own change.
    "amdgpu_board_temperature_celsius": "MI350-class board/ only; no panel until the dashboards get an MI350 row",
    "amdgpu_baseboard_temperature_celsius": "MI350-class board/ only (node-wide); no panel yet",
    "amdgpu_node_power_watts": "MI350-class board/ only (node-wide); no panel yet",
    "amdgpu_node_power_limit_watts": "MI350-class board/ only (node-wide); no panel yet",
    "amdgpu_node_power_limit_max_watts": "MI350-class board/ only (node-wide); no panel yet",
    "amdgpu_node_power_management_active": "MI350-class board/ only (node-wide); no panel yet",
    "amdgpu_baseboard_power_watts": "MI350-class board/ only (node-wide); no panel yet",
    "amdgpu_baseboard_power_limit_watts": "MI350-class board/ only (node-wide); no panel yet",
    # The raw health signals: the health verdict (docs/health.md) reads them; the dashboards, being
    # rewritten at the same time, are left to draw them (or the verdict) in their own change.
    "amdgpu_ras_pending_pages": "a raw health signal, read by the health verdict; not drawn yet",
    "amdgpu_ras_bad_page_threshold_pages": "a raw health signal, read by the health verdict; not drawn yet",
    "amdgpu_cper_records": "a raw health signal, read by the health verdict; not drawn yet",
    "amdgpu_cper_newest_record_timestamp_seconds": "a raw health signal, read by the health verdict; not drawn yet",
    "amdgpu_last_reset_timestamp_seconds": "a raw health signal, read by the health verdict; not drawn yet",
    "amdgpu_pcie_aer_errors_total": "a raw health signal, read by the health verdict; not drawn yet",
    # Per-XCC and per-decoder detail, the floor of each clock and the VRAM's peak bandwidth: new
    # families the dashboards' rewrite is to draw (a per-XCC busy heatmap of MI300-class devices).
    "amdgpu_xcc_busy_ratio": "new; per-XCC detail of amdgpu_busy_ratio{engine=gfx}, not drawn yet",
    "amdgpu_media_engine_busy_ratio": "opt-in (--collector.xcc); amdgpu_busy_ratio{engine=media} is drawn",
    "amdgpu_xcc_below_host_limit_seconds_total": "opt-in (--collector.xcc); throttle residency is drawn",
    "amdgpu_clock_min_hertz": "new; a static floor beside amdgpu_clock_max_hertz, not drawn yet",
    "amdgpu_memory_max_bandwidth_bytes_per_second": "new; a static peak for a memory panel, not drawn yet",
    "amdgpu_pcie_replay_rollovers_total": "new; beside amdgpu_pcie_replays_total, not drawn yet",
    "amdgpu_pcie_other_end_recoveries_total": "new; beside amdgpu_pcie_recoveries_total, not drawn yet",
    "amdgpu_gfx_clock_lock_active": "new; a clock lock beside amdgpu_clock_hertz, not drawn yet",
    "amdgpu_clock_average_hertz": "new; MI200-class only, beside amdgpu_clock_hertz, not drawn yet",
    # Opt-in modes' own counters: no series unless the mode is on; logged per action/call as well.
    "amdgpu_exporter_actions_total": "only with --action.slurm; each action is also a log event",
    "amdgpu_exporter_device_plugin_calls_total": "only with --device-plugin.socket; not drawn yet",
    # The collectors' own outcome (as node_exporter's node_scrape_collector_*): off by default.
    "amdgpu_exporter_collector_success": "the exporter's own; off by default (the series budget)",
    "amdgpu_exporter_collector_duration_seconds": "the exporter's own; off by default (the series budget)",
}


def all_metric_names() -> list[str]:
    """Every family name /metrics can carry (counters with their _total suffix)."""
    return [spec.exposed_name for spec in METRICS]
