"""The amdgpu CPER ring as debugfs reads it: UEFI Common Platform Error Records, oldest first.

Layouts follow the kernel's amd_cper.h (all packed, little-endian): a 128-byte record header
("CPER", revision 0x100, 0xFFFFFFFF, section count, severity, valid bits, record length, a UTC
timestamp as seconds/minutes/hours/flag/day/month/year-in-century/century bytes, platform id,
creator "amdgpu", notification GUID, an 8-byte record id "<socket>:<hex counter>"), one 72-byte
section descriptor, then the section: the 176-byte AMD crashdump section for a fatal error, the
272-byte AMD non-standard section for a non-fatal or corrected one. Reading
dri/<minor>/amdgpu_ring_cper gives three u32 ring pointers (rptr, wptr, wptr, in dwords) and then
the records between rptr and wptr.
"""

from __future__ import annotations

import struct
import time
import uuid

SEVERITY_CODES = {"nonfatal": 0, "fatal": 1, "corrected": 2}  # enum cper_error_severity
HEADER_BYTES = 128
SECTION_DESCRIPTOR_BYTES = 72
FATAL_SECTION_BYTES = 176
NONSTANDARD_SECTION_BYTES = 272

_NOTIFY_MCE = uuid.UUID("e8f56ffe-919c-4cc5-ba88-65abe14913bb")
_NOTIFY_CMC = uuid.UUID("2dce8bb1-bdd7-450e-b9ad-9cf4ebd4f890")
_AMD_CRASHDUMP = uuid.UUID("32ac0c78-2623-48f6-b0d0-7365725fd6ae")
_AMD_NONSTANDARD = uuid.UUID("32ac0c78-2623-48f6-81a2-ac691780551d")


def _guid(value: uuid.UUID) -> bytes:
    return value.bytes_le  # the kernel's guid_t: the first three fields little-endian


def _timestamp(unix_seconds: int) -> bytes:
    tm = time.gmtime(unix_seconds)
    return bytes((tm.tm_sec, tm.tm_min, tm.tm_hour, 0, tm.tm_mday, tm.tm_mon, tm.tm_year % 100, tm.tm_year // 100))


def record(unix_seconds: int, severity: str, record_id: str, device_id: int, socket: int) -> bytes:
    """One CPER record of `severity` ("fatal" | "nonfatal" | "corrected") logged at `unix_seconds`."""
    code = SEVERITY_CODES[severity]
    fatal = severity == "fatal"
    section_bytes = FATAL_SECTION_BYTES if fatal else NONSTANDARD_SECTION_BYTES
    length = HEADER_BYTES + SECTION_DESCRIPTOR_BYTES + section_bytes
    header = b"".join(
        (
            b"CPER",
            struct.pack("<HIHIII", 0x100, 0xFFFFFFFF, 1, code, 0b011, length),  # valid: platform id, timestamp
            _timestamp(unix_seconds),
            f"0x1002:0x{device_id:04X}".encode().ljust(16, b"\0"),
            bytes(16),  # partition id (not valid)
            b"amdgpu".ljust(16, b"\0"),
            _guid(_NOTIFY_CMC if severity == "corrected" else _NOTIFY_MCE),
            record_id.encode()[:8].ljust(8, b"\0"),
            bytes(4 + 8 + 12),  # flags, persistence info, reserved
        )
    )
    latent = 0 if fatal or severity == "corrected" else 1 << 4
    descriptor = b"".join(
        (
            struct.pack(
                "<IIBBBBI", HEADER_BYTES + SECTION_DESCRIPTOR_BYTES, section_bytes, 1, 0x22, 0b10, 0, 1 | latent
            ),
            _guid(_AMD_CRASHDUMP if fatal else _AMD_NONSTANDARD),
            bytes(16),  # FRU id (not valid)
            struct.pack("<I", code),
            f"OAM{socket}".encode().ljust(20, b"\0"),
        )
    )
    if fatal:
        # crashdump header (reserved, firmware id, reserved), then the register context: type 1 (crash),
        # 32 bytes of ACA registers (status, address, IPID, syndrome as lo/hi pairs)
        registers = struct.pack("<8I", 0x00000137, 0xBA000000, 0, 0, 0x00000000, 0x0096 | (socket % 4) << 12, 0, 0)
        section = bytes(128) + struct.pack("<HHIQ", 1, len(registers), 0, 0) + registers
    else:
        # non-standard error: header (valid bits: one info, one context), info (error type GUID, ...),
        # context (type 1, a 128-byte ACA register dump)
        registers = struct.pack(
            "<32I", 0x1, 0, 0x00000137, 0x9C000000 if severity == "corrected" else 0xBC000000, *([0] * 28)
        )
        section = (
            struct.pack("<QQ", (1 << 2) | (1 << 8), 0)
            + bytes(48)
            + _guid(_AMD_NONSTANDARD)
            + struct.pack("<QQQQQQ", 0, 1, 0, 0, 0, 0)
            + struct.pack("<HHIQ", 1, len(registers), 0, 0)
            + registers
        )
    assert len(header) == HEADER_BYTES and len(descriptor) == SECTION_DESCRIPTOR_BYTES and len(section) == section_bytes
    return header + descriptor + section


def ring(records: list[bytes]) -> bytes:
    """What a read of amdgpu_ring_cper gives: rptr, wptr and the driver's wptr (dwords), then the records."""
    body = b"".join(records)
    wptr = len(body) // 4
    return struct.pack("<III", 0, wptr, wptr) + body
