"""Plausible ranges, defined once per Sample field: a value outside them is rejected and counted, never exported.

The hardware and driver do hand out impossible values: a gpu_metrics field the firmware filled
with 0xFFFE (65534 °C, 65534 W), a blob decoded with the wrong layout (29179 W), a hwmon file of
1000000000 (1e6 °C), 2^64-1 in a %llu file. The ranges are wide: they reject what no Instinct part
can report, not what is merely unusual. Units are the Sample's (SI).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

from exporter.model import Sample, frozen_map

_INF = math.inf

# field -> (lowest, highest) accepted, inclusive; "low_exclusive" fields below also reject `lowest`.
RANGES: Mapping[str, tuple[float, float]] = {
    "temperatures": (0.0, 150.0),  # °C; a datacentre GPU is never at or below freezing, 150 is past any shutdown
    "temperature_thresholds": (0.0, 200.0),
    "power_watts": (0.0, 5000.0),  # W per socket or GCD (MI355X is 1.4 kW)
    "power_cap_watts": (0.0, 5000.0),
    "power_cap_max_watts": (0.0, 5000.0),
    "energy_joules": (0.0, _INF),  # accumulator; all-ones is already "not supplied"
    "busy": (0.0, 1.0),
    "memory_used_bytes": (0.0, 2.0**50),  # 1 PiB: no pool is larger (GTT is host RAM)
    "memory_total_bytes": (0.0, 2.0**50),
    "clocks_hertz": (0.0, 1e10),  # 10 GHz
    "clocks_max_hertz": (0.0, 1e10),
    "voltages_volts": (0.0, 5.0),
    "pcie_link_transfers_per_second": (0.0, 2e11),  # PCIe 7 is 128 GT/s
    "pcie_max_link_transfers_per_second": (0.0, 2e11),
    "pcie_link_width": (0.0, 32.0),
    "pcie_max_link_width": (0.0, 32.0),
    "pcie_bandwidth_bytes_per_second": (0.0, 1e12),  # 1 TB/s: 8x a PCIe 6 x16 link
    "pcie_bandwidth_upper_bound_bytes_per_second": (0.0, 1e12),
    "pcie_replays": (0.0, 2.0**62),
    "pcie_recoveries": (0.0, 2.0**62),
    "pcie_naks_sent": (0.0, 2.0**32),
    "pcie_naks_received": (0.0, 2.0**32),
    "xgmi_link_width": (0.0, 64.0),
    "xgmi_link_speed_bytes_per_second": (0.0, 2e12),
    "xgmi_read_bytes": (0.0, 2.0**74),  # u64 KB counters
    "xgmi_write_bytes": (0.0, 2.0**74),
    "xgmi_error_events": (0.0, 2.0**62),
    "ecc_errors": (0.0, 2.0**62),
    "ras_retired_pages": (0.0, 2.0**32),
    "throttle_residency_seconds": (0.0, _INF),
}
# Fields where the lowest value itself is implausible (a power cap of 0 W is "no cap", handled by
# the parser; a 0 °C GPU is a sensor that read nothing).
LOW_EXCLUSIVE = frozenset({"temperatures", "temperature_thresholds", "memory_total_bytes", "clocks_max_hertz"})
# How many xgmi_error events one read (the file clears on read) can plausibly add.
MAX_XGMI_ERRORS_PER_READ = 2**32


def _inclusive(low: float, high: float, low_exclusive: bool) -> tuple[float, float]:
    """Both bounds inclusive and finite: one chained comparison then also rejects an excluded lowest
    value, infinities and NaN (which fails every comparison)."""
    return (math.nextafter(low, _INF) if low_exclusive else low), min(high, sys.float_info.max)


BOUNDS: Mapping[str, tuple[float, float]] = {
    name: _inclusive(low, high, name in LOW_EXCLUSIVE) for name, (low, high) in RANGES.items()
}


def _range_check(low: float, high: float) -> Callable[[object], bool]:
    """True for a finite number in range; bools and non-numbers are no range's business."""

    def check(value: object) -> bool:
        if value.__class__ is float or value.__class__ is int:  # nearly every value: the short way
            return low <= value <= high
        return isinstance(value, bool) or not isinstance(value, int | float) or low <= value <= high

    return check


CHECKS: Mapping[str, Callable[[object], bool]] = {name: _range_check(*bounds) for name, bounds in BOUNDS.items()}
# Sample fields with a range that are mappings (key -> value); the others with a range are scalars.
_MAPPING_FIELDS = frozenset(
    f.name for f in dataclasses.fields(Sample) if f.name in RANGES and f.default_factory is not dataclasses.MISSING
)


def plausible(field: str, value: object) -> bool:
    """True if `value` is one the field can take (bools and fields without a range always are)."""
    check = CHECKS.get(field)
    return check is None or check(value)


def all_plausible(field: str, values: Collection[float]) -> bool:
    """plausible() of every one of a mapping's values, with no call per value when all are: min, max
    and sum run in C (a NaN can hide from min and max, never from the sum). Only when that finds
    something is each value checked on its own."""
    bounds = BOUNDS.get(field)
    if bounds is None or not values:
        return True
    low, high = bounds
    if low <= min(values) and max(values) <= high and math.isfinite(sum(values)):
        return True
    return all(map(CHECKS[field], values))


def without_implausible(sample: Sample) -> tuple[Sample, dict[str, int]]:
    """The sample with every implausible value removed, and how many it removed from each field.

    The sysfs source checks each value as it reads it (and names the file); this is the same check
    for any source, applied by the poller to whatever a source returns (the rocm_smi library too).
    """
    changes: dict[str, Any] = {}
    rejected: dict[str, int] = {}
    for name, check in CHECKS.items():
        value = getattr(sample, name)
        if name in _MAPPING_FIELDS:
            kept = {key: item for key, item in value.items() if check(item)}
            if len(kept) < len(value):
                changes[name] = frozen_map(kept)
                rejected[name] = len(value) - len(kept)
        elif value is not None and not check(value):
            changes[name] = None
            rejected[name] = 1
    return (dataclasses.replace(sample, **changes) if changes else sample), rejected
