"""Reading sysfs files: bounded whole-file reads that say 'not supplied now' instead of raising.

A file that does not exist is simply not supplied (an ASIC without that attribute). Every other
failure is also 'not supplied now', and is counted by reason for the device being read
(exporter/sources/errors.py): EIO, EBUSY, EPERM, a parse error, a file longer than any real
attribute... so an operator can see why a series vanished.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
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


def read_file_bytes(path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes | None:
    """Read a whole sysfs file (at most `max_bytes`); None when absent, refused or too large.

    os.open/os.read: a sysfs attribute is one read, and this is several times cheaper than
    the buffered file object on the hot path. ENODEV/ENXIO mean the device itself is gone.
    """
    fd = _open(path)
    return None if fd is None else _read_and_close(fd, path, max_bytes=max_bytes)


def read_file_head(path: str, size: int) -> bytes | None:
    """The first `size` bytes of a file (a device coredump's header: the rest may be megabytes)."""
    fd = _open(path)
    if fd is None:
        return None
    try:
        data = os.read(fd, size)
    except OSError as error:
        _read_failed(path, error)
        return None
    finally:
        os.close(fd)
    note_ok(path)
    return data


def read_file_chunks(path: str, consume: Callable[[bytes], None], max_bytes: int) -> bool:
    """Hand a file to `consume` chunk by chunk (nothing is held here); False when absent, refused or
    longer than `max_bytes` (counted `too_large`: what was consumed is then not the whole file)."""
    fd = _open(path)
    if fd is None:
        return False
    size = 0
    try:
        while chunk := os.read(fd, 65536):
            size += len(chunk)
            if size > max_bytes:
                record(path, "too_large", f"longer than {max_bytes} bytes")
                return False
            consume(chunk)
    except OSError as error:
        _read_failed(path, error)
        return False
    finally:
        os.close(fd)
    note_ok(path)
    return True


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        if error.errno not in _ABSENT:
            record(path, errno_reason(error), error.strerror or "")
        return None


def _read_and_close(fd: int, path: str, first: bytes = b"", max_bytes: int = MAX_FILE_BYTES) -> bytes | None:
    """The file to its end (after `first`, what a read from offset 0 already gave), then the descriptor closed."""
    try:
        chunks = [first]
        size = len(first)
        if size:
            os.lseek(fd, size, os.SEEK_SET)
        while chunk := os.read(fd, min(65536, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                record(path, "too_large", f"longer than {max_bytes} bytes")
                return None
        note_ok(path)
        return b"".join(chunks)
    except OSError as error:
        _read_failed(path, error)
        return None
    finally:
        os.close(fd)


def _read_failed(path: str, error: OSError) -> None:
    """Count a failed read; raise SourceError('gone') when it says the device itself is gone."""
    record(path, errno_reason(error), error.strerror or "")
    if error.errno in (errno.ENODEV, errno.ENXIO):
        raise SourceError("gone", f"{path}: {error.strerror}") from error


# One read of a sysfs attribute returns all of it when it is shorter than a page; a read that fills
# a page (or more) may have more behind it and is read on from the same descriptor to its end.
_ONE_READ_BYTES = 4096


# Descriptors one device keeps open at most: gpu_metrics and its every-cycle text files (the
# web layer's connection budget leaves room for them).
KEPT_PER_DEVICE = 16


class KeptFiles:
    """One device's every-cycle files, kept open and re-read from offset 0 (pread).

    Why: the poll reads the same few attributes of every device every second. Each open walks the
    path and allocates a file, each close frees it: two of the four system calls of a read, and most
    of the kernel's time. kernfs generates an attribute's text afresh at every read from offset 0
    (the documented way to re-read a sysfs attribute after poll()), so a kept descriptor reads the
    current value. A file replaced by rename (a simulated tree does that; sysfs never does) has no
    links left on its descriptor: fstat sees it and the path is opened again.

    A read that fails is counted as read_file_bytes counts it and its descriptor closed; the next
    read opens the path again. Never a second read in the same call: a device that just failed one
    is not asked again at once. Anything but a regular file, and a file of a page or more, is read
    the ordinary way and not kept. Not thread-safe: the owner hands it to one read at a time and
    closes it only when no read runs.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}  # at most KEPT_PER_DEVICE; other paths are read the ordinary way

    def read(self, path: str) -> bytes | None:
        fd = self._fds.get(path)
        if fd is not None and not keepable(fd):  # replaced under us: the path names another file now
            self._drop(path)
            fd = None
        if fd is None:
            if len(self._fds) >= KEPT_PER_DEVICE:
                return read_file_bytes(path)
            fd = _open(path)
            if fd is None:
                return None
            if not keepable(fd):
                return _read_and_close(fd, path)
            self._fds[path] = fd
        try:
            data = os.pread(fd, _ONE_READ_BYTES, 0)
        except OSError as error:
            self._drop(path)
            _read_failed(path, error)
            return None
        if len(data) < _ONE_READ_BYTES:
            note_ok(path)
            return data
        del self._fds[path]  # a page or more: read on from this descriptor, then closed
        return _read_and_close(fd, path, data)

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for path in list(self._fds):
            self._drop(path)


def keepable(fd: int) -> bool:
    """A regular file (as every sysfs attribute is) still linked where it was opened."""
    try:
        status = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and status.st_nlink > 0


def read_parsed(
    path: str, parse: Callable[[str], T], read: Callable[[str], bytes | None] = read_file_bytes
) -> T | None:
    """Read and parse a text file; absent, refused or unparsable all mean 'not supplied now'."""
    raw = read(path)
    return None if raw is None else parse_read(path, raw, parse)


def parse_read(path: str, raw: bytes, parse: Callable[[str], T]) -> T | None:
    """read_parsed's second half, for bytes already read: an unparsable text is counted, not raised."""
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
