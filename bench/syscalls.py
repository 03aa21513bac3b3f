"""Count what a poll cycle asks of the kernel, from an `strace -f -y` log.

The traced child (bench.pollcost trace) opens a marker path that does not exist before each
measured cycle (/bench-marker/cycle-N), so the log splits into cycles. Each cycle's calls are
attributed to device files by the path strace prints for the fd (-y). Pure functions over text.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

MARKER_PREFIX = "/bench-marker/cycle-"
_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<call>[a-z_0-9]+)\((?P<args>.*)$")
_OPEN_PATH = re.compile(r'^(?:AT_FDCWD(?:<[^>]*>)?|\d+<[^>]*>),\s*"(?P<path>[^"]*)"')
_FD_PATH = re.compile(r"^\d+<(?P<path>[^>]*)>")
_FD_CALLS = ("read", "pread64", "readv", "preadv", "close", "fstat", "lseek", "ioctl")


@dataclass(slots=True)
class CycleCalls:
    """Everything traced between two cycle markers."""

    cycle: int
    syscalls: Counter[str] = field(default_factory=Counter)  # syscall name -> count
    opened: list[str] = field(default_factory=list)  # paths, in order, successful or not
    reads: Counter[str] = field(default_factory=Counter)  # path -> read() calls
    # every file the cycle read or tried to, once each, in order: opened ones and the ones read through
    # a descriptor kept open from an earlier cycle (pread64 on it, no open)
    touched: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TracedCall:
    pid: int
    name: str
    path: str  # the path opened, or the path behind the fd; "" when neither


def parse_line(line: str) -> TracedCall | None:
    """One strace line -> the call it starts; None for resumptions, signals and exits."""
    match = _LINE.match(line.strip())
    if match is None:
        return None
    name, args = match["call"], match["args"]
    path = ""
    if name in ("openat", "open"):
        if name == "open":
            args = "AT_FDCWD, " + args
        found = _OPEN_PATH.match(args)
        path = found["path"] if found else ""
    elif name in _FD_CALLS:
        found = _FD_PATH.match(args)
        path = found["path"] if found else ""
    return TracedCall(int(match["pid"]), name, path)


def split_cycles(lines: Iterable[str]) -> Iterator[CycleCalls]:
    """Group traced calls into the cycles the markers delimit (calls before the first are dropped)."""
    current: CycleCalls | None = None
    for line in lines:
        call = parse_line(line)
        if call is None:
            continue
        if call.name in ("openat", "open") and call.path.startswith(MARKER_PREFIX):
            if current is not None:
                yield current
            suffix = call.path[len(MARKER_PREFIX) :]
            current = CycleCalls(cycle=int(suffix) if suffix.isdigit() else -1)
            continue
        if current is None:
            continue
        current.syscalls[call.name] += 1
        if call.name in ("openat", "open"):
            current.opened.append(call.path)
            if call.path not in current.touched:
                current.touched.append(call.path)
        elif call.name in ("read", "pread64", "readv", "preadv") and call.path:
            current.reads[call.path] += 1
            if call.path not in current.touched:
                current.touched.append(call.path)
    if current is not None:
        yield current


def file_kind(path: str) -> str:
    """The kind of device file a path is: its name, with hwmon channel numbers kept."""
    return path.rstrip("/").rsplit("/", 1)[-1]
