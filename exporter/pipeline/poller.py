"""The poll loop: every device read in parallel, off the event loop, each against a deadline.

Why poll at all (instead of reading at scrape time): most amdgpu reads are SMU round trips
serialised by a driver lock; several Prometheus servers or ad-hoc curls would multiply them; the
in-daemon rules need a steady sample stream; and a hung read must never hang a scrape.

Default interval 1 s: one gpu_metrics read per GCD per cycle is one SMU round trip, cheap enough
that a 16-GCD node spends a few milliseconds a second on it, and 1 s resolves the thermal rule's
for-duration and the compute/communication waveform far better than a 15 s scrape could.

A device whose read misses its deadline is marked down, and its stuck read is NOT re-issued
until that read returns: a hung GPU costs exactly one blocked thread, never a growing pile.
Reader and discovery threads are daemon threads (exporter/threads.py): a read stuck in the
driver never holds up the process's exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample, Snapshot
from exporter.pipeline.counters import CounterState, continue_counters
from exporter.pipeline.known_devices import KnownDevices, TrackedDevice
from exporter.sources.base import Source, SourceError
from exporter.sources.plausible import within_series_cap, without_implausible
from exporter.threads import DaemonPool

log = get_logger("exporter.pipeline.poller")


class Poller:
    def __init__(
        self,
        source: Source,
        *,
        interval: float = 1.0,
        read_timeout: float = 2.0,
        discovery_interval: float = 300.0,
        on_snapshot: Callable[[Snapshot], None] | None = None,
        source_name: str = "",
    ) -> None:
        if interval <= 0 or read_timeout <= 0:
            raise ValueError("interval and read timeout must be positive")
        self.source = source
        self.interval = interval
        self.read_timeout = read_timeout
        self.discovery_interval = discovery_interval
        # A discovery reads every card's identity against the read deadline (the sysfs source), so
        # one that runs past this is stuck in something else: it is waited for, never re-issued.
        self.discovery_deadline = max(10.0, read_timeout * 5)
        self.on_snapshot = on_snapshot
        self.source_name = source_name or source.name
        # A source that checked every value as it read it (the sysfs source) says so; any other
        # source's samples (a library's numbers) are judged here.
        self._values_checked = source.values_checked
        self._devices = KnownDevices()
        self._readers = DaemonPool(2, "read")
        # Discovery has its own single thread: never two at once, never on the poll path.
        self._discoverer = DaemonPool(1, "discovery")
        self._discovery: concurrent.futures.Future[Sequence[DeviceIdentity]] | None = None
        self._discovery_started = 0.0
        self._discovery_stuck_logged = False
        self._last_discovery = 0.0
        self._rediscover_soon = False  # a partition's read found it gone: rediscover before judging it
        self._cycle = 0
        self.discoveries = 0
        self.discovery_failures = 0

    # -- discovery -------------------------------------------------------------------------
    def discover(self) -> Sequence[DeviceIdentity]:
        """Blocking discovery, merged into the known devices (tests and tools; the daemon uses discover_within)."""
        found = list(self.source.discover())
        self._merge(found)
        return found

    async def discover_within(self, deadline: float) -> Sequence[DeviceIdentity] | None:
        """Discovery on its own thread, merged here on the event loop; None if it missed `deadline` seconds."""
        future = self._start_discovery()
        try:
            found = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), deadline)
        except TimeoutError:
            return None
        self._finish_discovery()
        return found

    def _start_discovery(self) -> concurrent.futures.Future[Sequence[DeviceIdentity]]:
        if self._discovery is None:
            self._discovery = self._discoverer.submit(lambda: list(self.source.discover()))
            self._discovery_started = time.monotonic()
            self._discovery_stuck_logged = False
        return self._discovery

    def _finish_discovery(self) -> None:
        """Merge a finished discovery (on the event loop, between cycles); log one that is overdue."""
        future = self._discovery
        if future is None:
            return
        if not future.done():
            overdue = time.monotonic() - self._discovery_started
            if overdue > self.discovery_deadline and not self._discovery_stuck_logged:
                self._discovery_stuck_logged = True
                self.discovery_failures += 1
                log.warning("discovery_stuck", running_seconds=round(overdue, 1), deadline=self.discovery_deadline)
            return
        self._discovery = None
        self._last_discovery = time.monotonic()
        try:
            found = future.result()
        except Exception as error:  # keep polling the devices we know
            self.discovery_failures += 1
            log.warning("rediscovery_failed", error=str(error) or type(error).__name__)
            return
        self._merge(found)

    def _merge(self, found: Sequence[DeviceIdentity]) -> None:
        incomplete = frozenset(d.pci_bus_id for d in found if not d.complete)
        known_bdfs = {t.identity.pci_bus_id for t in self._devices}
        self._devices.merge([d for d in found if d.complete or d.pci_bus_id not in known_bdfs], incomplete=incomplete)
        self._last_discovery = time.monotonic()
        self._rediscover_soon = False
        self.discoveries += 1
        self._readers.resize(len(self._devices) + 2)

    def _discovery_due(self) -> bool:
        if self._discovery is not None:
            return False
        every = self.discovery_interval
        if any(not t.identity.complete and t.present for t in self._devices):
            # A card that could not be identified in time: try again soon, not in five minutes.
            every = min(every, max(self.interval, self.read_timeout) * 5)
        # A source that knows its devices changed (an MI300 partition mode switch) says so.
        due = time.monotonic() - self._last_discovery >= every or self._rediscover_soon
        return due or self.source.needs_rediscovery()

    @property
    def device_count(self) -> int:
        return len(self._devices)

    # -- one cycle -------------------------------------------------------------------------
    async def poll_once(self) -> Snapshot:
        """Read every present device once, each against the read deadline.

        One reader thread drains the cycle's queue: a healthy read is a few tens of microseconds,
        and one thread hand-off per cycle costs far less than one per device (GIL and futex
        traffic dominated when every device had its own task). A read that runs longer than
        `_fan_out_after` starts another reader for the rest of the queue, so slow devices are
        still read in parallel and one hung device delays nobody else.
        """
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        queued: list[TrackedDevice] = []
        for tracked in list(self._devices):
            if not tracked.present:
                continue
            # "stuck": still in the read we gave up on; do not pile another read on top of it.
            reason = "identify_timeout" if not tracked.identity.complete else "stuck" if tracked.read_in_flight else ""
            if reason:
                tracked.up = False
                tracked.down_reason = reason
            else:
                queued.append(tracked)
        if queued:
            cycle = _Cycle(queued, self.source, loop)
            self._readers.submit(cycle.drain)
            deadline = started + self.read_timeout
            fan_out_after = min(0.05, self.read_timeout / 4)
            while not cycle.finished.done():
                now = time.monotonic()
                if now >= deadline:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(cycle.finished), min(fan_out_after, deadline - now))
                if not cycle.finished.done() and cycle.needs_helper(fan_out_after):
                    log.debug("reader_added", cycle=self._cycle + 1, slow_after=fan_out_after)
                    self._readers.submit(cycle.drain)
            for tracked, outcome in cycle.close():
                if outcome is None:
                    was = (tracked.up, tracked.down_reason)
                    tracked.up = False
                    tracked.down_reason = "timeout"
                    tracked.read_timeouts += 1
                    if was != (False, "timeout"):
                        log.warning(
                            "read_timeout",
                            gpu=tracked.gpu,
                            pci_bus_id=tracked.identity.pci_bus_id,
                            timeout=self.read_timeout,
                        )
                else:
                    self._record_result(tracked, outcome, started)
        self._cycle += 1
        return self._snapshot(time.monotonic() - started)

    def _record_result(self, tracked: TrackedDevice, outcome: Sample | BaseException, read_at: float) -> None:
        """One device's read of the cycle that started at `read_at` (time.monotonic())."""
        if isinstance(outcome, Sample):
            if outcome.file_errors:
                _add_counts(tracked.file_errors, outcome.file_errors)
            if not self._values_checked:
                outcome, rejected = without_implausible(outcome)
                _add_counts(tracked.file_errors, {(field, "implausible"): n for field, n in rejected.items()})
            outcome, dropped = within_series_cap(outcome)
            if dropped:
                _add_counts(tracked.file_errors, {(field, "series_cap"): n for field, n in dropped.items()})
            was_down = not tracked.up and tracked.sample is not None
            if tracked.counters is None:
                tracked.counters = CounterState()
            tracked.sample = continue_counters(tracked.counters, tracked.identity, outcome, read_at)
            tracked.up = True
            tracked.down_reason = ""
            tracked.vanishing = ""
            if was_down:
                log.info("device_recovered", gpu=tracked.gpu, pci_bus_id=tracked.identity.pci_bus_id)
            return
        error = outcome
        reason = error.reason if isinstance(error, SourceError) else type(error).__name__
        if reason == "gone" and tracked.identity.partition > 0 and tracked.vanishing != "checked":
            # Its socket may have switched partition mode: a rediscovery says whether it left (then it
            # is dropped, never judged down) before its read failure counts.
            if not tracked.vanishing:
                tracked.vanishing = "asked"
                self._rediscover_soon = True
            return
        if isinstance(error, SourceError):
            _add_counts(tracked.file_errors, error.file_errors)
        tracked.read_errors[reason] = tracked.read_errors.get(reason, 0) + 1
        if tracked.up or tracked.down_reason != reason:
            log.warning(
                "read_failed", gpu=tracked.gpu, pci_bus_id=tracked.identity.pci_bus_id, reason=reason, error=str(error)
            )
        tracked.up = False
        tracked.down_reason = reason

    def _snapshot(self, duration: float) -> Snapshot:
        return Snapshot(
            taken_at=time.time(),
            monotonic_at=time.monotonic(),
            devices=self._devices.states(),
            poll_duration_seconds=duration,
            source=self.source_name,
            cycle=self._cycle,
            source_stats=self.source.stats(),
            discoveries=self.discoveries,
            discovery_failures=self.discovery_failures,
        )

    # -- the loop --------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Poll every `interval` seconds on a fixed schedule (no drift) until `stop` is set.

        Rediscovery runs beside the loop on its own thread; its result is merged here, between
        two cycles, so the device set never changes while a cycle walks it.
        """
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while not stop.is_set():
            self._finish_discovery()
            if self._discovery_due():
                self._start_discovery()
            snapshot = await self.poll_once()
            if self.on_snapshot is not None:
                try:
                    self.on_snapshot(snapshot)
                except Exception:  # a bug downstream must not stop polling
                    log.exception("snapshot_handler_failed")
            next_tick += self.interval
            delay = next_tick - loop.time()
            if delay < 0:  # a slow cycle: skip the missed ticks instead of bursting
                next_tick = loop.time()
                delay = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    def close(self) -> None:
        self._readers.close()
        self._discoverer.close()
        self.source.close()


def _add_counts(totals: dict[tuple[str, str], int], counts: Mapping[tuple[str, str], int]) -> None:
    for key, count in counts.items():
        totals[key] = totals.get(key, 0) + count


class _Cycle:
    """The queue of one poll cycle, drained by one or more reader threads."""

    def __init__(self, devices: list[TrackedDevice], source: Source, loop: asyncio.AbstractEventLoop) -> None:
        self._queue = deque(devices)
        self._source = source
        self._loop = loop
        self._lock = threading.Lock()
        self._closed = False
        self._outcomes: dict[int, Sample | BaseException] = {}
        self._reading: dict[int, float] = {}  # id(tracked) -> when its read started
        self._order = devices
        self.finished: asyncio.Future[None] = loop.create_future()

    def drain(self) -> None:
        done: TrackedDevice | None = None  # the device just read, whose outcome is stored with the next pop
        outcome: Sample | BaseException | None = None
        while True:
            # One lock round per device: store the last outcome and take the next device together.
            with self._lock:
                if done is not None:
                    done.read_in_flight = False
                    del self._reading[id(done)]
                    if not self._closed:  # else: a late answer from a read the cycle gave up on, dropped
                        self._outcomes[id(done)] = outcome  # type: ignore[assignment]
                        if len(self._outcomes) == len(self._order):
                            self._loop.call_soon_threadsafe(_set_done, self.finished)
                if self._closed or not self._queue:
                    return
                tracked = self._queue.popleft()
                tracked.read_in_flight = True
                self._reading[id(tracked)] = time.monotonic()
            try:
                outcome = self._source.read(tracked.identity)
            except Exception as error:  # recorded per device; never kills the reader
                outcome = error
            done = tracked

    def needs_helper(self, slow_after: float) -> bool:
        """True when every running read has been at it for `slow_after` and devices still wait."""
        now = time.monotonic()
        with self._lock:
            return bool(self._queue) and all(now - t >= slow_after for t in self._reading.values())

    def close(self) -> list[tuple[TrackedDevice, Sample | BaseException | None]]:
        """Stop handing out devices; every device's outcome, None where its read did not finish (or start)."""
        with self._lock:
            self._closed = True
            return [(t, self._outcomes.get(id(t))) for t in self._order]


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
