"""The metric table: every per-device metric the exporter exports, defined once.

Adding a metric = adding one MetricSpec here. Exposition, the README's metric reference, the
dashboards' coverage test and the rules' name check all read this table; nothing else lists names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from exporter.model import Sample

LabelledValue = tuple[tuple[str, ...], float]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family read from each device's latest sample.

    `name` is the family name without `_total` (prometheus-client appends it to counters).
    `labels` are the labels after `gpu`; `values` yields (label values, value) pairs and yields
    nothing when the device did not supply the field (absent, never a fake zero).
    """

    name: str
    kind: str  # "gauge" | "counter"
    help: str
    labels: tuple[str, ...]
    values: Callable[[Sample], Iterable[LabelledValue]]

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name


def _scalar(attr: str) -> Callable[[Sample], Iterable[LabelledValue]]:
    def values(sample: Sample) -> Iterable[LabelledValue]:
        value = getattr(sample, attr)
        if value is not None:
            yield (), float(value)

    return values


def _mapping(attr: str) -> Callable[[Sample], Iterable[LabelledValue]]:
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


_POLL_NOTE = " Read by the exporter's poll loop, not at scrape time; see amdgpu_sample_timestamp_seconds for its age."

DEVICE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "amdgpu_temperature_celsius",
        "gauge",
        "Temperature of a sensor: edge, junction (hotspot), memory, hbm0..3, vr_gfx, vr_soc, vr_mem." + _POLL_NOTE,
        ("sensor",),
        _mapping("temperatures"),
    ),
    MetricSpec(
        "amdgpu_temperature_threshold_celsius",
        "gauge",
        "The device's own temperature limit for a sensor (critical: throttling starts; emergency: shutdown).",
        ("sensor", "threshold"),
        _mapping("temperature_thresholds"),
    ),
    MetricSpec(
        "amdgpu_power_watts",
        "gauge",
        "Socket power. MI250X: only die 0 measures the package; die 1 has no series." + _POLL_NOTE,
        (),
        _scalar("power_watts"),
    ),
    MetricSpec("amdgpu_power_cap_watts", "gauge", "Current power cap (PPT).", (), _scalar("power_cap_watts")),
    MetricSpec(
        "amdgpu_power_cap_max_watts",
        "gauge",
        "Highest power cap allowed.",
        (),
        _scalar("power_cap_max_watts"),
    ),
    MetricSpec(
        "amdgpu_energy_joules",
        "counter",
        "Energy consumed, from the hardware accumulator at 2^-16 J per tick (resets on driver reload). "
        "MI250X: die 0 only.",
        (),
        _scalar("energy_joules"),
    ),
    MetricSpec(
        "amdgpu_busy_ratio",
        "gauge",
        "Fraction of time an engine was busy (0..1): gfx, memory, media." + _POLL_NOTE,
        ("engine",),
        _mapping("busy"),
    ),
    MetricSpec(
        "amdgpu_memory_used_bytes",
        "gauge",
        "Memory in use by pool: vram, visible_vram, gtt.",
        ("pool",),
        _mapping("memory_used_bytes"),
    ),
    MetricSpec(
        "amdgpu_memory_total_bytes",
        "gauge",
        "Memory size by pool.",
        ("pool",),
        _mapping("memory_total_bytes"),
    ),
    MetricSpec(
        "amdgpu_clock_hertz",
        "gauge",
        "Current clock by domain: gfx, memory, fabric, soc, video, decode.",
        ("domain",),
        _mapping("clocks_hertz"),
    ),
    MetricSpec(
        "amdgpu_clock_max_hertz",
        "gauge",
        "Highest DPM level of a clock domain (the ceiling a clock-down suggestion lowers).",
        ("domain",),
        _mapping("clocks_max_hertz"),
    ),
    MetricSpec(
        "amdgpu_voltage_volts",
        "gauge",
        "Voltage by rail: gfx, soc, memory.",
        ("rail",),
        _mapping("voltages_volts"),
    ),
    MetricSpec(
        "amdgpu_throttle_active",
        "gauge",
        "1 while the SMU reports this throttler active (ASIC-independent SMU_THROTTLER reasons), else 0.",
        ("reason",),
        _mapping("throttle"),
    ),
    MetricSpec(
        "amdgpu_pcie_current_link_transfers_per_second",
        "gauge",
        "Current PCIe link speed in transfers per second (16e9 = 16 GT/s).",
        (),
        _scalar("pcie_link_transfers_per_second"),
    ),
    MetricSpec(
        "amdgpu_pcie_max_link_transfers_per_second",
        "gauge",
        "Maximum PCIe link speed the device supports, in transfers per second.",
        (),
        _scalar("pcie_max_link_transfers_per_second"),
    ),
    MetricSpec(
        "amdgpu_pcie_current_link_width",
        "gauge",
        "Current PCIe link width in lanes.",
        (),
        _scalar("pcie_link_width"),
    ),
    MetricSpec(
        "amdgpu_pcie_max_link_width",
        "gauge",
        "Maximum PCIe link width in lanes.",
        (),
        _scalar("pcie_max_link_width"),
    ),
    MetricSpec(
        "amdgpu_pcie_bandwidth_bytes_per_second",
        "gauge",
        "PCIe bandwidth. MI300: pcie_bandwidth_inst from gpu_metrics; MI200: upper-bound estimate "
        "(messages x max payload) from pcie_bw, read in the background.",
        (),
        _scalar("pcie_bandwidth_bytes_per_second"),
    ),
    MetricSpec("amdgpu_pcie_replays", "counter", "PCIe replays (NAKs sent + received).", (), _scalar("pcie_replays")),
    MetricSpec(
        "amdgpu_pcie_recoveries",
        "counter",
        "PCIe link transitions from L0 to recovery.",
        (),
        _scalar("pcie_recoveries"),
    ),
    MetricSpec("amdgpu_pcie_naks", "counter", "PCIe NAKs by direction.", ("direction",), _pcie_naks),
    MetricSpec("amdgpu_xgmi_link_width", "gauge", "XGMI link width in lanes.", (), _scalar("xgmi_link_width")),
    MetricSpec(
        "amdgpu_xgmi_link_bits_per_second",
        "gauge",
        "XGMI link rate: lane rate x width.",
        (),
        _scalar("xgmi_link_bits_per_second"),
    ),
    MetricSpec(
        "amdgpu_xgmi_link_up",
        "gauge",
        "1 when an XGMI link is up, 0 when down.",
        ("link",),
        _mapping("xgmi_link_up"),
    ),
    MetricSpec(
        "amdgpu_xgmi_read_bytes",
        "counter",
        "Data read over an XGMI link (MI300: cumulative counters in gpu_metrics).",
        ("link",),
        _mapping("xgmi_read_bytes"),
    ),
    MetricSpec(
        "amdgpu_xgmi_write_bytes",
        "counter",
        "Data written over an XGMI link.",
        ("link",),
        _mapping("xgmi_write_bytes"),
    ),
    MetricSpec(
        "amdgpu_xgmi_error_events",
        "counter",
        "XGMI error events, accumulated by the exporter (the driver's xgmi_error file clears on read).",
        (),
        _scalar("xgmi_error_events"),
    ),
    MetricSpec(
        "amdgpu_ecc_errors",
        "counter",
        "RAS error counts by block and type (correctable, uncorrectable, deferred) since driver load.",
        ("block", "type"),
        _mapping("ecc_errors"),
    ),
    MetricSpec("amdgpu_ras_retired_pages", "gauge", "VRAM pages retired by RAS.", (), _scalar("ras_retired_pages")),
)
