"""Reading sysfs files: whole-file reads that say 'not supplied now' instead of raising."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TypeVar

from exporter.sources import textfiles as tf
from exporter.sources.base import SourceError

T = TypeVar("T")


def read_file_bytes(path: str) -> bytes | None:
    """Read a whole sysfs file; None when it is absent or the driver refuses it right now.

    os.open/os.read: a sysfs attribute is one read, and this is several times cheaper than
    the buffered file object on the hot path. ENODEV/ENXIO mean the device itself is gone.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as error:
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
    except (UnicodeDecodeError, tf.TextParseError):
        return None


def listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
