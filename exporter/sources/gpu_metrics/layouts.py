"""The amdgpu `gpu_metrics` table layouts, as data.

One table per version of `struct gpu_metrics_v1_N` (drivers/gpu/drm/amd/include/kgd_pp_interface.h):
every field with its C type, byte offset and element count. Offsets are for x86-64 natural
alignment, little-endian, exactly as the kernel lays the struct out; tests rebuild each table as a
ctypes structure from the field order alone and hold the hand-written offsets and sizes to it.

v1_0 .. v1_3 are filled by MI100/MI200 (Aldebaran fills v1_3); v1_4 .. v1_8 by MI300 (SMU 13.0.6 /
13.0.12). v1_6 exists twice: an early 384-byte layout that was added and then reverted, and the final
1664-byte layout with per-partition blocks. v1.9 is self-describing: a packed header, an attribute
count, then [u64 encoding][values] records; its vocabulary (attribute ids, types, units) is here too.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

HEADER_SIZE = 4  # structure_size u16, format_revision u8, content_revision u8
HEADER = struct.Struct("<HBB")

# C type -> (struct code, size in bytes, ctypes type). All unsigned: the kernel structs are.
C_TYPES: dict[str, tuple[str, int, Any]] = {
    "u8": ("B", 1, ctypes.c_uint8),
    "u16": ("H", 2, ctypes.c_uint16),
    "u32": ("I", 4, ctypes.c_uint32),
    "u64": ("Q", 8, ctypes.c_uint64),
}


@dataclass(frozen=True, slots=True)
class Field:
    """One member of a kernel struct: name as in the kernel, C type, byte offset, element count."""

    name: str
    ctype: str  # key of C_TYPES
    offset: int
    count: int = 1

    @property
    def size(self) -> int:
        return C_TYPES[self.ctype][1] * self.count


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """A nested struct (the per-partition `amdgpu_xcp_metrics*` block)."""

    name: str
    size: int
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """One fixed gpu_metrics layout: which header it answers to and where every field lives."""

    name: str
    format_revision: int
    content_revision: int
    size: int  # sizeof(struct), also the structure_size the driver writes into the header
    fields: tuple[Field, ...]
    # The xcp_stats[] array of per-partition blocks (v1_6 final and later), else None.
    partition_block: BlockLayout | None = None
    partitions_offset: int = 0
    partition_count: int = 0


def _f(name: str, ctype: str, offset: int, count: int = 1) -> Field:
    return Field(name, ctype, offset, count)


_HEADER_FIELDS = (
    _f("structure_size", "u16", 0),
    _f("format_revision", "u8", 2),
    _f("content_revision", "u8", 3),
)

# The v1_1 .. v1_3 body shared by MI100/MI200 tables; v1_2 and v1_3 only append.
_V1_1_FIELDS = (
    *_HEADER_FIELDS,
    _f("temperature_edge", "u16", 4),
    _f("temperature_hotspot", "u16", 6),
    _f("temperature_mem", "u16", 8),
    _f("temperature_vrgfx", "u16", 10),
    _f("temperature_vrsoc", "u16", 12),
    _f("temperature_vrmem", "u16", 14),
    _f("average_gfx_activity", "u16", 16),
    _f("average_umc_activity", "u16", 18),
    _f("average_mm_activity", "u16", 20),
    _f("average_socket_power", "u16", 22),
    _f("energy_accumulator", "u64", 24),
    _f("system_clock_counter", "u64", 32),
    _f("average_gfxclk_frequency", "u16", 40),
    _f("average_socclk_frequency", "u16", 42),
    _f("average_uclk_frequency", "u16", 44),
    _f("average_vclk0_frequency", "u16", 46),
    _f("average_dclk0_frequency", "u16", 48),
    _f("average_vclk1_frequency", "u16", 50),
    _f("average_dclk1_frequency", "u16", 52),
    _f("current_gfxclk", "u16", 54),
    _f("current_socclk", "u16", 56),
    _f("current_uclk", "u16", 58),
    _f("current_vclk0", "u16", 60),
    _f("current_dclk0", "u16", 62),
    _f("current_vclk1", "u16", 64),
    _f("current_dclk1", "u16", 66),
    _f("throttle_status", "u32", 68),
    _f("current_fan_speed", "u16", 72),
    _f("pcie_link_width", "u16", 74),
    _f("pcie_link_speed", "u16", 76),
    _f("padding", "u16", 78),
    _f("gfx_activity_acc", "u32", 80),
    _f("mem_activity_acc", "u32", 84),
    _f("temperature_hbm", "u16", 88, 4),
)

V1_0 = Layout(
    name="v1_0",
    format_revision=1,
    content_revision=0,
    size=80,
    fields=(
        *_HEADER_FIELDS,
        _f("system_clock_counter", "u64", 8),
        _f("temperature_edge", "u16", 16),
        _f("temperature_hotspot", "u16", 18),
        _f("temperature_mem", "u16", 20),
        _f("temperature_vrgfx", "u16", 22),
        _f("temperature_vrsoc", "u16", 24),
        _f("temperature_vrmem", "u16", 26),
        _f("average_gfx_activity", "u16", 28),
        _f("average_umc_activity", "u16", 30),
        _f("average_mm_activity", "u16", 32),
        _f("average_socket_power", "u16", 34),
        _f("energy_accumulator", "u32", 36),
        _f("average_gfxclk_frequency", "u16", 40),
        _f("average_socclk_frequency", "u16", 42),
        _f("average_uclk_frequency", "u16", 44),
        _f("average_vclk0_frequency", "u16", 46),
        _f("average_dclk0_frequency", "u16", 48),
        _f("average_vclk1_frequency", "u16", 50),
        _f("average_dclk1_frequency", "u16", 52),
        _f("current_gfxclk", "u16", 54),
        _f("current_socclk", "u16", 56),
        _f("current_uclk", "u16", 58),
        _f("current_vclk0", "u16", 60),
        _f("current_dclk0", "u16", 62),
        _f("current_vclk1", "u16", 64),
        _f("current_dclk1", "u16", 66),
        _f("throttle_status", "u32", 68),
        _f("current_fan_speed", "u16", 72),
        _f("pcie_link_width", "u8", 74),
        _f("pcie_link_speed", "u8", 75),
    ),
)

V1_1 = Layout(name="v1_1", format_revision=1, content_revision=1, size=96, fields=_V1_1_FIELDS)

V1_2 = Layout(
    name="v1_2",
    format_revision=1,
    content_revision=2,
    size=104,
    fields=(*_V1_1_FIELDS, _f("firmware_timestamp", "u64", 96)),
)

V1_3 = Layout(
    name="v1_3",
    format_revision=1,
    content_revision=3,
    size=120,
    fields=(
        *_V1_1_FIELDS,
        _f("firmware_timestamp", "u64", 96),
        _f("voltage_soc", "u16", 104),
        _f("voltage_gfx", "u16", 106),
        _f("voltage_mem", "u16", 108),
        _f("padding1", "u16", 110),
        _f("indep_throttle_status", "u64", 112),
    ),
)

V1_4 = Layout(
    name="v1_4",
    format_revision=1,
    content_revision=4,
    size=288,
    fields=(
        *_HEADER_FIELDS,
        _f("temperature_hotspot", "u16", 4),
        _f("temperature_mem", "u16", 6),
        _f("temperature_vrsoc", "u16", 8),
        _f("curr_socket_power", "u16", 10),
        _f("average_gfx_activity", "u16", 12),
        _f("average_umc_activity", "u16", 14),
        _f("vcn_activity", "u16", 16, 4),
        _f("energy_accumulator", "u64", 24),
        _f("system_clock_counter", "u64", 32),
        _f("throttle_status", "u32", 40),
        _f("gfxclk_lock_status", "u32", 44),
        _f("pcie_link_width", "u16", 48),
        _f("pcie_link_speed", "u16", 50),
        _f("xgmi_link_width", "u16", 52),
        _f("xgmi_link_speed", "u16", 54),
        _f("gfx_activity_acc", "u32", 56),
        _f("mem_activity_acc", "u32", 60),
        _f("pcie_bandwidth_acc", "u64", 64),
        _f("pcie_bandwidth_inst", "u64", 72),
        _f("pcie_l0_to_recov_count_acc", "u64", 80),
        _f("pcie_replay_count_acc", "u64", 88),
        _f("pcie_replay_rover_count_acc", "u64", 96),
        _f("xgmi_read_data_acc", "u64", 104, 8),
        _f("xgmi_write_data_acc", "u64", 168, 8),
        _f("firmware_timestamp", "u64", 232),
        _f("current_gfxclk", "u16", 240, 8),
        _f("current_socclk", "u16", 256, 4),
        _f("current_vclk0", "u16", 264, 4),
        _f("current_dclk0", "u16", 272, 4),
        _f("current_uclk", "u16", 280),
        _f("padding", "u16", 282),
    ),
)

V1_5 = Layout(
    name="v1_5",
    format_revision=1,
    content_revision=5,
    size=360,
    fields=(
        *_HEADER_FIELDS,
        _f("temperature_hotspot", "u16", 4),
        _f("temperature_mem", "u16", 6),
        _f("temperature_vrsoc", "u16", 8),
        _f("curr_socket_power", "u16", 10),
        _f("average_gfx_activity", "u16", 12),
        _f("average_umc_activity", "u16", 14),
        _f("vcn_activity", "u16", 16, 4),
        _f("jpeg_activity", "u16", 24, 32),
        _f("energy_accumulator", "u64", 88),
        _f("system_clock_counter", "u64", 96),
        _f("throttle_status", "u32", 104),
        _f("gfxclk_lock_status", "u32", 108),
        _f("pcie_link_width", "u16", 112),
        _f("pcie_link_speed", "u16", 114),
        _f("xgmi_link_width", "u16", 116),
        _f("xgmi_link_speed", "u16", 118),
        _f("gfx_activity_acc", "u32", 120),
        _f("mem_activity_acc", "u32", 124),
        _f("pcie_bandwidth_acc", "u64", 128),
        _f("pcie_bandwidth_inst", "u64", 136),
        _f("pcie_l0_to_recov_count_acc", "u64", 144),
        _f("pcie_replay_count_acc", "u64", 152),
        _f("pcie_replay_rover_count_acc", "u64", 160),
        _f("pcie_nak_sent_count_acc", "u32", 168),
        _f("pcie_nak_rcvd_count_acc", "u32", 172),
        _f("xgmi_read_data_acc", "u64", 176, 8),
        _f("xgmi_write_data_acc", "u64", 240, 8),
        _f("firmware_timestamp", "u64", 304),
        _f("current_gfxclk", "u16", 312, 8),
        _f("current_socclk", "u16", 328, 4),
        _f("current_vclk0", "u16", 336, 4),
        _f("current_dclk0", "u16", 344, 4),
        _f("current_uclk", "u16", 352),
        _f("padding", "u16", 354),
    ),
)

# The v1_6 that was merged and later reverted: v1_5 plus throttler residency accumulators.
V1_6_EARLY = Layout(
    name="v1_6 (early, reverted)",
    format_revision=1,
    content_revision=6,
    size=384,
    fields=(
        *_HEADER_FIELDS,
        _f("temperature_hotspot", "u16", 4),
        _f("temperature_mem", "u16", 6),
        _f("temperature_vrsoc", "u16", 8),
        _f("curr_socket_power", "u16", 10),
        _f("average_gfx_activity", "u16", 12),
        _f("average_umc_activity", "u16", 14),
        _f("vcn_activity", "u16", 16, 4),
        _f("jpeg_activity", "u16", 24, 32),
        _f("energy_accumulator", "u64", 88),
        _f("system_clock_counter", "u64", 96),
        _f("accumulation_counter", "u32", 104),
        _f("prochot_residency_acc", "u32", 108),
        _f("ppt_residency_acc", "u32", 112),
        _f("socket_thm_residency_acc", "u32", 116),
        _f("vr_thm_residency_acc", "u32", 120),
        _f("hbm_thm_residency_acc", "u32", 124),
        _f("throttle_status", "u32", 128),
        _f("gfxclk_lock_status", "u32", 132),
        _f("pcie_link_width", "u16", 136),
        _f("pcie_link_speed", "u16", 138),
        _f("xgmi_link_width", "u16", 140),
        _f("xgmi_link_speed", "u16", 142),
        _f("gfx_activity_acc", "u32", 144),
        _f("mem_activity_acc", "u32", 148),
        _f("pcie_bandwidth_acc", "u64", 152),
        _f("pcie_bandwidth_inst", "u64", 160),
        _f("pcie_l0_to_recov_count_acc", "u64", 168),
        _f("pcie_replay_count_acc", "u64", 176),
        _f("pcie_replay_rover_count_acc", "u64", 184),
        _f("pcie_nak_sent_count_acc", "u32", 192),
        _f("pcie_nak_rcvd_count_acc", "u32", 196),
        _f("xgmi_read_data_acc", "u64", 200, 8),
        _f("xgmi_write_data_acc", "u64", 264, 8),
        _f("firmware_timestamp", "u64", 328),
        _f("current_gfxclk", "u16", 336, 8),
        _f("current_socclk", "u16", 352, 4),
        _f("current_vclk0", "u16", 360, 4),
        _f("current_dclk0", "u16", 368, 4),
        _f("current_uclk", "u16", 376),
        _f("padding", "u16", 378),
    ),
)

# Per-partition blocks: struct amdgpu_xcp_metrics (v1_6), _v1_1 (v1_7), _v1_2 (v1_8).
XCP_V1_0 = BlockLayout(
    "amdgpu_xcp_metrics",
    168,
    (
        _f("gfx_busy_inst", "u32", 0, 8),
        _f("jpeg_busy", "u16", 32, 32),
        _f("vcn_busy", "u16", 96, 4),
        _f("gfx_busy_acc", "u64", 104, 8),
    ),
)

XCP_V1_1 = BlockLayout(
    "amdgpu_xcp_metrics_v1_1",
    232,
    (*XCP_V1_0.fields, _f("gfx_below_host_limit_acc", "u64", 168, 8)),
)

XCP_V1_2 = BlockLayout(
    "amdgpu_xcp_metrics_v1_2",
    440,
    (
        _f("gfx_busy_inst", "u32", 0, 8),
        _f("jpeg_busy", "u16", 32, 40),
        _f("vcn_busy", "u16", 112, 4),
        _f("gfx_busy_acc", "u64", 120, 8),
        _f("gfx_below_host_limit_ppt_acc", "u64", 184, 8),
        _f("gfx_below_host_limit_thm_acc", "u64", 248, 8),
        _f("gfx_low_utilization_acc", "u64", 312, 8),
        _f("gfx_below_host_limit_total_acc", "u64", 376, 8),
    ),
)

# v1_6 final: no per-engine arrays at the top (they moved into xcp_stats) and no throttle_status.
V1_6 = Layout(
    name="v1_6",
    format_revision=1,
    content_revision=6,
    size=1664,
    fields=(
        *_HEADER_FIELDS,
        _f("temperature_hotspot", "u16", 4),
        _f("temperature_mem", "u16", 6),
        _f("temperature_vrsoc", "u16", 8),
        _f("curr_socket_power", "u16", 10),
        _f("average_gfx_activity", "u16", 12),
        _f("average_umc_activity", "u16", 14),
        _f("energy_accumulator", "u64", 16),
        _f("system_clock_counter", "u64", 24),
        _f("accumulation_counter", "u32", 32),
        _f("prochot_residency_acc", "u32", 36),
        _f("ppt_residency_acc", "u32", 40),
        _f("socket_thm_residency_acc", "u32", 44),
        _f("vr_thm_residency_acc", "u32", 48),
        _f("hbm_thm_residency_acc", "u32", 52),
        _f("gfxclk_lock_status", "u32", 56),
        _f("pcie_link_width", "u16", 60),
        _f("pcie_link_speed", "u16", 62),
        _f("xgmi_link_width", "u16", 64),
        _f("xgmi_link_speed", "u16", 66),
        _f("gfx_activity_acc", "u32", 68),
        _f("mem_activity_acc", "u32", 72),
        _f("pcie_bandwidth_acc", "u64", 80),
        _f("pcie_bandwidth_inst", "u64", 88),
        _f("pcie_l0_to_recov_count_acc", "u64", 96),
        _f("pcie_replay_count_acc", "u64", 104),
        _f("pcie_replay_rover_count_acc", "u64", 112),
        _f("pcie_nak_sent_count_acc", "u32", 120),
        _f("pcie_nak_rcvd_count_acc", "u32", 124),
        _f("xgmi_read_data_acc", "u64", 128, 8),
        _f("xgmi_write_data_acc", "u64", 192, 8),
        _f("firmware_timestamp", "u64", 256),
        _f("current_gfxclk", "u16", 264, 8),
        _f("current_socclk", "u16", 280, 4),
        _f("current_vclk0", "u16", 288, 4),
        _f("current_dclk0", "u16", 296, 4),
        _f("current_uclk", "u16", 304),
        _f("num_partition", "u16", 306),
        _f("pcie_lc_perf_other_end_recovery", "u32", 1656),
    ),
    partition_block=XCP_V1_0,
    partitions_offset=312,
    partition_count=8,
)

# v1_7 and v1_8 share everything but the per-partition block.
_V1_7_FIELDS = (
    *_HEADER_FIELDS,
    _f("temperature_hotspot", "u16", 4),
    _f("temperature_mem", "u16", 6),
    _f("temperature_vrsoc", "u16", 8),
    _f("curr_socket_power", "u16", 10),
    _f("average_gfx_activity", "u16", 12),
    _f("average_umc_activity", "u16", 14),
    _f("mem_max_bandwidth", "u64", 16),
    _f("energy_accumulator", "u64", 24),
    _f("system_clock_counter", "u64", 32),
    _f("accumulation_counter", "u32", 40),
    _f("prochot_residency_acc", "u32", 44),
    _f("ppt_residency_acc", "u32", 48),
    _f("socket_thm_residency_acc", "u32", 52),
    _f("vr_thm_residency_acc", "u32", 56),
    _f("hbm_thm_residency_acc", "u32", 60),
    _f("gfxclk_lock_status", "u32", 64),
    _f("pcie_link_width", "u16", 68),
    _f("pcie_link_speed", "u16", 70),
    _f("xgmi_link_width", "u16", 72),
    _f("xgmi_link_speed", "u16", 74),
    _f("gfx_activity_acc", "u32", 76),
    _f("mem_activity_acc", "u32", 80),
    _f("pcie_bandwidth_acc", "u64", 88),
    _f("pcie_bandwidth_inst", "u64", 96),
    _f("pcie_l0_to_recov_count_acc", "u64", 104),
    _f("pcie_replay_count_acc", "u64", 112),
    _f("pcie_replay_rover_count_acc", "u64", 120),
    _f("pcie_nak_sent_count_acc", "u32", 128),
    _f("pcie_nak_rcvd_count_acc", "u32", 132),
    _f("xgmi_read_data_acc", "u64", 136, 8),
    _f("xgmi_write_data_acc", "u64", 200, 8),
    _f("xgmi_link_status", "u16", 264, 8),
    _f("padding", "u16", 280),
    _f("firmware_timestamp", "u64", 288),
    _f("current_gfxclk", "u16", 296, 8),
    _f("current_socclk", "u16", 312, 4),
    _f("current_vclk0", "u16", 320, 4),
    _f("current_dclk0", "u16", 328, 4),
    _f("current_uclk", "u16", 336),
    _f("num_partition", "u16", 338),
)

V1_7 = Layout(
    name="v1_7",
    format_revision=1,
    content_revision=7,
    size=2208,
    fields=(*_V1_7_FIELDS, _f("pcie_lc_perf_other_end_recovery", "u32", 2200)),
    partition_block=XCP_V1_1,
    partitions_offset=344,
    partition_count=8,
)

V1_8 = Layout(
    name="v1_8",
    format_revision=1,
    content_revision=8,
    size=3872,
    fields=(*_V1_7_FIELDS, _f("pcie_lc_perf_other_end_recovery", "u32", 3864)),
    partition_block=XCP_V1_2,
    partitions_offset=344,
    partition_count=8,
)

FIXED_LAYOUTS: tuple[Layout, ...] = (V1_0, V1_1, V1_2, V1_3, V1_4, V1_5, V1_6_EARLY, V1_6, V1_7, V1_8)


# --- v1.9: self-describing records -------------------------------------------------------------

V1_9_FORMAT_REVISION = 1
V1_9_CONTENT_REVISION = 9
V1_9_FIXED = struct.Struct("<HBBi")  # packed header + int attr_count
V1_9_ENCODING = struct.Struct("<Q")


class AttrType(IntEnum):
    """enum amdgpu_metrics_attr_type: how each value of a record is stored."""

    U8 = 0
    S8 = 1
    U16 = 2
    S16 = 3
    U32 = 4
    S32 = 5
    U64 = 6
    S64 = 7


# type -> (struct code, width in bytes); every value is read unsigned so all-ones is easy to spot.
ATTR_TYPE_FORMAT: dict[AttrType, tuple[str, int]] = {
    AttrType.U8: ("B", 1),
    AttrType.S8: ("B", 1),
    AttrType.U16: ("H", 2),
    AttrType.S16: ("H", 2),
    AttrType.U32: ("I", 4),
    AttrType.S32: ("I", 4),
    AttrType.U64: ("Q", 8),
    AttrType.S64: ("Q", 8),
}
SIGNED_ATTR_TYPES = frozenset({AttrType.S8, AttrType.S16, AttrType.S32, AttrType.S64})


class AttrUnit(IntEnum):
    """enum amdgpu_metrics_attr_unit."""

    NONE = 0
    CLOCK_MHZ = 1  # CLOCK_1
    TEMP_CELSIUS = 2  # TEMP_1
    POWER_WATT = 3  # POWER_1
    TIME_NS = 4  # TIME_1
    TIME_10NS = 5  # TIME_2
    SPEED_GTS = 6  # SPEED_1
    SPEED_100MTS = 7  # SPEED_2: 0.1 GT/s
    BANDWIDTH_GBS = 8  # BW_1
    DATA_KB = 9  # DATA_1
    PERCENT = 10


# Bit fields of the u64 attribute encoding (AMDGPU_METRICS_ATTR_*_MASK / _SHIFT).
ATTR_UNIT_SHIFT, ATTR_UNIT_MASK = 24, 0xFF
ATTR_TYPE_SHIFT, ATTR_TYPE_MASK = 20, 0xF
ATTR_ID_SHIFT, ATTR_ID_MASK = 10, 0x3FF
ATTR_INSTANCES_MASK = 0x3FF

# enum amdgpu_metrics_attr_id, in kernel order: the id is the index. The names are the lower-case
# kernel names, which are also the field names of the fixed layouts above.
ATTR_NAMES: tuple[str, ...] = (
    "temperature_hotspot",
    "temperature_mem",
    "temperature_vrsoc",
    "curr_socket_power",
    "average_gfx_activity",
    "average_umc_activity",
    "mem_max_bandwidth",
    "energy_accumulator",
    "system_clock_counter",
    "accumulation_counter",
    "prochot_residency_acc",
    "ppt_residency_acc",
    "socket_thm_residency_acc",
    "vr_thm_residency_acc",
    "hbm_thm_residency_acc",
    "gfxclk_lock_status",
    "pcie_link_width",
    "pcie_link_speed",
    "xgmi_link_width",
    "xgmi_link_speed",
    "gfx_activity_acc",
    "mem_activity_acc",
    "pcie_bandwidth_acc",
    "pcie_bandwidth_inst",
    "pcie_l0_to_recov_count_acc",
    "pcie_replay_count_acc",
    "pcie_replay_rover_count_acc",
    "pcie_nak_sent_count_acc",
    "pcie_nak_rcvd_count_acc",
    "xgmi_read_data_acc",
    "xgmi_write_data_acc",
    "xgmi_link_status",
    "firmware_timestamp",
    "current_gfxclk",
    "current_socclk",
    "current_vclk0",
    "current_dclk0",
    "current_uclk",
    "num_partition",
    "pcie_lc_perf_other_end_recovery",
    "gfx_busy_inst",
    "jpeg_busy",
    "vcn_busy",
    "gfx_busy_acc",
    "gfx_below_host_limit_ppt_acc",
    "gfx_below_host_limit_thm_acc",
    "gfx_low_utilization_acc",
    "gfx_below_host_limit_total_acc",
)

# The unit each fixed-layout field is stored in (the v1.9 records declare theirs instead).
FIXED_FIELD_UNITS: dict[str, AttrUnit] = {
    **{
        name: AttrUnit.TEMP_CELSIUS
        for name in (
            "temperature_edge",
            "temperature_hotspot",
            "temperature_mem",
            "temperature_vrgfx",
            "temperature_vrsoc",
            "temperature_vrmem",
            "temperature_hbm",
        )
    },
    **{
        name: AttrUnit.PERCENT
        for name in (
            "average_gfx_activity",
            "average_umc_activity",
            "average_mm_activity",
            "vcn_activity",
            "jpeg_activity",
            "gfx_busy_inst",
            "jpeg_busy",
            "vcn_busy",
        )
    },
    "average_socket_power": AttrUnit.POWER_WATT,
    "curr_socket_power": AttrUnit.POWER_WATT,
    **{
        name: AttrUnit.CLOCK_MHZ
        for name in (
            "average_gfxclk_frequency",
            "average_socclk_frequency",
            "average_uclk_frequency",
            "average_vclk0_frequency",
            "average_dclk0_frequency",
            "average_vclk1_frequency",
            "average_dclk1_frequency",
            "current_gfxclk",
            "current_socclk",
            "current_uclk",
            "current_vclk0",
            "current_dclk0",
            "current_vclk1",
            "current_dclk1",
        )
    },
    "system_clock_counter": AttrUnit.TIME_NS,
    "firmware_timestamp": AttrUnit.TIME_10NS,
    "pcie_link_speed": AttrUnit.SPEED_100MTS,
    "xgmi_link_speed": AttrUnit.SPEED_GTS,  # the kernel says Gbps per lane
    "pcie_bandwidth_inst": AttrUnit.BANDWIDTH_GBS,
    "mem_max_bandwidth": AttrUnit.BANDWIDTH_GBS,
    "xgmi_read_data_acc": AttrUnit.DATA_KB,
    "xgmi_write_data_acc": AttrUnit.DATA_KB,
}


def struct_format(fields: tuple[Field, ...], size: int) -> str:
    """A little-endian struct format that reads `fields` in order, skipping gaps, `size` bytes long."""
    parts = ["<"]
    position = 0
    for field in sorted(fields, key=lambda f: f.offset):
        if field.offset < position:
            raise ValueError(f"field {field.name} at {field.offset} overlaps the previous field")
        if field.offset > position:
            parts.append(f"{field.offset - position}x")
        parts.append(f"{field.count}{C_TYPES[field.ctype][0]}")
        position = field.offset + field.size
    if position > size:
        raise ValueError(f"fields end at {position}, past the structure size {size}")
    if position < size:
        parts.append(f"{size - position}x")
    return "".join(parts)


def _ctypes_member(field: Field) -> tuple[str, Any]:
    ctype = C_TYPES[field.ctype][2]
    return (field.name, ctype * field.count if field.count > 1 else ctype)


def ctypes_structure(fields: tuple[Field, ...], name: str) -> Any:
    """The C struct with these members in this order, laid out by ctypes' own (natural) alignment.

    It ignores the hand-written offsets on purpose: comparing its offsets and size with the table's
    is how the tests prove the tables match what a C compiler makes of the kernel header.
    """
    members = [_ctypes_member(f) for f in sorted(fields, key=lambda f: f.offset)]
    return type(name, (ctypes.Structure,), {"_fields_": members})


def layout_ctypes_structure(layout: Layout) -> Any:
    """ctypes model of a whole fixed layout, the xcp_stats[] array placed where the kernel puts it."""
    if layout.partition_block is None:
        return ctypes_structure(layout.fields, layout.name)
    block = layout.partition_block
    block_type = ctypes_structure(block.fields, block.name)
    ordered = sorted(layout.fields, key=lambda f: f.offset)
    members = [_ctypes_member(f) for f in ordered if f.offset < layout.partitions_offset]
    members.append(("xcp_stats", block_type * layout.partition_count))
    members += [_ctypes_member(f) for f in ordered if f.offset >= layout.partitions_offset]
    return type(layout.name, (ctypes.Structure,), {"_fields_": members})
