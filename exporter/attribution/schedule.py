"""Attribution sources on their own schedule: a thread per source, its latest report published.

`Scheduled` takes a report every `interval` seconds, each read against a deadline, keeps the latest
as `report` (immutable, replaced wholesale) and logs each change of up/down; a subclass says how one
report is taken and what a down one holds.
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

    @property
    def taken_at(self) -> float: ...


R = TypeVar("R", bound=Report)


class Scheduled(Generic[R]):
    """A report taken every `interval` seconds on its own thread; `current()` is the latest.

    Each read runs on a thread of its own against `deadline`: a read that does not return in time
    (a hung NFS mount, a FIFO standing for a state file, a stuck kubelet) makes the report down at
    once, and no new read starts until it returns, so a stuck source holds one thread, never more.
    A report older than `max_age` is never served as current, and a schedule thread that died is
    started again; both show as the source being down.
    """

    def __init__(
        self, source: str, interval: float, first: R, clock: Callable[[], float], describe: str, deadline: float
    ) -> None:
        self.source = source
        self.interval = interval
        self.deadline = deadline
        self.max_age = 2 * interval + deadline + 1.0
        self.report = first
        self._clock = clock
        self._describe = describe
        self._logged_up: bool | None = None
        self._last_good = 0.0  # when a read last succeeded (clock seconds)
        self._stuck: tuple[threading.Thread, float] | None = None  # a read past its deadline, since when
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self, now: float, previous: R) -> R:
        """One blocking read turned into a report (an up one, or a down one for an expected failure)."""
        raise NotImplementedError

    def _down(self, now: float, previous: R, error: str) -> R:
        """The report when a read failed, was late, or is too old to serve."""
        raise NotImplementedError

    def read_once(self) -> R:
        """One read against the deadline; publishes and returns the new report."""
        now = self._clock()
        if self._stuck is not None and self._stuck[0].is_alive():
            report = self._down(now, self.report, f"a read has not returned for {now - self._stuck[1]:.0f} s")
        else:
            self._stuck = None
            report = self._read_with_deadline(now)
        if report.up:
            self._last_good = now
        self._publish(report)
        return report

    def _read_with_deadline(self, now: float) -> R:
        outcome: list[R | BaseException] = []

        def read() -> None:
            try:
                outcome.append(self._take(now, self.report))
            except Exception as error:  # a bug or an unexpected failure: the source is down, not dead
                outcome.append(error)

        try:
            thread = threading.Thread(target=read, name=f"{self.source}-read", daemon=True)
            thread.start()
        except RuntimeError as error:  # no thread could be made (RLIMIT_NPROC, RLIMIT_AS): try again next time
            return self._down(now, self.report, f"cannot start a read thread: {error}")
        thread.join(self.deadline)
        if thread.is_alive():
            self._stuck = (thread, now)
            return self._down(now, self.report, f"no answer within {self.deadline:g} s")
        result = outcome[0]
        if isinstance(result, BaseException):
            return self._down(now, self.report, f"{type(result).__name__}: {result}")
        return result

    def _publish(self, report: R) -> None:
        if report.up != self._logged_up:
            if report.up:
                log.info("attribution_source_up", source=self.source, reads=self._describe)
            else:
                log.warning("attribution_source_down", source=self.source, reads=self._describe, error=report.error)
            self._logged_up = report.up
        self.report = report

    def current(self) -> R:
        """The latest report, unless it is older than max_age (then a down one); restarts a dead
        schedule thread."""
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stop.is_set():
            log.error("attribution_thread_restarted", source=self.source)
            self.start()
        report, now = self.report, self._clock()
        if report.up and now - report.taken_at > self.max_age:
            report = self._down(now, report, f"no report for {now - report.taken_at:.0f} s")
            self._publish(report)
        return report

    def start(self) -> None:
        try:
            self._thread = threading.Thread(target=self._run, name=f"{self.source}-attribution", daemon=True)
            self._thread.start()
        except RuntimeError as error:
            log.error("attribution_thread_not_started", source=self.source, error=str(error))

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.read_once()
            except Exception as error:  # publishing must not end the schedule either
                log.error("attribution_read_failed", source=self.source, error=f"{type(error).__name__}: {error}")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.deadline + 1.0)


class ScheduledAttribution(Scheduled[AttributionReport]):
    def __init__(
        self,
        source: str,
        read: Callable[[], tuple[Claim, ...]],
        interval: float,
        keep_for: float = 60.0,
        clock: Callable[[], float] = time.time,
        describe: str = "",
        deadline: float = 2.0,
    ) -> None:
        first = AttributionReport(source, up=False, error="not read yet")
        super().__init__(source, interval, first, clock, describe, deadline)
        self.keep_for = keep_for
        self._read = read

    def _take(self, now: float, previous: AttributionReport) -> AttributionReport:
        try:
            claims = self._read()
        except AttributionReadError as error:
            return self._down(now, previous, str(error))
        log_claim_changes(self.source, previous.claims, claims)
        return AttributionReport(self.source, up=True, claims=claims, taken_at=now)

    def _down(self, now: float, previous: AttributionReport, error: str) -> AttributionReport:
        """Down; the last good claims are kept for keep_for after the last good read."""
        kept = previous.claims if self._last_good and now - self._last_good <= self.keep_for else ()
        log_claim_changes(self.source, previous.claims, kept)
        return AttributionReport(self.source, up=False, claims=kept, taken_at=now, error=error)


def log_claim_changes(source: str, before: Sequence[Claim], after: Sequence[Claim]) -> None:
    """One log line per claim that appeared or went away."""
    old, new = set(before), set(after)
    for event, claims in (("attribution_claim_added", new - old), ("attribution_claim_removed", old - new)):
        for claim in sorted(claims, key=repr):
            log.info(event, source=source, device=claim.device_id, resource=claim.resource, **dict(claim.labels))
