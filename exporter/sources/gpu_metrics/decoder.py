"""Pure decoder of the amdgpu binary `gpu_metrics` table (sysfs cardN/device/gpu_metrics).

Any bytes in, a `GpuMetrics` (SI units) or a `GpuMetricsError` out, nothing else. Covers v1_0 .. v1_8
(fixed C layouts, see layouts.py) and v1.9 (self-describing records); and, through the same plans and
decode, a partition's own table (xcp/xcp_metrics: amdgpu_partition_metrics v1_0 fixed, v1_1 records),
which reads as a gpu_metrics table of one partition block (decode_partition_metrics).

One table, _READS, says which kernel field each GpuMetrics value is read from and how it converts
by the unit the field is stored in (implied for fixed layouts, declared by v1.9 records); a field
stored in a unit its value is not measured in is left out rather than guessed. From it, a Plan per
layout lists which unpacked value fills which result value, converted how: made once per fixed
layout (one struct unpack) and once per v1.9 record list (its walk), so a decode is the unpack plus
one pass over the plan's short lists. All-ones reads as not supplied (the driver fills the table with 0xFF before
writing what the firmware supplies). The sampler's view (sampler_fields.py) is a plan over its values only.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from exporter.abi.gpu_metrics import (
    ATTR_ID_MASK,
    ATTR_ID_SHIFT,
    ATTR_INSTANCES_MASK,
    ATTR_NAMES,
    ATTR_TYPE_FORMAT,
    ATTR_TYPE_MASK,
    ATTR_TYPE_SHIFT,
    ATTR_UNIT_MASK,
    ATTR_UNIT_SHIFT,
    C_TYPES,
    FIXED_FIELD_UNITS,
    FIXED_LAYOUTS,
    HEADER,
    HEADER_SIZE,
    PARTITION_FIXED_LAYOUTS,
    PARTITION_V1_1_REVISION,
    SIGNED_ATTR_TYPES,
    V1_9_CONTENT_REVISION,
    V1_9_ENCODING,
    V1_9_FIXED,
    V1_9_FORMAT_REVISION,
    XCP_V1_0,
    XCP_V1_1,
    XCP_V1_2,
    AttrType,
    AttrUnit,
    Layout,
)
from exporter.model import frozen_map

# A sysfs read of gpu_metrics returns at most PAGE_SIZE - 1 bytes (4 KiB and 64 KiB pages).
_TRUNCATED_READ_LENGTHS = frozenset({4095, 65535})

ENERGY_JOULES_PER_TICK = 2.0**-16  # the kernel's unit; rocm_smi's 15.3 uJ reads ~0.27 % high

# Standard PCIe rates in the 0.1 GT/s unit. Aldebaran (and early SMU 13.0.6) report an ESM link as
# ((PCIE_ESM_CTRL >> 8) & 0x7F) + 128, a code in 128..255 that is not a rate in 0.1 GT/s (the
# kernel itself marks the formula unconfirmed), so such values are left out instead of mis-scaled.
_PCIE_RATES_100MTS = frozenset({25, 50, 80, 160, 320, 640})
_ESM_CODES = range(128, 256)

# SMU_THROTTLER_*_BIT (drivers/gpu/drm/amd/pm/swsmu/inc/amdgpu_smu.h): the ASIC-independent bits of
# indep_throttle_status, named by their lower-case short names.
THROTTLER_BITS: Mapping[int, str] = {
    first_bit + offset: name
    for first_bit, names in (
        (0, ("ppt0", "ppt1", "ppt2", "ppt3", "spl", "fppt", "sppt", "sppt_apu")),  # power
        (16, ("tdc_gfx", "tdc_soc", "tdc_mem", "tdc_vdd", "tdc_cvip", "edc_cpu", "edc_gfx", "apcc")),  # current
        (32, ("temp_gpu", "temp_core", "temp_mem", "temp_edge", "temp_hotspot", "temp_soc")),  # temperature
        (38, ("temp_vr_gfx", "temp_vr_soc", "temp_vr_mem0", "temp_vr_mem1", "temp_liquid0", "temp_liquid1")),
        (44, ("vrhot0", "vrhot1", "prochot_cpu", "prochot_gfx")),
        (56, ("ppm", "fit")),  # other
    )
    for offset, name in enumerate(names)
}


# The throttlers whose residency MI300's firmware accumulates (gpu_metrics v1_6+ `<name>_residency_acc`).
RESIDENCY_REASONS = ("prochot", "ppt", "socket_thm", "vr_thm", "hbm_thm")

# The per-XCC clock counters of v1_8's partition blocks (and of xcp_metrics, and v1.9): the key of
# partition_xcc_counters -> the kernel field. v1_7's single gfx_below_host_limit_acc is not read
# (see docs/design.md: v1_8 split it, and tools treat it as deprecated).
XCC_COUNTERS: Mapping[str, str] = {
    "power": "gfx_below_host_limit_ppt_acc",
    "thermal": "gfx_below_host_limit_thm_acc",
    "total": "gfx_below_host_limit_total_acc",
    "low_utilization": "gfx_low_utilization_acc",
}


class GpuMetricsError(ValueError):
    """The blob is not a gpu_metrics table this decoder can read; the message says why."""


_EMPTY: Mapping[Any, Any] = frozen_map()


class GpuMetrics(NamedTuple):
    """One decoded gpu_metrics table in SI units. None / absent key = not supplied by the device.

    A NamedTuple rather than a frozen dataclass: one is made per device on every poll, and a tuple
    is made in one step where a frozen dataclass sets its forty attributes one at a time.
    """

    format_revision: int
    content_revision: int
    structure_size: int
    temperatures: Mapping[str, float] = _EMPTY  # °C
    power_watts: float | None = None
    energy_joules: float | None = None
    busy: Mapping[str, float] = _EMPTY  # ratio 0..1
    clocks_hertz: Mapping[str, float] = _EMPTY
    clocks_average_hertz: Mapping[str, float] = _EMPTY  # MI200-class (v1_0-v1_3): the SMU's average per domain
    voltages_volts: Mapping[str, float] = _EMPTY
    throttle_status: int | None = None  # raw, ASIC-specific bits
    indep_throttle_status: int | None = None  # raw SMU_THROTTLER_* bits
    gfx_clock_lock_mask: int | None = None  # MI300-class: a bit per gfx clock instance (XCC) that is locked
    throttle: Mapping[str, bool] = _EMPTY
    pcie_link_width: int | None = None
    pcie_link_transfers_per_second: float | None = None
    pcie_bandwidth_bytes_per_second: float | None = None
    pcie_bandwidth_acc: int | None = None
    pcie_replays: int | None = None
    pcie_recoveries: int | None = None
    pcie_replay_rollovers: int | None = None
    pcie_other_end_recoveries: int | None = None  # v1_6+: recoveries the link partner started
    pcie_naks_sent: int | None = None
    pcie_naks_received: int | None = None
    xgmi_link_width: int | None = None
    xgmi_link_speed_bytes_per_second: float | None = None  # whole link: lane rate x width / 8
    xgmi_link_up: Mapping[int, bool] = _EMPTY
    xgmi_read_bytes: Mapping[int, float] = _EMPTY  # cumulative
    xgmi_write_bytes: Mapping[int, float] = _EMPTY
    gfx_activity_acc: int | None = None
    mem_activity_acc: int | None = None
    system_clock_counter_seconds: float | None = None
    num_partitions: int | None = None
    # Per partition (xcp), the instantaneous busy ratio of each XCC that reports one. v1.9 tables
    # carry one device-wide gfx_busy_inst array, returned as a single entry.
    partition_gfx_busy: tuple[tuple[float, ...], ...] = ()
    # Per partition, the busy ratio of each of its VCN (video) and JPEG engines that reports one
    # (v1.9: one device-wide entry, like partition_gfx_busy).
    partition_vcn_busy: tuple[tuple[float, ...], ...] = ()
    partition_jpeg_busy: tuple[tuple[float, ...], ...] = ()
    # Per partition, per XCC counters of the firmware's samples (accumulation_counter ticks) in which
    # that XCC's gfx clock sat below the host's limit, by cause (XCC_COUNTERS keys), as stored (v1_8+).
    partition_xcc_counters: tuple[Mapping[str, tuple[int, ...]], ...] = ()
    # MI300 v1_6+: the firmware's sample count and, per throttler, how many of those samples it was
    # holding the clocks back (prochot, ppt, socket_thm, vr_thm, hbm_thm), raw u32 counters that wrap.
    accumulation_counter: int | None = None
    residency_acc: Mapping[str, int] = _EMPTY
    memory_max_bandwidth_bytes_per_second: float | None = None  # v1_7+: the HBM's peak

    @property
    def version(self) -> str:
        """ "1.3" — the form DeviceIdentity.gpu_metrics_version uses."""
        return f"{self.format_revision}.{self.content_revision}"


# The reasons Aldebaran's firmware maps into indep_throttle_status (aldebaran_ppt.c's throttler map):
# always exported, 0 or 1, so their series are stable. Any other known reason is exported only while
# its bit is set — 34 always-zero series per GCD would be noise, but a set bit must never be lost.
ALWAYS_EXPORTED_THROTTLERS = frozenset(
    {"ppt0", "ppt1", "apcc", "tdc_gfx", "tdc_soc", "tdc_mem"}  # power, current
    | {"temp_gpu", "temp_mem", "temp_vr_gfx", "temp_vr_soc", "temp_vr_mem0"}  # temperature
)


def throttle_reasons(indep_bits: int) -> dict[str, bool]:
    """SMU_THROTTLER_* reasons -> active: the always-exported set, plus any other reason that is set."""
    reasons = {}
    for bit, name in THROTTLER_BITS.items():
        active = bool((indep_bits >> bit) & 1)
        if active or name in ALWAYS_EXPORTED_THROTTLERS:
            reasons[name] = active
    return reasons


# --- step 1: what each GpuMetrics value is read from -------------------------------------------

# How a stored number becomes its SI value: ("*", f) multiplies by f; ("/", d) divides by d, which
# keeps a percent exact (35 / 100 is 0.35, 35 * 0.01 is not); ("=", 1) keeps the number as stored.
Conversion = tuple[Literal["*", "/", "="], float]
Kind = Mapping[AttrUnit, Conversion] | Conversion  # by the unit stored in (others are left out), or any unit
_AS_STORED: Conversion = ("=", 1)
_FLOAT: Conversion = ("*", 1.0)
_MILLIVOLT: Conversion = ("/", 1000.0)  # the kernel's only voltage unit; no v1.9 record declares one
_TEMPERATURE: Kind = {AttrUnit.TEMP_CELSIUS: ("*", 1.0)}
_POWER: Kind = {AttrUnit.POWER_WATT: ("*", 1.0)}
_CLOCK: Kind = {AttrUnit.CLOCK_MHZ: ("*", 1e6)}
_TIME: Kind = {AttrUnit.TIME_NS: ("*", 1e-9), AttrUnit.TIME_10NS: ("*", 1e-8)}
_RATE: Kind = {AttrUnit.SPEED_GTS: ("*", 1e9), AttrUnit.SPEED_100MTS: ("*", 1e8)}  # per second, per lane
_BANDWIDTH: Kind = {AttrUnit.BANDWIDTH_GBS: ("*", 1e9)}
_DATA: Kind = {AttrUnit.DATA_KB: ("*", 1024.0)}
_ENERGY: Kind = {AttrUnit.NONE: ("*", ENERGY_JOULES_PER_TICK)}
_PERCENT: Kind = {AttrUnit.PERCENT: ("/", 100)}  # as a 0..1 ratio; outside 0..100 % is not a utilisation

Key = str | int | None  # the key within a mapping field; None for a scalar field
# Which elements of a kernel field: element 0, every element (key + index), the highest supplied
# (multiplied), or the first supplied (a percent: the first within 0..100).
Elements = Literal["first", "each", "highest", "any"]

# (GpuMetrics field, key, kernel field, elements, kind). Where two rows fill one value, the first
# supplied wins. xgmi_lane_rate is not a GpuMetrics field: the decode turns it into the link's rate.
_READS: tuple[tuple[str, Key, str, Elements, Kind], ...] = (
    ("temperatures", "edge", "temperature_edge", "first", _TEMPERATURE),
    ("temperatures", "junction", "temperature_hotspot", "first", _TEMPERATURE),
    ("temperatures", "memory", "temperature_mem", "first", _TEMPERATURE),
    ("temperatures", "vr_gfx", "temperature_vrgfx", "first", _TEMPERATURE),
    ("temperatures", "vr_soc", "temperature_vrsoc", "first", _TEMPERATURE),
    ("temperatures", "vr_mem", "temperature_vrmem", "first", _TEMPERATURE),
    ("temperatures", "hbm", "temperature_hbm", "each", _TEMPERATURE),
    ("power_watts", None, "curr_socket_power", "first", _POWER),
    ("power_watts", None, "average_socket_power", "first", _POWER),
    ("energy_joules", None, "energy_accumulator", "first", _ENERGY),
    ("busy", "gfx", "average_gfx_activity", "any", _PERCENT),
    ("busy", "memory", "average_umc_activity", "any", _PERCENT),
    ("busy", "media", "average_mm_activity", "any", _PERCENT),  # MI2xx; else the busiest VCN (see the decode)
    ("clocks_hertz", "gfx", "current_gfxclk", "highest", _CLOCK),
    ("clocks_hertz", "soc", "current_socclk", "highest", _CLOCK),
    ("clocks_hertz", "memory", "current_uclk", "highest", _CLOCK),
    ("clocks_hertz", "video", "current_vclk0", "highest", _CLOCK),
    ("clocks_hertz", "decode", "current_dclk0", "highest", _CLOCK),
    ("clocks_average_hertz", "gfx", "average_gfxclk_frequency", "first", _CLOCK),
    ("clocks_average_hertz", "soc", "average_socclk_frequency", "first", _CLOCK),
    ("clocks_average_hertz", "memory", "average_uclk_frequency", "first", _CLOCK),
    ("clocks_average_hertz", "video", "average_vclk0_frequency", "first", _CLOCK),
    ("clocks_average_hertz", "decode", "average_dclk0_frequency", "first", _CLOCK),
    ("voltages_volts", "gfx", "voltage_gfx", "first", _MILLIVOLT),
    ("voltages_volts", "soc", "voltage_soc", "first", _MILLIVOLT),
    ("voltages_volts", "memory", "voltage_mem", "first", _MILLIVOLT),
    ("pcie_link_transfers_per_second", None, "pcie_link_speed", "first", _RATE),
    ("pcie_bandwidth_bytes_per_second", None, "pcie_bandwidth_inst", "first", _BANDWIDTH),
    ("memory_max_bandwidth_bytes_per_second", None, "mem_max_bandwidth", "first", _BANDWIDTH),
    ("xgmi_lane_rate", None, "xgmi_link_speed", "first", _RATE),
    ("xgmi_read_bytes", "", "xgmi_read_data_acc", "each", _DATA),
    ("xgmi_write_bytes", "", "xgmi_write_data_acc", "each", _DATA),
    ("system_clock_counter_seconds", None, "system_clock_counter", "first", _TIME),
    ("throttle_status", None, "throttle_status", "first", _AS_STORED),
    ("indep_throttle_status", None, "indep_throttle_status", "first", _AS_STORED),
    ("gfx_clock_lock_mask", None, "gfxclk_lock_status", "first", _AS_STORED),
    ("pcie_link_width", None, "pcie_link_width", "first", _AS_STORED),
    ("pcie_bandwidth_acc", None, "pcie_bandwidth_acc", "first", _AS_STORED),
    ("pcie_replays", None, "pcie_replay_count_acc", "first", _AS_STORED),
    ("pcie_recoveries", None, "pcie_l0_to_recov_count_acc", "first", _AS_STORED),
    ("pcie_replay_rollovers", None, "pcie_replay_rover_count_acc", "first", _AS_STORED),
    ("pcie_other_end_recoveries", None, "pcie_lc_perf_other_end_recovery", "first", _AS_STORED),
    ("pcie_naks_sent", None, "pcie_nak_sent_count_acc", "first", _AS_STORED),
    ("pcie_naks_received", None, "pcie_nak_rcvd_count_acc", "first", _AS_STORED),
    ("xgmi_link_width", None, "xgmi_link_width", "first", _AS_STORED),
    ("gfx_activity_acc", None, "gfx_activity_acc", "first", _AS_STORED),
    ("mem_activity_acc", None, "mem_activity_acc", "first", _AS_STORED),
    ("num_partitions", None, "num_partition", "first", _AS_STORED),
    ("accumulation_counter", None, "accumulation_counter", "first", _AS_STORED),
    *(("residency_acc", reason, f"{reason}_residency_acc", "first", _AS_STORED) for reason in RESIDENCY_REASONS),
)


# --- step 2: a plan per table layout: which unpacked value goes where, converted how --------------

Slot = tuple[int, int, int, int]  # [first, stop) in the table's flat values, its all-ones value, AttrUnit code
# One value to take from the flat values: target, key, index, all-ones, then per conversion the
# factor; the lowest and highest accepted and the divisor; or nothing (as stored).
Scaled = tuple[int, Key, int, int, float]
Divided = tuple[int, Key, int, int, float, float, float]
Stored = tuple[int, Key, int, int]
# The highest supplied of a run of values: target, key, first, stop, all-ones, factor.
Span = tuple[int, Key, int, int, int, float]
# Where a view puts one GpuMetrics value: (index of its target, key there), or None when not wanted.
Target = Callable[[str, Key], tuple[int, Key] | None]
# A kernel field placed in the flat values: name, first, stop, all-ones, AttrUnit code, partition (-1: none).
Place = tuple[str, int, int, int, int, int]

# In v1.9 these arrays live at the top level; fixed layouts keep them per partition.
_PARTITION_FIELDS = frozenset(f.name for block in (XCP_V1_0, XCP_V1_1, XCP_V1_2) for f in block.fields)
_TYPE_CODES = frozenset(t.value for t in AttrType)
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Plan:
    """One table layout, worked out once: which flat value fills each result value, already converted.

    Each value's sources are listed lowest priority first (the last write stands), all of one kind,
    so a mapping's keys are set in the read table's order.
    """

    codec: struct.Struct | None  # the fixed layout's one unpack; None for v1.9 (its record walk)
    scaled: tuple[Scaled, ...]
    divided: tuple[Divided, ...]
    stored: tuple[Stored, ...]
    spans: tuple[Span, ...]
    slots: Mapping[str, Slot]  # every placed top-level field, for the values the decode derives
    partitions: tuple[Mapping[str, Slot], ...]  # the xcp_stats[] blocks (or v1.9's one), in index order
    read: frozenset[str]  # the kernel fields some value is read from


def _plan(codec: struct.Struct | None, places: Sequence[Place], target: Target, as_float: bool) -> Plan:
    slots: dict[str, Slot] = {}
    partitions: list[dict[str, Slot]] = []
    for name, first, stop, ones, unit, partition in places:
        if partition < 0:
            slots[name] = (first, stop, ones, unit)
        else:
            partitions += [{} for _ in range(partition + 1 - len(partitions))]
            partitions[partition][name] = (first, stop, ones, unit)
    sources: dict[tuple[int, Key], list[tuple[str, tuple[Any, ...]]]] = {}
    spans: list[Span] = []
    read: set[str] = set()
    for value, key, name, elements, kind in _READS:
        slot = slots.get(name)
        if slot is None:
            continue  # not in this table
        # AttrUnit is an IntEnum: a plain int code finds its member's entry; an unknown code finds none.
        conversion = kind.get(slot[3]) if isinstance(kind, Mapping) else kind  # type: ignore[call-overload]
        if conversion is None:
            continue  # stored in a unit this value is not measured in
        operation, number = _FLOAT if as_float and conversion is _AS_STORED else conversion
        first, stop, ones, _ = slot
        if elements == "highest":
            if (where := target(value, key)) is not None:
                spans.append((*where, first, stop, ones, number))
                read.add(name)
            continue
        low, high = (0, 100) if kind is _PERCENT else (-_INF, _INF)
        for index in range(first, min(stop, first + 1) if elements == "first" else stop):
            element_key = (f"{key}{index - first}" if key else index - first) if elements == "each" else key
            if (where := target(value, element_key)) is not None:
                extra = {"*": (number,), "/": (low, high, number), "=": ()}[operation]
                sources.setdefault(where, []).append((operation, (*where, index, ones, *extra)))
                read.add(name)
    picks: dict[str, list[Any]] = {"*": [], "/": [], "=": []}
    for found in sources.values():
        for operation, pick in reversed(found):
            picks[operation].append(pick)
    scaled, divided, stored = (tuple(picks[operation]) for operation in "*/=")
    return Plan(codec, scaled, divided, stored, tuple(spans), slots, tuple(partitions), frozenset(read))


def _as_bytes(blob: object) -> bytes:
    if isinstance(blob, bytes):
        return blob
    if isinstance(blob, bytearray | memoryview):
        return bytes(blob)
    raise GpuMetricsError(f"gpu_metrics must be bytes, not {type(blob).__name__}")


def _read_header(data: bytes) -> tuple[int, int, int]:
    if len(data) < HEADER_SIZE:
        raise GpuMetricsError(f"blob of {len(data)} bytes shorter than the {HEADER_SIZE}-byte header")
    structure_size, format_revision, content_revision = HEADER.unpack_from(data)
    return structure_size, format_revision, content_revision


def _check_length(data: bytes, structure_size: int) -> None:
    if len(data) >= structure_size:
        return
    hint = ""
    if len(data) in _TRUNCATED_READ_LENGTHS:
        hint = " (the kernel cuts a gpu_metrics read at PAGE_SIZE-1 bytes)"
    raise GpuMetricsError(f"blob of {len(data)} bytes shorter than structure_size {structure_size}{hint}")


def _unknown_layout(
    structure_size: int, format_revision: int, content_revision: int, layouts: Sequence[Layout] = FIXED_LAYOUTS
) -> GpuMetricsError:
    sizes = [
        str(layout.size)
        for layout in layouts
        if (layout.format_revision, layout.content_revision) == (format_revision, content_revision)
    ]
    if layouts is PARTITION_FIXED_LAYOUTS and not sizes:
        return GpuMetricsError(
            f"unknown partition metrics revision {format_revision}.{content_revision} (this decoder reads 1.0 and 1.1)"
        )
    if not sizes:
        return GpuMetricsError(
            f"unknown gpu_metrics revision {format_revision}.{content_revision}"
            " (this decoder reads 1.0 to 1.9; 2.x and 3.x are APU tables)"
        )
    # v1_6 has two layouts under one revision, which is why the size decides, never the revision alone.
    return GpuMetricsError(
        f"gpu_metrics v{format_revision}.{content_revision} with structure_size {structure_size};"
        f" known layouts are {' or '.join(sizes)} bytes"
    )


def _walk_v1_9(data: bytes, structure_size: int) -> Iterator[tuple[int, int, AttrType, tuple[int, ...]]]:
    """The records of a v1.9 table in order: (attribute id, unit code, value type, values), signed types signed."""
    if structure_size < V1_9_FIXED.size:
        raise GpuMetricsError(
            f"gpu_metrics v1.9 structure_size {structure_size} shorter than its {V1_9_FIXED.size}-byte"
            " header and attribute count"
        )
    count = V1_9_FIXED.unpack_from(data)[3]
    position, end = V1_9_FIXED.size, structure_size
    # Every record is at least its 8-byte encoding, which bounds the count before any loop runs.
    if count < 0 or count > (end - position) // V1_9_ENCODING.size:
        raise GpuMetricsError(f"gpu_metrics v1.9 attr_count {count} does not fit in {end} bytes")
    for index in range(count):
        if position + V1_9_ENCODING.size > end:
            raise GpuMetricsError(f"gpu_metrics v1.9 record {index} of {count} runs past byte {end}")
        (encoding,) = V1_9_ENCODING.unpack_from(data, position)
        position += V1_9_ENCODING.size
        attr_id = (encoding >> ATTR_ID_SHIFT) & ATTR_ID_MASK
        type_code = (encoding >> ATTR_TYPE_SHIFT) & ATTR_TYPE_MASK
        if type_code not in _TYPE_CODES:
            raise GpuMetricsError(
                f"gpu_metrics v1.9 record {index} (attribute {attr_id}) has unknown value type {type_code}"
            )
        value_type = AttrType(type_code)
        code, width = ATTR_TYPE_FORMAT[value_type]
        instances = encoding & ATTR_INSTANCES_MASK
        if position + instances * width > end:
            raise GpuMetricsError(
                f"gpu_metrics v1.9 record {index} (attribute {attr_id}, {instances} values) runs past byte {end}"
            )
        values = struct.unpack_from(f"<{instances}{code}", data, position)
        position += instances * width
        if value_type in SIGNED_ATTR_TYPES:
            half = 1 << (8 * width - 1)
            values = tuple(v - 2 * half if v >= half else v for v in values)
        yield attr_id, (encoding >> ATTR_UNIT_SHIFT) & ATTR_UNIT_MASK, value_type, values


def _fixed_places(layout: Layout, wanted: frozenset[str] | None) -> tuple[struct.Struct, list[Place]]:
    """The unpack of the wanted fields of a fixed layout, in offset order, and where each lands."""
    placed = [(f.offset, f, -1) for f in layout.fields]
    block = layout.partition_block
    if block is not None:
        for index in range(layout.partition_count):
            base = layout.partitions_offset + index * block.size
            placed += [(base + f.offset, f, index) for f in block.fields]
    parts, position, first = ["<"], 0, 0
    places: list[Place] = []
    for offset, fld, partition in sorted(placed, key=lambda entry: entry[0]):
        if wanted is not None and fld.name not in wanted:
            continue
        code, width = C_TYPES[fld.ctype]
        if offset > position:
            parts.append(f"{offset - position}x")
        parts.append(f"{fld.count}{code}")
        position = offset + width * fld.count
        unit = FIXED_FIELD_UNITS.get(fld.name, AttrUnit.NONE)
        places.append((fld.name, first, first + fld.count, (1 << 8 * width) - 1, unit, partition))
        first += fld.count
    return struct.Struct("".join(parts)), places


# A v1.9 table's shape: (attribute id, unit code, value type, value count) of each record, in order.
Shape = tuple[tuple[int, int, AttrType, int], ...]


@functools.lru_cache(maxsize=64)
def _v1_9_plan(shape: Shape, target: Target, as_float: bool) -> Plan:
    """A device writes the same records every time: one plan per shape, over all records' values in order."""
    places: list[Place] = []
    seen: set[str] = set()
    first = 0
    for attr_id, unit, value_type, count in shape:
        name = ATTR_NAMES[attr_id] if attr_id < len(ATTR_NAMES) else ""
        if name and name not in seen:
            # All-ones in the stored bits: -1 once a signed type has been sign-converted.
            ones = -1 if value_type in SIGNED_ATTR_TYPES else (1 << (8 * ATTR_TYPE_FORMAT[value_type][1])) - 1
            places.append((name, first, first + count, ones, unit, 0 if name in _PARTITION_FIELDS else -1))
        seen.add(name)  # the first record of an id wins
        first += count
    return _plan(None, places, target, as_float)


class Plans:
    """One view of gpu_metrics: a plan per fixed layout, made once, and per v1.9 shape, made when first seen.

    `target` says where each GpuMetrics value goes (None: not wanted). `every_field`: a fixed layout
    unpacks all its fields (the full decode derives values from some); else only those a wanted
    value is read from (the rest of the table is skipped). `as_float` gives counters as floats.
    """

    def __init__(
        self,
        target: Target,
        every_field: bool = True,
        as_float: bool = False,
        layouts: Sequence[Layout] = FIXED_LAYOUTS,
        records_revision: tuple[int, int] = (V1_9_FORMAT_REVISION, V1_9_CONTENT_REVISION),
    ) -> None:
        self.target, self.as_float = target, as_float
        self.layouts, self.records_revision = layouts, records_revision
        self.fixed = {}
        for layout in layouts:
            plan = _plan(*_fixed_places(layout, None), target, as_float)
            if not every_field:
                plan = _plan(*_fixed_places(layout, plan.read), target, as_float)
            self.fixed[layout.size, layout.format_revision, layout.content_revision] = plan

    def unpack(self, blob: bytes | bytearray | memoryview) -> tuple[Plan, Sequence[int], int, int, int]:
        """The blob's plan, its flat values, format revision, content revision and structure size."""
        data = _as_bytes(blob)
        structure_size, format_revision, content_revision = header = _read_header(data)
        plan = self.fixed.get(header)
        if plan is not None and plan.codec is not None:
            _check_length(data, structure_size)
            return plan, plan.codec.unpack_from(data), format_revision, content_revision, structure_size
        if (format_revision, content_revision) != self.records_revision:
            raise _unknown_layout(structure_size, format_revision, content_revision, self.layouts)
        _check_length(data, structure_size)
        records = list(_walk_v1_9(data, structure_size))
        shape = tuple((attr_id, unit, value_type, len(values)) for attr_id, unit, value_type, values in records)
        flat = [value for *_, values in records for value in values]
        plan = _v1_9_plan(shape, self.target, self.as_float)
        return plan, flat, format_revision, content_revision, structure_size


def take(plan: Plan, flat: Sequence[int], targets: Sequence[Any]) -> None:
    """Write every value the plan finds in a table's flat values into its target (a dict, or a list)."""
    for target, key, index, ones, factor in plan.scaled:
        value = flat[index]
        if value != ones:
            targets[target][key] = value * factor
    for target, key, index, ones, low, high, divisor in plan.divided:
        value = flat[index]
        if value != ones and low <= value <= high:
            targets[target][key] = value / divisor
    for target, key, index, ones in plan.stored:
        value = flat[index]
        if value != ones:
            targets[target][key] = value
    for target, key, first, stop, ones, factor in plan.spans:
        run = flat[first:stop]
        if ones in run:
            run = [value for value in run if value != ones]
        if run:
            targets[target][key] = max(run) * factor


# --- step 3: the flat values -> GpuMetrics ----------------------------------------------------------

# The mapping fields the plan fills (those read by key), in target order after 0, the scalars.
_MAPPINGS = tuple(dict.fromkeys(value for value, key, *_ in _READS if key is not None))
_MAPPING_TARGET = {name: index for index, name in enumerate(_MAPPINGS, 1)}
# Aldebaran's ESM link codes in the 0.1 GT/s unit that are not a standard rate (see _PCIE_RATES_100MTS).
_ESM_ONLY = frozenset(_ESM_CODES) - _PCIE_RATES_100MTS


def _whole(field: str, key: Key) -> tuple[int, Key]:
    return (0, field) if key is None else (_MAPPING_TARGET[field], key)


_FULL = Plans(_whole)
_PARTITION = Plans(_whole, layouts=PARTITION_FIXED_LAYOUTS, records_revision=PARTITION_V1_1_REVISION)


def decode_gpu_metrics(blob: bytes | bytearray | memoryview) -> GpuMetrics:
    """Decode one gpu_metrics read. Raises GpuMetricsError (and nothing else) when it cannot."""
    return _decode(_FULL, blob)


def decode_partition_metrics(blob: bytes | bytearray | memoryview) -> GpuMetrics:
    """Decode one partition's xcp/xcp_metrics read: a GpuMetrics with its clocks and one partition
    block (partition_gfx_busy[0] etc. are this partition's own). Raises GpuMetricsError when it cannot."""
    return _decode(_PARTITION, blob)


def _decode(plans: Plans, blob: bytes | bytearray | memoryview) -> GpuMetrics:
    plan, flat, format_revision, content_revision, structure_size = plans.unpack(blob)
    scalars: dict[str, Any] = {}
    mappings: dict[str, dict[Any, Any]] = {name: {} for name in _MAPPINGS}
    take(plan, flat, (scalars, *mappings.values()))
    lane_rate = scalars.pop("xgmi_lane_rate", None)
    width = scalars.get("xgmi_link_width")
    if lane_rate is not None and width is not None:
        # xgmi_link_speed is a per-lane bit rate (Gbps): bytes per second of the whole link.
        scalars["xgmi_link_speed_bytes_per_second"] = lane_rate * width / 8
    speed = plan.slots.get("pcie_link_speed")  # the rate, when read, was read from flat[speed[0]]
    rate = "pcie_link_transfers_per_second"
    if rate in scalars and speed and speed[3] == AttrUnit.SPEED_100MTS and flat[speed[0]] in _ESM_ONLY:
        del scalars[rate]
    partitions = _reported_partitions(plan.partitions, flat, scalars.get("num_partitions"))
    busy = mappings["busy"]
    if "media" not in busy:  # the busiest VCN, at the top (v1_4, v1_5) or per partition
        vcn = [*_ratios(flat, plan.slots.get("vcn_activity"))]
        vcn += [ratio for partition in partitions for ratio in _ratios(flat, partition.get("vcn_busy"))]
        if vcn:
            busy["media"] = max(vcn)
    if partitions:
        for field, name in (("gfx", "gfx_busy_inst"), ("vcn", "vcn_busy"), ("jpeg", "jpeg_busy")):
            scalars[f"partition_{field}_busy"] = tuple(_ratios(flat, partition.get(name)) for partition in partitions)
        counters = tuple(_counters(flat, partition) for partition in partitions)
        if any(counters):
            scalars["partition_xcc_counters"] = counters
    if (link := plan.slots.get("xgmi_link_status")) is not None:
        mappings["xgmi_link_up"] = {i: v == 1 for i, v in enumerate(flat[link[0] : link[1]]) if v in (0, 1)}
    if (indep := scalars.get("indep_throttle_status")) is not None:
        scalars["throttle"] = _throttle(indep)
    # Only what was supplied (the rest keeps its empty default); the dicts are this decode's own,
    # so they are wrapped read-only rather than copied.
    frozen: dict[str, Any] = {name: MappingProxyType(values) for name, values in mappings.items() if values}
    return GpuMetrics(format_revision, content_revision, structure_size, **scalars, **frozen)


@functools.lru_cache(maxsize=256)
def _throttle(indep: int) -> Mapping[str, bool]:
    # Throttle bits change rarely: one frozen mapping per bit pattern seen.
    return frozen_map(throttle_reasons(indep))


def _ratios(flat: Sequence[int], slot: Slot | None) -> tuple[float, ...]:
    """A percent field's supplied values within 0..100 %, as 0..1 ratios."""
    if slot is None or slot[3] != AttrUnit.PERCENT:
        return ()
    first, stop, ones, _ = slot
    return tuple(v / 100 for v in flat[first:stop] if v != ones and 0 <= v <= 100)


def _counters(flat: Sequence[int], partition: Mapping[str, Slot]) -> Mapping[str, tuple[int, ...]]:
    """A partition block's per-XCC clock counters that are supplied (the driver fills each array from index 0)."""
    found = {}
    for key, name in XCC_COUNTERS.items():
        slot = partition.get(name)
        if slot is not None:
            first, stop, ones, _ = slot
            if values := tuple(v for v in flat[first:stop] if v != ones):
                found[key] = values
    return frozen_map(found)


def _reported_partitions(
    blocks: tuple[Mapping[str, Slot], ...], flat: Sequence[int], num_partitions: int | None
) -> tuple[Mapping[str, Slot], ...]:
    """The partition blocks that describe live partitions.

    With num_partition supplied, the first that many blocks (the rest are unused slots). Without
    it, every block up to the last one that holds any supplied value.
    """
    if num_partitions is not None:
        return blocks[:num_partitions]
    used = [
        i
        for i, block in enumerate(blocks)
        if any(v != ones for first, stop, ones, _ in block.values() for v in flat[first:stop])
    ]
    return blocks[: used[-1] + 1] if used else ()
