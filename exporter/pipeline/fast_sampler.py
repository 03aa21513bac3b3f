"""The fast sampler: one gpu_metrics read per device every --fast.interval (default 100 ms).

Why a second loop beside the poller: a 1 s poll read by a 15 s scrape shows one value per 15 s,
so a 300 ms spike or a job busy half of each step is invisible. gpu_metrics alone carries the
temperatures, power, busy and clocks, in one read (one SMU round trip), so this loop reads only
that file and decodes only those fields (sources/gpu_metrics/channels.py), into a bounded ring per device that
the windows and the waveform API read.

It runs on its own thread, never on the event loop, with the poller's rules for hung devices:
each device has at most one read in flight; one reader thread drains a cycle's queue, and another
joins only when a read has run for `fan_out_after`, so a slow device delays nobody else; a device
whose read runs past the read deadline is marked down and skipped until that read returns — a hung
GPU costs one blocked thread, never a growing pile.
"""

from __future__ import annotations

import errno
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.model import (
    FAST_CYCLE_BUCKETS,
    DeviceIdentity,
    DeviceWindow,
    FastStats,
    Histogram,
    WindowSnapshot,
    frozen_map,
)
from exporter.pipeline.windows import SampleRing, ring_slots, window_stats
from exporter.sources.gpu_metrics import GpuMetricsError
from exporter.sources.gpu_metrics.channels import CHANNEL_INDEX, CHANNELS, channel_values
from exporter.sources.identity import measures_package_power

_POWER = CHANNEL_INDEX[("power", "socket")]
_ENERGY = CHANNEL_INDEX[("acc", "energy_joules")]


def read_gpu_metrics(path: str) -> bytes:
    """One open, one read, one close: gpu_metrics is at most a page and comes back in one read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


@dataclass(slots=True)
class _Device:
    """Mutable bookkeeping for one device, private to the sampler (windows copy out of it)."""

    gpu: int
    identity: DeviceIdentity
    path: str
    ring: SampleRing
    mask_power: bool
    busy: bool = False  # a read is running (possibly stuck) on a reader thread
    reading_since: float = 0.0
    timed_out: bool = False  # the running read has passed the deadline (counted once)
    samples: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class FastSampler:
    """Samples gpu_metrics of every tracked device on a fixed schedule, on its own threads."""

    def __init__(
        self,
        *,
        interval: float = 0.1,
        window: float = 15.0,
        read_timeout: float = 2.0,
        read: Callable[[str], bytes] = read_gpu_metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0 or window <= 0 or read_timeout <= 0:
            raise ValueError("fast interval, window and read timeout must be positive")
        self.interval = interval
        self.window = window
        self.read_timeout = read_timeout
        self.slots = ring_slots(window, interval)
        self._read = read
        self._clock = clock
        self._devices: dict[tuple[object, ...], _Device] = {}
        self._by_gpu: dict[int, _Device] = {}
        self._without_table: set[tuple[object, ...]] = set()
        self._lock = threading.Lock()  # guards the device set and the cycle histogram
        self._readers: _Readers | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._cycle_durations = Histogram(FAST_CYCLE_BUCKETS, (0,) * (len(FAST_CYCLE_BUCKETS) + 1))
        self.cycles = 0

    # -- which devices -----------------------------------------------------------------------
    def track(self, devices: Iterable[tuple[int, DeviceIdentity]]) -> None:
        """Follow this set of (gpu, identity): new ones get a ring, known ones keep theirs, gone ones go."""
        wanted = {}
        for gpu, identity in devices:
            key = identity.key
            # Checked once per device seen: a device with no table (a partition's platform device,
            # an old ASIC) is never sampled rather than failing ten times a second.
            new = key not in self._devices and key not in self._without_table
            if new and not os.path.exists(os.path.join(identity.device_dir, "gpu_metrics")):
                self._without_table.add(key)
            if key not in self._without_table:
                wanted[key] = (gpu, identity)
        with self._lock:
            if wanted.keys() == self._devices.keys() and all(self._devices[k].gpu == g for k, (g, _) in wanted.items()):
                return
            kept: dict[tuple[object, ...], _Device] = {}
            for key, (gpu, identity) in wanted.items():
                device = self._devices.get(key)
                if device is None:
                    device = _Device(
                        gpu=gpu,
                        identity=identity,
                        path=os.path.join(identity.device_dir, "gpu_metrics"),
                        ring=SampleRing(self.slots),
                        # the sources' rule: die 1 of an MI250X reads 0 W and 0 J, never a fake 0 W window
                        mask_power=not measures_package_power(identity),
                    )
                device.gpu = gpu
                kept[key] = device
            self._devices = kept
            self._by_gpu = {d.gpu: d for d in kept.values()}
            # One reader per device plus two: at most one read per device is ever in flight, so even
            # with every device hung two readers are free. Started up front: the count never changes
            # with load or hangs (a pool that grows on demand would add threads under CPU pressure).
            if self._readers is None:
                self._readers = _Readers()
            self._readers.grow_to(len(kept) + 2)

    @property
    def ring_bytes_per_device(self) -> int:
        return SampleRing(self.slots).nbytes

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fast-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._readers is not None:
            self._readers.close()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self.sample_once(until=next_tick + self.interval)
            next_tick += self.interval
            delay = next_tick - time.monotonic()
            if delay < 0:  # a slow cycle: skip the missed ticks instead of bursting
                next_tick = time.monotonic()
                delay = 0
            if self._stop.wait(delay):
                return

    def sample_once(self, until: float | None = None) -> float:
        """One fast cycle: read every device that is not stuck. Returns its duration (seconds).

        Waits for the cycle until it finishes or `until` (monotonic; default: the read deadline),
        whichever comes first; reads still running then finish on their thread and are recorded.
        """
        started = time.monotonic()
        with self._lock:
            devices = list(self._devices.values())
            executor = self._readers
        queued = []
        for device in devices:
            if device.busy:
                if not device.timed_out and started - device.reading_since >= self.read_timeout:
                    device.timed_out = True
                    device.errors["timeout"] = device.errors.get("timeout", 0) + 1
                continue  # still in the read it started: never pile another one on top
            queued.append(device)
        if not queued or executor is None:
            return 0.0
        cycle = _Cycle(queued, self)
        executor.submit(cycle.drain)
        deadline = started + self.read_timeout if until is None else min(until, started + self.read_timeout)
        fan_out_after = min(0.05, self.interval / 2, self.read_timeout / 4)
        while not cycle.finished.wait(min(fan_out_after, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                break
            if cycle.needs_helper(fan_out_after):
                executor.submit(cycle.drain)
        duration = cycle.close()
        if duration is None:
            duration = time.monotonic() - started
        with self._lock:
            self._cycle_durations = self._cycle_durations.observe(duration)
            self.cycles += 1
        return duration

    def _read_device(self, device: _Device) -> None:
        try:
            blob = self._read(device.path)
            values = channel_values(blob)
        except GpuMetricsError:
            device.errors["unreadable_table"] = device.errors.get("unreadable_table", 0) + 1
            return
        except OSError as error:
            reason = "gone" if error.errno in (errno.ENODEV, errno.ENXIO, errno.ENOENT) else "read_error"
            device.errors[reason] = device.errors.get(reason, 0) + 1
            return
        if device.mask_power:
            masked = list(values)
            masked[_POWER] = masked[_ENERGY] = math.nan
            values = tuple(masked)
        device.ring.append(self._clock(), values)
        device.samples += 1

    # -- what is published ----------------------------------------------------------------------
    def windows(self, now: float | None = None) -> WindowSnapshot:
        """Every device's window as of `now` (default: the clock), with the sampler's counters."""
        now = self._clock() if now is None else now
        with self._lock:
            devices = sorted(self._devices.values(), key=lambda d: d.gpu)
            durations = self._cycle_durations
        windows: list[DeviceWindow] = []
        monotonic = time.monotonic()
        for device in devices:
            if device.busy and monotonic - device.reading_since >= self.read_timeout:
                continue  # hung: its window would show the values from before it hung as current
            windows.append(window_stats(device.gpu, device.ring.view(now - self.window), now, self.window))
        stats = FastStats(
            samples=frozen_map({d.gpu: d.samples for d in devices}),
            read_errors=frozen_map({(d.gpu, reason): n for d in devices for reason, n in dict(d.errors).items()}),
            cycle_durations=durations,
        )
        return WindowSnapshot(now, self.window, self.interval, tuple(windows), stats)

    def waveform(self, gpu: int, seconds: float, now: float | None = None) -> dict[str, Any] | None:
        """The samples of the last `seconds` of one device, as JSON-ready columns; None: no such gpu."""
        with self._lock:
            device = self._by_gpu.get(gpu)
        if device is None:
            return None
        now = self._clock() if now is None else now
        view = device.ring.view(now - seconds)
        first = next((i for i, t in enumerate(view.times) if t >= now - seconds), len(view.times))
        columns: dict[str, dict[str, list[float | None]]] = {"temperature": {}, "power": {}, "busy": {}}
        for index, (family, key) in enumerate(CHANNELS):
            if family in columns:
                values = view.channel(index, first)
                if any(v == v for v in values):
                    columns[family][key] = [v if v == v else None for v in values]
        return {
            "gpu": gpu,
            "pci_bus_id": device.identity.pci_bus_id,
            "interval_seconds": self.interval,
            "seconds": seconds,
            "timestamps": list(view.times[first:]),
            "temperatures_celsius": columns["temperature"],
            "power_watts": columns["power"].get("socket"),
            "busy_ratio": columns["busy"],
        }

    def gpus_sampled(self) -> Sequence[int]:
        with self._lock:
            return sorted(self._by_gpu)


class _Readers:
    """A fixed set of reader threads taking jobs from one queue (threads only ever added, never piled)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def grow_to(self, count: int) -> None:
        while len(self._threads) < count:
            thread = threading.Thread(target=self._work, name=f"fast-read-{len(self._threads)}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()  # _Cycle.drain never raises

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)  # a reader stuck in a hung read never takes its None: it is a daemon


class _Cycle:
    """The queue of one fast cycle, drained by one or more reader threads."""

    def __init__(self, devices: list[_Device], sampler: FastSampler) -> None:
        self._queue = deque(devices)
        self._sampler = sampler
        self._lock = threading.Lock()
        self._closed = False
        self._pending = len(devices)
        self._reading: dict[int, float] = {}  # id(device) -> when its read started
        self._started = time.monotonic()
        self._duration: float | None = None
        self.finished = threading.Event()

    def drain(self) -> None:
        while True:
            with self._lock:
                if self._closed or not self._queue:
                    return
                device = self._queue.popleft()
                device.busy = True
                device.timed_out = False
                device.reading_since = now = time.monotonic()
                self._reading[id(device)] = now
            try:
                self._sampler._read_device(device)
            except Exception:  # a bug must never kill the reader or leave the device busy
                device.errors["internal_error"] = device.errors.get("internal_error", 0) + 1
            with self._lock:
                device.busy = False
                del self._reading[id(device)]
                self._pending -= 1
                if self._pending == 0 and self._duration is None:
                    self._duration = time.monotonic() - self._started
                    self.finished.set()

    def needs_helper(self, slow_after: float) -> bool:
        """True when every running read has been at it for `slow_after` and devices still wait."""
        now = time.monotonic()
        with self._lock:
            return bool(self._queue) and all(now - t >= slow_after for t in self._reading.values())

    def close(self) -> float | None:
        """Stop handing out devices (unread ones wait for the next cycle); the duration if it finished."""
        with self._lock:
            self._closed = True
            return self._duration
