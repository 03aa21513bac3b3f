"""Plausible ranges: a value outside its Sample field's range is rejected and counted, never exported.

The hardware and driver do hand out impossible values (0xFFFE in a gpu_metrics field, 1e6 °C in
a hwmon file, 2^64-1 in a %llu file). Each range is declared once, on its Sample field in
exporter/model.py (within / each_within); this module only applies them. Units are the Sample's (SI).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

from exporter.model import SAMPLE_MAPPINGS, Sample, frozen_map

_INF = math.inf
_DECLARED = {f.name: f.metadata["plausible"] for f in dataclasses.fields(Sample) if "plausible" in f.metadata}
# field -> (lowest, highest) accepted, inclusive; the LOW_EXCLUSIVE fields also reject `lowest`.
RANGES: Mapping[str, tuple[float, float]] = {name: (low, high) for name, (low, high, _) in _DECLARED.items()}
LOW_EXCLUSIVE = frozenset(name for name, (_, _, low_exclusive) in _DECLARED.items() if low_exclusive)
# How many xgmi_error events one read (the file clears on read) can plausibly add.
MAX_XGMI_ERRORS_PER_READ = 2**32


# Both bounds inclusive and finite: one chained comparison then also rejects an excluded lowest
# value, infinities and NaN (which fails every comparison).
BOUNDS: Mapping[str, tuple[float, float]] = {
    name: (math.nextafter(low, _INF) if low_exclusive else low, min(high, sys.float_info.max))
    for name, (low, high, low_exclusive) in _DECLARED.items()
}


def _range_check(low: float, high: float) -> Callable[[object], bool]:
    """True for a finite number in range; bools and non-numbers are no range's business."""

    def check(value: object) -> bool:
        if value.__class__ is float or value.__class__ is int:  # nearly every value: the short way
            return low <= value <= high
        return isinstance(value, bool) or not isinstance(value, int | float) or low <= value <= high

    return check


CHECKS: Mapping[str, Callable[[object], bool]] = {name: _range_check(*bounds) for name, bounds in BOUNDS.items()}
_MAPPING_FIELDS = SAMPLE_MAPPINGS & RANGES.keys()  # the fields with a range that are mappings


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


# The series a device can have at run time: at most this many keys per mapping field (each key is a
# series of its family). Far above what any Instinct part has (8 XGMI link slots, 8 XCCs per socket,
# a few dozen RAS blocks and sensors), far below what a table that lies makes (a v1.9 gpu_metrics
# xgmi_link_status of 1,023 instances would give one GPU 1,023 series).
MAX_KEYS_PER_FIELD = 64
MAX_KEYS: Mapping[str, int] = {"xgmi_link_up": 16, "xgmi_read_bytes": 16, "xgmi_write_bytes": 16}
_CAPPED_FIELDS = tuple(sorted(SAMPLE_MAPPINGS - {"file_errors"}))
_CAPS = tuple((name, MAX_KEYS.get(name, MAX_KEYS_PER_FIELD)) for name in _CAPPED_FIELDS)


def within_series_cap(sample: Sample) -> tuple[Sample, dict[str, int]]:
    """The sample with each mapping field cut to its first MAX_KEYS (lowest keys first), and how many
    keys it dropped from each: a run-time bound on a device's series, whatever a source hands in."""
    changes: dict[str, Any] = {}
    dropped: dict[str, int] = {}
    for name, cap in _CAPS:
        value = getattr(sample, name)
        if len(value) > cap:
            kept = sorted(value, key=repr)[:cap] if not _sortable(value) else sorted(value)[:cap]
            changes[name] = frozen_map({key: value[key] for key in kept})
            dropped[name] = len(value) - cap
    return (dataclasses.replace(sample, **changes) if changes else sample), dropped


def _sortable(keys: Collection[Any]) -> bool:
    try:
        sorted(keys)
    except TypeError:
        return False
    return True
