"""Encoder for the binary gpu_metrics table (the simulator's side; never imports the decoder).

Each fixed version (v1_3 .. v1_8) is declared the way kgd_pp_interface.h declares it — fields in
order, C types — and offsets follow from x86-64 natural alignment, so the layouts can be checked
against the driver's published offsets and sizes (tests do, with ctypes as a second opinion). Like
the driver, the table starts all-ones: a field nobody sets reads 0xFF.. = "not supported".

v1.9 is the driver's attribute-encoded table (DECLARE_SMU_METRICS_CLASS in smu_cmn.h): a packed
struct of the 4-byte header, an int attr_count, then for every attribute of the SMU's field list a
u64 encoding (unit << 24 | type << 20 | attribute id << 10 | instances) followed by its values.
Every attribute of the list is always present (initialised all-ones), so the size is fixed per SMU.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8}

# A field: (name, C type letter or nested Layout, element count; 1 for a scalar)
_Decl = tuple[str, "str | Layout", int]


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    kind: str  # struct letter for scalars/arrays; "" for nested structs
    count: int
    element_size: int
    sub: Layout | None = None


class Layout:
    """Offsets and size of one C struct under natural alignment."""

    size: int
    alignment: int

    def __init__(self, name: str, decls: Sequence[_Decl]) -> None:
        self.name = name
        self.fields: dict[str, Field] = {}
        offset = 0
        self.alignment = 1
        for field_name, kind, count in decls:
            if isinstance(kind, Layout):
                size, align = kind.size, kind.alignment
                letter, sub = "", kind
            else:
                size = align = _SIZES[kind]
                letter, sub = kind, None
            offset = -(-offset // align) * align
            self.fields[field_name] = Field(field_name, offset, letter, count, size, sub)
            offset += size * count
            self.alignment = max(self.alignment, align)
        self.size = -(-offset // self.alignment) * self.alignment

    def offset(self, name: str) -> int:
        return self.fields[name].offset


_HEADER: list[_Decl] = [("structure_size", "H", 1), ("format_revision", "B", 1), ("content_revision", "B", 1)]

V1_3 = Layout(
    "gpu_metrics_v1_3",
    [
        *_HEADER,
        ("temperature_edge", "H", 1),
        ("temperature_hotspot", "H", 1),
        ("temperature_mem", "H", 1),
        ("temperature_vrgfx", "H", 1),
        ("temperature_vrsoc", "H", 1),
        ("temperature_vrmem", "H", 1),
        ("average_gfx_activity", "H", 1),
        ("average_umc_activity", "H", 1),
        ("average_mm_activity", "H", 1),
        ("average_socket_power", "H", 1),
        ("energy_accumulator", "Q", 1),
        ("system_clock_counter", "Q", 1),
        ("average_gfxclk_frequency", "H", 1),
        ("average_socclk_frequency", "H", 1),
        ("average_uclk_frequency", "H", 1),
        ("average_vclk0_frequency", "H", 1),
        ("average_dclk0_frequency", "H", 1),
        ("average_vclk1_frequency", "H", 1),
        ("average_dclk1_frequency", "H", 1),
        ("current_gfxclk", "H", 1),
        ("current_socclk", "H", 1),
        ("current_uclk", "H", 1),
        ("current_vclk0", "H", 1),
        ("current_dclk0", "H", 1),
        ("current_vclk1", "H", 1),
        ("current_dclk1", "H", 1),
        ("throttle_status", "I", 1),
        ("current_fan_speed", "H", 1),
        ("pcie_link_width", "H", 1),
        ("pcie_link_speed", "H", 1),
        ("padding", "H", 1),
        ("gfx_activity_acc", "I", 1),
        ("mem_activity_acc", "I", 1),
        ("temperature_hbm", "H", 4),
        ("firmware_timestamp", "Q", 1),
        ("voltage_soc", "H", 1),
        ("voltage_gfx", "H", 1),
        ("voltage_mem", "H", 1),
        ("padding1", "H", 1),
        ("indep_throttle_status", "Q", 1),
    ],
)

_MI300_HEAD: list[_Decl] = [
    *_HEADER,
    ("temperature_hotspot", "H", 1),
    ("temperature_mem", "H", 1),
    ("temperature_vrsoc", "H", 1),
    ("curr_socket_power", "H", 1),
    ("average_gfx_activity", "H", 1),
    ("average_umc_activity", "H", 1),
]
_LINK_AND_ACC: list[_Decl] = [
    ("pcie_link_width", "H", 1),
    ("pcie_link_speed", "H", 1),
    ("xgmi_link_width", "H", 1),
    ("xgmi_link_speed", "H", 1),
    ("gfx_activity_acc", "I", 1),
    ("mem_activity_acc", "I", 1),
    ("pcie_bandwidth_acc", "Q", 1),
    ("pcie_bandwidth_inst", "Q", 1),
    ("pcie_l0_to_recov_count_acc", "Q", 1),
    ("pcie_replay_count_acc", "Q", 1),
    ("pcie_replay_rover_count_acc", "Q", 1),
]
_NAKS: list[_Decl] = [("pcie_nak_sent_count_acc", "I", 1), ("pcie_nak_rcvd_count_acc", "I", 1)]
_XGMI_DATA: list[_Decl] = [("xgmi_read_data_acc", "Q", 8), ("xgmi_write_data_acc", "Q", 8)]
_CLOCKS: list[_Decl] = [
    ("firmware_timestamp", "Q", 1),
    ("current_gfxclk", "H", 8),
    ("current_socclk", "H", 4),
    ("current_vclk0", "H", 4),
    ("current_dclk0", "H", 4),
    ("current_uclk", "H", 1),
]
_RESIDENCIES: list[_Decl] = [
    ("accumulation_counter", "I", 1),
    ("prochot_residency_acc", "I", 1),
    ("ppt_residency_acc", "I", 1),
    ("socket_thm_residency_acc", "I", 1),
    ("vr_thm_residency_acc", "I", 1),
    ("hbm_thm_residency_acc", "I", 1),
]

V1_4 = Layout(
    "gpu_metrics_v1_4",
    [
        *_MI300_HEAD,
        ("vcn_activity", "H", 4),
        ("energy_accumulator", "Q", 1),
        ("system_clock_counter", "Q", 1),
        ("throttle_status", "I", 1),
        ("gfxclk_lock_status", "I", 1),
        *_LINK_AND_ACC,
        *_XGMI_DATA,
        *_CLOCKS,
        ("padding", "H", 1),
    ],
)

V1_5 = Layout(
    "gpu_metrics_v1_5",
    [
        *_MI300_HEAD,
        ("vcn_activity", "H", 4),
        ("jpeg_activity", "H", 32),
        ("energy_accumulator", "Q", 1),
        ("system_clock_counter", "Q", 1),
        ("throttle_status", "I", 1),
        ("gfxclk_lock_status", "I", 1),
        *_LINK_AND_ACC,
        *_NAKS,
        *_XGMI_DATA,
        *_CLOCKS,
        ("padding", "H", 1),
    ],
)

XCP_V1_0 = Layout(
    "amdgpu_xcp_metrics",
    [("gfx_busy_inst", "I", 8), ("jpeg_busy", "H", 32), ("vcn_busy", "H", 4), ("gfx_busy_acc", "Q", 8)],
)
XCP_V1_1 = Layout(
    "amdgpu_xcp_metrics_v1_1",
    [
        ("gfx_busy_inst", "I", 8),
        ("jpeg_busy", "H", 32),
        ("vcn_busy", "H", 4),
        ("gfx_busy_acc", "Q", 8),
        ("gfx_below_host_limit_acc", "Q", 8),
    ],
)

V1_6 = Layout(
    "gpu_metrics_v1_6",
    [
        *_MI300_HEAD,
        ("energy_accumulator", "Q", 1),
        ("system_clock_counter", "Q", 1),
        *_RESIDENCIES,
        ("gfxclk_lock_status", "I", 1),
        *_LINK_AND_ACC,
        *_NAKS,
        *_XGMI_DATA,
        *_CLOCKS,
        ("num_partition", "H", 1),
        ("xcp_stats", XCP_V1_0, 8),
        ("pcie_lc_perf_other_end_recovery", "I", 1),
    ],
)

XCP_V1_2 = Layout(
    "amdgpu_xcp_metrics_v1_2",
    [
        ("gfx_busy_inst", "I", 8),
        ("jpeg_busy", "H", 40),
        ("vcn_busy", "H", 4),
        ("gfx_busy_acc", "Q", 8),
        ("gfx_below_host_limit_ppt_acc", "Q", 8),
        ("gfx_below_host_limit_thm_acc", "Q", 8),
        ("gfx_low_utilization_acc", "Q", 8),
        ("gfx_below_host_limit_total_acc", "Q", 8),
    ],
)

V1_7 = Layout(
    "gpu_metrics_v1_7",
    [
        *_MI300_HEAD,
        ("mem_max_bandwidth", "Q", 1),
        ("energy_accumulator", "Q", 1),
        ("system_clock_counter", "Q", 1),
        *_RESIDENCIES,
        ("gfxclk_lock_status", "I", 1),
        *_LINK_AND_ACC,
        *_NAKS,
        *_XGMI_DATA,
        ("xgmi_link_status", "H", 8),
        ("padding", "H", 1),
        *_CLOCKS,
        ("num_partition", "H", 1),
        ("xcp_stats", XCP_V1_1, 8),
        ("pcie_lc_perf_other_end_recovery", "I", 1),
    ],
)

_V1_7_BODY: list[_Decl] = [
    *_MI300_HEAD,
    ("mem_max_bandwidth", "Q", 1),
    ("energy_accumulator", "Q", 1),
    ("system_clock_counter", "Q", 1),
    *_RESIDENCIES,
    ("gfxclk_lock_status", "I", 1),
    *_LINK_AND_ACC,
    *_NAKS,
    *_XGMI_DATA,
    ("xgmi_link_status", "H", 8),
    ("padding", "H", 1),
    *_CLOCKS,
    ("num_partition", "H", 1),
]

# v1_8 (SMU 13.0.12): v1_7 with the larger per-partition block (40 JPEG rings, split host-limit counters)
V1_8 = Layout(
    "gpu_metrics_v1_8",
    [*_V1_7_BODY, ("xcp_stats", XCP_V1_2, 8), ("pcie_lc_perf_other_end_recovery", "I", 1)],
)

LAYOUTS: dict[tuple[int, int], Layout] = {
    (1, 3): V1_3,
    (1, 4): V1_4,
    (1, 5): V1_5,
    (1, 6): V1_6,
    (1, 7): V1_7,
    (1, 8): V1_8,
}

# --- v1.9 ------------------------------------------------------------------------------------
# enum amdgpu_metrics_attr_id, in kernel order (the id is the position)
ATTR_IDS: tuple[str, ...] = (
    "temperature_hotspot", "temperature_mem", "temperature_vrsoc", "curr_socket_power",
    "average_gfx_activity", "average_umc_activity", "mem_max_bandwidth", "energy_accumulator",
    "system_clock_counter", "accumulation_counter", "prochot_residency_acc", "ppt_residency_acc",
    "socket_thm_residency_acc", "vr_thm_residency_acc", "hbm_thm_residency_acc", "gfxclk_lock_status",
    "pcie_link_width", "pcie_link_speed", "xgmi_link_width", "xgmi_link_speed", "gfx_activity_acc",
    "mem_activity_acc", "pcie_bandwidth_acc", "pcie_bandwidth_inst", "pcie_l0_to_recov_count_acc",
    "pcie_replay_count_acc", "pcie_replay_rover_count_acc", "pcie_nak_sent_count_acc",
    "pcie_nak_rcvd_count_acc", "xgmi_read_data_acc", "xgmi_write_data_acc", "xgmi_link_status",
    "firmware_timestamp", "current_gfxclk", "current_socclk", "current_vclk0", "current_dclk0",
    "current_uclk", "num_partition", "pcie_lc_perf_other_end_recovery", "gfx_busy_inst", "jpeg_busy",
    "vcn_busy", "gfx_busy_acc", "gfx_below_host_limit_ppt_acc", "gfx_below_host_limit_thm_acc",
    "gfx_low_utilization_acc", "gfx_below_host_limit_total_acc",
)  # fmt: skip
ATTR_TYPES = {"B": 0, "H": 2, "I": 4, "Q": 6}  # enum amdgpu_metrics_attr_type: U8, U16, U32, U64
# enum amdgpu_metrics_attr_unit
UNIT_NONE, UNIT_MHZ, UNIT_CELSIUS, UNIT_WATT, UNIT_NS, UNIT_10NS = 0, 1, 2, 3, 4, 5
UNIT_GTS, UNIT_100MTS, UNIT_GBS, UNIT_KB, UNIT_PERCENT = 6, 7, 8, 9, 10

# SMU_13_0_6_METRICS_FIELDS (smu_v13_0_6_ppt.h): (attribute, unit, C type, instances), in order.
# Units as the driver declares them, quirks included (pcie_bandwidth_acc is declared PERCENT).
V1_9_FIELDS: tuple[tuple[str, int, str, int], ...] = (
    ("temperature_hotspot", UNIT_CELSIUS, "H", 1),
    ("temperature_mem", UNIT_CELSIUS, "H", 1),
    ("temperature_vrsoc", UNIT_CELSIUS, "H", 1),
    ("curr_socket_power", UNIT_WATT, "H", 1),
    ("average_gfx_activity", UNIT_PERCENT, "H", 1),
    ("average_umc_activity", UNIT_PERCENT, "H", 1),
    ("mem_max_bandwidth", UNIT_GBS, "Q", 1),
    ("energy_accumulator", UNIT_NONE, "Q", 1),
    ("system_clock_counter", UNIT_NS, "Q", 1),
    ("accumulation_counter", UNIT_NONE, "I", 1),
    ("prochot_residency_acc", UNIT_NONE, "I", 1),
    ("ppt_residency_acc", UNIT_NONE, "I", 1),
    ("socket_thm_residency_acc", UNIT_NONE, "I", 1),
    ("vr_thm_residency_acc", UNIT_NONE, "I", 1),
    ("hbm_thm_residency_acc", UNIT_NONE, "I", 1),
    ("gfxclk_lock_status", UNIT_NONE, "I", 1),
    ("pcie_link_width", UNIT_NONE, "H", 1),
    ("pcie_link_speed", UNIT_100MTS, "H", 1),
    ("xgmi_link_width", UNIT_NONE, "H", 1),
    ("xgmi_link_speed", UNIT_GTS, "H", 1),
    ("gfx_activity_acc", UNIT_PERCENT, "I", 1),
    ("mem_activity_acc", UNIT_PERCENT, "I", 1),
    ("pcie_bandwidth_acc", UNIT_PERCENT, "Q", 1),
    ("pcie_bandwidth_inst", UNIT_GBS, "Q", 1),
    ("pcie_l0_to_recov_count_acc", UNIT_NONE, "Q", 1),
    ("pcie_replay_count_acc", UNIT_NONE, "Q", 1),
    ("pcie_replay_rover_count_acc", UNIT_NONE, "Q", 1),
    ("pcie_nak_sent_count_acc", UNIT_NONE, "I", 1),
    ("pcie_nak_rcvd_count_acc", UNIT_NONE, "I", 1),
    ("xgmi_read_data_acc", UNIT_KB, "Q", 8),
    ("xgmi_write_data_acc", UNIT_KB, "Q", 8),
    ("xgmi_link_status", UNIT_NONE, "H", 8),
    ("firmware_timestamp", UNIT_10NS, "Q", 1),
    ("current_gfxclk", UNIT_MHZ, "H", 8),
    ("current_socclk", UNIT_MHZ, "H", 4),
    ("current_vclk0", UNIT_MHZ, "H", 4),
    ("current_dclk0", UNIT_MHZ, "H", 4),
    ("current_uclk", UNIT_MHZ, "H", 1),
    ("pcie_lc_perf_other_end_recovery", UNIT_NONE, "I", 1),
    ("gfx_busy_inst", UNIT_PERCENT, "I", 8),
    ("jpeg_busy", UNIT_PERCENT, "H", 40),
    ("vcn_busy", UNIT_PERCENT, "H", 4),
    ("gfx_busy_acc", UNIT_PERCENT, "Q", 8),
    ("gfx_below_host_limit_ppt_acc", UNIT_NONE, "Q", 8),
    ("gfx_below_host_limit_thm_acc", UNIT_NONE, "Q", 8),
    ("gfx_low_utilization_acc", UNIT_NONE, "Q", 8),
    ("gfx_below_host_limit_total_acc", UNIT_NONE, "Q", 8),
)


# --- per-partition tables (xcp/xcp_metrics on newer drivers) -------------------------------------
# amdgpu_partition_metrics_v1_0: a fixed struct; v1_1 is attribute-encoded exactly like gpu_metrics
# v1.9 (same attribute ids), with the per-partition subset of the fields.
PARTITION_V1_0 = Layout(
    "amdgpu_partition_metrics_v1_0",
    [
        *_HEADER,
        ("current_gfxclk", "H", 8),
        ("current_socclk", "H", 4),
        ("current_vclk0", "H", 4),
        ("current_dclk0", "H", 4),
        ("current_uclk", "H", 1),
        ("padding", "H", 1),
        ("gfx_busy_inst", "I", 8),
        ("jpeg_busy", "H", 40),
        ("vcn_busy", "H", 4),
        ("gfx_busy_acc", "Q", 8),
        ("gfx_below_host_limit_ppt_acc", "Q", 8),
        ("gfx_below_host_limit_thm_acc", "Q", 8),
        ("gfx_low_utilization_acc", "Q", 8),
        ("gfx_below_host_limit_total_acc", "Q", 8),
    ],
)
PARTITION_V1_1_NAMES = (
    "current_gfxclk", "current_socclk", "current_vclk0", "current_dclk0", "current_uclk", "gfx_busy_inst",
    "jpeg_busy", "vcn_busy", "gfx_busy_acc", "gfx_below_host_limit_ppt_acc", "gfx_below_host_limit_thm_acc",
    "gfx_low_utilization_acc", "gfx_below_host_limit_total_acc",
)  # fmt: skip


def attr_encoding(unit: int, kind: str, name: str, instances: int) -> int:
    """AMDGPU_METRICS_ENC_ATTR(unit, type, id, instances)."""
    return (unit << 24) | (ATTR_TYPES[kind] << 20) | (ATTR_IDS.index(name) << 10) | instances


V1_9_SIZE = 8 + sum(8 + _SIZES[kind] * n for _name, _unit, kind, n in V1_9_FIELDS)


PARTITION_V1_1_FIELDS = tuple(f for f in V1_9_FIELDS if f[0] in PARTITION_V1_1_NAMES)


def encode_v1_9(values: Mapping[str, int | Sequence[int]]) -> bytes:
    """The v1.9 blob: every attribute of V1_9_FIELDS, all-ones except where `values` sets it."""
    return _encode_attributes(V1_9_FIELDS, (1, 9), values, "gpu_metrics v1.9")


def encode_partition_metrics(version: tuple[int, int], values: Mapping[str, Value]) -> bytes:
    """xcp_metrics of one partition: amdgpu_partition_metrics v1_0 (fixed) or v1_1 (attributes)."""
    if version == (1, 1):
        return _encode_attributes(PARTITION_V1_1_FIELDS, version, values, "partition metrics v1.1")  # type: ignore[arg-type]
    if version != (1, 0):
        raise ValueError(f"no partition metrics layout for version {version[0]}.{version[1]}; known: 1.0, 1.1")
    buf = bytearray(b"\xff" * PARTITION_V1_0.size)
    struct.pack_into("<HBB", buf, 0, PARTITION_V1_0.size, 1, 0)
    _put(buf, 0, PARTITION_V1_0, values)
    return bytes(buf)


def _encode_attributes(
    fields: tuple[tuple[str, int, str, int], ...],
    version: tuple[int, int],
    values: Mapping[str, int | Sequence[int]],
    what: str,
) -> bytes:
    known = {name for name, *_ in fields}
    unknown = set(values) - known
    if unknown:
        raise KeyError(f"{what} has no attribute {sorted(unknown)[0]!r}")
    size = 8 + sum(8 + _SIZES[kind] * n for _name, _unit, kind, n in fields)
    out = bytearray(struct.pack("<HBBi", size, version[0], version[1], len(fields)))
    for name, unit, kind, count in fields:
        out += struct.pack("<Q", attr_encoding(unit, kind, name, count))
        mask = (1 << (8 * _SIZES[kind])) - 1
        value = values.get(name)
        numbers = [] if value is None else [value] if isinstance(value, int) else list(value)
        if len(numbers) > count:
            raise ValueError(f"{what} {name} holds {count} values, got {len(numbers)}")
        for number in numbers:
            if not isinstance(number, int) or number < 0:
                raise ValueError(f"{what} {name} takes non-negative integers, got {number!r}")
        numbers += [mask] * (count - len(numbers))
        out += struct.pack(f"<{count}{kind}", *(n & mask for n in numbers))
    return bytes(out)


Value = int | Sequence[int] | Sequence[Mapping[str, "Value"]]


def _put(buf: bytearray, base: int, layout: Layout, values: Mapping[str, Value]) -> None:
    for name, value in values.items():
        try:
            f = layout.fields[name]
        except KeyError:
            raise KeyError(f"{layout.name} has no field {name!r}") from None
        start = base + f.offset
        if f.sub is not None:
            items = value if isinstance(value, Sequence) else [value]
            if len(items) > f.count:
                raise ValueError(f"{layout.name}.{name} holds {f.count} entries, got {len(items)}")
            for i, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise TypeError(f"{layout.name}.{name}[{i}] must be a mapping of sub-fields")
                _put(buf, start + i * f.element_size, f.sub, item)
            continue
        numbers = [value] if isinstance(value, int) else list(value)
        if len(numbers) > f.count:
            raise ValueError(f"{layout.name}.{name} holds {f.count} values, got {len(numbers)}")
        mask = (1 << (8 * f.element_size)) - 1
        fmt = "<" + f.kind
        for i, number in enumerate(numbers):
            if not isinstance(number, int):
                raise TypeError(f"{layout.name}.{name} takes integers, got {number!r}")
            # counters wrap like the hardware's; negative values are a bug in the caller
            if number < 0:
                raise ValueError(f"{layout.name}.{name} cannot hold negative {number}")
            struct.pack_into(fmt, buf, start + i * f.element_size, number & mask)


_TEMPLATES: dict[tuple[int, int], bytes] = {}


def encode(version: tuple[int, int], values: Mapping[str, Value]) -> bytes:
    """The gpu_metrics blob of `version` with `values` set and every other byte 0xFF.

    The header (structure_size, format/content revision) is filled in from the version. Integers
    wider than a field wrap (hardware counters do); arrays may be given shorter than declared.
    v1.9 takes the attribute names as keys, with flat values (no xcp_stats blocks).
    """
    if version == (1, 9):
        return encode_v1_9(values)  # type: ignore[arg-type]
    layout = LAYOUTS.get(version)
    if layout is None:
        known = ", ".join(f"{a}.{b}" for a, b in LAYOUTS)
        raise ValueError(f"no gpu_metrics layout for version {version[0]}.{version[1]}; known: {known}")
    template = _TEMPLATES.get(version)
    if template is None:
        blank = bytearray(b"\xff" * layout.size)
        struct.pack_into("<HBB", blank, 0, layout.size, version[0], version[1])
        template = _TEMPLATES[version] = bytes(blank)
    buf = bytearray(template)
    _put(buf, 0, layout, values)
    return bytes(buf)
