"""Counters that stay monotonic across accumulator wraparound and restart cleanly on a hardware reset.

The hardware's accumulators are fixed-width: gpu_metrics v1_0's energy_accumulator is a u32 of
2^-16 J ticks (it wraps every 65,536 J, about 3.6 minutes at 300 W); the others are u32 or u64.
Exported raw, a wrap is a huge drop that Prometheus's rate() reads as a counter reset.

Per device and counter, this keeps the last raw value and an offset (whole wraps seen so far):
- raw >= last: the counter moved on; exported = raw + offset;
- raw < last, and going round the register's width explains it (the increment that implies is one
  the hardware can make in the elapsed time): a wrap; offset += width;
- otherwise a reset (driver reload, GPU reset): the offset is dropped and the raw value exported
  as it is, so the series restarts from the hardware's own figure and rate() sees one clean reset,
  never a huge negative step nor a counter made up across it.

Widths and plausible rates are declared once here, per Sample field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.model import SAMPLE_MAPPINGS, DeviceIdentity, Sample, frozen_map

_TICK = 2.0**-16  # J per energy_accumulator tick
_U32 = 2**32  # ints: exact arithmetic near the top of a u64 (a float cannot tell 2^64 - 5 from 2^64)
_U64 = 2**64


@dataclass(frozen=True, slots=True)
class CounterRule:
    """How one counter field wraps: its register width in the field's unit, the fastest it can climb."""

    width: int | float | None  # None: never wraps (accumulated in software)
    max_rate_per_second: float | None = None  # None: a wrap is only believed from the top quarter


# Sample counter fields (scalar or mapping of keys to counts). 5 kW bounds any socket's power.
COUNTERS: Mapping[str, CounterRule] = {
    "energy_joules": CounterRule(_U64 * _TICK, max_rate_per_second=5000.0),  # v1_1+ (and rocm_smi's): u64
    "pcie_replays": CounterRule(_U64),
    "pcie_recoveries": CounterRule(_U64),
    "pcie_replay_rollovers": CounterRule(_U64),
    "pcie_other_end_recoveries": CounterRule(_U32),
    "pcie_naks_sent": CounterRule(_U32),
    "pcie_naks_received": CounterRule(_U32),
    "xgmi_read_bytes": CounterRule(_U64 * 1024),  # KB registers
    "xgmi_write_bytes": CounterRule(_U64 * 1024),
    "xgmi_error_events": CounterRule(None),
    "ecc_errors": CounterRule(_U64),
    "pcie_aer_errors": CounterRule(_U64),  # the kernel's u64 counts, since boot
    # u32 tick accumulators converted to seconds by the decoder: a drop is treated as a reset
    "throttle_residency_seconds": CounterRule(None),
    "xcc_below_host_limit_seconds": CounterRule(None),  # u64 tick accumulators, in seconds
}
_V1_0_ENERGY_WIDTH = _U32 * _TICK  # gpu_metrics v1_0's energy accumulator is a u32
# The rules split once: mapping counters, and scalar ones with their track key.
_MAPPING_RULES = tuple((name, rule) for name, rule in COUNTERS.items() if name in SAMPLE_MAPPINGS)
_SCALAR_RULES = tuple((name, (name, None), rule) for name, rule in COUNTERS.items() if name not in SAMPLE_MAPPINGS)


@dataclass(slots=True)
class _Track:
    raw: int | float
    offset: int | float = 0


@dataclass(slots=True)
class CounterState:
    """Per-device continuity state: (field, key) -> last raw value and wrap offset."""

    tracks: dict[tuple[str, Any], _Track] = field(default_factory=dict)
    last_read_at: float | None = None  # time.monotonic() of the previous sample's cycle
    # mapping field -> its values at the last step, while no key of it carries a wrap offset: an
    # unchanged mapping (ECC counts between slow refreshes, the common case) then needs no step at all
    settled: dict[str, dict[Any, Any]] = field(default_factory=dict)
    widths: dict[str, int | float | None] = field(default_factory=dict)  # of `widths_for`
    widths_for: DeviceIdentity | None = None


def continue_counters(state: CounterState, identity: DeviceIdentity, sample: Sample, read_at: float) -> Sample:
    """The sample with every counter made continuous against the previous ones of this device.

    `read_at` is time.monotonic() of the cycle that read it: the elapsed time that bounds a wrap is
    a duration, so a step of the wall clock (NTP) can neither make a reset look like a wrap nor the
    reverse.
    """
    dt = read_at - state.last_read_at if state.last_read_at is not None else None
    state.last_read_at = read_at
    changes: dict[str, Any] = {}
    if state.widths_for is not identity:  # widths depend on the identity only (its gpu_metrics version)
        state.widths = {name: rule.width for name, rule in COUNTERS.items()}
        if identity.gpu_metrics_version == "1.0":
            state.widths["energy_joules"] = _V1_0_ENERGY_WIDTH
        state.widths_for = identity
    widths, settled, tracks = state.widths, state.settled, state.tracks
    for name, rule in _MAPPING_RULES:
        value = getattr(sample, name)
        if value:
            if settled.get(name) == value:
                continue  # every key as last time and no offset carried: stepping would change nothing
            width = widths[name]
            stepped = {key: _step(state, (name, key), raw, width, rule, dt) for key, raw in value.items()}
            # No wrap ever seen (the common case): every value is the raw one, the mapping stays as it is.
            if any(stepped[key] is not raw for key, raw in value.items()):
                changes[name] = frozen_map(stepped)
                settled.pop(name, None)
            else:
                settled[name] = dict(value)
    for name, key, rule in _SCALAR_RULES:
        value = getattr(sample, name)
        if value is None:
            continue
        track = tracks.get(key)
        if track is not None and not value < track.raw and not track.offset:
            track.raw = value  # _step's common case, inline: moved on, no wrap carried
            continue
        changed = _step(state, key, value, widths[name], rule, dt)
        if changed is not value:
            changes[name] = type(value)(changed) if isinstance(value, int) else changed
    return dataclasses.replace(sample, **changes) if changes else sample


def _step(
    state: CounterState,
    key: tuple[str, Any],
    raw: int | float,
    width: int | float | None,
    rule: CounterRule,
    dt: float | None,
) -> int | float:
    track = state.tracks.get(key)
    if track is None:
        state.tracks[key] = _Track(raw)
        return raw
    if raw < track.raw:
        if width is not None and _is_wrap(track.raw, raw, width, rule, dt):
            track.offset += width
        else:
            track.offset = 0
    track.raw = raw
    # The raw value itself while no wrap is carried: continue_counters then keeps the sample as it is.
    return raw + track.offset if track.offset else raw


def _is_wrap(last: int | float, raw: int | float, width: int | float, rule: CounterRule, dt: float | None) -> bool:
    increment = (raw - last) + width
    if increment <= 0:
        return False
    if rule.max_rate_per_second is not None and dt is not None and dt > 0:
        # Twice the fastest climb plus one second of slack: a read delayed by a slow cycle still counts.
        return increment <= rule.max_rate_per_second * (2 * dt + 1)
    return last >= 0.75 * width and raw < 0.25 * width
