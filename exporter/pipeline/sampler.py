"""The sampler: one gpu_metrics read per device every --fast.interval (default 100 ms).

Why a second loop beside the poller: a 1 s poll read by a 15 s scrape shows one value per 15 s,
so a 300 ms spike or a job busy half of each step is invisible. gpu_metrics alone carries the
temperatures, power, busy and clocks, in one read (one SMU round trip), so this loop reads only
that file and decodes only those fields (sources/gpu_metrics/sampler_fields.py), into a bounded ring per device that
the windows and the waveform API read.

One thread reads every device in turn, never on the event loop: a healthy read costs microseconds,
so a cycle handed to other threads would cost more in wake-ups than in reads. The poller's rules for
hung devices hold: a watcher looks every `watch_every` seconds, and a read running for `slow_after`
is moved aside (its thread is left to finish it; a new loop goes on with the other devices); its
device is skipped until that read returns, and counted down once the read passes the read
deadline. A hung GPU costs one blocked thread, never a growing pile.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.model import DeviceIdentity, DeviceWindow, SamplerStats, WindowSnapshot, frozen_map
from exporter.pipeline.windows import SampleRing, ring_slots, window_stats
from exporter.sources.gpu_metrics import GpuMetricsError
from exporter.sources.gpu_metrics.sampler_fields import SAMPLER_FIELD_INDEX, SAMPLER_FIELDS, sampler_values
from exporter.sources.identity import measures_package_power
from exporter.sources.sysfs.files import keepable
from exporter.threads import DaemonPool

_POWER = SAMPLER_FIELD_INDEX[("power", "socket")]
_ENERGY = SAMPLER_FIELD_INDEX[("acc", "energy_joules")]


def read_gpu_metrics(path: str) -> bytes:
    """One open, one read, one close: gpu_metrics is at most a page and comes back in one read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _read_kept(device: _Device) -> bytes:
    """The device's table re-read in place: its descriptor kept open, read from offset 0 (pread).

    A read from offset 0 of an open sysfs attribute runs its show() again (kernfs regenerates the
    text, or the table, at every read from the start: Documentation/filesystems/sysfs.rst's way to
    re-read after poll() is to seek to 0 and read), so this reads what open, read, close would, for
    one system call instead of three, and without the path walk. The path is opened again when the
    file was replaced (fstat: no longer linked) or a read failed; a device that went away at all
    is a new device to the sampler (track), with a descriptor of its own.
    """
    fd = device.fd
    if fd is not None and not keepable(fd):
        _close(device)
        fd = None
    if fd is None:
        fd = os.open(device.path, os.O_RDONLY | os.O_CLOEXEC)
        if not keepable(fd):  # not a regular file (a test's pipe): read the ordinary way, not kept
            try:
                return os.read(fd, 65536)
            finally:
                os.close(fd)
        device.fd = fd
    try:
        return os.pread(fd, 65536, 0)
    except OSError:
        _close(device)
        raise
    finally:
        if device.dropped:
            _close(device)


def _close(device: _Device) -> None:
    fd, device.fd = device.fd, None
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


@dataclass(slots=True)
class _Device:
    """Mutable bookkeeping for one device, private to the sampler (windows copy out of it)."""

    gpu: int
    identity: DeviceIdentity
    path: str
    ring: SampleRing
    mask_power: bool
    fd: int | None = None  # gpu_metrics kept open, re-read from offset 0 (the default read only)
    dropped: bool = False  # no longer tracked: its descriptor is closed by the sampler's loop, never under a read
    reading_since: float | None = None  # monotonic start of the read running now (possibly stuck)
    timed_out: bool = False  # the running read has passed the deadline (counted once)
    samples: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class Sampler:
    """Samples gpu_metrics of every tracked device on a fixed schedule, on one thread."""

    def __init__(
        self,
        *,
        interval: float = 0.1,
        window: float = 15.0,
        read_timeout: float = 2.0,
        read: Callable[[str], bytes] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0 or window <= 0 or read_timeout <= 0:
            raise ValueError("sampler interval, window and read timeout must be positive")
        self.interval = interval
        self.window = window
        self.read_timeout = read_timeout
        self.slots = ring_slots(window, interval)
        # A healthy read takes microseconds; one running this long is moved aside at the next look,
        # so a hung device holds the others up for at most watch_every + slow_after, once.
        self.slow_after = min(0.05, interval / 2, read_timeout / 4)
        self.watch_every = min(0.25, read_timeout / 8)
        self._read = read  # None: each device's table kept open and re-read in place (_read_kept)
        # Samples are stamped on the monotonic clock, so a step of the wall clock can neither
        # stretch a window nor make a waveform run backwards; the waveform is shown on the wall
        # clock with one offset per answer.
        self._clock = clock
        self._wall_clock = wall_clock
        self._devices: dict[tuple[object, ...], _Device] = {}
        self._by_gpu: dict[int, _Device] = {}
        self._without_table: set[tuple[object, ...]] = set()
        self._lock = threading.Lock()  # guards the device set and the cycle histogram
        # The loop, the watcher, and at most one stuck read per device (grown by track()).
        self._pool = DaemonPool(2, "sampler")
        self._loop = 0  # which loop reads; one moved aside ends after its stuck read
        self._running: concurrent.futures.Future[None] | None = None
        self._reading: _Device | None = None  # the device the current loop is reading
        self._stop = threading.Event()
        self._dropped: list[_Device] = []  # devices no longer tracked whose descriptor the loop closes
        self._cycle_durations = SamplerStats().cycle_durations  # empty, over the sampler cycle buckets
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
            self._dropped += [d for key, d in self._devices.items() if kept.get(key) is not d]
            for device in self._dropped:
                device.dropped = True
            self._devices = kept
            self._by_gpu = {d.gpu: d for d in kept.values()}
        self._pool.resize(len(kept) + 2)

    @property
    def ring_bytes_per_device(self) -> int:
        return SampleRing(self.slots).nbytes

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._running is None:
            self._running = self._pool.submit(self._run, self._loop)
            self._pool.submit(self._watch)

    def stop(self) -> None:
        """Stop sampling; waits (up to the read deadline) for the cycle under way to end."""
        self._stop.set()
        if self._running is not None:
            with contextlib.suppress(TimeoutError):
                self._running.result(timeout=self.read_timeout)
        self._pool.close()
        self._close_all()

    def _run(self, loop: int) -> None:
        next_tick = time.monotonic()
        while True:
            self.sample_once(loop)
            if loop != self._loop:
                return  # moved aside while stuck in a read: another loop has taken over
            next_tick += self.interval
            delay = next_tick - time.monotonic()
            if delay < 0:  # a slow cycle: skip the missed ticks instead of bursting
                next_tick = time.monotonic()
                delay = 0
            if self._stop.wait(delay):
                return

    def _watch(self) -> None:
        """A read running for `slow_after` is left to its thread; a new loop goes on without it."""
        while not self._stop.wait(self.watch_every):
            device = self._reading
            since = device.reading_since if device is not None else None
            if since is not None and time.monotonic() - since >= self.slow_after:
                self._loop += 1
                self._reading = None
                self._running = self._pool.submit(self._run, self._loop)

    def sample_once(self, loop: int | None = None) -> float:
        """One cycle on the calling thread: every device not stuck in an earlier read, in turn.

        Returns its duration (seconds); a cycle whose loop was moved aside ends after its stuck read.
        """
        started = time.monotonic()
        with self._lock:
            devices = list(self._devices.values())
            dropped, self._dropped = self._dropped, []
        for device in dropped:  # on the loop's thread, so never under a read of this loop
            if device.reading_since is None:
                _close(device)
            else:  # its read is stuck: closed after it returns
                with self._lock:
                    self._dropped.append(device)
        for device in devices:
            since = device.reading_since
            if since is not None:  # still in the read it started: never pile another one on top
                if not device.timed_out and started - since >= self.read_timeout:
                    device.timed_out = True
                    device.errors["timeout"] = device.errors.get("timeout", 0) + 1
                continue
            device.reading_since = time.monotonic()
            self._reading = device
            try:
                self._read_device(device)
            except Exception:  # a bug must never end the loop or leave the device stuck
                device.errors["internal_error"] = device.errors.get("internal_error", 0) + 1
            device.reading_since = None
            device.timed_out = False
            if loop is not None and loop != self._loop:
                return 0.0
        self._reading = None
        duration = time.monotonic() - started
        with self._lock:
            self._cycle_durations = self._cycle_durations.observe(duration)
            self.cycles += 1
        return duration

    def _read_device(self, device: _Device) -> None:
        try:
            blob = self._read(device.path) if self._read is not None else _read_kept(device)
            values = sampler_values(blob)
        except GpuMetricsError:
            device.errors["unreadable_table"] = device.errors.get("unreadable_table", 0) + 1
            return
        except OSError as error:
            reason = "gone" if error.errno in (errno.ENODEV, errno.ENXIO, errno.ENOENT) else "read_error"
            device.errors[reason] = device.errors.get(reason, 0) + 1
            return
        if device.mask_power:
            values[_POWER] = values[_ENERGY] = math.nan
        device.ring.append(self._clock(), values)
        device.samples += 1

    def _close_all(self) -> None:
        """Close every kept descriptor once the loop has ended (a read still stuck keeps its own)."""
        with self._lock:
            devices = [*self._devices.values(), *self._dropped]
        for device in devices:
            if device.reading_since is None:
                _close(device)

    # -- what is published ----------------------------------------------------------------------
    def windows(self, now: float | None = None) -> WindowSnapshot:
        """Every device's window as of `now` (monotonic seconds, default: now), with the sampler's counters."""
        now = self._clock() if now is None else now
        with self._lock:
            devices = sorted(self._devices.values(), key=lambda d: d.gpu)
            durations = self._cycle_durations
        windows: list[DeviceWindow] = []
        monotonic = time.monotonic()
        for device in devices:
            since = device.reading_since
            if since is not None and monotonic - since >= self.read_timeout:
                continue  # hung: its window would show the values from before it hung as current
            windows.append(window_stats(device.gpu, device.ring.view(now - self.window), now, self.window))
        stats = SamplerStats(
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
        offset = self._wall_clock() - self._clock()
        now = self._clock() if now is None else now
        view = device.ring.view(now - seconds)
        first = next((i for i, t in enumerate(view.times) if t >= now - seconds), len(view.times))
        columns: dict[str, dict[str, list[float | None]]] = {"temperature": {}, "power": {}, "busy": {}}
        for index, (family, key) in enumerate(SAMPLER_FIELDS):
            if family in columns:
                values = view.column(index, first)
                if any(v == v for v in values):
                    columns[family][key] = [v if v == v else None for v in values]
        return {
            "gpu": gpu,
            "pci_bus_id": device.identity.pci_bus_id,
            "interval_seconds": self.interval,
            "seconds": seconds,
            "timestamps": [t + offset for t in view.times[first:]],
            "temperatures_celsius": columns["temperature"],
            "power_watts": columns["power"].get("socket"),
            "busy_ratio": columns["busy"],
        }

    def gpus_sampled(self) -> Sequence[int]:
        with self._lock:
            return sorted(self._by_gpu)
