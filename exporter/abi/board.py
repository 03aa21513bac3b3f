"""The board/ temperature tables of MP1 13.0.12 parts (MI350X, MI355X), as the kernel defines them.

kgd_pp_interface.h: struct amdgpu_gpuboard_temp_metrics_v1_0 (board/gpuboard_temp: this GPU
board's own sensors) and struct amdgpu_baseboard_temp_metrics_v1_0 (board/baseboard_temp: the
universal baseboard the node's GPUs sit on). Both start with the gpu_metrics header (u16 size, u8
format_revision, u8 content_revision), then u16 label_version, u16 node_id, u64
accumulation_counter, then u32 entries, native little-endian, the struct padded to 8 bytes.

The driver fills the table with 0xFF, then packs the sensors the firmware reads (not -1) from
index 0 on: each entry is the sensor's id in bits 24-31 (an index into the name tuples below: the
kernel's enum amdgpu_node_temp / amdgpu_vr_temp / amdgpu_system_temp) and its temperature in whole
degrees Celsius in bits 0-23. An unused entry reads all-ones.

Data only, imported by the reader and by the simulator that writes the tables.
"""

from __future__ import annotations

from typing import NamedTuple

HEADER_BYTES = 4
ARRAYS_AT = 16  # after the header, label_version (u16 @4), node_id (u16 @6), accumulation_counter (u64 @8)
ENTRY_BYTES = 4
UNUSED_ENTRY = 0xFFFFFFFF

# enum amdgpu_node_temp: the GPU board's own sensors (AMDGPU_NODE_MAX_TEMP_ENTRIES = 12)
NODE_SENSORS = (
    "retimer_x", "oam_x_ibc", "oam_x_ibc_2", "oam_x_vdd18_vr", "oam_x_04_hbm_b_vr", "oam_x_04_hbm_d_vr",
)  # fmt: skip
# enum amdgpu_vr_temp: the GPU board's voltage regulators (AMDGPU_VR_MAX_TEMP_ENTRIES = 13)
VR_SENSORS = (
    "vddcr_vdd0", "vddcr_vdd1", "vddcr_vdd2", "vddcr_vdd3", "vddcr_soc_a", "vddcr_soc_c", "vddcr_socio_a",
    "vddcr_socio_c", "vdd_085_hbm", "vddcr_11_hbm_b", "vddcr_11_hbm_d", "vdd_usr", "vddio_11_e32",
)  # fmt: skip
# enum amdgpu_system_temp: the universal baseboard's sensors (AMDGPU_SYSTEM_MAX_TEMP_ENTRIES = 32)
SYSTEM_SENSORS = (
    "ubb_fpga", "ubb_front", "ubb_back", "ubb_oam7", "ubb_ibc", "ubb_ufpga", "ubb_oam1", "oam_0_1_hsc",
    "oam_2_3_hsc", "oam_4_5_hsc", "oam_6_7_hsc", "ubb_fpga_0v72_vr", "ubb_fpga_3v3_vr", "retimer_0_1_2_3_1v2_vr",
    "retimer_4_5_6_7_1v2_vr", "retimer_0_1_0v9_vr", "retimer_4_5_0v9_vr", "retimer_2_3_0v9_vr",
    "retimer_6_7_0v9_vr", "oam_0_1_2_3_3v3_vr", "oam_4_5_6_7_3v3_vr", "ibc_hsc", "ibc",
)  # fmt: skip


class TempArray(NamedTuple):
    offset: int  # bytes from the table's start
    entries: int
    names: tuple[str, ...]  # sensor id -> name


class TempTable(NamedTuple):
    file: str  # below the device's board/ folder
    size: int  # structure_size: sizeof the struct
    arrays: tuple[TempArray, ...]


GPUBOARD_TEMP = TempTable(
    "gpuboard_temp",
    120,  # 16 + 12 * 4 + 13 * 4 = 116, padded to 8
    (TempArray(ARRAYS_AT, 12, NODE_SENSORS), TempArray(ARRAYS_AT + 12 * ENTRY_BYTES, 13, VR_SENSORS)),
)
BASEBOARD_TEMP = TempTable("baseboard_temp", 144, (TempArray(ARRAYS_AT, 32, SYSTEM_SENSORS),))
TEMP_TABLE_VERSION = (1, 0)
