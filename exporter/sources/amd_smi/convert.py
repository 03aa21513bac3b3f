"""Pure conversions: what the amd-smi worker read (the amdsmi module's units) -> the data model (SI).

Module units: temperatures and their limits whole °C; socket power W; power caps µW; energy as the
raw accumulator (the module's counter_resolution of 15.3 µJ is replaced by the hardware's 2^-16 J);
activity %; memory bytes; clocks MHz; PCIe speed MT/s; gpu_metrics fields in the kernel table's
own units (pcie_link_speed 0.1 GT/s, xgmi_link_speed Gbps per lane, XGMI data KB, residency ticks
of 1 ms, pcie_bandwidth_inst GB/s). None = not supplied (the module's "N/A", or a failed call).

The rules are the sysfs source's for the same kernel values, so the two agree on the same tree:
a power cap of 0 is no cap; the second die of a dual-die package shows no power or energy. Those
the two SMI libraries share (gpu_metrics fields, caps) are rocm_smi/convert.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.model import Sample, frozen_map
from exporter.sources.rocm_smi.convert import (
    ENERGY_TICK_JOULES,
    cap_watts,
    metrics_clocks,
    metrics_pcie_link,
    metrics_temperatures,
    number,
    numbers,
)
from exporter.sources.sysfs.partitions import RESIDENCY_LABELS, RESIDENCY_TICK_SECONDS

# the throttle `reason` label -> its gpu_metrics residency accumulator (the sysfs source's names)
_RESIDENCIES = {label: f"{name}_residency_acc" for name, label in RESIDENCY_LABELS.items()}


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def temperatures(readings: Mapping[str, Any]) -> dict[str, float]:
    return numbers(readings.get("temperatures")) | metrics_temperatures(readings.get("gpu_metrics") or {})


def thresholds(slow: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    return {
        (sensor, threshold): celsius
        for sensor, limits in (slow.get("thresholds") or {}).items()
        for threshold, raw in (limits or {}).items()
        if (celsius := number(raw)) is not None
    }


def clocks(readings: Mapping[str, Any], slow: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    current: dict[str, float] = {}
    maximum: dict[str, float] = {}
    for domain, info in (slow.get("clocks") or {}).items():
        info = info or {}
        if number(info.get("max_clk")) is not None:
            maximum[domain] = float(info["max_clk"]) * 1e6
        if number(info.get("clk")) is not None:
            current[domain] = float(info["clk"]) * 1e6
    return current | metrics_clocks(readings.get("gpu_metrics") or {}), maximum


def pcie(readings: Mapping[str, Any], slow: Mapping[str, Any]) -> dict[str, Any]:
    info = slow.get("pcie") or {}
    static, metric = info.get("pcie_static") or {}, info.get("pcie_metric") or {}
    metrics = readings.get("gpu_metrics") or {}
    counts = {
        "pcie_max_link_width": static.get("max_pcie_width"),
        "pcie_link_width": metric.get("pcie_width"),
        "pcie_recoveries": metrics.get("pcie_l0_to_recov_count_acc"),
        "pcie_naks_sent": metrics.get("pcie_nak_sent_count_acc"),
        "pcie_naks_received": metrics.get("pcie_nak_rcvd_count_acc"),
        "pcie_replay_rollovers": metrics.get("pcie_replay_rover_count_acc"),
        "pcie_other_end_recoveries": metrics.get("pcie_lc_perf_other_end_recovery"),
        "pcie_replays": slow.get("pcie_replays"),
    }
    rates_mts = {
        "pcie_max_link_transfers_per_second": static.get("max_pcie_speed"),
        "pcie_link_transfers_per_second": metric.get("pcie_speed"),
    }
    result: dict[str, Any] = {field: count for field, raw in counts.items() if (count := _int(raw)) is not None}
    result |= {field: rate * 1e6 for field, raw in rates_mts.items() if (rate := number(raw)) is not None}
    result |= metrics_pcie_link(metrics)  # the current link as gpu_metrics has it, over pcie_metric's
    bandwidth = number(metrics.get("pcie_bandwidth_inst"))
    if bandwidth is not None:
        result["pcie_bandwidth_bytes_per_second"] = bandwidth * 1e9
    return result


def xgmi(readings: Mapping[str, Any]) -> dict[str, Any]:
    metrics = readings.get("gpu_metrics") or {}
    result: dict[str, Any] = {}
    width, lane_gbps = _int(metrics.get("xgmi_link_width")), number(metrics.get("xgmi_link_speed"))
    if width is not None:
        result["xgmi_link_width"] = width
        if lane_gbps is not None:
            result["xgmi_link_speed_bytes_per_second"] = lane_gbps * 1e9 * width / 8
    result["xgmi_link_up"] = frozen_map(
        {i: v == 1 for i, v in enumerate(metrics.get("xgmi_link_status") or ()) if v in (0, 1)}
    )
    for field, name in (("xgmi_read_bytes", "xgmi_read_data_acc"), ("xgmi_write_bytes", "xgmi_write_data_acc")):
        values = metrics.get(name) or ()
        result[field] = frozen_map({i: float(v) * 1024.0 for i, v in enumerate(values) if number(v) is not None})
    return result


# amdsmi_memory_page_status_t, as the module gives it (an int) or as the CLI prints it
_PAGE_STATUS = {0: "retired", 1: "pending", "RESERVED": "retired", "PENDING": "pending"}


def bad_pages(pages: Any) -> tuple[int | None, int | None]:
    """(retired, pending) of amdsmi_get_gpu_bad_page_info's records (status 0 reserved, 1 pending;
    2, unreservable, whose retirement failed, in neither); (None, None) when not read."""
    if not isinstance(pages, list):
        return None, None
    statuses = [_PAGE_STATUS.get(page.get("status")) for page in pages if isinstance(page, Mapping)]
    return statuses.count("retired"), statuses.count("pending")


def sample_from_readings(readings: Mapping[str, Any], slow: Mapping[str, Any], timestamp: float) -> Sample:
    """One Sample from an every-cycle read plus the latest slow read of the same device."""
    current_clocks, max_clocks = clocks(readings, slow)
    energy_ticks = number((readings.get("energy") or {}).get("energy_accumulator"))
    activity = readings.get("activity") or {}
    busy = numbers({"gfx": number(activity.get("gfx_activity")), "memory": number(activity.get("umc_activity"))})
    caps = slow.get("power_cap") or {}
    metrics = readings.get("gpu_metrics") or {}
    residency = numbers({reason: number(metrics.get(name)) for reason, name in _RESIDENCIES.items()})
    ecc = {
        (block, kind): count
        for block, counts in (slow.get("ecc") or {}).items()
        for kind in ("correctable", "uncorrectable")
        if (count := _int((counts or {}).get(f"{kind}_count"))) is not None
    }
    voltage = number(readings.get("vddgfx_mv"))
    retired, pending = bad_pages(slow.get("bad_pages"))
    return Sample(
        timestamp=timestamp,
        temperatures=frozen_map(temperatures(readings)),
        temperature_thresholds=frozen_map(thresholds(slow)),
        power_watts=number((readings.get("power") or {}).get("socket_power")),
        power_cap_watts=cap_watts(caps.get("power_cap")),
        power_cap_max_watts=cap_watts(caps.get("max_power_cap")),
        energy_joules=energy_ticks * ENERGY_TICK_JOULES if energy_ticks is not None else None,
        busy=frozen_map({engine: percent / 100 for engine, percent in busy.items()}),
        memory_used_bytes=frozen_map(numbers(readings.get("memory_used"))),
        memory_total_bytes=frozen_map(numbers(slow.get("memory_total"))),
        clocks_hertz=frozen_map(current_clocks),
        clocks_max_hertz=frozen_map(max_clocks),
        clocks_min_hertz=frozen_map(
            {
                d: float(i["min_clk"]) * 1e6
                for d, i in (slow.get("clocks") or {}).items()
                if number((i or {}).get("min_clk")) is not None
            }
        ),
        voltages_volts=frozen_map({"gfx": voltage / 1000.0} if voltage is not None else {}),
        throttle_residency_seconds=frozen_map({k: ticks * RESIDENCY_TICK_SECONDS for k, ticks in residency.items()}),
        ecc_errors=frozen_map(ecc),
        ras_retired_pages=retired,
        ras_pending_pages=pending,
        ras_bad_page_threshold=_int(slow.get("bad_page_threshold")),
        **pcie(readings, slow),
        **xgmi(readings),
    )
