"""Pure conversions: what the rocm_smi worker read (library units) -> the data model (SI units).

Library units: temperatures millidegrees C (gpu_metrics fields whole degrees C), power and caps
microwatts, memory bytes, clocks Hz, PCIe rates transfers/s, voltage millivolts, energy as raw
accumulator ticks (the library's own 15.3 uJ resolution is replaced by the hardware's 2^-16 J).

Field by field the rules are the ones the sysfs source applies to the same files, so the two
sources agree on the same tree: all-ones gpu_metrics fields are absent, a power cap of 0 (MI250X
second die) is no cap, the second die of a dual-die package shows no power or energy. The rules
for the values both SMI libraries supply alike (gpu_metrics fields, caps) are here once; the
amd-smi converter uses them too.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from exporter.abi.gpu_metrics import C_TYPES, V1_1
from exporter.model import DeviceIdentity, Sample, TopologyLink, frozen_map
from exporter.sources.rocm_smi.library import ENERGY_TICK_JOULES, IO_LINK_TYPES, RSMI_MAX_NUM_FREQUENCIES

_U16_NONE = 0xFFFF
# gpu_metrics pcie_link_speed is in 0.1 GT/s. Aldebaran reports an ESM link as a code in 128..255
# that is not a rate; like the gpu_metrics decoder, such a value is left out, not mis-scaled.
_PCIE_RATES_100MTS = frozenset({25, 50, 80, 160, 320, 640})
_METRICS_TEMPERATURES = {"vr_gfx": "temperature_vrgfx", "vr_soc": "temperature_vrsoc", "vr_mem": "temperature_vrmem"}
# gpu_metrics current clocks (MHz) -> our domain; the same fields the gpu_metrics decoder uses.
_METRICS_CLOCKS = {
    "gfx": "current_gfxclk",
    "soc": "current_socclk",
    "memory": "current_uclk",
    "video": "current_vclk0",
    "decode": "current_dclk0",
}
_RETIRED = "0"  # rsmi_memory_page_status_t RSMI_MEM_PAGE_STATUS_RESERVED
_PENDING = "1"  # RSMI_MEM_PAGE_STATUS_PENDING


def gpu_metrics_table(readings: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's rsmi_gpu_metrics_t bytes (hex) -> kernel field name -> value (a list for arrays).

    The library converts every table it accepts into the kernel's gpu_metrics_v1_1 layout.
    """
    raw = bytes.fromhex(readings.get("gpu_metrics") or "")
    if len(raw) < V1_1.size:
        return {}
    table = {}
    for field in V1_1.fields:
        values = struct.unpack_from(f"<{field.count}{C_TYPES[field.ctype][0]}", raw, field.offset)
        table[field.name] = list(values) if field.count > 1 else values[0]
    return table


def number(value: Any) -> float | None:
    """A value the library supplied as a number; None for anything else (None, a string, a bool)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def numbers(values: Mapping[Any, Any] | None) -> dict[Any, float]:
    """The entries of `values` that are numbers."""
    return {k: v for k, v in ((k, number(v)) for k, v in (values or {}).items()) if v is not None}


def _metric(value: Any) -> float | None:
    """A gpu_metrics field (all u16 here): all-ones is the kernel's "not supplied"."""
    reading = number(value)
    return None if reading == _U16_NONE else reading


def metrics_temperatures(table: Mapping[str, Any]) -> dict[str, float]:
    """The voltage regulator and HBM sensors (°C) of a gpu_metrics table."""
    result = numbers({sensor: _metric(table.get(name)) for sensor, name in _METRICS_TEMPERATURES.items()})
    return result | numbers({f"hbm{i}": _metric(v) for i, v in enumerate(table.get("temperature_hbm") or ())})


def metrics_clocks(table: Mapping[str, Any]) -> dict[str, float]:
    """The current clocks (Hz) of a gpu_metrics table."""
    return {
        domain: mhz * 1e6 for domain, name in _METRICS_CLOCKS.items() if (mhz := _metric(table.get(name))) is not None
    }


def metrics_pcie_link(table: Mapping[str, Any]) -> dict[str, Any]:
    """The current PCIe link of a gpu_metrics table, as Sample fields."""
    result: dict[str, Any] = {}
    width, speed = _metric(table.get("pcie_link_width")), _metric(table.get("pcie_link_speed"))
    if width is not None:
        result["pcie_link_width"] = int(width)
    if speed is not None and not (128 <= speed < 256 and speed not in _PCIE_RATES_100MTS):
        result["pcie_link_transfers_per_second"] = speed * 1e8
    return result


def cap_watts(microwatts: Any) -> float | None:
    """µW -> W. MI250X die 1 reports a cap of 0: there is no cap to show, not a cap of zero."""
    value = number(microwatts)
    return value / 1e6 if value else None


def temperatures(readings: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, float]:
    """Sensor -> °C: hwmon sensors through rsmi_dev_temp_metric_get, the rest from gpu_metrics."""
    result = {sensor: m["current"] / 1000.0 for sensor, m in readings.get("temperatures", {}).items() if "current" in m}
    return result | metrics_temperatures(metrics)


def thresholds(slow: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    return {
        (sensor, threshold): metrics[threshold] / 1000.0
        for sensor, metrics in slow.get("temperatures", {}).items()
        for threshold in ("critical", "emergency")
        if threshold in metrics
    }


def energy_joules(readings: Mapping[str, Any]) -> float | None:
    """The accumulator times the hardware tick (2^-16 J), not the library's 15.3 uJ."""
    energy = readings.get("energy")
    if not energy:
        return None
    ticks = int(energy["ticks"])
    if ticks == (1 << 64) - 1:
        return None
    return ticks * ENERGY_TICK_JOULES


def busy(readings: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, float]:
    percent = {"gfx": readings.get("busy_percent"), "memory": readings.get("memory_busy_percent")}
    percent["media"] = _metric(metrics.get("average_mm_activity"))
    return {engine: value / 100.0 for engine, value in percent.items() if value is not None}


def _current_level(levels: list[int], current: int) -> int | None:
    # The library leaves `current` out of range (RSMI_MAX_NUM_FREQUENCIES + 1 or -1) when no
    # level is marked.
    return levels[current] if 0 <= current < min(len(levels), RSMI_MAX_NUM_FREQUENCIES) else None


def gfx_levels(slow: Mapping[str, Any]) -> tuple[float, ...] | None:
    """The gfx DPM table's levels in Hz, lowest first; None when the library gave none."""
    levels = [float(hz) for hz in slow.get("clocks", {}).get("gfx", {}).get("hertz", ())]
    if not levels:
        return None
    levels.sort()
    # As the sysfs source: a fine-grained table (min, the clock of the moment, max) is its range.
    return (levels[0], levels[-1]) if len(levels) <= 3 else tuple(levels)


def clocks(metrics: Mapping[str, Any], slow: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(current, max) Hz per domain: DPM tables on the slow schedule, gpu_metrics every read."""
    current: dict[str, float] = {}
    maximum: dict[str, float] = {}
    for domain, table in slow.get("clocks", {}).items():
        levels = [int(hz) for hz in table.get("hertz", ())]
        if not levels:
            continue
        maximum[domain] = float(max(levels))
        level = _current_level(levels, int(table.get("current", -1)))
        if level is not None:
            current[domain] = float(level)
    return current | metrics_clocks(metrics), maximum


def minimum_clocks(slow: Mapping[str, Any]) -> dict[str, float]:
    """The lowest DPM level per domain, Hz (as the sysfs source: the first pp_dpm_* line)."""
    found = {}
    for domain, table in slow.get("clocks", {}).items():
        levels = [int(hz) for hz in table.get("hertz", ())]
        if levels:
            found[domain] = float(min(levels))
    return found


def pcie_link(metrics: Mapping[str, Any], slow: Mapping[str, Any]) -> dict[str, Any]:
    """Current link from gpu_metrics (else the marked pp_dpm_pcie level), max from pp_dpm_pcie."""
    result: dict[str, Any] = {}
    levels = slow.get("pcie_levels") or {}
    rates = [int(r) for r in levels.get("transfers", ())]
    lanes = [int(n) for n in levels.get("lanes", ())]
    if rates:
        result["pcie_max_link_transfers_per_second"] = float(max(rates))
    if lanes:
        result["pcie_max_link_width"] = max(lanes)
    index = int(levels.get("current", -1))
    if 0 <= index < min(len(rates), len(lanes)):
        result["pcie_link_transfers_per_second"] = float(rates[index])
        result["pcie_link_width"] = lanes[index]
    return result | metrics_pcie_link(metrics)


def pcie_bandwidth(readings: Mapping[str, Any]) -> float | None:
    """(sent + received) x max payload: an upper bound over the kernel's 1 s window."""
    throughput = readings.get("pcie_throughput")
    if not throughput:
        return None
    return float((int(throughput["sent"]) + int(throughput["received"])) * int(throughput["max_payload"]))


def ecc(slow: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    return {
        (block, kind): int(count)
        for block, counts in slow.get("ecc", {}).items()
        for kind, count in zip(("correctable", "uncorrectable"), counts, strict=True)
    }


def retired_pages(slow: Mapping[str, Any], status: str = "0") -> int | None:
    """Pages retired for good (status reserved); pending and unreservable ones are not counted (or, with
    `status`, the pages of that rsmi_memory_page_status_t)."""
    by_status = slow.get("retired_pages")
    if by_status is None:
        return None
    return int(by_status.get(status, 0))


def sample_from_readings(readings: Mapping[str, Any], slow: Mapping[str, Any], timestamp: float) -> Sample:
    """One Sample from an every-cycle read plus the latest slow read of the same device."""
    metrics = gpu_metrics_table(readings)
    current_clocks, max_clocks = clocks(metrics, slow)
    microwatts = number(readings.get("power_average"))
    millivolts = number(readings.get("vddgfx_mv"))
    return Sample(
        timestamp=timestamp,
        temperatures=frozen_map(temperatures(readings, metrics)),
        temperature_thresholds=frozen_map(thresholds(slow)),
        power_watts=microwatts / 1e6 if microwatts is not None else None,
        power_cap_watts=cap_watts(slow.get("power_cap")),
        power_cap_max_watts=cap_watts(slow.get("power_cap_max")),
        energy_joules=energy_joules(readings),
        busy=frozen_map(busy(readings, metrics)),
        memory_used_bytes=frozen_map(numbers(readings.get("memory_used"))),
        memory_total_bytes=frozen_map(numbers(slow.get("memory_total"))),
        clocks_hertz=frozen_map(current_clocks),
        clocks_max_hertz=frozen_map(max_clocks),
        clocks_min_hertz=frozen_map(minimum_clocks(slow)),
        gfx_dpm_levels_hertz=gfx_levels(slow),
        voltages_volts=frozen_map({"gfx": millivolts / 1000.0} if millivolts is not None else {}),
        pcie_bandwidth_upper_bound_bytes_per_second=pcie_bandwidth(readings),
        pcie_replays=slow.get("pcie_replays"),
        ecc_errors=frozen_map(ecc(slow)),
        ras_retired_pages=retired_pages(slow, _RETIRED),
        ras_pending_pages=retired_pages(slow, _PENDING),
        **pcie_link(metrics, slow),
    )


def for_device(sample: Sample, device: DeviceIdentity, xgmi_error_events: int | None) -> Sample:
    """What either library's sample of `device` shows, by rules of the device rather than the library."""
    changes: dict[str, Any] = {"xgmi_error_events": xgmi_error_events}
    if device.die > 0:
        # The second die of an MI250X reads 0 W and 0 J: the package is measured on die 0.
        changes |= {"power_watts": None, "energy_joules": None}
    if device.compute_partition not in ("", "SPX"):
        # A partitioned socket: the library's gfx/media busy (gpu_busy_percent) is the socket's,
        # not partition 0's own (its xcp_stats block), which only the fallback reads.
        changes["busy"] = frozen_map({k: v for k, v in sample.busy.items() if k not in ("gfx", "media")})
    return dataclasses.replace(sample, **changes)


_MAPPING_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(Sample)
    if f.name != "timestamp" and isinstance(getattr(Sample(0.0), f.name), Mapping)
)
_SCALAR_FIELDS = tuple(
    f.name for f in dataclasses.fields(Sample) if f.name != "timestamp" and f.name not in _MAPPING_FIELDS
)


def overlay(fallback: Sample, library: Sample) -> Sample:
    """The library's values, with the fallback's for whatever the library did not supply.

    Mappings merge per key (a library reading wins over the fallback's for the same key); an empty
    tuple (cper_records: neither library reads the CPER ring) is not supplied, like None.
    """
    changes: dict[str, Any] = {"timestamp": library.timestamp}
    for name in _SCALAR_FIELDS:
        value = getattr(library, name)
        changes[name] = value if value is not None and value != () else getattr(fallback, name)
    for name in _MAPPING_FIELDS:
        merged = {**getattr(fallback, name), **getattr(library, name)}
        changes[name] = frozen_map(merged)
    return Sample(**changes)


# What identify() answers as text, under the DeviceIdentity field's own name.
_IDENTITY_TEXTS = (
    "unique_id", "device_id", "product", "serial", "vbios", "xgmi_hive_id", "gpu_metrics_version",
    "compute_partition", "memory_partition",
)  # fmt: skip
# What the library reads over the fallback's values when it has one.
_LIBRARY_FIRST = ("unique_id", "device_id", "serial", "vbios", "driver_version", "xgmi_hive_id")


def identity_from_library(
    ident: Mapping[str, Any],
    *,
    pci_bus_id: str,
    card: str,
    device_dir: str,
    driver_version: str,
    peer_bus_ids: Mapping[int, str],
) -> DeviceIdentity:
    """A DeviceIdentity from the worker's identify() answer (no fallback to fill the rest)."""
    numa = ident.get("numa_node")
    texts: dict[str, Any] = {name: str(ident.get(name, "")) for name in _IDENTITY_TEXTS}
    return DeviceIdentity(
        pci_bus_id=pci_bus_id,
        card=card,
        device_dir=device_dir,
        driver_version=driver_version,
        numa_node=numa if isinstance(numa, int) and 0 <= numa < 1 << 31 else None,
        firmware=frozen_map({block: f"0x{int(v):08x}" for block, v in ident.get("firmware", {}).items()}),
        topology=direct_links(ident.get("links", ()), peer_bus_ids),
        **texts,
    )


def direct_links(links: Iterable[Mapping[str, Any]], peer_bus_ids: Mapping[int, str]) -> tuple[TopologyLink, ...]:
    """GPU-to-GPU links one hop long: what a KFD io_link between two GPU nodes describes.

    The library also reports multi-hop paths through the CPU (hops 2..4), which are not links.
    """
    result = []
    for link in links:
        peer = peer_bus_ids.get(int(link["peer"]))
        if peer is None or int(link["hops"]) != 1:
            continue
        kind = IO_LINK_TYPES.get(int(link["type"]), f"type{link['type']}")
        result.append(TopologyLink(peer, kind, 1, int(link.get("weight") or 0)))
    return tuple(sorted(result, key=lambda item: (item.peer_pci_bus_id, item.link_type)))


def merge_identity(fallback: DeviceIdentity, library: DeviceIdentity) -> DeviceIdentity:
    """The fallback's identity with what the library read put over it.

    The library cannot see CPU io_links, partitions, packages or hwmon folders; those stay. The
    product name stays the fallback's when it has one: without a product_name file the library
    falls back to pci.ids names, a different spelling of the same board.
    """
    cpu_links = tuple(link for link in fallback.topology if not link.peer_pci_bus_id)
    topology = tuple(sorted(library.topology + cpu_links, key=lambda item: (item.peer_pci_bus_id, item.link_type)))
    if not library.topology or any(link.peer_partition for link in fallback.topology):
        # No links from the library (amd-smi reports none), or a partitioned socket: the library's
        # links are between its devices' indices, which do not say which partition a peer is; KFD's
        # (the fallback's) do.
        topology = fallback.topology
    return dataclasses.replace(
        fallback,
        product=fallback.product or library.product,
        numa_node=library.numa_node if library.numa_node is not None else fallback.numa_node,
        firmware=frozen_map({**fallback.firmware, **library.firmware}),
        topology=topology,
        **{name: getattr(library, name) or getattr(fallback, name) for name in _LIBRARY_FIRST},
    )
