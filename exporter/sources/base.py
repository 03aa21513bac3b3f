"""The Source protocol: the one small interface every device source implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from exporter.model import DeviceIdentity, Sample, SourceStats


class SourceError(Exception):
    """A read failed for a reason worth naming (the `reason` label of read_errors_total)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        # (file, reason) -> count of the file errors met before the read gave up (set by the source)
        self.file_errors: dict[tuple[str, str], int] = {}


class StartupError(RuntimeError):
    """The exporter cannot start (no usable source, no device, a busy port); one sentence for the operator."""


class Source(Protocol):
    """A device source. Every source class subclasses it, so the optional capabilities below have
    their defaults; the poller reads them as plain members."""

    name: str
    # True on a source whose every returned value already passed sources/plausible.py (the sysfs
    # source): the poller then does not judge its samples again.
    values_checked: bool = False
    # The sysfs source under an SMI source, serving what its library cannot (None: none).
    fallback: Source | None = None

    def discover(self) -> Sequence[DeviceIdentity]:
        """Find devices. Blocking; called at start and on the slow refresh schedule."""
        ...

    def read(self, device: DeviceIdentity) -> Sample:
        """Read one device once. Blocking (run in a thread or worker). Raises SourceError."""
        ...

    def stats(self) -> SourceStats:
        """The source's own counters now (cheap, non-blocking); the poller copies them into each Snapshot.
        A source without a worker has nothing to count."""
        return SourceStats()

    def want(self, wanted: frozenset[str] | None) -> None:
        """Read only the optional Sample fields of `wanted` (those the shown families are made of;
        None: the source's own choice) from the next read on. A source that reads nothing optional ignores it; one
        that reads through a fallback source (rocm-smi, amd-smi) tells it."""
        if self.fallback is not None:
            self.fallback.want(wanted)

    def needs_rediscovery(self) -> bool:
        """True when the source knows its devices changed (an MI300 partition mode switch): the poller
        then rediscovers at once."""
        return False

    def close(self) -> None: ...
