"""Pure decoder of the amdgpu binary `gpu_metrics` table (sysfs cardN/device/gpu_metrics).

Any bytes in, a `GpuMetrics` (SI units) or a `GpuMetricsError` out, nothing else. Covers v1_0 .. v1_8
(fixed C layouts, see layouts.py) and v1.9 (self-describing records).

Decoding is two steps so every version shares one set of unit rules:
  1. unpack the blob into raw fields: one precomputed struct per fixed layout (or the v1.9 record
     walk) gives flat values and where each kernel field sits in them, plus the unit each field is
     stored in (implied for fixed layouts, declared by v1.9 records); all-ones reads as not supplied
     (the driver fills the table with 0xFF before writing what the firmware supplies);
  2. build `GpuMetrics` from the raw fields, converting by unit. A field whose unit is not the one
     its metric needs is left out rather than guessed.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.model import frozen_map
from exporter.sources.gpu_metrics.layouts import (
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
    SIGNED_ATTR_TYPES,
    V1_9_CONTENT_REVISION,
    V1_9_ENCODING,
    V1_9_FIXED,
    V1_9_FORMAT_REVISION,
    AttrType,
    AttrUnit,
    Layout,
)

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
    0: "ppt0",
    1: "ppt1",
    2: "ppt2",
    3: "ppt3",
    4: "spl",
    5: "fppt",
    6: "sppt",
    7: "sppt_apu",
    16: "tdc_gfx",
    17: "tdc_soc",
    18: "tdc_mem",
    19: "tdc_vdd",
    20: "tdc_cvip",
    21: "edc_cpu",
    22: "edc_gfx",
    23: "apcc",
    32: "temp_gpu",
    33: "temp_core",
    34: "temp_mem",
    35: "temp_edge",
    36: "temp_hotspot",
    37: "temp_soc",
    38: "temp_vr_gfx",
    39: "temp_vr_soc",
    40: "temp_vr_mem0",
    41: "temp_vr_mem1",
    42: "temp_liquid0",
    43: "temp_liquid1",
    44: "vrhot0",
    45: "vrhot1",
    46: "prochot_cpu",
    47: "prochot_gfx",
    56: "ppm",
    57: "fit",
}


# The throttlers whose residency MI300's firmware accumulates (gpu_metrics v1_6+ `<name>_residency_acc`).
RESIDENCY_REASONS = ("prochot", "ppt", "socket_thm", "vr_thm", "hbm_thm")


class GpuMetricsError(ValueError):
    """The blob is not a gpu_metrics table this decoder can read; the message says why."""


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    """One decoded gpu_metrics table in SI units. None / absent key = not supplied by the device."""

    format_revision: int
    content_revision: int
    structure_size: int
    temperatures: Mapping[str, float] = field(default_factory=frozen_map)  # °C
    power_watts: float | None = None
    energy_joules: float | None = None
    busy: Mapping[str, float] = field(default_factory=frozen_map)  # ratio 0..1
    clocks_hertz: Mapping[str, float] = field(default_factory=frozen_map)
    clocks_average_hertz: Mapping[str, float] = field(default_factory=frozen_map)
    voltages_volts: Mapping[str, float] = field(default_factory=frozen_map)
    throttle_status: int | None = None  # raw, ASIC-specific bits
    indep_throttle_status: int | None = None  # raw SMU_THROTTLER_* bits
    throttle: Mapping[str, bool] = field(default_factory=frozen_map)
    fan_rpm: float | None = None
    pcie_link_width: int | None = None
    pcie_link_transfers_per_second: float | None = None
    pcie_bandwidth_bytes_per_second: float | None = None
    pcie_bandwidth_acc: int | None = None
    pcie_replays: int | None = None
    pcie_recoveries: int | None = None
    pcie_replay_rollovers: int | None = None
    pcie_naks_sent: int | None = None
    pcie_naks_received: int | None = None
    xgmi_link_width: int | None = None
    xgmi_link_speed_bytes_per_second: float | None = None  # whole link: lane rate x width / 8
    xgmi_link_up: Mapping[int, bool] = field(default_factory=frozen_map)
    xgmi_read_bytes: Mapping[int, float] = field(default_factory=frozen_map)  # cumulative
    xgmi_write_bytes: Mapping[int, float] = field(default_factory=frozen_map)
    gfx_activity_acc: int | None = None
    mem_activity_acc: int | None = None
    system_clock_counter_seconds: float | None = None
    firmware_timestamp_seconds: float | None = None
    num_partitions: int | None = None
    # Per partition (xcp), the instantaneous busy ratio of each XCC that reports one. v1.9 tables
    # carry one device-wide gfx_busy_inst array, returned as a single entry.
    partition_gfx_busy: tuple[tuple[float, ...], ...] = ()
    # Per partition, the busy ratio of each of its VCN (video) and JPEG engines that reports one
    # (v1.9: one device-wide entry, like partition_gfx_busy).
    partition_vcn_busy: tuple[tuple[float, ...], ...] = ()
    partition_jpeg_busy: tuple[tuple[float, ...], ...] = ()
    # MI300 v1_6+: the firmware's sample count and, per throttler, how many of those samples it was
    # holding the clocks back (prochot, ppt, socket_thm, vr_thm, hbm_thm), raw u32 counters that wrap.
    accumulation_counter: int | None = None
    residency_acc: Mapping[str, int] = field(default_factory=frozen_map)

    @property
    def version(self) -> str:
        """ "1.3" — the form DeviceIdentity.gpu_metrics_version uses."""
        return f"{self.format_revision}.{self.content_revision}"


@dataclass(frozen=True, slots=True)
class MetricsAttribute:
    """One v1.9 record, as stored: values are raw integers (signed types already signed)."""

    attr_id: int
    name: str  # kernel attribute name in lower case, or "attr_<id>" for ids this decoder predates
    unit: int  # AttrUnit value (may be one this decoder predates)
    value_type: AttrType
    values: tuple[int, ...]


# The reasons Aldebaran's firmware maps into indep_throttle_status (aldebaran_ppt.c's throttler map):
# always exported, 0 or 1, so their series are stable. Any other known reason is exported only while
# its bit is set — 34 always-zero series per GCD would be noise, but a set bit must never be lost.
ALWAYS_EXPORTED_THROTTLERS = frozenset(
    {
        "ppt0",
        "ppt1",
        "tdc_gfx",
        "tdc_soc",
        "tdc_mem",
        "temp_gpu",
        "temp_mem",
        "temp_vr_gfx",
        "temp_vr_soc",
        "temp_vr_mem0",
        "apcc",
    }
)


def throttle_reasons(indep_bits: int) -> dict[str, bool]:
    """SMU_THROTTLER_* reasons -> active: the always-exported set, plus any other reason that is set."""
    reasons = {}
    for bit, name in THROTTLER_BITS.items():
        active = bool((indep_bits >> bit) & 1)
        if active or name in ALWAYS_EXPORTED_THROTTLERS:
            reasons[name] = active
    return reasons


# --- step 1: blob -> raw fields -----------------------------------------------------------------

# Where one field's elements sit in a table's flat values: [first, stop), and its all-ones value.
Slot = tuple[int, int, int]

# In v1.9 these arrays live at the top level; fixed layouts keep them per partition.
_PARTITION_FIELDS = frozenset(
    {
        "gfx_busy_inst",
        "jpeg_busy",
        "vcn_busy",
        "gfx_busy_acc",
        "gfx_below_host_limit_acc",
        "gfx_below_host_limit_ppt_acc",
        "gfx_below_host_limit_thm_acc",
        "gfx_low_utilization_acc",
        "gfx_below_host_limit_total_acc",
    }
)
_TYPE_CODES = frozenset(t.value for t in AttrType)


@dataclass(frozen=True, slots=True)
class _FixedPlan:
    """One fixed layout read by one struct call: where each field's elements land in its result."""

    codec: struct.Struct
    slots: Mapping[str, Slot]
    partitions: tuple[Mapping[str, Slot], ...]  # the xcp_stats[] blocks, in index order


def _fixed_plan(layout: Layout, wanted: frozenset[str] | None) -> _FixedPlan:
    placed = [(f.offset, f, -1) for f in layout.fields]
    block = layout.partition_block
    if block is not None:
        for index in range(layout.partition_count):
            base = layout.partitions_offset + index * block.size
            placed += [(base + f.offset, f, index) for f in block.fields]
    parts, position, first = ["<"], 0, 0
    slots: dict[str, Slot] = {}
    partitions: list[dict[str, Slot]] = [{} for _ in range(layout.partition_count)]
    for offset, fld, partition in sorted(placed, key=lambda entry: entry[0]):
        if wanted is not None and fld.name not in wanted:
            continue
        code, width, _ = C_TYPES[fld.ctype]
        if offset > position:
            parts.append(f"{offset - position}x")
        parts.append(f"{fld.count}{code}")
        position = offset + width * fld.count
        (slots if partition < 0 else partitions[partition])[fld.name] = (first, first + fld.count, (1 << 8 * width) - 1)
        first += fld.count
    return _FixedPlan(struct.Struct("".join(parts)), slots, tuple(partitions))


class _Fields:
    """One table's raw fields, typed and unit-checked on access: the same for fixed layouts and v1.9."""

    __slots__ = ("first", "flat", "partitions", "slots", "units")

    def __init__(
        self,
        flat: Sequence[int],
        slots: Mapping[str, Slot],
        units: Mapping[str, int],  # field -> AttrUnit it is stored in; absent = no unit (a count)
        partitions: tuple[Mapping[str, Slot], ...],
    ) -> None:
        self.flat, self.slots, self.units, self.partitions = flat, slots, units, partitions
        # Element 0 of every supplied field: a scalar as stored (counters, bit fields, widths).
        self.first = {name: v for name, (i, stop, ones) in slots.items() if i < stop and (v := flat[i]) != ones}

    def elements(self, name: str, slots: Mapping[str, Slot] | None = None) -> list[int | None]:
        slot = (self.slots if slots is None else slots).get(name)
        if slot is None:
            return []
        first, stop, all_ones = slot
        return [None if v == all_ones else v for v in self.flat[first:stop]]

    def factor(self, name: str, kind: Mapping[AttrUnit, float]) -> float | None:
        # AttrUnit is an IntEnum: a plain int code finds its member's entry; an unknown code finds none.
        return kind.get(self.units.get(name, AttrUnit.NONE))  # type: ignore[call-overload]

    def scaled(self, name: str, kind: Mapping[AttrUnit, float]) -> float | None:
        return self.each({name: name}, kind).get(name)

    def each(self, fields: Mapping[str, str], kind: Mapping[AttrUnit, float]) -> dict[str, float]:
        """key -> its field's first element in SI units, for each field supplied in a unit of `kind`."""
        first, units = self.first, self.units
        return {
            key: value * factor
            for key, name in fields.items()
            if (value := first.get(name)) is not None
            and (factor := kind.get(units.get(name, AttrUnit.NONE))) is not None  # type: ignore[call-overload]
        }

    def indexed(self, name: str, kind: Mapping[AttrUnit, float]) -> dict[int, float]:
        """Array element index -> scaled value, for the elements that are supplied."""
        factor = self.factor(name, kind)
        if factor is None:
            return {}
        return {i: v * factor for i, v in enumerate(self.elements(name)) if v is not None}

    def highest(self, name: str, kind: Mapping[AttrUnit, float]) -> float | None:
        """One value for a per-instance array (per-XCC clocks...): the highest supplied instance."""
        supplied = self.indexed(name, kind)
        return max(supplied.values()) if supplied else None

    def ratios(self, name: str, slots: Mapping[str, Slot] | None = None) -> tuple[float, ...]:
        """Percent values as 0..1 ratios; a value outside 0..100 % is not a utilisation and is dropped."""
        if self.factor(name, _PERCENT) is None:
            return ()
        # Divide rather than multiply by 0.01: 35 / 100 is exactly 0.35, 35 * 0.01 is not.
        return tuple(v / 100 for v in self.elements(name, slots) if v is not None and 0 <= v <= 100)

    def ratio(self, name: str) -> float | None:
        values = self.ratios(name)
        return values[0] if values else None

    def any_supplied(self, slots: Mapping[str, Slot]) -> bool:
        return any(v != ones for first, stop, ones in slots.values() for v in self.flat[first:stop])


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


def _unknown_layout(structure_size: int, format_revision: int, content_revision: int) -> GpuMetricsError:
    sizes = [
        str(layout.size)
        for layout in FIXED_LAYOUTS
        if (layout.format_revision, layout.content_revision) == (format_revision, content_revision)
    ]
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


def _v1_9_fields(data: bytes, structure_size: int, wanted: frozenset[str] | None) -> _Fields:
    flat: list[int] = []
    slots: dict[str, Slot] = {}
    units: dict[str, int] = {}
    partition: dict[str, Slot] = {}
    for attr_id, unit, value_type, values in _walk_v1_9(data, structure_size):
        name = ATTR_NAMES[attr_id] if attr_id < len(ATTR_NAMES) else ""
        if not name or name in units or (wanted is not None and name not in wanted):
            continue  # unknown to this decoder, a repeat (the first record of an id wins), or not wanted
        # All-ones in the stored bits: -1 once a signed type has been sign-converted.
        all_ones = -1 if value_type in SIGNED_ATTR_TYPES else (1 << (8 * ATTR_TYPE_FORMAT[value_type][1])) - 1
        units[name] = unit
        (partition if name in _PARTITION_FIELDS else slots)[name] = (len(flat), len(flat) + len(values), all_ones)
        flat.extend(values)
    return _Fields(flat, slots, units, (partition,) if partition else ())


class FieldDecoder:
    """decode_gpu_metrics over the `wanted` kernel fields (every field when None); the rest read as not supplied."""

    def __init__(self, wanted: frozenset[str] | None = None) -> None:
        self.wanted = wanted
        self.plans = {
            (layout.size, layout.format_revision, layout.content_revision): _fixed_plan(layout, wanted)
            for layout in FIXED_LAYOUTS
        }

    def decode(self, blob: bytes | bytearray | memoryview) -> GpuMetrics:
        """Decode one gpu_metrics read. Raises GpuMetricsError (and nothing else) when it cannot."""
        return _build(*self.fields(blob))

    def fields(self, blob: bytes | bytearray | memoryview) -> tuple[_Fields, int, int, int]:
        """The blob's raw fields and its format revision, content revision and structure size."""
        data = _as_bytes(blob)
        structure_size, format_revision, content_revision = header = _read_header(data)
        plan = self.plans.get(header)
        if plan is not None:
            _check_length(data, structure_size)
            fields = _Fields(plan.codec.unpack_from(data), plan.slots, FIXED_FIELD_UNITS, plan.partitions)
        elif (format_revision, content_revision) == (V1_9_FORMAT_REVISION, V1_9_CONTENT_REVISION):
            _check_length(data, structure_size)
            fields = _v1_9_fields(data, structure_size, self.wanted)
        else:
            raise _unknown_layout(structure_size, format_revision, content_revision)
        return fields, format_revision, content_revision, structure_size


decode_gpu_metrics = FieldDecoder().decode


def read_v1_9_attributes(blob: bytes | bytearray | memoryview) -> tuple[MetricsAttribute, ...]:
    """The records of a v1.9 table in table order, unknown attribute ids included."""
    data = _as_bytes(blob)
    structure_size, format_revision, content_revision = _read_header(data)
    if (format_revision, content_revision) != (V1_9_FORMAT_REVISION, V1_9_CONTENT_REVISION):
        raise GpuMetricsError(f"gpu_metrics v{format_revision}.{content_revision} is not a v1.9 table")
    _check_length(data, structure_size)
    return tuple(
        MetricsAttribute(id_, ATTR_NAMES[id_] if id_ < len(ATTR_NAMES) else f"attr_{id_}", unit, kind, values)
        for id_, unit, kind, values in _walk_v1_9(data, structure_size)
    )


# --- step 2: raw fields -> GpuMetrics -------------------------------------------------------------

# What one stored unit is worth in the SI unit of each kind of metric.
_TEMPERATURE = {AttrUnit.TEMP_CELSIUS: 1.0}
_POWER = {AttrUnit.POWER_WATT: 1.0}
_CLOCK = {AttrUnit.CLOCK_MHZ: 1e6}
_TIME = {AttrUnit.TIME_NS: 1e-9, AttrUnit.TIME_10NS: 1e-8}
_RATE = {AttrUnit.SPEED_GTS: 1e9, AttrUnit.SPEED_100MTS: 1e8}  # per second, per lane
_BANDWIDTH = {AttrUnit.BANDWIDTH_GBS: 1e9}
_DATA = {AttrUnit.DATA_KB: 1024.0}
_PERCENT = {AttrUnit.PERCENT: 0.01}
_COUNT = {AttrUnit.NONE: 1.0}

# GpuMetrics key -> the kernel field it is read from.
_TEMPERATURE_FIELDS = {
    "edge": "temperature_edge",
    "junction": "temperature_hotspot",
    "memory": "temperature_mem",
    "vr_gfx": "temperature_vrgfx",
    "vr_soc": "temperature_vrsoc",
    "vr_mem": "temperature_vrmem",
}
_CLOCK_FIELDS = {
    "gfx": "current_gfxclk",
    "soc": "current_socclk",
    "memory": "current_uclk",
    "video": "current_vclk0",
    "decode": "current_dclk0",
}
_AVERAGE_CLOCK_FIELDS = {
    "gfx": "average_gfxclk_frequency",
    "soc": "average_socclk_frequency",
    "memory": "average_uclk_frequency",
    "video": "average_vclk0_frequency",
    "decode": "average_dclk0_frequency",
}
_POWER_FIELDS = {"current": "curr_socket_power", "average": "average_socket_power"}  # the first supplied wins
_VOLTAGE_FIELDS = {"gfx": "voltage_gfx", "soc": "voltage_soc", "memory": "voltage_mem"}


@functools.lru_cache(maxsize=256)
def _throttle(indep: int) -> Mapping[str, bool]:
    # Throttle bits change rarely: one frozen mapping per bit pattern seen.
    return frozen_map(throttle_reasons(indep))


def _build(read: _Fields, format_revision: int, content_revision: int, structure_size: int) -> GpuMetrics:
    num_partitions = read.first.get("num_partition")
    partitions = _reported_partitions(read, num_partitions)
    indep = read.first.get("indep_throttle_status")
    return GpuMetrics(
        format_revision=format_revision,
        content_revision=content_revision,
        structure_size=structure_size,
        temperatures=frozen_map(_temperatures(read)),
        power_watts=_first_present(*read.each(_POWER_FIELDS, _POWER).values()),
        energy_joules=_energy(read),
        busy=frozen_map(_busy(read, partitions)),
        clocks_hertz=frozen_map(_present({key: read.highest(name, _CLOCK) for key, name in _CLOCK_FIELDS.items()})),
        clocks_average_hertz=frozen_map(read.each(_AVERAGE_CLOCK_FIELDS, _CLOCK)),
        voltages_volts=frozen_map(
            {key: mv / 1000.0 for key, name in _VOLTAGE_FIELDS.items() if (mv := read.first.get(name)) is not None}
        ),
        throttle_status=read.first.get("throttle_status"),
        indep_throttle_status=indep,
        throttle=frozen_map() if indep is None else _throttle(indep),
        fan_rpm=_as_float(read.first.get("current_fan_speed")),
        pcie_link_width=read.first.get("pcie_link_width"),
        pcie_link_transfers_per_second=_pcie_rate(read),
        pcie_bandwidth_bytes_per_second=read.scaled("pcie_bandwidth_inst", _BANDWIDTH),
        pcie_bandwidth_acc=read.first.get("pcie_bandwidth_acc"),
        pcie_replays=read.first.get("pcie_replay_count_acc"),
        pcie_recoveries=read.first.get("pcie_l0_to_recov_count_acc"),
        pcie_replay_rollovers=read.first.get("pcie_replay_rover_count_acc"),
        pcie_naks_sent=read.first.get("pcie_nak_sent_count_acc"),
        pcie_naks_received=read.first.get("pcie_nak_rcvd_count_acc"),
        xgmi_link_width=read.first.get("xgmi_link_width"),
        xgmi_link_speed_bytes_per_second=_xgmi_link_rate(read),
        xgmi_link_up=frozen_map({i: v == 1 for i, v in enumerate(read.elements("xgmi_link_status")) if v in (0, 1)}),
        xgmi_read_bytes=frozen_map(read.indexed("xgmi_read_data_acc", _DATA)),
        xgmi_write_bytes=frozen_map(read.indexed("xgmi_write_data_acc", _DATA)),
        gfx_activity_acc=read.first.get("gfx_activity_acc"),
        mem_activity_acc=read.first.get("mem_activity_acc"),
        system_clock_counter_seconds=read.scaled("system_clock_counter", _TIME),
        firmware_timestamp_seconds=read.scaled("firmware_timestamp", _TIME),
        num_partitions=num_partitions,
        partition_gfx_busy=tuple(read.ratios("gfx_busy_inst", p) for p in partitions),
        partition_vcn_busy=tuple(read.ratios("vcn_busy", p) for p in partitions),
        partition_jpeg_busy=tuple(read.ratios("jpeg_busy", p) for p in partitions),
        accumulation_counter=read.first.get("accumulation_counter"),
        residency_acc=frozen_map(
            {
                reason: value
                for reason in RESIDENCY_REASONS
                if (value := read.first.get(f"{reason}_residency_acc")) is not None
            }
        ),
    )


def _reported_partitions(read: _Fields, num_partitions: int | None) -> tuple[Mapping[str, Slot], ...]:
    """The partition blocks that describe live partitions.

    With num_partition supplied, the first that many blocks (the rest are unused slots). Without
    it, every block up to the last one that holds any supplied value.
    """
    if num_partitions is not None:
        return read.partitions[:num_partitions]
    used = [i for i, block in enumerate(read.partitions) if read.any_supplied(block)]
    return read.partitions[: used[-1] + 1] if used else ()


def _temperatures(read: _Fields) -> dict[str, float]:
    temperatures = read.each(_TEMPERATURE_FIELDS, _TEMPERATURE)
    for index, celsius in read.indexed("temperature_hbm", _TEMPERATURE).items():
        temperatures[f"hbm{index}"] = celsius
    return temperatures


def _energy(read: _Fields) -> float | None:
    ticks = read.first.get("energy_accumulator")
    if ticks is None or read.factor("energy_accumulator", _COUNT) is None:
        return None
    return ticks * ENERGY_JOULES_PER_TICK


def _busy(read: _Fields, partitions: tuple[Mapping[str, Slot], ...]) -> dict[str, float]:
    # Media: MI2xx's single average; else the busiest VCN, at the top (v1_4, v1_5) or per partition.
    vcn = list(read.ratios("vcn_activity"))
    for partition in partitions:
        vcn.extend(read.ratios("vcn_busy", partition))
    return _present(
        {
            "gfx": read.ratio("average_gfx_activity"),
            "memory": read.ratio("average_umc_activity"),
            "media": _first_present(read.ratio("average_mm_activity"), max(vcn) if vcn else None),
        }
    )


def _pcie_rate(read: _Fields) -> float | None:
    speed = read.first.get("pcie_link_speed")
    factor = read.factor("pcie_link_speed", _RATE)
    if speed is None or factor is None:
        return None
    stored_in_100mts = read.units.get("pcie_link_speed") == AttrUnit.SPEED_100MTS
    if stored_in_100mts and speed in _ESM_CODES and speed not in _PCIE_RATES_100MTS:
        return None
    return speed * factor


def _xgmi_link_rate(read: _Fields) -> float | None:
    # xgmi_link_speed is a per-lane bit rate (Gbps): bytes per second of the whole link.
    lane_rate = read.scaled("xgmi_link_speed", _RATE)
    width = read.first.get("xgmi_link_width")
    return None if lane_rate is None or width is None else lane_rate * width / 8


def _as_float(value: int | None) -> float | None:
    return None if value is None else float(value)


def _first_present(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _present(values: Mapping[str, float | None]) -> dict[str, float]:
    return {k: v for k, v in values.items() if v is not None}
