"""Plausible ranges, defined once per Sample field: a value outside them is rejected and counted, never exported.

The hardware and driver do hand out impossible values: a gpu_metrics field the firmware filled
with 0xFFFE (65534 °C, 65534 W), a blob decoded with the wrong layout (29179 W), a hwmon file of
1000000000 (1e6 °C), 2^64-1 in a %llu file. The ranges are wide: they reject what no Instinct part
can report, not what is merely unusual. Units are the Sample's (SI).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Mapping
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


# field -> (lowest, highest, lowest itself rejected): looked up once per value on the poll path.
_BOUNDS: Mapping[str, tuple[float, float, bool]] = {
    name: (low, high, name in LOW_EXCLUSIVE) for name, (low, high) in RANGES.items()
}


def plausible(field: str, value: object) -> bool:
    """True if `value` is one the field can take (bools and fields without a range always are)."""
    fast = _VALUE_PLAUSIBLE.get(field)
    return True if fast is None else (fast(value) or _within(_BOUNDS[field], value))


def _within(bounds: tuple[float, float, bool], value: object) -> bool:
    """plausible() for a field whose bounds are already looked up (NaN fails every comparison)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    low, high, low_exclusive = bounds
    if low_exclusive:
        return low < value <= high and value != _INF and value != -_INF
    return low <= value <= high and value != _INF and value != -_INF


def items_check(field: str) -> Callable[[Mapping[Any, Any]], bool]:
    """plausible_items for one field, looked up once (a caller that checks the same fields every read)."""
    return _ITEMS_CHECKS.get(field, _always)


def plausible_items(field: str, values: Mapping[Any, Any]) -> bool:
    """True if every value of a mapping field is plausible (the common case, checked without copying)."""
    return _ITEMS_CHECKS.get(field, _always)(values)


def _always(values: Mapping[Any, Any]) -> bool:
    return True


def _all_within(bounds: tuple[float, float, bool], values: Collection[Any]) -> bool:
    """_within() of every value, in three C-level passes when they are finite numbers all in range.

    A finite sum means no NaN and no infinity among them; then min and max decide. Anything else
    (a value out of range, a non-number, an overflow) is judged value by value, exactly as _within.
    """
    low, high, low_exclusive = bounds
    try:
        total = sum(values)
        if total - total == 0:
            lowest, highest = min(values), max(values)
            if (lowest > low if low_exclusive else lowest >= low) and highest <= high:
                return True
    except (TypeError, OverflowError):
        pass
    return all(_within(bounds, item) for item in values)


# Sample fields with a range that are mappings (key -> value); the others with a range are scalars.
_MAPPING_FIELDS = frozenset(
    f.name for f in dataclasses.fields(Sample) if f.name in RANGES and f.default_factory is not dataclasses.MISSING
)


def _in_range_expression(name: str) -> str:
    """A chained comparison true only for a finite number within the field's range (NaN fails it)."""
    low, high, low_exclusive = _BOUNDS[name]
    upper = "x < _INF" if high == _INF else f"x <= {high!r}"  # +inf itself is never plausible
    return f"{low!r} {'<' if low_exclusive else '<='} {upper}"


def _generated(function: str, body: list[str], filename: str) -> Any:
    """Compile `def <function>...` from the lines given: a body that returns False on TypeError.

    Generated from RANGES alone (field names and constants), never from device data.
    """
    lines = [
        function,
        "    try:",
        *(f"        {line}" for line in body),
        "    except TypeError:",
        "        return False",
    ]
    namespace: dict[str, Any] = {"_INF": _INF}
    exec(compile("\n".join(lines) + "\n", filename, "exec"), namespace)
    return namespace[function.split()[1].split("(")[0]]


def _compile_all_plausible() -> Callable[[Sample], bool]:
    """One generated function: True when every ranged value of a Sample is a finite number in range.

    The poll's common case is a sample with nothing to reject; checking it field by field through
    _within costs more than the rest of the poller's work on it. The generated code folds each
    field's bounds in as constants. It is a sufficient test only: False (or a value that does not
    compare, TypeError) sends the sample to the exact, field-by-field path, which decides.
    """
    body = []
    for name in _BOUNDS:
        test = _in_range_expression(name)
        if name in _MAPPING_FIELDS:
            body += [f"for x in s.{name}.values():", f"    if not ({test}): return False"]
        else:
            body += [f"x = s.{name}", f"if x is not None and not ({test}): return False"]
    return _generated("def all_plausible(s):", [*body, "return True"], "<plausible all_plausible>")


def _compile_items_check(name: str) -> Callable[[Iterable[Any]], bool]:
    """plausible_items' fast test for one mapping field, generated the same way (sufficient only)."""
    body = ["for x in values:", f"    if not ({_in_range_expression(name)}): return False", "return True"]
    return _generated("def items_plausible(values):", body, f"<plausible {name}>")


def _compile_value_check(name: str) -> Callable[[object], bool]:
    """plausible()'s fast test for one field's single value (sufficient only, like the others)."""
    body = [f"return {_in_range_expression(name)}"]
    return _generated("def value_plausible(x):", body, f"<plausible {name} value>")


all_plausible = _compile_all_plausible()
_VALUE_PLAUSIBLE: Mapping[str, Callable[[object], bool]] = {name: _compile_value_check(name) for name in _BOUNDS}


def _items_check(name: str) -> Callable[[Mapping[Any, Any]], bool]:
    """The generated test over a mapping's values; the exact path decides what it does not pass."""
    bounds, fast = _BOUNDS[name], _compile_items_check(name)

    def check(values: Mapping[Any, Any]) -> bool:
        return not values or fast(values.values()) or _all_within(bounds, values.values())

    return check


_ITEMS_CHECKS: Mapping[str, Callable[[Mapping[Any, Any]], bool]] = {name: _items_check(name) for name in _BOUNDS}


def without_implausible(sample: Sample) -> tuple[Sample, dict[str, int]]:
    """The sample with every implausible value removed, and the fields it removed them from.

    The sysfs source checks each value as it reads it (and names the file); this is the same check
    for any source, applied by the poller to whatever a source returns (the rocm_smi library too).
    """
    if all_plausible(sample):  # the common case, in one generated pass
        return sample, {}
    return remove_implausible(sample)


def remove_implausible(sample: Sample) -> tuple[Sample, dict[str, int]]:
    """without_implausible's exact path: every ranged value judged by _within, one by one."""
    changes: dict[str, Any] = {}
    rejected: dict[str, int] = {}
    for name, bounds in _BOUNDS.items():
        value = getattr(sample, name)
        if name in _MAPPING_FIELDS:
            if not value or _all_within(bounds, value.values()):
                continue
            kept = {key: item for key, item in value.items() if _within(bounds, item)}
            changes[name] = frozen_map(kept)
            rejected[name] = len(value) - len(kept)
        elif value is not None and not _within(bounds, value):
            changes[name] = None
            rejected[name] = 1
    return (dataclasses.replace(sample, **changes) if changes else sample), rejected
