"""The amdgpu CPER ring (debugfs dri/<minor>/amdgpu_ring_cper) decoded to CperRecords: pure over bytes.

A read gives three u32 ring pointers (rptr, wptr, the driver's wptr) and then the bytes between the
read and write pointers: whole UEFI Common Platform Error Records, oldest first, each a 128-byte
packed little-endian header (the layout of the kernel's amd_cper.h) followed by its section
descriptors and sections, `record_length` bytes in all. Only the header is decoded here: severity,
time and record id. The AMD Field IDs amd-smi shows are derived from the sections' ACA register
dumps by AMD's decoder tables, which this decoder does not carry: `afids` stays empty.
"""

from __future__ import annotations

import calendar
import struct

from exporter.model import CperRecord

RING_POINTERS_BYTES = 12
HEADER_BYTES = 128
# enum cper_error_severity (the UEFI record header's): 3, informational, is no error and not kept
SEVERITIES = {0: "nonfatal", 1: "fatal", 2: "corrected"}
_TIMESTAMP_VALID = 1 << 1
_HEADER = struct.Struct("<4sHIHIII8B")  # signature .. record_length, then the 8 timestamp bytes


class CperParseError(ValueError):
    """The ring does not hold what the kernel writes."""


def parse_cper_ring(data: bytes) -> tuple[CperRecord, ...]:
    """Every error record in a read of amdgpu_ring_cper, oldest first (a record cut short at the end
    of the read, being written as it was read, is left for the next read)."""
    if len(data) < RING_POINTERS_BYTES:
        raise CperParseError(f"a CPER ring read is at least {RING_POINTERS_BYTES} bytes, got {len(data)}")
    records: list[CperRecord] = []
    offset = RING_POINTERS_BYTES
    while len(data) - offset >= HEADER_BYTES:
        record, length = _record(data, offset)
        if length > len(data) - offset:
            break
        if record is not None:
            records.append(record)
        offset += length
    return tuple(records)


def _record(data: bytes, offset: int) -> tuple[CperRecord | None, int]:
    signature, _revision, end, _sections, severity, valid, length, *stamp = _HEADER.unpack_from(data, offset)
    if signature != b"CPER" or end != 0xFFFFFFFF:
        raise CperParseError(f"no CPER record header at byte {offset}: {bytes(data[offset : offset + 10])!r}")
    if length < HEADER_BYTES:
        raise CperParseError(f"a CPER record of {length} bytes at byte {offset} is shorter than its header")
    kind = SEVERITIES.get(severity)
    if kind is None:
        return None, length
    record_id = bytes(data[offset + 96 : offset + 104]).split(b"\0", 1)[0].decode("ascii", errors="replace")
    when = _unix_seconds(stamp) if valid & _TIMESTAMP_VALID else 0.0
    return CperRecord(timestamp=when, severity=kind, afids=(), record_id=record_id), length


def _unix_seconds(stamp: list[int]) -> float:
    """The header's UTC time: seconds, minutes, hours, flag, day, month, year in century, century."""
    seconds, minutes, hours, _flag, day, month, year, century = stamp
    if not (seconds < 60 and minutes < 60 and hours < 24 and 1 <= day <= 31 and 1 <= month <= 12 and year < 100):
        raise CperParseError(f"not a CPER timestamp: {stamp}")
    return float(calendar.timegm((century * 100 + year, month, day, hours, minutes, seconds, 0, 0, 0)))
