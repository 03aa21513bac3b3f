"""Attribution sources on their own schedule: a thread per source, its latest report published.

`Scheduled` takes a report every `interval` seconds, keeps the latest as `report` (immutable,
replaced wholesale) and logs each change of up/down; a subclass says how one report is taken.
ScheduledAttribution reads claims (kubernetes, slurm): a failed read marks the source down at once,
and the last good claims are kept for `keep_for` seconds after the last good read (a kubelet
restart or a slow NFS-mounted state directory should not relabel every series twice). Each claim
added or removed is logged with its labels: the record of which pod or job had which GPU, and when.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from exporter.log import get_logger
from exporter.model import AttributionReport, Claim

log = get_logger("exporter.attribution")


class AttributionReadError(Exception):
    """A read failed; the message is one line for the operator."""


class Report(Protocol):
    @property
    def up(self) -> bool: ...

    @property
    def error(self) -> str: ...


R = TypeVar("R", bound=Report)


class Scheduled(Generic[R]):
    """A report taken every `interval` seconds on its own thread; `report` is the latest."""

    def __init__(self, source: str, interval: float, first: R, clock: Callable[[], float], describe: str) -> None:
        self.source = source
        self.interval = interval
        self.report = first
        self._clock = clock
        self._describe = describe
        self._logged_up: bool | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self, now: float, previous: R) -> R:
        raise NotImplementedError

    def read_once(self) -> R:
        """One read; publishes and returns the new report."""
        report = self._take(self._clock(), self.report)
        if report.up != self._logged_up:
            if report.up:
                log.info("attribution_source_up", source=self.source, reads=self._describe)
            else:
                log.warning("attribution_source_down", source=self.source, reads=self._describe, error=report.error)
            self._logged_up = report.up
        self.report = report
        return report

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self.source}-attribution", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.read_once()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


class ScheduledAttribution(Scheduled[AttributionReport]):
    def __init__(
        self,
        source: str,
        read: Callable[[], tuple[Claim, ...]],
        interval: float,
        keep_for: float = 60.0,
        clock: Callable[[], float] = time.time,
        describe: str = "",
    ) -> None:
        super().__init__(source, interval, AttributionReport(source, up=False, error="not read yet"), clock, describe)
        self.keep_for = keep_for
        self._read = read
        self._last_good = 0.0

    def _take(self, now: float, previous: AttributionReport) -> AttributionReport:
        try:
            claims = self._read()
        except AttributionReadError as error:
            kept = previous.claims if self._last_good and now - self._last_good <= self.keep_for else ()
            report = AttributionReport(self.source, up=False, claims=kept, taken_at=now, error=str(error))
        else:
            self._last_good = now
            report = AttributionReport(self.source, up=True, claims=claims, taken_at=now)
        log_claim_changes(self.source, previous.claims, report.claims)
        return report


def log_claim_changes(source: str, before: Sequence[Claim], after: Sequence[Claim]) -> None:
    """One log line per claim that appeared or went away."""
    old, new = set(before), set(after)
    for event, claims in (("attribution_claim_added", new - old), ("attribution_claim_removed", old - new)):
        for claim in sorted(claims, key=repr):
            log.info(event, source=source, device=claim.device_id, resource=claim.resource, **dict(claim.labels))
