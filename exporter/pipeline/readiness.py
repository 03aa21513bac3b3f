"""Readiness and liveness: what /readyz and /healthz answer, from facts the stages report.

Ready (/readyz 200): a cycle has been published, the newest snapshot is younger than three poll
intervals (never less than one interval plus the read deadline, the longest a healthy cycle can
take when a device has just hung), and no stage is failing: the rules, the rendering of /metrics,
an Alertmanager sender. Each stage failure is counted (amdgpu_exporter_stage_failures_total).

A GPU that cannot be read does not make the exporter unready (it is serving the truth: the GPU is
down, amdgpu_up 0, and the pod must stay scraped to say so), but /readyz names it, from the health
verdict's own device_down checks (alerting/verdict.py), so the two never disagree about it.

Alive (/healthz 200): the poll loop has finished a cycle within the last five intervals (never
less than twice the read deadline plus one interval). A wedged loop is for the supervisor to restart.
"""

from __future__ import annotations

import threading
import time

from exporter.alerting.verdict import unreadable
from exporter.model import Published


class Readiness:
    """Stage failures and the poll loop's heartbeat; written by the stages, read by the web routes.

    Every age here is a duration on the monotonic clock (Snapshot.monotonic_at, time.monotonic()):
    a step of the wall clock (NTP, an operator's `date -s`) changes neither answer.
    """

    def __init__(self, interval: float = 1.0, read_timeout: float = 2.0) -> None:
        self.stale_after = max(3 * interval, interval + read_timeout)
        self.stuck_after = max(5 * interval, 2 * read_timeout + interval)
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._failing: dict[str, str] = {}  # stage -> its last error
        self.last_progress = time.monotonic()

    def progress(self) -> None:
        self.last_progress = time.monotonic()

    def failed(self, stage: str, error: str) -> bool:
        """Count one failure; True when the stage was not failing before (log it then)."""
        with self._lock:
            self._failures[stage] = self._failures.get(stage, 0) + 1
            new = stage not in self._failing
            self._failing[stage] = error
            return new

    def ok(self, stage: str) -> bool:
        """The stage ran fine; True when it was failing before."""
        with self._lock:
            return self._failing.pop(stage, None) is not None

    @property
    def failures(self) -> dict[str, int]:
        with self._lock:
            return dict(self._failures)

    @property
    def failing(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failing)

    def readiness(self, published: Published | None, now: float | None = None) -> tuple[bool, str]:
        """(ready, why); `now` is time.monotonic() (default: now)."""
        if published is None:
            return False, "waiting for the first poll cycle"
        age = (time.monotonic() if now is None else now) - published.snapshot.monotonic_at
        if age > self.stale_after:
            return False, f"the newest snapshot is {age:.1f} s old (more than {self.stale_after:g} s)"
        failing = self.failing
        if failing:
            stage, error = sorted(failing.items())[0]
            return False, f"stage {stage} is failing: {error}"
        down = list(unreadable(published.health))
        if down:
            named = "; ".join(f"gpu {gpu}: {reason}" for gpu, reason in down)
            return True, f"ready; not fit, cannot be read: {named}"
        return True, "ready"

    def liveness(self, now: float | None = None) -> tuple[bool, str]:
        """(alive, why); `now` is time.monotonic() (default: now)."""
        idle = (time.monotonic() if now is None else now) - self.last_progress
        if idle > self.stuck_after:
            return False, f"the poll loop has made no progress for {idle:.1f} s (more than {self.stuck_after:g} s)"
        return True, "ok"
