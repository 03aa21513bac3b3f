"""What the daemon and its rocm_smi worker process share: message framing and the breadcrumbs.

Messages are JSON lines on two pipes (requests down, replies up). JSON because every value is a
number, a string or a list of them, and a human can read a captured stream.

Breadcrumbs: before each library call a worker thread writes (thread ident, native tid, device,
call name) into its slot of a small shared memory file the daemon also maps. When the worker dies
in abort(), the slots say which calls were in flight; faulthandler's "Current thread 0x..." line
(written to a second shared file) says which of them aborted. The native tids also tell the daemon
which /dev/shm/rocm_smi_card* mutexes a killed worker still held (see mutex.py).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SLOT_FORMAT = "<QIi48s"  # ident (pthread_t), native tid, device index (-1 = none), call name
SLOT_SIZE = struct.calcsize(SLOT_FORMAT)
SLOT_COUNT = 256  # one per worker thread: devices, the discovery thread, pcie_bw readers
BREADCRUMB_BYTES = SLOT_SIZE * SLOT_COUNT
CRASH_LOG_BYTES = 1 << 16
IDLE = ""


@dataclass(frozen=True, slots=True)
class Breadcrumb:
    ident: int
    tid: int
    device: int
    call: str  # IDLE when the thread is between library calls


def pack_slot(ident: int, tid: int, device: int, call: str) -> bytes:
    return struct.pack(SLOT_FORMAT, ident, tid, device, call.encode()[:48])


def unpack_slots(raw: bytes) -> list[Breadcrumb]:
    """All used slots (ident != 0) of a breadcrumb area."""
    crumbs = []
    for offset in range(0, min(len(raw), BREADCRUMB_BYTES) - SLOT_SIZE + 1, SLOT_SIZE):
        ident, tid, device, name = struct.unpack_from(SLOT_FORMAT, raw, offset)
        if ident:
            crumbs.append(Breadcrumb(ident, tid, device, name.rstrip(b"\0").decode(errors="replace")))
    return crumbs


_CURRENT_THREAD = re.compile(rb"Current thread (0x[0-9a-fA-F]+)")


def crashed_thread(crash_log: bytes) -> int | None:
    """The ident of the thread faulthandler reported as current at the fatal signal, if any."""
    match = _CURRENT_THREAD.search(crash_log)
    return int(match.group(1), 16) if match else None


def blamed_calls(crumbs: list[Breadcrumb], crash_log: bytes) -> list[Breadcrumb]:
    """The in-flight library call(s) to blame for a crash.

    The aborting thread's call when faulthandler named it; every in-flight call otherwise (a
    conservative answer: each blamed call is only re-routed to the fallback, never lost).
    """
    busy = [crumb for crumb in crumbs if crumb.call != IDLE]
    current = crashed_thread(crash_log)
    return [crumb for crumb in busy if crumb.ident == current] or busy


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def read_lines(fd: int) -> Iterator[bytes]:
    """The non-empty lines read from `fd` until end of file (or a read error, which ends it too)."""
    buffer = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from (line for line in lines if line)
