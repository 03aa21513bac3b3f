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
from dataclasses import dataclass

from exporter.model import CperRecord

RING_POINTERS_BYTES = 12
HEADER_BYTES = 128
# The kernel's ring (CPER_MAX_RING_SIZE): no record in it can be longer (nor in a larger ring than a
# read that long), and a read holds this much after the three ring pointers.
RING_BYTES = 1 << 20
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


@dataclass(frozen=True, slots=True)
class CperScan:
    """A ring read decoded record by record: the good records, oldest first, and one sentence for
    each stretch of bytes that was not a record (counted by the caller, skipped here)."""

    records: tuple[CperRecord, ...]
    errors: tuple[str, ...] = ()


_SIGNATURE = b"CPER"
_SIGNATURE_END = b"\xff\xff\xff\xff"


def _next_header(data: bytes, start: int) -> int:
    """The offset of the next byte sequence from `start` on that looks like a record header, or -1."""
    while (found := data.find(_SIGNATURE, start)) >= 0:
        if data[found + 6 : found + 10] == _SIGNATURE_END:
            return found
        start = found + 1
    return -1


def scan_cper_ring(data: bytes) -> CperScan:
    """Every readable error record of an amdgpu_ring_cper read, oldest first, each decoded on its own:
    a record that is not what the kernel writes (a bad signature, a length no record in the ring can
    have, a time that is no date) is one error, and the scan goes on at the next record header, so
    the good records before and after it still count. A record with a broken time but a sound header
    is kept, without a time (timestamp 0: the verdict judges it by when it was first seen). The last
    record cut short at the end of the read, being written as it was read, is left for the next read
    (no error); a length that runs past the end while another header follows is an error."""
    if len(data) < RING_POINTERS_BYTES:
        return CperScan((), (f"a CPER ring read is at least {RING_POINTERS_BYTES} bytes, got {len(data)}",))
    records: list[CperRecord] = []
    errors: list[str] = []
    offset = RING_POINTERS_BYTES
    end = len(data)
    longest = max(RING_BYTES, end - RING_POINTERS_BYTES)  # no record is longer than the ring it is in

    def skip(reason: str) -> int:
        """Count the bad stretch at `offset` and go on at the next header (or stop)."""
        errors.append(reason)
        following = _next_header(data, offset + 1)
        return end if following < 0 else following

    while end - offset >= HEADER_BYTES:
        signature, _revision, tail, _sections, severity, valid, length, *stamp = _HEADER.unpack_from(data, offset)
        if signature != _SIGNATURE or tail != 0xFFFFFFFF:
            offset = skip(f"no CPER record header at byte {offset}: {bytes(data[offset : offset + 10])!r}")
            continue
        if not HEADER_BYTES <= length <= longest:
            offset = skip(f"a CPER record at byte {offset} says it is {length} bytes long")
            continue
        if length > end - offset:
            following = _next_header(data, offset + HEADER_BYTES)
            if following < 0:
                break  # being written as it was read: the next read has it whole
            errors.append(f"a CPER record at byte {offset} of {length} bytes runs into the next one")
            offset = following
            continue
        kind = SEVERITIES.get(severity)
        if kind is not None:
            record_id = _printable(data[offset + 96 : offset + 104])
            when = 0.0
            if valid & _TIMESTAMP_VALID:
                try:
                    when = _unix_seconds(stamp)
                except CperParseError as error:
                    errors.append(f"record at byte {offset}: {error}")
            records.append(CperRecord(timestamp=when, severity=kind, afids=(), record_id=record_id))
        offset += length
    return CperScan(tuple(records), tuple(errors))


def _printable(field: bytes) -> str:
    """A header's text field up to its NUL, each byte that is not printable ASCII (an escape sequence
    a terminal would act on) shown as '?'."""
    text = bytes(field).split(b"\0", 1)[0].decode("ascii", errors="replace")
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)


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
