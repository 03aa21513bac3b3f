"""The amdgpu `gpu_metrics` table layouts, as data.

One listing per version of `struct gpu_metrics_v1_N` (drivers/gpu/drm/amd/include/kgd_pp_interface.h):
its members in kernel order with their C types and element counts, so it reads against the header
line by line. Offsets and sizes follow from the order by x86-64 natural alignment, little-endian,
exactly as the kernel lays the struct out; tests hold them to ctypes' layout of the same members
and to the sizes the driver documents.

v1_0 .. v1_3 are filled by MI100/MI200 (Aldebaran fills v1_3); v1_4 .. v1_8 by MI300 (SMU 13.0.6 /
13.0.12). v1_6 exists twice: an early 384-byte layout that was added and then reverted, and the final
1664-byte layout with per-partition blocks. v1.9 is self-describing: a packed header, an attribute
count, then [u64 encoding][values] records; its vocabulary (attribute ids, types, units) is here too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

HEADER_SIZE = 4  # structure_size u16, format_revision u8, content_revision u8
HEADER = struct.Struct("<HBB")

# C type -> (struct code, size in bytes). All unsigned: the kernel structs are.
C_TYPES: dict[str, tuple[str, int]] = {"u8": ("B", 1), "u16": ("H", 2), "u32": ("I", 4), "u64": ("Q", 8)}


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


def _members(listing: str) -> list[tuple[str, str, int]]:
    """(C type, name, element count) of each member, in order: one line per C type, then its members."""
    members = []
    for line in filter(str.strip, listing.splitlines()):
        ctype, *names = line.split()
        for name in names:
            base, _, count = name.partition("[")
            members.append((ctype, base, int(count.rstrip("]") or 1)))
    return members


def _aligned(position: int, alignment: int) -> int:
    return -(-position // alignment) * alignment


def _place(listing: str, block: BlockLayout | None = None) -> tuple[tuple[Field, ...], int, int, int]:
    """The members at their x86-64 offsets (each aligned to its own size), where the `xcp` array of
    `block`s sits and how many, and the struct's size (a multiple of its widest member)."""
    fields: list[Field] = []
    position = alignment = partitions_offset = partition_count = 0
    for ctype, name, count in _members(listing):
        if ctype == "xcp" and block is not None:
            width = max(C_TYPES[f.ctype][1] for f in block.fields)
            partitions_offset = position = _aligned(position, width)
            partition_count = count
            position += block.size * count
        else:
            width = C_TYPES[ctype][1]
            position = _aligned(position, width)
            fields.append(Field(name, ctype, position, count))
            position += width * count
        alignment = max(alignment, width)
    return tuple(fields), partitions_offset, partition_count, _aligned(position, alignment)


def _block(name: str, listing: str) -> BlockLayout:
    fields, _, _, size = _place(listing)
    return BlockLayout(name, size, fields)


# struct metrics_table_header, the first member of every gpu_metrics struct.
_HEADER_MEMBERS = "u16 structure_size\nu8 format_revision content_revision\n"


def _layout(name: str, content_revision: int, listing: str, block: BlockLayout | None = None) -> Layout:
    fields, partitions_offset, partition_count, size = _place(_HEADER_MEMBERS + listing, block)
    return Layout(name, 1, content_revision, size, fields, block, partitions_offset, partition_count)


# The members of each struct gpu_metrics_v1_N in kernel order, one line per run of one C type,
# after its struct metrics_table_header (which _layout puts first).
V1_0 = _layout(
    "v1_0",
    0,
    """
    u64 system_clock_counter
    u16 temperature_edge temperature_hotspot temperature_mem temperature_vrgfx temperature_vrsoc temperature_vrmem
    u16 average_gfx_activity average_umc_activity average_mm_activity average_socket_power
    u32 energy_accumulator
    u16 average_gfxclk_frequency average_socclk_frequency average_uclk_frequency average_vclk0_frequency
    u16 average_dclk0_frequency average_vclk1_frequency average_dclk1_frequency
    u16 current_gfxclk current_socclk current_uclk current_vclk0 current_dclk0 current_vclk1 current_dclk1
    u32 throttle_status
    u16 current_fan_speed
    u8 pcie_link_width pcie_link_speed
""",
)
# v1_2 and v1_3 only append to v1_1.
_V1_1 = """
    u16 temperature_edge temperature_hotspot temperature_mem temperature_vrgfx temperature_vrsoc temperature_vrmem
    u16 average_gfx_activity average_umc_activity average_mm_activity average_socket_power
    u64 energy_accumulator system_clock_counter
    u16 average_gfxclk_frequency average_socclk_frequency average_uclk_frequency average_vclk0_frequency
    u16 average_dclk0_frequency average_vclk1_frequency average_dclk1_frequency
    u16 current_gfxclk current_socclk current_uclk current_vclk0 current_dclk0 current_vclk1 current_dclk1
    u32 throttle_status
    u16 current_fan_speed pcie_link_width pcie_link_speed padding
    u32 gfx_activity_acc mem_activity_acc
    u16 temperature_hbm[4]
"""
_V1_2 = _V1_1 + "u64 firmware_timestamp\n"
V1_1 = _layout("v1_1", 1, _V1_1)
V1_2 = _layout("v1_2", 2, _V1_2)
V1_3 = _layout("v1_3", 3, _V1_2 + "u16 voltage_soc voltage_gfx voltage_mem padding1\nu64 indep_throttle_status\n")
V1_4 = _layout(
    "v1_4",
    4,
    """
    u16 temperature_hotspot temperature_mem temperature_vrsoc curr_socket_power average_gfx_activity
    u16 average_umc_activity vcn_activity[4]
    u64 energy_accumulator system_clock_counter
    u32 throttle_status gfxclk_lock_status
    u16 pcie_link_width pcie_link_speed xgmi_link_width xgmi_link_speed
    u32 gfx_activity_acc mem_activity_acc
    u64 pcie_bandwidth_acc pcie_bandwidth_inst pcie_l0_to_recov_count_acc pcie_replay_count_acc
    u64 pcie_replay_rover_count_acc xgmi_read_data_acc[8] xgmi_write_data_acc[8] firmware_timestamp
    u16 current_gfxclk[8] current_socclk[4] current_vclk0[4] current_dclk0[4] current_uclk padding
""",
)
V1_5 = _layout(
    "v1_5",
    5,
    """
    u16 temperature_hotspot temperature_mem temperature_vrsoc curr_socket_power average_gfx_activity
    u16 average_umc_activity vcn_activity[4] jpeg_activity[32]
    u64 energy_accumulator system_clock_counter
    u32 throttle_status gfxclk_lock_status
    u16 pcie_link_width pcie_link_speed xgmi_link_width xgmi_link_speed
    u32 gfx_activity_acc mem_activity_acc
    u64 pcie_bandwidth_acc pcie_bandwidth_inst pcie_l0_to_recov_count_acc pcie_replay_count_acc
    u64 pcie_replay_rover_count_acc
    u32 pcie_nak_sent_count_acc pcie_nak_rcvd_count_acc
    u64 xgmi_read_data_acc[8] xgmi_write_data_acc[8] firmware_timestamp
    u16 current_gfxclk[8] current_socclk[4] current_vclk0[4] current_dclk0[4] current_uclk padding
""",
)
# The v1_6 that was merged and later reverted: v1_5 plus throttler residency accumulators.
V1_6_EARLY = _layout(
    "v1_6 (early, reverted)",
    6,
    """
    u16 temperature_hotspot temperature_mem temperature_vrsoc curr_socket_power average_gfx_activity
    u16 average_umc_activity vcn_activity[4] jpeg_activity[32]
    u64 energy_accumulator system_clock_counter
    u32 accumulation_counter prochot_residency_acc ppt_residency_acc socket_thm_residency_acc
    u32 vr_thm_residency_acc hbm_thm_residency_acc throttle_status gfxclk_lock_status
    u16 pcie_link_width pcie_link_speed xgmi_link_width xgmi_link_speed
    u32 gfx_activity_acc mem_activity_acc
    u64 pcie_bandwidth_acc pcie_bandwidth_inst pcie_l0_to_recov_count_acc pcie_replay_count_acc
    u64 pcie_replay_rover_count_acc
    u32 pcie_nak_sent_count_acc pcie_nak_rcvd_count_acc
    u64 xgmi_read_data_acc[8] xgmi_write_data_acc[8] firmware_timestamp
    u16 current_gfxclk[8] current_socclk[4] current_vclk0[4] current_dclk0[4] current_uclk padding
""",
)
# Per-partition blocks: struct amdgpu_xcp_metrics (v1_6), _v1_1 (v1_7), _v1_2 (v1_8).
_XCP_V1_0 = """
    u32 gfx_busy_inst[8]
    u16 jpeg_busy[32] vcn_busy[4]
    u64 gfx_busy_acc[8]
"""
XCP_V1_0 = _block("amdgpu_xcp_metrics", _XCP_V1_0)
XCP_V1_1 = _block("amdgpu_xcp_metrics_v1_1", _XCP_V1_0 + "u64 gfx_below_host_limit_acc[8]\n")
XCP_V1_2 = _block(
    "amdgpu_xcp_metrics_v1_2",
    """
    u32 gfx_busy_inst[8]
    u16 jpeg_busy[40] vcn_busy[4]
    u64 gfx_busy_acc[8] gfx_below_host_limit_ppt_acc[8] gfx_below_host_limit_thm_acc[8]
    u64 gfx_low_utilization_acc[8] gfx_below_host_limit_total_acc[8]
""",
)
# v1_6 final: no per-engine arrays at the top (they moved into xcp_stats, type `xcp`) and no throttle_status.
V1_6 = _layout(
    "v1_6",
    6,
    """
    u16 temperature_hotspot temperature_mem temperature_vrsoc curr_socket_power average_gfx_activity
    u16 average_umc_activity
    u64 energy_accumulator system_clock_counter
    u32 accumulation_counter prochot_residency_acc ppt_residency_acc socket_thm_residency_acc
    u32 vr_thm_residency_acc hbm_thm_residency_acc gfxclk_lock_status
    u16 pcie_link_width pcie_link_speed xgmi_link_width xgmi_link_speed
    u32 gfx_activity_acc mem_activity_acc
    u64 pcie_bandwidth_acc pcie_bandwidth_inst pcie_l0_to_recov_count_acc pcie_replay_count_acc
    u64 pcie_replay_rover_count_acc
    u32 pcie_nak_sent_count_acc pcie_nak_rcvd_count_acc
    u64 xgmi_read_data_acc[8] xgmi_write_data_acc[8] firmware_timestamp
    u16 current_gfxclk[8] current_socclk[4] current_vclk0[4] current_dclk0[4] current_uclk num_partition
    xcp xcp_stats[8]
    u32 pcie_lc_perf_other_end_recovery
""",
    XCP_V1_0,
)
# v1_7 and v1_8 share everything but the per-partition block.
_V1_7 = """
    u16 temperature_hotspot temperature_mem temperature_vrsoc curr_socket_power average_gfx_activity
    u16 average_umc_activity
    u64 mem_max_bandwidth energy_accumulator system_clock_counter
    u32 accumulation_counter prochot_residency_acc ppt_residency_acc socket_thm_residency_acc
    u32 vr_thm_residency_acc hbm_thm_residency_acc gfxclk_lock_status
    u16 pcie_link_width pcie_link_speed xgmi_link_width xgmi_link_speed
    u32 gfx_activity_acc mem_activity_acc
    u64 pcie_bandwidth_acc pcie_bandwidth_inst pcie_l0_to_recov_count_acc pcie_replay_count_acc
    u64 pcie_replay_rover_count_acc
    u32 pcie_nak_sent_count_acc pcie_nak_rcvd_count_acc
    u64 xgmi_read_data_acc[8] xgmi_write_data_acc[8]
    u16 xgmi_link_status[8] padding
    u64 firmware_timestamp
    u16 current_gfxclk[8] current_socclk[4] current_vclk0[4] current_dclk0[4] current_uclk num_partition
    xcp xcp_stats[8]
    u32 pcie_lc_perf_other_end_recovery
"""
V1_7 = _layout("v1_7", 7, _V1_7, XCP_V1_1)
V1_8 = _layout("v1_8", 8, _V1_7, XCP_V1_2)

FIXED_LAYOUTS: tuple[Layout, ...] = (V1_0, V1_1, V1_2, V1_3, V1_4, V1_5, V1_6_EARLY, V1_6, V1_7, V1_8)

# struct amdgpu_partition_metrics_v1_0: one partition's own table (its xcp/xcp_metrics file). The
# kernel declares its members flat: the partition's clocks, then exactly the members of
# amdgpu_xcp_metrics_v1_2 in that order, which start at byte 48 (a multiple of 8), so the listing
# places that block once as its one `xcp`, the same bytes the flat struct has. v1_1 is
# attribute-encoded like gpu_metrics v1.9 (same attribute ids), under revision 1.1.
PARTITION_V1_0 = _layout(
    "amdgpu_partition_metrics_v1_0",
    0,
    """
    u16 current_gfxclk[8] current_socclk[4] current_vclk0[4] current_dclk0[4] current_uclk padding
    xcp xcp_stats[1]
""",
    XCP_V1_2,
)
PARTITION_FIXED_LAYOUTS: tuple[Layout, ...] = (PARTITION_V1_0,)


# --- v1.9: self-describing records -------------------------------------------------------------

V1_9_FORMAT_REVISION = 1
V1_9_CONTENT_REVISION = 9
PARTITION_V1_1_REVISION = (1, 1)  # amdgpu_partition_metrics_v1_1: the same records as v1.9
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


# type -> (struct code, width in bytes), those of the unsigned C type of its width: every value is
# read unsigned so all-ones is easy to spot (the decoder signs the signed types after).
ATTR_TYPE_FORMAT: dict[AttrType, tuple[str, int]] = {t: C_TYPES[f"u{t.name[1:]}"] for t in AttrType}
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

# The unit each fixed-layout field is stored in (the v1.9 records declare theirs instead); others: none.
FIXED_FIELD_UNITS: dict[str, AttrUnit] = {
    name: unit
    for unit, names in (
        (
            AttrUnit.TEMP_CELSIUS,
            "temperature_edge temperature_hotspot temperature_mem temperature_vrgfx temperature_vrsoc"
            " temperature_vrmem temperature_hbm",
        ),
        (
            AttrUnit.PERCENT,
            "average_gfx_activity average_umc_activity average_mm_activity vcn_activity jpeg_activity"
            " gfx_busy_inst jpeg_busy vcn_busy",
        ),
        (AttrUnit.POWER_WATT, "average_socket_power curr_socket_power"),
        (
            AttrUnit.CLOCK_MHZ,
            "average_gfxclk_frequency average_socclk_frequency average_uclk_frequency average_vclk0_frequency"
            " average_dclk0_frequency average_vclk1_frequency average_dclk1_frequency current_gfxclk"
            " current_socclk current_uclk current_vclk0 current_dclk0 current_vclk1 current_dclk1",
        ),
        (AttrUnit.TIME_NS, "system_clock_counter"),
        (AttrUnit.TIME_10NS, "firmware_timestamp"),
        (AttrUnit.SPEED_100MTS, "pcie_link_speed"),
        (AttrUnit.SPEED_GTS, "xgmi_link_speed"),  # the kernel says Gbps per lane
        (AttrUnit.BANDWIDTH_GBS, "pcie_bandwidth_inst mem_max_bandwidth"),
        (AttrUnit.DATA_KB, "xgmi_read_data_acc xgmi_write_data_acc"),
    )
    for name in names.split()
}
