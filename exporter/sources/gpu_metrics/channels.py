"""The sub-second sampler's view of gpu_metrics: a few values of each table as a flat tuple of floats.

The same decoder as the poll's, told to unpack only the kernel fields these channels come from (the
rest of a table, the 3.8 kB of per-partition blocks included, is skipped); the channels are read
off its raw fields by the rules (and field map) GpuMetrics is built with. NaN = not supplied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from exporter.sources.gpu_metrics.decoder import (
    _CLOCK,
    _CLOCK_FIELDS,
    _POWER,
    _POWER_FIELDS,
    _TIME,
    FieldDecoder,
    _energy,
    _temperatures,
)

# What the fast sampler records, as (family, key): families are those of the window metrics, keys
# their label values (sensor, engine, domain). Accumulators are family "acc".
CHANNELS: tuple[tuple[str, str], ...] = (
    ("temperature", "edge"),
    ("temperature", "junction"),
    ("temperature", "memory"),
    ("temperature", "vr_gfx"),
    ("temperature", "vr_soc"),
    ("temperature", "vr_mem"),
    ("temperature", "hbm0"),
    ("temperature", "hbm1"),
    ("temperature", "hbm2"),
    ("temperature", "hbm3"),
    ("power", "socket"),
    ("busy", "gfx"),
    ("busy", "memory"),
    ("clock", "gfx"),
    ("clock", "memory"),
    ("clock", "soc"),
    ("acc", "energy_joules"),  # 2^-16 J ticks x 2^-16
    ("acc", "gfx_activity"),  # accumulated %·s (MI300-class only, see ACTIVITY_ACCUMULATOR_FIRST)
    ("acc", "mem_activity"),
    ("acc", "clock_seconds"),  # system_clock_counter: the time base of the accumulators
)
CHANNEL_INDEX = {channel: index for index, channel in enumerate(CHANNELS)}

# The activity accumulators are used from the MI300 tables on (v1_4+); MI200 tables carry the
# fields too but their firmware's accumulation is not documented, so MI200 means come from samples.
ACTIVITY_ACCUMULATOR_FIRST = (1, 4)

_DECODER = FieldDecoder(
    frozenset(
        {
            "temperature_edge",
            "temperature_hotspot",
            "temperature_mem",
            "temperature_vrgfx",
            "temperature_vrsoc",
            "temperature_vrmem",
            "temperature_hbm",
            "curr_socket_power",
            "average_socket_power",
            "average_gfx_activity",
            "average_umc_activity",
            "current_gfxclk",
            "current_uclk",
            "current_socclk",
            "energy_accumulator",
            "gfx_activity_acc",
            "mem_activity_acc",
            "system_clock_counter",
        }
    )
)
_NAN = math.nan


def channel_values(blob: bytes) -> tuple[float, ...]:
    """CHANNELS-ordered floats of one gpu_metrics read (NaN = not supplied); GpuMetricsError if unreadable."""
    read, format_revision, content_revision, _ = _DECODER.fields(blob)
    accumulated = (format_revision, content_revision) >= ACTIVITY_ACCUMULATOR_FIRST
    by_family: dict[str, Mapping[str, float | None]] = {
        "temperature": _temperatures(read),
        "busy": {"gfx": read.ratio("average_gfx_activity"), "memory": read.ratio("average_umc_activity")},
        "clock": {key: read.highest(_CLOCK_FIELDS[key], _CLOCK) for key in ("gfx", "memory", "soc")},
        "power": {"socket": next(iter(read.each(_POWER_FIELDS, _POWER).values()), None)},
        "acc": {
            "energy_joules": _energy(read),
            "gfx_activity": read.first.get("gfx_activity_acc") if accumulated else None,
            "mem_activity": read.first.get("mem_activity_acc") if accumulated else None,
            "clock_seconds": read.scaled("system_clock_counter", _TIME),
        },
    }
    values = (by_family[family].get(key) for family, key in CHANNELS)
    return tuple(_NAN if value is None else float(value) for value in values)
