"""Reading a file the daemon does not control (config, web config, certificates, rules, state files).

Every such read is bounded the same way, so that nothing a file is or contains can end or stall the
process: the path must be a regular file (opened O_NONBLOCK, so a FIFO or a device standing where a
file should be never blocks the open, and is then refused), at most `limit` bytes are read, and text
must be UTF-8. Each failure is one FileReadError sentence naming the file; no OSError, ValueError or
UnicodeDecodeError escapes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DEFAULT_LIMIT = 1 << 20  # 1 MiB: the largest shipped file (the rules) is 10 KiB


class FileReadError(ValueError):
    """The file cannot be used: "<what> <path>: <reason>", one sentence."""

    def __init__(self, what: str, path: str, reason: str) -> None:
        super().__init__(f"{what} {path}: {reason}")
        self.reason = reason


def read_bytes(path: str | Path, what: str, limit: int = DEFAULT_LIMIT) -> bytes:
    name = str(path)
    if "\0" in name:
        raise FileReadError(what, repr(name), "the path contains a NUL byte")
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise FileReadError(what, name, f"cannot read it: {error.strerror or error}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise FileReadError(what, name, "not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(descriptor, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise FileReadError(what, name, f"cannot read it: {error.strerror or error}") from None
    finally:
        os.close(descriptor)
    if size > limit:
        raise FileReadError(what, name, f"larger than {_size(limit)}")
    return b"".join(chunks)


def read_text(path: str | Path, what: str, limit: int = DEFAULT_LIMIT) -> str:
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start})"
        raise FileReadError(what, str(path), reason) from None


def _size(limit: int) -> str:
    return f"{limit // 1024} KiB" if limit >= 1024 else f"{limit} bytes"
