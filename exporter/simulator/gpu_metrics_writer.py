"""Encoder for the binary gpu_metrics tables, through the exporter's own layout tables.

A fixed version (v1_3 .. v1_8) is written where FIXED_LAYOUTS places each field; the tests hold
those tables to the driver's published offsets and to what a C compiler makes of the kernel header,
so the encoder needs no layout of its own. Like the driver, a table starts all-ones: a field nobody
sets reads 0xFF.. = "not supported".

v1.9 is the driver's attribute-encoded table (DECLARE_SMU_METRICS_CLASS in smu_cmn.h): a packed
struct of the 4-byte header, an int attr_count, then for every attribute of the SMU's field list a
u64 encoding (unit << 24 | type << 20 | attribute id << 10 | instances) followed by its values.
Every attribute of the list is always present (initialised all-ones), so the size is fixed per SMU.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from exporter.abi.gpu_metrics import ATTR_NAMES, FIXED_LAYOUTS, PARTITION_V1_0, Field, Layout

Value = int | Sequence[int] | Sequence[Mapping[str, "Value"]]

# the final v1_6 comes after the early, reverted one in FIXED_LAYOUTS, so it is the one kept here
LAYOUTS = {(t.format_revision, t.content_revision): t for t in FIXED_LAYOUTS}
_V1_8 = LAYOUTS[(1, 8)]
assert _V1_8.partition_block is not None
_XCP = _V1_8.partition_block
_LETTERS = {1: "B", 2: "H", 4: "I", 8: "Q"}  # element width -> struct letter (all unsigned)
ATTR_TYPES = {"B": 0, "H": 2, "I": 4, "Q": 6}  # enum amdgpu_metrics_attr_type: U8, U16, U32, U64

# enum amdgpu_metrics_attr_unit -> the attributes SMU 13.0.6 declares in it (every other one: NONE).
# As the driver declares them, quirks included: the activity accumulators and pcie_bandwidth_acc
# are PERCENT.
UNIT_MHZ, UNIT_CELSIUS, UNIT_KB, UNIT_PERCENT = 1, 2, 9, 10
_UNITS: dict[int, tuple[str, ...]] = {
    UNIT_MHZ: ("current_gfxclk", "current_socclk", "current_vclk0", "current_dclk0", "current_uclk"),
    UNIT_CELSIUS: ("temperature_hotspot", "temperature_mem", "temperature_vrsoc"),
    3: ("curr_socket_power",),  # W
    4: ("system_clock_counter",),  # ns
    5: ("firmware_timestamp",),  # 10 ns
    6: ("xgmi_link_speed",),  # GT/s
    7: ("pcie_link_speed",),  # 0.1 GT/s
    8: ("mem_max_bandwidth", "pcie_bandwidth_inst"),  # GB/s
    UNIT_KB: ("xgmi_read_data_acc", "xgmi_write_data_acc"),
    UNIT_PERCENT: (
        "average_gfx_activity", "average_umc_activity", "gfx_activity_acc", "mem_activity_acc",
        "pcie_bandwidth_acc", "gfx_busy_inst", "jpeg_busy", "vcn_busy", "gfx_busy_acc",
    ),
}  # fmt: skip
_UNIT_OF = {name: unit for unit, names in _UNITS.items() for name in names}
_V1_8_FIELDS = {f.name: f for f in (*_V1_8.fields, *_XCP.fields)}
_XCP_NAMES = frozenset(f.name for f in _XCP.fields)


def _attribute(name: str) -> tuple[str, int, str, int]:
    f = _V1_8_FIELDS[name]
    return (name, _UNIT_OF.get(name, 0), _LETTERS[f.size // f.count], f.count)


# SMU_13_0_6_METRICS_FIELDS (smu_v13_0_6_ppt.h): (attribute, unit, struct letter, instances) in
# attribute-id order: every field of the v1_8 table and of its per-partition block but num_partition.
V1_9_FIELDS = tuple(_attribute(name) for name in ATTR_NAMES if name != "num_partition")
V1_9_SIZE = 8 + sum(8 + struct.calcsize(kind) * n for _name, _unit, kind, n in V1_9_FIELDS)

# xcp/xcp_metrics of one partition (newer drivers): amdgpu_partition_metrics_v1_0 is the exporter's
# PARTITION_V1_0 layout (the partition's clocks, then v1_8's per-partition block, written as its one
# xcp_stats entry); v1_1 is attribute-encoded like gpu_metrics v1.9 (same attribute ids) with the
# fields of SMU_13_0_6_PARTITION_METRICS_FIELDS (smu_v13_0_6_ppt.h), in attribute-id order.
_PARTITION_NAMES = {f.name for f in (*PARTITION_V1_0.fields, *_XCP.fields)} - {"padding"}
PARTITION_V1_1_FIELDS = tuple(f for f in V1_9_FIELDS if f[0] in _PARTITION_NAMES)


def attr_encoding(unit: int, kind: str, name: str, instances: int) -> int:
    """AMDGPU_METRICS_ENC_ATTR(unit, type, id, instances)."""
    return (unit << 24) | (ATTR_TYPES[kind] << 20) | (ATTR_NAMES.index(name) << 10) | instances


def _stored(what: str, value: Value, count: int, width: int) -> bytes:
    """`value` (one integer, or up to `count`) as the field stores it; the unset rest all-ones.

    Integers wider than the field wrap, as hardware counters do; negative ones are a caller's bug.
    """
    numbers = [value] if isinstance(value, int) else list(value)
    if len(numbers) > count:
        raise ValueError(f"{what} holds {count} values, got {len(numbers)}")
    ones = (1 << (8 * width)) - 1
    stored = [n & ones if isinstance(n, int) and n >= 0 else -1 for n in numbers]
    if -1 in stored:
        raise ValueError(f"{what} takes non-negative integers, got {numbers!r}")
    return struct.pack(f"<{count}{_LETTERS[width]}", *stored, *[ones] * (count - len(stored)))


def _fill(buf: bytearray, base: int, fields: tuple[Field, ...], values: Mapping[str, Value], what: str) -> None:
    by_name = {f.name: f for f in fields}
    for name, value in values.items():
        f = by_name.get(name)
        if f is None:
            raise KeyError(f"{what} has no field {name!r}")
        start = base + f.offset
        buf[start : start + f.size] = _stored(f"{what}.{name}", value, f.count, f.size // f.count)


def _blank(size: int, version: tuple[int, int]) -> bytearray:
    buf = bytearray(b"\xff" * size)
    struct.pack_into("<HBB", buf, 0, size, *version)
    return buf


def _encode_attributes(
    fields: tuple[tuple[str, int, str, int], ...], version: tuple[int, int], values: Mapping[str, Value], what: str
) -> bytes:
    unknown = set(values) - {name for name, *_ in fields}
    if unknown:
        raise KeyError(f"{what} has no attribute {sorted(unknown)[0]!r}")
    size = 8 + sum(8 + struct.calcsize(kind) * n for _name, _unit, kind, n in fields)
    out = [struct.pack("<HBBi", size, *version, len(fields))]
    for name, unit, kind, count in fields:
        out.append(struct.pack("<Q", attr_encoding(unit, kind, name, count)))
        out.append(_stored(f"{what} {name}", values.get(name, ()), count, struct.calcsize(kind)))
    return b"".join(out)


def encode(version: tuple[int, int], values: Mapping[str, Value]) -> bytes:
    """The gpu_metrics blob of `version` with `values` set and every other byte 0xFF.

    The header (structure_size, format/content revision) is filled in from the version; arrays may
    be given shorter than declared. Fixed layouts take `xcp_stats` as a list of per-partition
    mappings; v1.9 takes the attribute names as keys, with flat values.
    """
    if version == (1, 9):
        return _encode_attributes(V1_9_FIELDS, version, values, "gpu_metrics v1.9")
    layout = LAYOUTS.get(version)
    if layout is None:
        known = ", ".join(f"{a}.{b}" for a, b in LAYOUTS)
        raise ValueError(f"no gpu_metrics layout for version {version[0]}.{version[1]}; known: {known}, 1.9")
    return encode_layout(layout, version, values)


def encode_layout(layout: Layout, version: tuple[int, int], values: Mapping[str, Value]) -> bytes:
    """A fixed layout's blob: its fields from `values`, its xcp_stats[] blocks from values["xcp_stats"]."""
    buf = _blank(layout.size, version)
    _fill(buf, 0, layout.fields, {k: v for k, v in values.items() if k != "xcp_stats"}, layout.name)
    blocks: Sequence[Mapping[str, Value]] = values.get("xcp_stats", ())  # type: ignore[assignment]
    block = layout.partition_block
    if blocks and (block is None or len(blocks) > layout.partition_count):
        raise ValueError(f"{layout.name} holds {layout.partition_count} xcp_stats blocks, got {len(blocks)}")
    for i, entry in enumerate(blocks):
        assert block is not None
        _fill(buf, layout.partitions_offset + i * block.size, block.fields, entry, block.name)
    return bytes(buf)


def encode_partition_metrics(version: tuple[int, int], values: Mapping[str, Value]) -> bytes:
    """xcp_metrics of one partition: amdgpu_partition_metrics v1_0 (fixed) or v1_1 (attributes)."""
    if version == (1, 1):
        return _encode_attributes(PARTITION_V1_1_FIELDS, version, values, "partition metrics v1.1")
    if version != (1, 0):
        raise ValueError(f"no partition metrics layout for version {version[0]}.{version[1]}; known: 1.0, 1.1")
    fixed = {name: value for name, value in values.items() if name not in _XCP_NAMES}
    block = {name: value for name, value in values.items() if name in _XCP_NAMES}
    return encode_layout(PARTITION_V1_0, version, {**fixed, "xcp_stats": [block]})


def with_attribute_instances(blob: bytes, name: str, instances: int, value: int) -> bytes:
    """A v1.9 table with attribute `name` re-encoded as `instances` values of `value` (a fault: a table
    that claims 1,023 XGMI links). The header's structure_size follows; every other record is kept."""
    size, *version, count = struct.unpack_from("<HBBi", blob)
    position, out = 8, []
    target = ATTR_NAMES.index(name)
    for _ in range(count):
        (encoding,) = struct.unpack_from("<Q", blob, position)
        kind = next(letter for letter, code in ATTR_TYPES.items() if code == (encoding >> 20) & 0xF)
        width, had = struct.calcsize(kind), encoding & 0x3FF
        values = blob[position + 8 : position + 8 + had * width]
        if (encoding >> 10) & 0x3FF == target:
            encoding = (encoding & ~0x3FF) | instances
            values = struct.pack(f"<{instances}{kind}", *[value] * instances)
        out.append(struct.pack("<Q", encoding) + values)
        position += 8 + had * width
    body = b"".join(out)
    assert position == size, f"walked {position} of {size} bytes"
    return struct.pack("<HBBi", 8 + len(body), *version, count) + body
