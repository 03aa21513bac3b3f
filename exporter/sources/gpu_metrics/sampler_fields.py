"""The sampler's view of gpu_metrics: its fields of each table as a flat tuple of floats.

The same decoder as the poll's, its plans restricted to these fields: only the kernel fields they
come from are unpacked (the rest of a table, the 3.8 kB of per-partition blocks included, is
skipped) and each is the GpuMetrics value of the same rule. NaN = not supplied.
"""

from __future__ import annotations

import math
from array import array

from exporter.sources.gpu_metrics.decoder import Key, Plans, take

# What the sampler records, as (family, key): families are those of the window metrics, keys
# their label values (sensor, engine, domain). Accumulators are family "acc".
SAMPLER_FIELDS: tuple[tuple[str, str], ...] = (
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
SAMPLER_FIELD_INDEX = {sampled: index for index, sampled in enumerate(SAMPLER_FIELDS)}

# The activity accumulators are used from the MI300 tables on (v1_4+); MI200 tables carry the
# fields too but their firmware's accumulation is not documented, so MI200 means come from samples.
ACTIVITY_ACCUMULATOR_FIRST = (1, 4)

# Each sampler field's GpuMetrics value: a key of a mapping field, or a scalar field.
_MAPPING_OF = {"temperature": "temperatures", "busy": "busy", "clock": "clocks_hertz"}
_SCALAR_OF = {
    ("power", "socket"): "power_watts",
    ("acc", "energy_joules"): "energy_joules",
    ("acc", "gfx_activity"): "gfx_activity_acc",
    ("acc", "mem_activity"): "mem_activity_acc",
    ("acc", "clock_seconds"): "system_clock_counter_seconds",
}
_INDEX_OF: dict[tuple[str, Key], int] = {
    (_MAPPING_OF[family], key) if family in _MAPPING_OF else (_SCALAR_OF[family, key], None): index
    for index, (family, key) in enumerate(SAMPLER_FIELDS)
}


def _target(field: str, key: Key) -> tuple[int, Key] | None:
    index = _INDEX_OF.get((field, key))
    return None if index is None else (0, index)


_PLANS = Plans(_target, every_field=False, as_float=True)
_NAN = math.nan
_ACTIVITY_ACCUMULATORS = (SAMPLER_FIELD_INDEX["acc", "gfx_activity"], SAMPLER_FIELD_INDEX["acc", "mem_activity"])


_UNSUPPLIED = array("d", [_NAN] * len(SAMPLER_FIELDS))


def sampler_values(blob: bytes) -> array[float]:
    """SAMPLER_FIELDS-ordered floats of one gpu_metrics read (NaN = not supplied), a new array the
    caller owns (the sample ring takes it as it is); GpuMetricsError if unreadable."""
    plan, flat, format_revision, content_revision, _ = _PLANS.unpack(blob)
    values = _UNSUPPLIED[:]
    take(plan, flat, (values,))
    if (format_revision, content_revision) < ACTIVITY_ACCUMULATOR_FIRST:
        for index in _ACTIVITY_ACCUMULATORS:
            values[index] = _NAN
    return values
