"""Pure decoder of the amdgpu binary `gpu_metrics` table (sysfs cardN/device/gpu_metrics).

Any bytes in, a `GpuMetrics` (SI units) or a `GpuMetricsError` out, nothing else. Covers v1_0 .. v1_8
(fixed C layouts, see layouts.py) and v1.9 (self-describing records).

Decoding is two steps so every version shares one set of unit rules:
  1. unpack the blob into a raw table: kernel field name -> values, all-ones already turned into
     None (the driver fills the table with 0xFF before writing what the firmware supplies), plus
     the unit each field is stored in (implied for fixed layouts, declared by v1.9 records);
  2. build `GpuMetrics` from the raw table, converting by unit. A field whose unit is not the one
     its metric needs is left out rather than guessed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
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
    BlockLayout,
    Field,
    Layout,
    struct_format,
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


def decode_gpu_metrics(blob: bytes | bytearray | memoryview) -> GpuMetrics:
    """Decode one gpu_metrics read. Raises GpuMetricsError (and nothing else) when it cannot."""
    data = _as_bytes(blob)
    structure_size, format_revision, content_revision = _read_header(data)
    if (format_revision, content_revision) == (V1_9_FORMAT_REVISION, V1_9_CONTENT_REVISION):
        _check_length(data, structure_size)
        table = _attributes_table(_parse_attributes(data, structure_size))
    else:
        layout = _select_layout(structure_size, format_revision, content_revision)
        _check_length(data, structure_size)
        table = _unpack_fixed(data, layout)
    return _build(table, format_revision, content_revision, structure_size)


def read_v1_9_attributes(blob: bytes | bytearray | memoryview) -> tuple[MetricsAttribute, ...]:
    """The records of a v1.9 table in table order, unknown attribute ids included."""
    data = _as_bytes(blob)
    structure_size, format_revision, content_revision = _read_header(data)
    if (format_revision, content_revision) != (V1_9_FORMAT_REVISION, V1_9_CONTENT_REVISION):
        raise GpuMetricsError(f"gpu_metrics v{format_revision}.{content_revision} is not a v1.9 table")
    _check_length(data, structure_size)
    return _parse_attributes(data, structure_size)


# --- step 1: blob -> raw table --------------------------------------------------------------------

RawValues = tuple[int | None, ...]  # one field's elements; None where the element was all-ones

_TYPE_CODES = frozenset(t.value for t in AttrType)
_UNIT_CODES = frozenset(u.value for u in AttrUnit)


@dataclass(frozen=True, slots=True)
class _RawTable:
    values: Mapping[str, RawValues]
    units: Mapping[str, int]  # field -> AttrUnit it is stored in; absent = no unit (a count)
    partitions: tuple[Mapping[str, RawValues], ...]  # xcp_stats[] blocks, in index order


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


def _select_layout(structure_size: int, format_revision: int, content_revision: int) -> Layout:
    candidates = [
        layout
        for layout in FIXED_LAYOUTS
        if (layout.format_revision, layout.content_revision) == (format_revision, content_revision)
    ]
    if not candidates:
        raise GpuMetricsError(
            f"unknown gpu_metrics revision {format_revision}.{content_revision}"
            " (this decoder reads 1.0 to 1.9; 2.x and 3.x are APU tables)"
        )
    for layout in candidates:
        if layout.size == structure_size:
            return layout
    # v1_6 has two layouts under one revision, which is why the size decides, never the revision alone.
    expected = " or ".join(str(layout.size) for layout in candidates)
    raise GpuMetricsError(
        f"gpu_metrics v{format_revision}.{content_revision} with structure_size {structure_size};"
        f" known layouts are {expected} bytes"
    )


@dataclass(frozen=True, slots=True)
class _Unpacker:
    """A fixed layout (or partition block) compiled once into one struct.Struct call."""

    codec: struct.Struct
    fields: tuple[Field, ...]  # in offset order, as the codec returns them
    all_ones: tuple[int, ...]  # the "not supplied" value of each field's C type


def _compile_unpacker(fields: tuple[Field, ...], size: int) -> _Unpacker:
    ordered = tuple(sorted(fields, key=lambda f: f.offset))
    all_ones = tuple((1 << (8 * C_TYPES[f.ctype][1])) - 1 for f in ordered)
    return _Unpacker(struct.Struct(struct_format(ordered, size)), ordered, all_ones)


def _compile_all() -> dict[str, _Unpacker]:
    """Every fixed layout and partition block, compiled once at import, keyed by struct name."""
    compiled: dict[str, _Unpacker] = {}
    for layout in FIXED_LAYOUTS:
        compiled[layout.name] = _compile_unpacker(layout.fields, layout.size)
        block = layout.partition_block
        if block is not None and block.name not in compiled:
            compiled[block.name] = _compile_unpacker(block.fields, block.size)
    return compiled


# Decoding looks a layout up by its (unique) struct name: cheaper than hashing its ~40 Field
# records on every decode, and stable, unlike an id().
_UNPACKERS: Mapping[str, _Unpacker] = _compile_all()


def _unpack_fields(data: bytes, offset: int, struct_name: str) -> dict[str, RawValues]:
    unpacker = _UNPACKERS[struct_name]
    flat = unpacker.codec.unpack_from(data, offset)
    values: dict[str, RawValues] = {}
    position = 0
    for fld, all_ones in zip(unpacker.fields, unpacker.all_ones, strict=True):
        elements = flat[position : position + fld.count]
        position += fld.count
        values[fld.name] = tuple(None if v == all_ones else v for v in elements)
    return values


def _unpack_fixed(data: bytes, layout: Layout) -> _RawTable:
    values = _unpack_fields(data, 0, layout.name)
    partitions: list[Mapping[str, RawValues]] = []
    block: BlockLayout | None = layout.partition_block
    if block is not None:
        for index in range(layout.partition_count):
            offset = layout.partitions_offset + index * block.size
            partitions.append(_unpack_fields(data, offset, block.name))
    return _RawTable(values, FIXED_FIELD_UNITS, tuple(partitions))


def _parse_attributes(data: bytes, structure_size: int) -> tuple[MetricsAttribute, ...]:
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
    records: list[MetricsAttribute] = []
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
        raw = struct.unpack_from(f"<{instances}{code}", data, position)
        position += instances * width
        if value_type in SIGNED_ATTR_TYPES:
            half = 1 << (8 * width - 1)
            raw = tuple(v - 2 * half if v >= half else v for v in raw)
        name = ATTR_NAMES[attr_id] if attr_id < len(ATTR_NAMES) else f"attr_{attr_id}"
        unit = (encoding >> ATTR_UNIT_SHIFT) & ATTR_UNIT_MASK
        records.append(MetricsAttribute(attr_id, name, unit, value_type, raw))
    return tuple(records)


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


def _attributes_table(records: Iterable[MetricsAttribute]) -> _RawTable:
    values: dict[str, RawValues] = {}
    units: dict[str, int] = {}
    partition: dict[str, RawValues] = {}
    for record in records:
        if record.attr_id >= len(ATTR_NAMES) or record.name in units:
            continue  # unknown to this decoder, or a repeat: the first record of an id wins
        _, width = ATTR_TYPE_FORMAT[record.value_type]
        # All-ones in the stored bits: -1 once a signed type has been sign-converted.
        all_ones = -1 if record.value_type in SIGNED_ATTR_TYPES else (1 << (8 * width)) - 1
        elements = tuple(None if v == all_ones else v for v in record.values)
        units[record.name] = record.unit
        (partition if record.name in _PARTITION_FIELDS else values)[record.name] = elements
    return _RawTable(values, units, (partition,) if partition else ())


# --- step 2: raw table -> GpuMetrics ----------------------------------------------------------------

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


class _Reader:
    """Typed, unit-checked access to one raw table."""

    def __init__(self, table: _RawTable) -> None:
        self.table = table

    def elements(self, name: str, source: Mapping[str, RawValues] | None = None) -> RawValues:
        return (self.table.values if source is None else source).get(name, ())

    def factor(self, name: str, kind: Mapping[AttrUnit, float]) -> float | None:
        unit = self.table.units.get(name, AttrUnit.NONE)
        # AttrUnit is an IntEnum: a plain int code finds its member's entry without constructing it.
        return kind.get(unit) if unit in _UNIT_CODES else None  # type: ignore[call-overload]

    def raw(self, name: str) -> int | None:
        """A scalar as stored (counters, bit fields, widths)."""
        elements = self.elements(name)
        return elements[0] if elements else None

    def scaled(self, name: str, kind: Mapping[AttrUnit, float]) -> float | None:
        value, factor = self.raw(name), self.factor(name, kind)
        return None if value is None or factor is None else value * factor

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

    def ratios(self, name: str, source: Mapping[str, RawValues] | None = None) -> tuple[float, ...]:
        """Percent values as 0..1 ratios; a value outside 0..100 % is not a utilisation and is dropped."""
        factor = self.factor(name, _PERCENT)
        if factor is None:
            return ()
        # Divide rather than multiply by 0.01: 35 / 100 is exactly 0.35, 35 * 0.01 is not.
        return tuple(v / 100 for v in self.elements(name, source) if v is not None and 0 <= v <= 100)

    def ratio(self, name: str) -> float | None:
        values = self.ratios(name)
        return values[0] if values else None


def _build(table: _RawTable, format_revision: int, content_revision: int, structure_size: int) -> GpuMetrics:
    read = _Reader(table)
    num_partitions = read.raw("num_partition")
    partitions = _reported_partitions(table.partitions, num_partitions)
    indep = read.raw("indep_throttle_status")
    return GpuMetrics(
        format_revision=format_revision,
        content_revision=content_revision,
        structure_size=structure_size,
        temperatures=frozen_map(_temperatures(read)),
        power_watts=_first_present(
            read.scaled("curr_socket_power", _POWER), read.scaled("average_socket_power", _POWER)
        ),
        energy_joules=_energy(read),
        busy=frozen_map(_busy(read, partitions)),
        clocks_hertz=frozen_map(
            _present(
                gfx=read.highest("current_gfxclk", _CLOCK),
                soc=read.highest("current_socclk", _CLOCK),
                memory=read.highest("current_uclk", _CLOCK),
                video=read.highest("current_vclk0", _CLOCK),
                decode=read.highest("current_dclk0", _CLOCK),
            )
        ),
        clocks_average_hertz=frozen_map(
            _present(
                gfx=read.scaled("average_gfxclk_frequency", _CLOCK),
                soc=read.scaled("average_socclk_frequency", _CLOCK),
                memory=read.scaled("average_uclk_frequency", _CLOCK),
                video=read.scaled("average_vclk0_frequency", _CLOCK),
                decode=read.scaled("average_dclk0_frequency", _CLOCK),
            )
        ),
        voltages_volts=frozen_map(
            _present(
                gfx=_millivolts(read.raw("voltage_gfx")),
                soc=_millivolts(read.raw("voltage_soc")),
                memory=_millivolts(read.raw("voltage_mem")),
            )
        ),
        throttle_status=read.raw("throttle_status"),
        indep_throttle_status=indep,
        throttle=frozen_map(throttle_reasons(indep) if indep is not None else None),
        fan_rpm=_as_float(read.raw("current_fan_speed")),
        pcie_link_width=read.raw("pcie_link_width"),
        pcie_link_transfers_per_second=_pcie_rate(read),
        pcie_bandwidth_bytes_per_second=read.scaled("pcie_bandwidth_inst", _BANDWIDTH),
        pcie_bandwidth_acc=read.raw("pcie_bandwidth_acc"),
        pcie_replays=read.raw("pcie_replay_count_acc"),
        pcie_recoveries=read.raw("pcie_l0_to_recov_count_acc"),
        pcie_replay_rollovers=read.raw("pcie_replay_rover_count_acc"),
        pcie_naks_sent=read.raw("pcie_nak_sent_count_acc"),
        pcie_naks_received=read.raw("pcie_nak_rcvd_count_acc"),
        xgmi_link_width=read.raw("xgmi_link_width"),
        xgmi_link_speed_bytes_per_second=_xgmi_link_rate(read),
        xgmi_link_up=frozen_map({i: v == 1 for i, v in enumerate(read.elements("xgmi_link_status")) if v in (0, 1)}),
        xgmi_read_bytes=frozen_map(read.indexed("xgmi_read_data_acc", _DATA)),
        xgmi_write_bytes=frozen_map(read.indexed("xgmi_write_data_acc", _DATA)),
        gfx_activity_acc=read.raw("gfx_activity_acc"),
        mem_activity_acc=read.raw("mem_activity_acc"),
        system_clock_counter_seconds=read.scaled("system_clock_counter", _TIME),
        firmware_timestamp_seconds=read.scaled("firmware_timestamp", _TIME),
        num_partitions=num_partitions,
        partition_gfx_busy=tuple(read.ratios("gfx_busy_inst", p) for p in partitions),
        partition_vcn_busy=tuple(read.ratios("vcn_busy", p) for p in partitions),
        partition_jpeg_busy=tuple(read.ratios("jpeg_busy", p) for p in partitions),
        accumulation_counter=read.raw("accumulation_counter"),
        residency_acc=frozen_map(
            {
                reason: value
                for reason in RESIDENCY_REASONS
                if (value := read.raw(f"{reason}_residency_acc")) is not None
            }
        ),
    )


def _reported_partitions(
    partitions: tuple[Mapping[str, RawValues], ...], num_partitions: int | None
) -> tuple[Mapping[str, RawValues], ...]:
    """The partition blocks that describe live partitions.

    With num_partition supplied, the first that many blocks (the rest are unused slots). Without
    it, every block up to the last one that holds any supplied value.
    """
    if num_partitions is not None:
        return partitions[:num_partitions]
    used = [i for i, block in enumerate(partitions) if any(v is not None for vs in block.values() for v in vs)]
    return partitions[: used[-1] + 1] if used else ()


def _temperatures(read: _Reader) -> dict[str, float]:
    sensors = {
        "edge": "temperature_edge",
        "junction": "temperature_hotspot",
        "memory": "temperature_mem",
        "vr_gfx": "temperature_vrgfx",
        "vr_soc": "temperature_vrsoc",
        "vr_mem": "temperature_vrmem",
    }
    temperatures = _present(**{sensor: read.scaled(name, _TEMPERATURE) for sensor, name in sensors.items()})
    for index, celsius in read.indexed("temperature_hbm", _TEMPERATURE).items():
        temperatures[f"hbm{index}"] = celsius
    return temperatures


def _energy(read: _Reader) -> float | None:
    ticks = read.raw("energy_accumulator")
    if ticks is None or read.factor("energy_accumulator", _COUNT) is None:
        return None
    return ticks * ENERGY_JOULES_PER_TICK


def _busy(read: _Reader, partitions: tuple[Mapping[str, RawValues], ...]) -> dict[str, float]:
    # Media: MI2xx's single average; else the busiest VCN, at the top (v1_4, v1_5) or per partition.
    vcn = list(read.ratios("vcn_activity"))
    for partition in partitions:
        vcn.extend(read.ratios("vcn_busy", partition))
    return _present(
        gfx=read.ratio("average_gfx_activity"),
        memory=read.ratio("average_umc_activity"),
        media=_first_present(read.ratio("average_mm_activity"), max(vcn) if vcn else None),
    )


def _pcie_rate(read: _Reader) -> float | None:
    speed = read.raw("pcie_link_speed")
    factor = read.factor("pcie_link_speed", _RATE)
    if speed is None or factor is None:
        return None
    stored_in_100mts = read.table.units.get("pcie_link_speed") == AttrUnit.SPEED_100MTS
    if stored_in_100mts and speed in _ESM_CODES and speed not in _PCIE_RATES_100MTS:
        return None
    return speed * factor


def _xgmi_link_rate(read: _Reader) -> float | None:
    # xgmi_link_speed is a per-lane bit rate (Gbps): bytes per second of the whole link.
    lane_rate = read.scaled("xgmi_link_speed", _RATE)
    width = read.raw("xgmi_link_width")
    return None if lane_rate is None or width is None else lane_rate * width / 8


def _millivolts(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


def _as_float(value: int | None) -> float | None:
    return None if value is None else float(value)


def _first_present(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _present(**values: float | None) -> dict[str, float]:
    return {k: v for k, v in values.items() if v is not None}
