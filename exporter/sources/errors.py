"""Errors as data: every failed file read or rejected value of a device read, by file and reason.

A reader thread installs a FileErrors for the device it reads (`collecting`); the file helpers
(sysfs/files.py) and the value checks (plausible.py, labels) record into it without being handed
it. The source copies the counts into the Sample (`Sample.file_errors`), the poller adds them up
into `amdgpu_exporter_file_errors_total{gpu, file, reason}`.

Reasons are a small fixed set, so the label stays bounded whatever the kernel returns: parse (the
text or blob is not what the driver writes), implausible (parsed, but outside the field's range in
plausible.py), unavailable (the driver's own "no value right now" text), too_large (longer than any
real attribute, or more records than the hardware holds: not slurped), bad_record (one record of a
list or ring that is not what the driver writes: skipped, the others still count), future (evidence
dated ahead of now: the verdict ages it from when it was first seen), series_cap (keys of a
mapping field past plausible.MAX_KEYS, dropped: the file is the field's name), label (an identity string cut
to length or cleaned of control characters), timeout (a reader that hung, such as pcie_bw's), and
one per errno below (ENODEV / ENXIO: the device itself is gone), "other" for any other errno.
"""

from __future__ import annotations

import errno
import os
import threading

from exporter.sources.labels import clean_name

# An errno's reason is its name in lower case, but where two errnos mean one thing to an operator.
_NAMED_ERRNOS = ("EIO", "ENODEV", "EBUSY", "EAGAIN", "EPERM", "ENODATA", "EINVAL", "EOPNOTSUPP", "EISDIR", "ELOOP")
_ERRNO_REASONS = {
    **{getattr(errno, name): name.lower() for name in _NAMED_ERRNOS},
    errno.ENXIO: "enodev",
    errno.EACCES: "eperm",
    errno.ETIMEDOUT: "timeout",
}


def errno_reason(error: OSError) -> str:
    return _ERRNO_REASONS.get(error.errno or 0, "other")


class FileErrors:
    """The (file, reason) failures of one device read; files named relative to the device's folders."""

    def __init__(self, *bases: str) -> None:
        self._given = bases  # folders, ordered when a name is first needed (most reads need none)
        self._bases: tuple[str, ...] | None = None
        self.counts: dict[tuple[str, str], int] = {}
        self.details: dict[tuple[str, str], str] = {}
        self.read_ok: set[str] = set()  # paths read without an error (a later check may still reject the value)
        # Whether read_ok is kept: only a read that can log a recovery (some file failed before) needs it.
        self.track_ok = True

    def name_of(self, path: str) -> str:
        if self._bases is None:
            # longest first: the hwmon folder lies inside the device's, and its files are named from it
            self._bases = tuple(sorted((b.rstrip("/") + "/" for b in self._given if b), key=len, reverse=True))
        for base in self._bases:
            if path.startswith(base):
                return path[len(base) :]
        return os.path.basename(path)

    def add(self, path_or_file: str, reason: str, detail: str = "") -> None:
        key = (clean_name(self.name_of(path_or_file) if path_or_file.startswith("/") else path_or_file), reason)
        self.counts[key] = self.counts.get(key, 0) + 1
        if detail and key not in self.details:
            self.details[key] = detail[:200]

    def ok_files(self) -> set[str]:
        """Files read and accepted this read."""
        failed = {file for file, _ in self.counts}
        return {name for name in (clean_name(self.name_of(path)) for path in self.read_ok) if name not in failed}

    def failed_files(self) -> dict[str, str]:
        """file -> its (first) reason this read."""
        result: dict[str, str] = {}
        for file, reason in self.counts:
            result.setdefault(file, reason)
        return result


_current = threading.local()


class collecting:
    """Record this thread's file errors into `errors` while the block runs.

    A class, not a generator-based contextmanager: it wraps every device read on the poll path,
    where the generator machinery cost more than the bookkeeping itself.
    """

    __slots__ = ("_errors", "_previous")

    def __init__(self, errors: FileErrors) -> None:
        self._errors = errors
        self._previous: FileErrors | None = None

    def __enter__(self) -> FileErrors:
        self._previous = getattr(_current, "errors", None)
        _current.errors = self._errors
        return self._errors

    def __exit__(self, *exc: object) -> None:
        _current.errors = self._previous


def note_ok(path: str) -> None:
    errors: FileErrors | None = getattr(_current, "errors", None)
    if errors is not None and errors.track_ok:
        errors.read_ok.add(path)


def failures_recorded() -> int:
    """How many failures the block this thread is in has recorded so far (0 outside one)."""
    errors: FileErrors | None = getattr(_current, "errors", None)
    return sum(errors.counts.values()) if errors is not None else 0


def record(path_or_file: str, reason: str, detail: str = "") -> None:
    """Count one failure for the device this thread is reading (nothing outside a `collecting` block)."""
    errors: FileErrors | None = getattr(_current, "errors", None)
    if errors is not None:
        errors.add(path_or_file, reason, detail)
