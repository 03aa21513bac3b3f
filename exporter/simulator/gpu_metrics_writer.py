"""Encoder for the binary gpu_metrics table (the simulator's side; never imports the decoder).

Each version is declared the way kgd_pp_interface.h declares it — fields in order, C types — and
offsets follow from x86-64 natural alignment, so the layouts can be checked against the driver's
published offsets and sizes (tests do, with ctypes as a second opinion). Like the driver, the
table starts all-ones: a field nobody sets reads 0xFF.. = "not supported".
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

LAYOUTS: dict[tuple[int, int], Layout] = {(1, 3): V1_3, (1, 4): V1_4, (1, 5): V1_5, (1, 6): V1_6, (1, 7): V1_7}

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
    """
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
