"""What a rule can watch: values derived from the metric table (exposition/metrics.py), not a second list.

A rule's `metric` is the name of a per-device family of the table without its `amdgpu_` prefix
(temperature_celsius reads amdgpu_temperature_celsius), read through that entry's own sample
getter; the one derived value, memory_used_ratio, is computed from two table entries. What is
declared here is only what the table does not say: which families rules may watch, and the values
their key label may take (so a typo in a rule file is an error, not a rule that never fires).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from exporter.exposition.metrics import BY_NAME, MetricSpec
from exporter.model import Sample

# The table's base units as rule texts show them after a value ("{value}{unit}").
UNIT_SYMBOLS = {"celsius": " °C", "watts": " W", "bytes": " B", "hertz": " Hz", "ratio": ""}


@dataclass(frozen=True, slots=True)
class Watchable:
    """A Sample value a rule can compare: which label selects it, its unit, how to read it."""

    key_label: str | None  # "sensor" | "engine" | "pool" | "domain" | None
    keys: tuple[str, ...]  # the values the key label may take
    unit: str  # as shown after a value, " °C"
    read: Callable[[Sample, str], float | None]
    # The fast sampler's window family of the same value ("temperature", ...), "" when there is none;
    # window_key maps the rule's key to the window's (power has no key: its window key is "socket").
    window_family: str = ""
    window_key: Callable[[str], str] = str


def _from_table(family: str, keys: tuple[str, ...] = (), window_family: str = "") -> Watchable:
    """A watchable read through the table entry of `family`, checked at import."""
    spec: MetricSpec = BY_NAME[family]
    getter = spec.sample_getter
    if getter is None or spec.kind != "gauge" or len(spec.labels) > 2:
        raise AssertionError(f"{family} is not a per-device gauge with at most one label after gpu")
    key_label = spec.labels[1] if len(spec.labels) == 2 else None
    if (key_label is None) != (not keys):
        raise AssertionError(f"{family}: the keys of its label {key_label!r} must be listed exactly when it has one")

    def read(sample: Sample, key: str) -> float | None:
        wanted = (key,) if key_label is not None else ()
        return next((value for labels, value in getter(sample) if labels == wanted), None)

    window_key = (lambda _key: "socket") if key_label is None and window_family else str
    return Watchable(key_label, keys, UNIT_SYMBOLS[spec.unit], read, window_family, window_key)


def _memory_used_ratio(sample: Sample, pool: str) -> float | None:
    used = sample.memory_used_bytes.get(pool)
    total = sample.memory_total_bytes.get(pool)
    if used is None or not total:
        return None
    return used / total


TEMPERATURE_SENSORS = ("edge", "junction", "memory", "hbm0", "hbm1", "hbm2", "hbm3", "vr_gfx", "vr_soc", "vr_mem")
MEMORY_POOLS = ("vram", "visible_vram", "gtt")
ENGINES = ("gfx", "memory", "media")
CLOCK_DOMAINS = ("gfx", "memory", "fabric", "soc", "video", "decode")

WATCHABLE: Mapping[str, Watchable] = {
    "temperature_celsius": _from_table("amdgpu_temperature_celsius", TEMPERATURE_SENSORS, "temperature"),
    "power_watts": _from_table("amdgpu_power_watts", (), "power"),
    "busy_ratio": _from_table("amdgpu_busy_ratio", ENGINES, "busy"),
    # Derived from amdgpu_memory_used_bytes / amdgpu_memory_total_bytes (not a family of its own).
    "memory_used_ratio": Watchable("pool", MEMORY_POOLS, "", _memory_used_ratio),
    "memory_used_bytes": _from_table("amdgpu_memory_used_bytes", MEMORY_POOLS),
    "clock_hertz": _from_table("amdgpu_clock_hertz", CLOCK_DOMAINS, "clock"),
}
