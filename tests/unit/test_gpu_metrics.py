"""gpu_metrics decoder: layout sizes, every version field by field, all-ones, truncation, v1.9, fuzzing.

Test blobs are built here with struct.pack_into at the byte offsets of the kernel header
(kgd_pp_interface.h, x86-64 natural alignment) as listed in shared/reference/amdgpu-driver-interface.md,
independently of exporter/abi/gpu_metrics.py. Like the driver, every table starts as
0xFF bytes (= "not supplied") and only the fields a test names are written.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.abi import gpu_metrics as layouts
from exporter.sources.gpu_metrics.decoder import (
    ALWAYS_EXPORTED_THROTTLERS,
    GpuMetrics,
    GpuMetricsError,
    _as_bytes,
    _check_length,
    _read_header,
    _walk_v1_9,
    decode_gpu_metrics,
    throttle_reasons,
)

# --- helpers ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricsAttribute:
    """One v1.9 record, as stored: values are raw integers (signed types already signed)."""

    attr_id: int
    name: str  # kernel attribute name in lower case, or "attr_<id>" for ids the decoder predates
    unit: int  # AttrUnit value (may be one the decoder predates)
    value_type: layouts.AttrType
    values: tuple[int, ...]


def read_v1_9_attributes(blob: bytes | bytearray | memoryview) -> tuple[MetricsAttribute, ...]:
    """The records of a v1.9 table in table order, unknown attribute ids included: the decoder's own walk."""
    data = _as_bytes(blob)
    structure_size, format_revision, content_revision = _read_header(data)
    if (format_revision, content_revision) != (layouts.V1_9_FORMAT_REVISION, layouts.V1_9_CONTENT_REVISION):
        raise GpuMetricsError(f"gpu_metrics v{format_revision}.{content_revision} is not a v1.9 table")
    _check_length(data, structure_size)
    names = layouts.ATTR_NAMES
    return tuple(
        MetricsAttribute(id_, names[id_] if id_ < len(names) else f"attr_{id_}", unit, kind, values)
        for id_, unit, kind, values in _walk_v1_9(data, structure_size)
    )


def struct_format(fields: tuple[layouts.Field, ...], size: int) -> str:
    """A little-endian struct format that reads `fields` in order, skipping gaps, `size` bytes long."""
    parts = ["<"]
    position = 0
    for field in sorted(fields, key=lambda f: f.offset):
        if field.offset < position:
            raise ValueError(f"field {field.name} at {field.offset} overlaps the previous field")
        if field.offset > position:
            parts.append(f"{field.offset - position}x")
        parts.append(f"{field.count}{layouts.C_TYPES[field.ctype][0]}")
        position = field.offset + field.size
    if position > size:
        raise ValueError(f"fields end at {position}, past the structure size {size}")
    if position < size:
        parts.append(f"{size - position}x")
    return "".join(parts)


_CTYPES = {"u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64}


def _ctypes_member(field: layouts.Field) -> tuple[str, Any]:
    ctype = _CTYPES[field.ctype]
    return (field.name, ctype * field.count if field.count > 1 else ctype)


def ctypes_structure(fields: tuple[layouts.Field, ...], name: str) -> Any:
    """The C struct with these members in this order, laid out by ctypes' own (natural) alignment.

    It ignores the hand-written offsets on purpose: comparing its offsets and size with the table's
    is how these tests prove the tables match what a C compiler makes of the kernel header.
    """
    members = [_ctypes_member(f) for f in sorted(fields, key=lambda f: f.offset)]
    return type(name, (ctypes.Structure,), {"_fields_": members})


def layout_ctypes_structure(layout: layouts.Layout) -> Any:
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


def table(size: int, content_revision: int, structure_size: int | None = None) -> bytearray:
    """A format-1 table of `size` bytes, all 0xFF, with its header written."""
    blob = bytearray(b"\xff" * size)
    header_size = size if structure_size is None else structure_size
    struct.pack_into("<HBB", blob, 0, header_size, 1, content_revision)
    return blob


def put(blob: bytearray, offset: int, fmt: str, *values: int) -> None:
    struct.pack_into("<" + fmt, blob, offset, *values)


U16_NONE = 0xFFFF
U32_NONE = 0xFFFFFFFF
U64_NONE = 0xFFFFFFFFFFFFFFFF


def assert_metrics(actual: GpuMetrics, **expected: Any) -> None:
    """Every GpuMetrics field equals `expected` (floats approximately); unnamed fields are empty/None."""
    for name in GpuMetrics._fields:
        got = getattr(actual, name)
        if name in expected:
            want = expected[name]
        elif isinstance(got, Mapping):
            want = {}
        elif isinstance(got, tuple):
            want = ()
        else:
            want = None
        if isinstance(want, Mapping):
            assert dict(got) == pytest.approx(want, rel=1e-12), name
            assert set(got) == set(want), name
        elif isinstance(want, tuple):
            assert len(got) == len(want), name
            for got_item, want_item in zip(got, want, strict=True):
                assert got_item == pytest.approx(want_item, rel=1e-12), name
        elif isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-12), name
        else:
            assert got == want, name
            assert type(got) is type(want), name


NO_THROTTLE = {name: False for name in throttle_reasons(0)}

# (size, format, content) of every fixed layout, from the reference, not from the layout tables.
FIXED_TABLES = [
    (80, 1, 0),
    (96, 1, 1),
    (104, 1, 2),
    (120, 1, 3),
    (288, 1, 4),
    (360, 1, 5),
    (384, 1, 6),
    (1664, 1, 6),
    (2208, 1, 7),
    (3872, 1, 8),
]

# --- struct sizes and offsets ----------------------------------------------------------------------

EXPECTED_SIZES = [
    (layouts.V1_0, 80, 0),
    (layouts.V1_1, 96, 1),
    (layouts.V1_2, 104, 2),
    (layouts.V1_3, 120, 3),
    (layouts.V1_4, 288, 4),
    (layouts.V1_5, 360, 5),
    (layouts.V1_6, 1664, 6),
    (layouts.V1_7, 2208, 7),
    (layouts.V1_8, 3872, 8),
    (layouts.V1_6_EARLY, 384, 6),
]


@pytest.mark.parametrize(("layout", "size", "content"), EXPECTED_SIZES, ids=lambda v: getattr(v, "name", v))
def test_layout_size_matches_the_c_struct(layout: layouts.Layout, size: int, content: int) -> None:
    c_struct = layout_ctypes_structure(layout)
    assert ctypes.sizeof(c_struct) == size
    assert layout.size == size
    assert struct.calcsize(struct_format(layout.fields, layout.size)) == size
    assert (layout.format_revision, layout.content_revision) == (1, content)


@pytest.mark.parametrize(("layout", "size", "content"), EXPECTED_SIZES, ids=lambda v: getattr(v, "name", v))
def test_layout_offsets_match_natural_alignment(layout: layouts.Layout, size: int, content: int) -> None:
    # ctypes places each member by natural alignment from the member order alone; the hand-written
    # offsets must agree with it for every field, as a C compiler would lay out the kernel struct.
    c_struct = layout_ctypes_structure(layout)
    for fld in layout.fields:
        assert getattr(c_struct, fld.name).offset == fld.offset, fld.name
    if layout.partition_block is not None:
        assert c_struct.xcp_stats.offset == layout.partitions_offset


@pytest.mark.parametrize(("block", "size"), [(layouts.XCP_V1_0, 168), (layouts.XCP_V1_1, 232), (layouts.XCP_V1_2, 440)])
def test_partition_block_sizes(block: layouts.BlockLayout, size: int) -> None:
    c_struct = ctypes_structure(block.fields, block.name)
    assert ctypes.sizeof(c_struct) == size == block.size
    for fld in block.fields:
        assert getattr(c_struct, fld.name).offset == fld.offset, fld.name


def test_partition_arrays_sit_where_the_reference_says() -> None:
    assert (layouts.V1_6.partitions_offset, layouts.V1_7.partitions_offset) == (312, 344)
    assert layouts.V1_8.partitions_offset == 344
    ends = {
        layout.name: layout.partitions_offset + 8 * layout.partition_block.size
        for layout in (layouts.V1_6, layouts.V1_7, layouts.V1_8)
        if layout.partition_block
    }
    # pcie_lc_perf_other_end_recovery follows the eight blocks directly.
    assert ends == {"v1_6": 1656, "v1_7": 2200, "v1_8": 3864}


# --- v1_0 .. v1_3 (MI100 / MI200) -------------------------------------------------------------------


def test_v1_0_every_field() -> None:
    blob = table(80, 0)
    put(blob, 8, "Q", 5_000_000_000)  # system_clock_counter, ns
    put(blob, 16, "6H", 40, 55, 60, 45, 46, 47)  # edge, hotspot, mem, vrgfx, vrsoc, vrmem
    put(blob, 28, "3H", 50, 25, 10)  # gfx, umc, mm activity %
    put(blob, 34, "H", 300)  # average_socket_power W
    put(blob, 36, "I", 1000 * 65536)  # energy_accumulator (u32 in v1_0)
    put(blob, 40, "7H", 1700, 1000, 1600, 0, 0, U16_NONE, U16_NONE)  # average clocks MHz
    put(blob, 54, "7H", 1650, 1090, 1600, 30, 40, U16_NONE, U16_NONE)  # current clocks MHz
    put(blob, 68, "I", 0x5)  # throttle_status
    put(blob, 72, "H", 1200)  # fan rpm
    put(blob, 74, "BB", 16, 160)  # pcie width, speed (u8 in v1_0)
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        format_revision=1,
        content_revision=0,
        structure_size=80,
        system_clock_counter_seconds=5.0,
        temperatures={"edge": 40.0, "junction": 55.0, "memory": 60.0, "vr_gfx": 45.0, "vr_soc": 46.0, "vr_mem": 47.0},
        busy={"gfx": 0.5, "memory": 0.25, "media": 0.1},
        power_watts=300.0,
        energy_joules=1000.0,
        clocks_hertz={"gfx": 1.65e9, "soc": 1.09e9, "memory": 1.6e9, "video": 3.0e7, "decode": 4.0e7},
        clocks_average_hertz={"gfx": 1.7e9, "soc": 1.0e9, "memory": 1.6e9, "video": 0.0, "decode": 0.0},
        throttle_status=5,
        pcie_link_width=16,
        pcie_link_transfers_per_second=16e9,
    )


def _v1_1_body(blob: bytearray) -> None:
    put(blob, 4, "6H", 35, 48, 40, 36, 38, 33)  # edge, hotspot, mem, vrgfx, vrsoc, vrmem
    put(blob, 16, "3H", 97, 42, U16_NONE)  # gfx, umc, mm (Aldebaran: 0xFFFF)
    put(blob, 22, "H", 362)  # average_socket_power
    put(blob, 24, "Q", 3_000_000 * 65536)  # energy_accumulator u64
    put(blob, 32, "Q", 42_000_000_000)  # system_clock_counter
    put(blob, 40, "7H", 1700, 1090, 1600, 0, 0, U16_NONE, U16_NONE)
    put(blob, 54, "7H", 1700, 1090, 1600, U16_NONE, U16_NONE, U16_NONE, U16_NONE)
    put(blob, 68, "I", 0x10)  # throttle_status
    put(blob, 72, "H", 0)  # fan: Aldebaran has none and writes 0
    put(blob, 74, "HH", 16, 160)  # pcie width, speed (u16 from v1_1)
    put(blob, 80, "II", 123456, 654321)  # gfx_activity_acc, mem_activity_acc
    put(blob, 88, "4H", 41, 42, U16_NONE, 44)  # temperature_hbm[4]


V1_1_EXPECTED: dict[str, Any] = {
    "format_revision": 1,
    "temperatures": {
        "edge": 35.0,
        "junction": 48.0,
        "memory": 40.0,
        "vr_gfx": 36.0,
        "vr_soc": 38.0,
        "vr_mem": 33.0,
        "hbm0": 41.0,
        "hbm1": 42.0,
        "hbm3": 44.0,
    },
    "busy": {"gfx": 0.97, "memory": 0.42},
    "power_watts": 362.0,
    "energy_joules": 3_000_000.0,
    "system_clock_counter_seconds": 42.0,
    "clocks_hertz": {"gfx": 1.7e9, "soc": 1.09e9, "memory": 1.6e9},
    "clocks_average_hertz": {"gfx": 1.7e9, "soc": 1.09e9, "memory": 1.6e9, "video": 0.0, "decode": 0.0},
    "throttle_status": 0x10,
    "pcie_link_width": 16,
    "pcie_link_transfers_per_second": 16e9,
    "gfx_activity_acc": 123456,
    "mem_activity_acc": 654321,
}


def test_v1_1_every_field() -> None:
    blob = table(96, 1)
    _v1_1_body(blob)
    assert_metrics(decode_gpu_metrics(bytes(blob)), **V1_1_EXPECTED, content_revision=1, structure_size=96)


def test_v1_2_reads_as_v1_1_past_its_firmware_timestamp() -> None:
    blob = table(104, 2)
    _v1_1_body(blob)
    put(blob, 96, "Q", 123_456_789)  # firmware_timestamp, 10 ns units
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **V1_1_EXPECTED,
        content_revision=2,
        structure_size=104,
    )


def test_v1_3_aldebaran_every_field() -> None:
    blob = table(120, 3)
    _v1_1_body(blob)
    put(blob, 96, "Q", 10**11)  # firmware_timestamp: 1000 s
    put(blob, 104, "3H", 900, 1100, U16_NONE)  # voltage soc, gfx, mem (mV)
    put(blob, 112, "Q", (1 << 0) | (1 << 36) | (1 << 47))  # ppt0, temp_hotspot, prochot_gfx
    throttle = dict(NO_THROTTLE, ppt0=True, temp_hotspot=True, prochot_gfx=True)  # set bits join the stable set
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **V1_1_EXPECTED,
        content_revision=3,
        structure_size=120,
        voltages_volts={"soc": 0.9, "gfx": 1.1},
        indep_throttle_status=(1 << 0) | (1 << 36) | (1 << 47),
        throttle=throttle,
    )


def test_v1_3_aldebaran_gcd1_zero_power_and_energy_stay_zero() -> None:
    # The second GCD of an MI250X reads 0 for package power and energy: the decoder reports what the
    # table says; deciding that die 1 has no package power is the source's business (it knows the die).
    blob = table(120, 3)
    put(blob, 22, "H", 0)
    put(blob, 24, "Q", 0)
    decoded = decode_gpu_metrics(bytes(blob))
    assert (decoded.power_watts, decoded.energy_joules) == (0.0, 0.0)


def test_energy_uses_the_exact_kernel_tick() -> None:
    blob = table(120, 3)
    put(blob, 24, "Q", 1)
    assert decode_gpu_metrics(bytes(blob)).energy_joules == 15.2587890625e-6  # 2**-16 J, not 15.3 uJ


@pytest.mark.parametrize(
    ("speed", "expected"),
    [(25, 2.5e9), (50, 5e9), (80, 8e9), (160, 16e9), (0, 0.0), (128 + 25, None), (128 + 0x7F, None)],
)
def test_pcie_speed_in_100mts_and_aldebaran_esm_codes(speed: int, expected: float | None) -> None:
    # ESM links report ((PCIE_ESM_CTRL >> 8) & 0x7F) + 128, which is not a 0.1 GT/s rate.
    blob = table(120, 3)
    put(blob, 74, "HH", 16, speed)
    assert decode_gpu_metrics(bytes(blob)).pcie_link_transfers_per_second == expected


def test_utilisation_over_100_percent_is_dropped_not_clamped() -> None:
    blob = table(120, 3)
    put(blob, 16, "3H", 150, 100, 0)
    assert dict(decode_gpu_metrics(bytes(blob)).busy) == {"memory": 1.0, "media": 0.0}


# --- v1_4 .. v1_8 (MI300) ------------------------------------------------------------------------


def _mi300_top(blob: bytearray) -> None:
    put(blob, 4, "3H", 70, 65, 50)  # hotspot, mem, vrsoc
    put(blob, 10, "H", 550)  # curr_socket_power
    put(blob, 12, "HH", 80, 30)  # gfx, umc activity


MI300_COMMON: dict[str, Any] = {
    "format_revision": 1,
    "temperatures": {"junction": 70.0, "memory": 65.0, "vr_soc": 50.0},
    "power_watts": 550.0,
    "energy_joules": 7.5,
    "system_clock_counter_seconds": 1.5,
    "pcie_link_width": 16,
    "pcie_link_transfers_per_second": 32e9,
    "xgmi_link_width": 16,
    "xgmi_link_speed_bytes_per_second": 32e9 * 16 / 8,
    "gfx_activity_acc": 1000,
    "mem_activity_acc": 2000,
    "pcie_bandwidth_acc": 3000,
    "pcie_bandwidth_bytes_per_second": 12e9,
    "pcie_recoveries": 4,
    "pcie_replays": 5,
    "pcie_replay_rollovers": 6,
    "xgmi_read_bytes": {0: 100 * 1024.0, 1: 200 * 1024.0},
    "xgmi_write_bytes": {0: 300 * 1024.0, 7: 400 * 1024.0},
    "clocks_hertz": {"gfx": 2.1e9, "soc": 1.2e9, "memory": 1.3e9, "video": 1.0e9, "decode": 0.9e9},
}


def _mi300_links_and_clocks(
    blob: bytearray, *, energy: int, pcie: int, acc: int, bandwidth: int, xgmi: int, fw: int, clocks: int
) -> None:
    """Write the MI300 fields whose offsets move from version to version (offsets passed in)."""
    put(blob, energy, "QQ", int(7.5 * 65536), 1_500_000_000)  # energy_accumulator, system_clock_counter
    put(blob, pcie, "4H", 16, 320, 16, 32)  # pcie width, speed (0.1 GT/s); xgmi width, speed (Gbps)
    put(blob, acc, "II", 1000, 2000)  # gfx_activity_acc, mem_activity_acc
    put(blob, bandwidth, "5Q", 3000, 12, 4, 5, 6)  # bw acc, bw inst GB/s, l0->recovery, replay, rollover
    put(blob, xgmi, "8Q", 100, 200, *[U64_NONE] * 6)  # xgmi_read_data_acc KB
    put(blob, xgmi + 64, "8Q", 300, *[U64_NONE] * 6, 400)  # xgmi_write_data_acc KB
    put(blob, fw, "Q", 250_000_000)  # firmware_timestamp: 2.5 s
    put(blob, clocks, "8H", 2000, 2100, 2050, *[U16_NONE] * 5)  # current_gfxclk per XCC
    put(blob, clocks + 16, "4H", 1200, 1100, U16_NONE, U16_NONE)  # current_socclk
    put(blob, clocks + 24, "4H", 1000, U16_NONE, U16_NONE, U16_NONE)  # current_vclk0
    put(blob, clocks + 32, "4H", 900, 800, U16_NONE, U16_NONE)  # current_dclk0
    put(blob, clocks + 40, "H", 1300)  # current_uclk


def test_v1_4_every_field() -> None:
    blob = table(288, 4)
    _mi300_top(blob)
    put(blob, 16, "4H", 5, 20, U16_NONE, U16_NONE)  # vcn_activity
    put(blob, 40, "II", 0x3, 0xFF)  # throttle_status, gfxclk_lock_status
    _mi300_links_and_clocks(blob, energy=24, pcie=48, acc=56, bandwidth=64, xgmi=104, fw=232, clocks=240)
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **MI300_COMMON,
        content_revision=4,
        structure_size=288,
        gfx_clock_lock_mask=0xFF,
        busy={"gfx": 0.8, "memory": 0.3, "media": 0.2},
        throttle_status=3,
    )


def test_v1_5_every_field() -> None:
    blob = table(360, 5)
    _mi300_top(blob)
    put(blob, 16, "4H", 7, 3, U16_NONE, U16_NONE)  # vcn_activity
    put(blob, 24, "32H", *[1] * 32)  # jpeg_activity (not exported)
    put(blob, 104, "II", 0x1, 0xFF)  # throttle_status, gfxclk_lock_status
    put(blob, 168, "II", 11, 12)  # pcie naks sent, received
    _mi300_links_and_clocks(blob, energy=88, pcie=112, acc=120, bandwidth=128, xgmi=176, fw=304, clocks=312)
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **MI300_COMMON,
        content_revision=5,
        structure_size=360,
        gfx_clock_lock_mask=0xFF,
        busy={"gfx": 0.8, "memory": 0.3, "media": 0.07},
        throttle_status=1,
        pcie_naks_sent=11,
        pcie_naks_received=12,
    )


def test_mapping_keys_follow_one_order_whatever_the_layout() -> None:
    # MI300's per-XCC clock arrays and its single memory clock are listed like MI200's single clocks.
    blob = table(360, 5)
    _mi300_top(blob)
    _mi300_links_and_clocks(blob, energy=88, pcie=112, acc=120, bandwidth=128, xgmi=176, fw=304, clocks=312)
    assert list(decode_gpu_metrics(bytes(blob)).clocks_hertz) == ["gfx", "soc", "memory", "video", "decode"]


def test_v1_6_early_reverted_layout_every_field() -> None:
    blob = table(384, 6)
    _mi300_top(blob)
    put(blob, 16, "4H", 9, U16_NONE, U16_NONE, U16_NONE)  # vcn_activity
    put(blob, 104, "6I", 1, 2, 3, 4, 5, 6)  # accumulation counter + residencies
    put(blob, 128, "II", 0x2, 0xFF)  # throttle_status, gfxclk_lock_status
    put(blob, 192, "II", 13, 14)  # naks
    _mi300_links_and_clocks(blob, energy=88, pcie=136, acc=144, bandwidth=152, xgmi=200, fw=328, clocks=336)
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **MI300_COMMON,
        content_revision=6,
        structure_size=384,
        gfx_clock_lock_mask=0xFF,
        busy={"gfx": 0.8, "memory": 0.3, "media": 0.09},
        throttle_status=2,
        pcie_naks_sent=13,
        pcie_naks_received=14,
        accumulation_counter=1,
        residency_acc={"prochot": 2, "ppt": 3, "socket_thm": 4, "vr_thm": 5, "hbm_thm": 6},
    )


def _partition(blob: bytearray, base: int, *, gfx_busy: list[int], vcn: list[int], vcn_offset: int) -> None:
    put(blob, base, "8I", *gfx_busy, *[U32_NONE] * (8 - len(gfx_busy)))
    put(blob, base + vcn_offset, "4H", *vcn, *[U16_NONE] * (4 - len(vcn)))


def test_v1_6_final_layout_every_field() -> None:
    blob = table(1664, 6)
    _mi300_top(blob)
    put(blob, 32, "6I", 1, 2, 3, 4, 5, 6)  # accumulation counter + residencies
    put(blob, 56, "I", 0xFF)  # gfxclk_lock_status
    put(blob, 120, "II", 15, 16)  # naks
    _mi300_links_and_clocks(blob, energy=16, pcie=60, acc=68, bandwidth=80, xgmi=128, fw=256, clocks=264)
    put(blob, 306, "H", 2)  # num_partition
    _partition(blob, 312, gfx_busy=[50, 60], vcn=[15], vcn_offset=96)
    _partition(blob, 312 + 168, gfx_busy=[70, 80], vcn=[25, 5], vcn_offset=96)
    _partition(blob, 312 + 2 * 168, gfx_busy=[99], vcn=[90], vcn_offset=96)  # beyond num_partition
    put(blob, 1656, "I", 3)  # pcie_lc_perf_other_end_recovery
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **MI300_COMMON,
        content_revision=6,
        structure_size=1664,
        gfx_clock_lock_mask=0xFF,
        busy={"gfx": 0.8, "memory": 0.3, "media": 0.25},
        pcie_naks_sent=15,
        pcie_naks_received=16,
        num_partitions=2,
        partition_gfx_busy=((0.5, 0.6), (0.7, 0.8)),
        partition_vcn_busy=((0.15,), (0.25, 0.05)),
        partition_jpeg_busy=((), ()),
        accumulation_counter=1,
        residency_acc={"prochot": 2, "ppt": 3, "socket_thm": 4, "vr_thm": 5, "hbm_thm": 6},
        pcie_other_end_recoveries=3,
    )


def test_v1_7_every_field() -> None:
    blob = table(2208, 7)
    _mi300_top(blob)
    put(blob, 16, "Q", 5300)  # mem_max_bandwidth, GB/s
    put(blob, 128, "II", 17, 18)  # naks
    _mi300_links_and_clocks(blob, energy=24, pcie=68, acc=76, bandwidth=88, xgmi=136, fw=288, clocks=296)
    # xgmi_link_status: 1 up, 0 down, all-ones not supplied, anything else not trusted.
    put(blob, 264, "8H", 1, 0, 1, U16_NONE, 2, 0, U16_NONE, U16_NONE)
    put(blob, 338, "H", 1)  # num_partition
    _partition(blob, 344, gfx_busy=[100, 0, 45], vcn=[0, 0, 0, 30], vcn_offset=96)
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **MI300_COMMON,
        content_revision=7,
        structure_size=2208,
        busy={"gfx": 0.8, "memory": 0.3, "media": 0.3},
        memory_max_bandwidth_bytes_per_second=5300e9,
        pcie_naks_sent=17,
        pcie_naks_received=18,
        xgmi_link_up={0: True, 1: False, 2: True, 5: False},
        num_partitions=1,
        partition_gfx_busy=((1.0, 0.0, 0.45),),
        partition_vcn_busy=((0.0, 0.0, 0.0, 0.3),),
        partition_jpeg_busy=((),),
    )


def test_v1_8_every_field_without_num_partition() -> None:
    blob = table(3872, 8)
    _mi300_top(blob)
    put(blob, 128, "II", 19, 20)  # naks
    _mi300_links_and_clocks(blob, energy=24, pcie=68, acc=76, bandwidth=88, xgmi=136, fw=288, clocks=296)
    put(blob, 264, "8H", *[1] * 8)  # all links up
    # num_partition left all-ones: the blocks that hold values decide; block 1 is an unused slot.
    _partition(blob, 344, gfx_busy=[10, 20], vcn=[40], vcn_offset=112)
    _partition(blob, 344 + 2 * 440, gfx_busy=[30], vcn=[], vcn_offset=112)
    put(blob, 3864, "I", 3)  # pcie_lc_perf_other_end_recovery
    assert_metrics(
        decode_gpu_metrics(bytes(blob)),
        **MI300_COMMON,
        content_revision=8,
        structure_size=3872,
        busy={"gfx": 0.8, "memory": 0.3, "media": 0.4},
        pcie_other_end_recoveries=3,
        pcie_naks_sent=19,
        pcie_naks_received=20,
        xgmi_link_up=dict.fromkeys(range(8), True),
        partition_gfx_busy=((0.1, 0.2), (), (0.3,)),
        partition_vcn_busy=((0.4,), (), ()),
        partition_jpeg_busy=((), (), ()),
    )


# --- all-ones, lengths, errors --------------------------------------------------------------------


@pytest.mark.parametrize(("size", "fmt", "content"), FIXED_TABLES)
def test_a_table_of_all_ones_supplies_nothing(size: int, fmt: int, content: int) -> None:
    decoded = decode_gpu_metrics(bytes(table(size, content)))
    assert_metrics(decoded, format_revision=fmt, content_revision=content, structure_size=size)
    assert decoded.version == f"1.{content}"


@pytest.mark.parametrize(("size", "fmt", "content"), FIXED_TABLES)
def test_bytes_after_structure_size_are_ignored(size: int, fmt: int, content: int) -> None:
    blob = table(size, content)
    put(blob, 4, "H", 61)
    assert decode_gpu_metrics(bytes(blob) + b"\x00" * 100) == decode_gpu_metrics(bytes(blob))


@pytest.mark.parametrize(("size", "fmt", "content"), FIXED_TABLES)
def test_truncated_table_is_rejected(size: int, fmt: int, content: int) -> None:
    blob = bytes(table(size, content))
    with pytest.raises(GpuMetricsError, match=f"blob of {size - 1} bytes shorter than structure_size {size}"):
        decode_gpu_metrics(blob[:-1])


def test_truncation_message_names_the_lengths() -> None:
    with pytest.raises(GpuMetricsError, match=r"^blob of 50 bytes shorter than structure_size 120$"):
        decode_gpu_metrics(bytes(table(120, 3))[:50])


@pytest.mark.parametrize("blob", [b"", b"\x78", b"\x78\x00\x01"])
def test_shorter_than_the_header_is_rejected(blob: bytes) -> None:
    with pytest.raises(GpuMetricsError, match="shorter than the 4-byte header"):
        decode_gpu_metrics(blob)


@pytest.mark.parametrize(("fmt", "content"), [(2, 1), (3, 0), (0, 0), (1, 10), (1, 255)])
def test_unknown_revision_is_rejected(fmt: int, content: int) -> None:
    blob = bytearray(b"\xff" * 200)
    put(blob, 0, "HBB", 200, fmt, content)
    with pytest.raises(GpuMetricsError, match=f"revision {fmt}.{content}"):
        decode_gpu_metrics(bytes(blob))


def test_structure_size_must_match_the_revision() -> None:
    with pytest.raises(GpuMetricsError, match=r"v1\.3 with structure_size 96; known layouts are 120 bytes"):
        decode_gpu_metrics(bytes(table(120, 3, structure_size=96)))
    with pytest.raises(GpuMetricsError, match="known layouts are 384 or 1664 bytes"):
        decode_gpu_metrics(bytes(table(1664, 6, structure_size=1000)))


def test_v1_6_dispatch_is_by_structure_size() -> None:
    early, final = table(384, 6), table(1664, 6)
    put(early, 88, "Q", 65536)  # energy in the early layout
    put(final, 16, "Q", 2 * 65536)  # energy in the final layout
    assert decode_gpu_metrics(bytes(early)).energy_joules == 1.0
    assert decode_gpu_metrics(bytes(final)).energy_joules == 2.0


def test_bytes_like_inputs_decode_and_other_types_are_rejected() -> None:
    blob = table(120, 3)
    put(blob, 22, "H", 100)
    assert decode_gpu_metrics(blob).power_watts == 100.0
    assert decode_gpu_metrics(memoryview(bytes(blob))).power_watts == 100.0
    with pytest.raises(GpuMetricsError, match="must be bytes"):
        decode_gpu_metrics("not bytes")  # type: ignore[arg-type]


# --- throttle reasons --------------------------------------------------------------------------------


def test_throttle_reason_names_and_bits() -> None:
    reasons = throttle_reasons((1 << 0) | (1 << 16) | (1 << 36) | (1 << 47) | (1 << 57))
    assert {name for name, active in reasons.items() if active} == {
        "ppt0",
        "tdc_gfx",
        "temp_hotspot",
        "prochot_gfx",
        "fit",
    }
    # the always-exported reasons plus exactly the other reasons whose bit is set
    assert set(reasons) == ALWAYS_EXPORTED_THROTTLERS | {"temp_hotspot", "prochot_gfx", "fit"}
    assert len(throttle_reasons((1 << 64) - 1)) == 34
    assert set(throttle_reasons(0)) == ALWAYS_EXPORTED_THROTTLERS
    assert all(name == name.lower() and " " not in name for name in reasons)


def test_throttle_reasons_ignore_bits_without_a_name() -> None:
    assert not any(throttle_reasons((1 << 8) | (1 << 31) | (1 << 63)).values())
    assert all(throttle_reasons((1 << 64) - 1).values())


# --- v1.9 -------------------------------------------------------------------------------------------

# enum amdgpu_metrics_attr_type / _unit values, as in the kernel header.
U8, S8, U16, S16, U32, S32, U64, S64 = range(8)
NONE, CLOCK_MHZ, TEMP_C, POWER_W, TIME_NS, TIME_10NS, SPEED_GTS, SPEED_100MTS, BW_GBS, DATA_KB, PERCENT = range(11)
TYPE_CODES = {U8: "B", S8: "b", U16: "H", S16: "h", U32: "I", S32: "i", U64: "Q", S64: "q"}


def record(attr_id: int, unit: int, value_type: int, values: list[int]) -> bytes:
    encoding = (unit << 24) | (value_type << 20) | (attr_id << 10) | len(values)
    return struct.pack(f"<Q{len(values)}{TYPE_CODES[value_type]}", encoding, *values)


def v1_9(records: list[bytes], *, count: int | None = None, structure_size: int | None = None) -> bytes:
    body = b"".join(records)
    size = 8 + len(body) if structure_size is None else structure_size
    return struct.pack("<HBBi", size, 1, 9, len(records) if count is None else count) + body


V1_9_RECORDS = [
    record(0, TEMP_C, U16, [72]),  # temperature_hotspot
    record(1, TEMP_C, U16, [U16_NONE]),  # temperature_mem: not supplied
    record(2, CLOCK_MHZ, U16, [50]),  # temperature_vrsoc declared in MHz: not trusted as a temperature
    record(3, POWER_W, U16, [600]),  # curr_socket_power
    record(4, PERCENT, U16, [90]),  # average_gfx_activity
    record(5, PERCENT, U16, [35]),  # average_umc_activity
    record(7, NONE, U64, [5 * 65536]),  # energy_accumulator
    record(8, TIME_NS, U64, [2_000_000_000]),  # system_clock_counter
    record(16, NONE, U16, [16]),  # pcie_link_width
    record(17, SPEED_100MTS, U16, [320]),  # pcie_link_speed
    record(18, NONE, U16, [16]),  # xgmi_link_width
    record(19, SPEED_GTS, U16, [32]),  # xgmi_link_speed
    record(20, PERCENT, U32, [777]),  # gfx_activity_acc
    record(22, PERCENT, U64, [888]),  # pcie_bandwidth_acc (the kernel declares PERCENT)
    record(23, BW_GBS, U64, [40]),  # pcie_bandwidth_inst
    record(25, NONE, U64, [9]),  # pcie_replay_count_acc
    record(27, NONE, U64, [21]),  # pcie_nak_sent_count_acc (U64 in later kernels)
    record(29, DATA_KB, U64, [10, U64_NONE, 30, *[U64_NONE] * 5]),  # xgmi_read_data_acc
    record(31, NONE, U16, [1, 0, *[U16_NONE] * 6]),  # xgmi_link_status
    record(32, TIME_10NS, U64, [300_000_000]),  # firmware_timestamp
    record(33, CLOCK_MHZ, U16, [1900, 2000, *[U16_NONE] * 6]),  # current_gfxclk
    record(37, CLOCK_MHZ, U16, [1300]),  # current_uclk
    record(38, NONE, U16, [4]),  # num_partition
    record(40, PERCENT, U32, [10, 20, 30, 40, *[U32_NONE] * 4]),  # gfx_busy_inst (device-wide)
    record(42, PERCENT, U16, [5, 60, U16_NONE, U16_NONE]),  # vcn_busy
    record(500, NONE, S32, [-5, 7]),  # an attribute id this decoder predates
    record(0, TEMP_C, U16, [10]),  # a repeated id: the first record wins
]


def test_v1_9_every_decoded_field() -> None:
    assert_metrics(
        decode_gpu_metrics(v1_9(V1_9_RECORDS)),
        format_revision=1,
        content_revision=9,
        structure_size=8 + sum(len(r) for r in V1_9_RECORDS),
        temperatures={"junction": 72.0},
        power_watts=600.0,
        busy={"gfx": 0.9, "memory": 0.35, "media": 0.6},
        energy_joules=5.0,
        system_clock_counter_seconds=2.0,
        pcie_link_width=16,
        pcie_link_transfers_per_second=32e9,
        xgmi_link_width=16,
        xgmi_link_speed_bytes_per_second=32e9 * 16 / 8,
        gfx_activity_acc=777,
        pcie_bandwidth_acc=888,
        pcie_bandwidth_bytes_per_second=40e9,
        pcie_replays=9,
        pcie_naks_sent=21,
        xgmi_read_bytes={0: 10 * 1024.0, 2: 30 * 1024.0},
        xgmi_link_up={0: True, 1: False},
        clocks_hertz={"gfx": 2.0e9, "memory": 1.3e9},
        num_partitions=4,
        partition_gfx_busy=((0.1, 0.2, 0.3, 0.4),),
        partition_vcn_busy=((0.05, 0.6),),
        partition_jpeg_busy=((),),
    )


def test_v1_9_generic_parse_keeps_every_record() -> None:
    attributes = read_v1_9_attributes(v1_9(V1_9_RECORDS))
    assert len(attributes) == len(V1_9_RECORDS)
    assert [a.attr_id for a in attributes[:3]] == [0, 1, 2]
    assert attributes[0].name == "temperature_hotspot"
    assert attributes[23].name == "gfx_busy_inst"
    assert (attributes[2].unit, attributes[2].values) == (CLOCK_MHZ, (50,))
    unknown = attributes[25]
    assert (unknown.attr_id, unknown.name, unknown.value_type, unknown.values) == (500, "attr_500", S32, (-5, 7))


def test_v1_9_declared_units_drive_conversion() -> None:
    blob = v1_9(
        [
            record(17, SPEED_GTS, U16, [16]),  # pcie_link_speed in GT/s this time
            record(8, TIME_10NS, U64, [100]),  # system_clock_counter in 10 ns
            record(0, TEMP_C, S16, [-1]),  # signed all-ones: not supplied
            record(1, TEMP_C, S16, [-20]),  # a real negative temperature
            record(3, PERCENT, U16, [600]),  # power declared as percent: not a power
        ]
    )
    decoded = decode_gpu_metrics(blob)
    assert decoded.pcie_link_transfers_per_second == 16e9
    assert decoded.system_clock_counter_seconds == pytest.approx(1e-6)
    assert dict(decoded.temperatures) == {"memory": -20.0}
    assert decoded.power_watts is None


def test_v1_9_empty_table_supplies_nothing() -> None:
    assert_metrics(decode_gpu_metrics(v1_9([])), format_revision=1, content_revision=9, structure_size=8)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (v1_9([record(0, TEMP_C, U16, [1])], count=-1), "attr_count -1 does not fit"),
        (v1_9([record(0, TEMP_C, U16, [1])], count=2), "attr_count 2 does not fit"),
        (v1_9([record(0, TEMP_C, U16, [1]), b"\x00" * 8], count=2), None),  # 2nd record: 0 values, fits
        (v1_9([record(33, CLOCK_MHZ, U16, [1] * 8)], structure_size=8 + 8 + 15), "runs past byte 31"),
        (v1_9([struct.pack("<Q", (9 << 20) | (4 << 10) | 1) + b"\x00" * 8]), "unknown value type 9"),
        (struct.pack("<HBB", 6, 1, 9) + b"\x00" * 4, "structure_size 6 shorter than its 8-byte header"),
        (v1_9([record(0, TEMP_C, U16, [1])], structure_size=100), "blob of 18 bytes shorter"),
    ],
)
def test_v1_9_malformed_record_lists_are_rejected(blob: bytes, message: str | None) -> None:
    if message is None:
        assert decode_gpu_metrics(blob).temperatures == {"junction": 1.0}
        return
    with pytest.raises(GpuMetricsError, match=message):
        decode_gpu_metrics(blob)


def test_v1_9_record_running_past_the_end_is_rejected_even_with_spare_blob_bytes() -> None:
    # structure_size bounds the records, not the length of the read.
    blob = v1_9([record(33, CLOCK_MHZ, U16, [1] * 8)], structure_size=30) + b"\x00" * 64
    with pytest.raises(GpuMetricsError, match=r"record 0 .* runs past byte 30"):
        decode_gpu_metrics(blob)


def test_page_size_truncation_is_named() -> None:
    records = [record(29, DATA_KB, U64, [1] * 8)] * 60  # 4320 bytes of records
    blob = v1_9(records)[:4095]
    with pytest.raises(GpuMetricsError, match=r"shorter than structure_size 4328 \(the kernel cuts"):
        decode_gpu_metrics(blob)


def test_read_v1_9_attributes_rejects_other_versions() -> None:
    with pytest.raises(GpuMetricsError, match=r"not a v1\.9 table"):
        read_v1_9_attributes(bytes(table(120, 3)))


# --- properties ---------------------------------------------------------------------------------------


def _check_invariants(decoded: GpuMetrics) -> None:
    assert all(0.0 <= v <= 1.0 for v in decoded.busy.values())
    assert all(0.0 <= v <= 1.0 for partition in decoded.partition_gfx_busy for v in partition)
    assert set(decoded.busy) <= {"gfx", "memory", "media"}
    assert set(decoded.clocks_hertz) <= {"gfx", "soc", "memory", "video", "decode"}
    assert all(v >= 0 for v in decoded.xgmi_read_bytes.values())


def _decode_or_error(blob: bytes) -> GpuMetrics | None:
    try:
        return decode_gpu_metrics(blob)
    except GpuMetricsError as error:
        assert str(error)
        return None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4200))
def test_arbitrary_bytes_give_metrics_or_gpu_metrics_error(blob: bytes) -> None:
    decoded = _decode_or_error(blob)
    if decoded is not None:
        _check_invariants(decoded)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(FIXED_TABLES), st.data())
def test_any_body_under_a_valid_fixed_header_decodes(header: tuple[int, int, int], data: st.DataObject) -> None:
    size, fmt, content = header
    body = data.draw(st.binary(min_size=size - 4, max_size=size - 4 + 16))
    decoded = decode_gpu_metrics(struct.pack("<HBB", size, fmt, content) + body)
    assert (decoded.format_revision, decoded.content_revision, decoded.structure_size) == (fmt, content, size)
    _check_invariants(decoded)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=0xFFFF),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.binary(max_size=600),
)
def test_any_body_under_a_v1_9_header_decodes_or_errors(size: int, count: int, body: bytes) -> None:
    blob = struct.pack("<HBBi", size, 1, 9, count) + body
    decoded = _decode_or_error(blob)
    if decoded is not None:
        _check_invariants(decoded)


_attribute = st.tuples(
    st.integers(min_value=0, max_value=1023),  # id, known or not
    st.integers(min_value=0, max_value=255),  # unit, known or not
    st.integers(min_value=0, max_value=7),  # type
    st.integers(min_value=0, max_value=12),  # instances
    st.randoms(use_true_random=False),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_attribute, max_size=40))
def test_v1_9_well_formed_records_round_trip(specs: list[tuple[int, int, int, int, Any]]) -> None:
    records, expected = [], []
    for attr_id, unit, value_type, instances, rnd in specs:
        width = struct.calcsize(TYPE_CODES[value_type])
        low = -(1 << (8 * width - 1)) if TYPE_CODES[value_type].islower() else 0
        high = (1 << (8 * width - 1)) - 1 if low else (1 << (8 * width)) - 1
        values = [rnd.randint(low, high) for _ in range(instances)]
        records.append(record(attr_id, unit, value_type, values))
        expected.append((attr_id, unit, value_type, tuple(values)))
    blob = v1_9(records)
    attributes = read_v1_9_attributes(blob)
    assert [(a.attr_id, a.unit, a.value_type, a.values) for a in attributes] == expected
    _check_invariants(decode_gpu_metrics(blob))
