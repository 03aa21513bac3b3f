"""Reading sysfs files: bounded whole-file reads that say 'not supplied now' instead of raising.

A file that does not exist is simply not supplied (an ASIC without that attribute). Every other
failure is also 'not supplied now', and is counted by reason for the device being read
(exporter/sources/errors.py): EIO, EBUSY, EPERM, a parse error, a file longer than any real
attribute... so an operator can see why a series vanished.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TypeVar

from exporter.sources import textfiles as tf
from exporter.sources.base import SourceError
from exporter.sources.errors import errno_reason, note_ok, record

T = TypeVar("T")

# A sysfs attribute is at most one page (PAGE_SIZE - 1 bytes; 64 KiB pages on some arm64/ppc64
# kernels). Nothing longer is read: a 10 MB "product_name" is an error, not a label.
MAX_FILE_BYTES = 65536
_ABSENT = (errno.ENOENT, errno.ENOTDIR)


def read_file_bytes(path: str, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """Read a whole sysfs file (at most `limit` bytes); None when absent, refused or too large.

    os.open/os.read: a sysfs attribute is one read, and this is several times cheaper than
    the buffered file object on the hot path. ENODEV/ENXIO mean the device itself is gone.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        if error.errno not in _ABSENT:
            record(path, errno_reason(error), error.strerror or "")
        return None
    try:
        chunks = []
        size = 0
        while True:
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                record(path, "too_large", f"longer than {limit} bytes")
                return None
        data = b"".join(chunks)
        note_ok(path)
        return data
    except OSError as error:
        record(path, errno_reason(error), error.strerror or "")
        if error.errno in (errno.ENODEV, errno.ENXIO):
            raise SourceError("gone", f"{path}: {error.strerror}") from error
        return None
    finally:
        os.close(fd)


def read_parsed(path: str, parse: Callable[[str], T]) -> T | None:
    """Read and parse a text file; absent, refused or unparsable all mean 'not supplied now'."""
    raw = read_file_bytes(path)
    if raw is None:
        return None
    try:
        return parse(raw.decode("ascii", errors="strict"))
    except tf.TextUnavailableError as error:
        record(path, "unavailable", str(error))
    except (UnicodeDecodeError, tf.TextParseError) as error:
        record(path, "parse", str(error))
    return None


def listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError as error:
        if error.errno not in _ABSENT:
            record(path, errno_reason(error), error.strerror or "")
        return []
