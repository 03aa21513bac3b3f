"""Sliding windows over the sampler's samples: a bounded ring per device, and min / max / mean of it.

The ring is the one mutable piece (one writer: the sampler's read of the device; readers copy it under its
lock). Everything computed from it is an immutable value: a RingView copied out of the ring,
then window_stats() over the view, a pure function (whose stats are computed from the copy when
first read, so what nobody reads costs nothing). Memory per device is fixed at construction:
(1 + len(SAMPLER_FIELDS)) x 8 bytes per slot, slots = window / sampler interval (--fast.interval) + 2.

Means: where the firmware keeps an accumulator the mean is the accumulator's change over the
device's own clock (system_clock_counter) across the window, which is exact whatever the sampling
— energy on every ASIC gives the mean power; on MI300-class tables gfx_activity_acc and
mem_activity_acc (accumulated %·s) give the mean busy. Elsewhere the mean is the average of the
samples, which are taken at a fixed interval. min / max are over the samples in the window.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
import threading
from array import array
from collections.abc import ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass

from exporter.model import DeviceWindow, WindowStat
from exporter.sources.gpu_metrics.sampler_fields import SAMPLER_FIELD_INDEX, SAMPLER_FIELDS

WIDTH = len(SAMPLER_FIELDS)
SLOT_BYTES = 8 * (1 + WIDTH)  # one float64 timestamp plus one float64 per sampler field
_NAN = math.nan
_U32 = float(1 << 32)

# The families exported as windows; "acc" fields only feed the exact means.
WINDOW_FAMILIES = ("temperature", "power", "busy", "clock")
_WINDOW_FIELDS = {sampled: i for i, sampled in enumerate(SAMPLER_FIELDS) if sampled[0] in WINDOW_FAMILIES}
_ENERGY = SAMPLER_FIELD_INDEX[("acc", "energy_joules")]
_CLOCK = SAMPLER_FIELD_INDEX[("acc", "clock_seconds")]
# field -> (its accumulator's field, how it wraps, what one accumulated unit per second is worth)
_EXACT_MEANS: dict[int, tuple[int, float | None, float]] = {
    SAMPLER_FIELD_INDEX[("power", "socket")]: (_ENERGY, None, 1.0),  # J / s = W; u64 ticks never wrap
    SAMPLER_FIELD_INDEX[("busy", "gfx")]: (
        SAMPLER_FIELD_INDEX[("acc", "gfx_activity")],
        _U32,
        0.01,
    ),  # %·s / s -> ratio
    SAMPLER_FIELD_INDEX[("busy", "memory")]: (SAMPLER_FIELD_INDEX[("acc", "mem_activity")], _U32, 0.01),
}


def ring_slots(window_seconds: float, interval_seconds: float) -> int:
    """Slots for a window: every sample in it, plus the one before it opens (the base of the exact means)."""
    return math.ceil(window_seconds / interval_seconds) + 2


@dataclass(frozen=True, slots=True)
class RingView:
    """The samples of one ring, oldest first, copied out of it: times (unix s) and rows of WIDTH floats."""

    times: array = dataclasses.field(default_factory=lambda: array("d"))
    rows: array = dataclasses.field(default_factory=lambda: array("d"))  # len(times) x WIDTH, row-major

    def column(self, index: int, first: int = 0) -> list[float]:
        return self.rows[first * WIDTH + index :: WIDTH].tolist()


class SampleRing:
    """A fixed-size ring of the sampler's samples of one device (one writer at a time, readers copy)."""

    def __init__(self, slots: int) -> None:
        if slots < 2:
            raise ValueError("a sample ring needs at least 2 slots")
        self.slots = slots
        self._times = array("d", [_NAN]) * slots
        self._rows = array("d", [_NAN]) * (slots * WIDTH)
        self._next = 0  # slot the next sample goes to
        self._count = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held by the ring's sample storage (fixed for its lifetime)."""
        return self._times.itemsize * len(self._times) + self._rows.itemsize * len(self._rows)

    def __len__(self) -> int:
        return self._count

    def append(self, timestamp: float, values: Sequence[float]) -> None:
        """One sample: WIDTH floats (an array('d') is stored as it is, anything else converted)."""
        row = self._next
        if not isinstance(values, array):
            values = array("d", values)
        with self._lock:
            self._times[row] = timestamp
            self._rows[row * WIDTH : (row + 1) * WIDTH] = values
            self._next = row + 1 if row + 1 < self.slots else 0
            if self._count < self.slots:
                self._count += 1

    def view(self, since: float = -math.inf) -> RingView:
        """The samples taken at or after `since`, plus the newest one before it (oldest first).

        Copies only those (a window is about all of the ring, the timestamps are one small copy more).
        """
        with self._lock:
            count, end = self._count, self._next
            start = (end - count) % self.slots
            head = self.slots - start  # slots from start to the end of the storage
            times = (
                self._times[start : start + count]
                if count <= head
                else self._times[start:] + self._times[: count - head]
            )
            first = max(0, bisect.bisect_right(times, since) - 1)
            begin, count = (start + first) % self.slots, count - first
            head = self.slots - begin
            if count <= head:
                rows = self._rows[begin * WIDTH : (begin + count) * WIDTH]
            else:
                rows = self._rows[begin * WIDTH :] + self._rows[: (count - head) * WIDTH]
        return RingView(times[first:] if first else times, rows)


def window_stats(gpu: int, view: RingView, now: float, seconds: float) -> DeviceWindow:
    """min / max / mean over the samples of `view` taken in [now - seconds, now]."""
    inside = bisect.bisect_left(view.times, now - seconds)
    return DeviceWindow(gpu, len(view.times) - inside, WindowStats(view, inside))


class WindowStats(Mapping[tuple[str, str], WindowStat]):
    """(family, key) -> one field's stat over a view's samples from `first` on, for every field supplied.

    A field read by key (a rule reads one field of a device every cycle) is computed from the
    copied view when first read, then kept; iterating (a scrape renders every supplied field, every
    15 s or more) computes every field once and keeps the list. No lock: entries are only ever
    added, and two threads computing a field first both compute the same value.
    """

    __slots__ = ("_all", "_computed", "_first", "_view")

    def __init__(self, view: RingView, first: int) -> None:
        self._view, self._first = view, first
        self._computed: dict[tuple[str, str], WindowStat | None] = {}
        self._all: tuple[tuple[tuple[str, str], WindowStat], ...] | None = None

    def _stat(self, sampled: tuple[str, str]) -> WindowStat | None:
        if sampled not in self._computed:
            self._computed[sampled] = _field_stat(self._view, _WINDOW_FIELDS[sampled], self._first)
        return self._computed[sampled]

    def __getitem__(self, sampled: tuple[str, str]) -> WindowStat:
        stat = self._stat(sampled) if sampled in _WINDOW_FIELDS else None
        if stat is None:
            raise KeyError(sampled)
        return stat

    def supplied(self) -> tuple[tuple[tuple[str, str], WindowStat], ...]:
        """(field, stat) of every field supplied, in SAMPLER_FIELDS order."""
        if self._all is None:
            found = ((sampled, self._stat(sampled)) for sampled in _WINDOW_FIELDS)
            self._all = tuple((sampled, stat) for sampled, stat in found if stat is not None)
        return self._all

    def items(self) -> ItemsView[tuple[str, str], WindowStat]:
        return dict(self.supplied()).items()

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return (sampled for sampled, _ in self.supplied())

    def __len__(self) -> int:
        return len(self.supplied())

    def __repr__(self) -> str:
        return f"WindowStats({dict(self.supplied())!r})"


def _field_stat(view: RingView, index: int, first: int) -> WindowStat | None:
    """min / max / mean of one field over the view's samples from `first` on; None: none supplied it."""
    values = view.column(index, first)
    total = math.fsum(values)
    if total != total:  # NaN: some samples lack the value; the others still count
        values = [v for v in values if v == v]
        total = math.fsum(values)
    if not values:
        return None
    exact = _exact_mean(view, index)
    mean = exact if exact is not None else total / len(values)
    return WindowStat(min(values), max(values), mean, exact is not None)


def _exact_mean(view: RingView, index: int) -> float | None:
    """The mean of a field from its accumulator: Δaccumulator / Δdevice clock over the view."""
    spec = _EXACT_MEANS.get(index)
    if spec is None:
        return None
    accumulator, wrap, factor = spec
    accumulators, clocks = view.column(accumulator), view.column(_CLOCK)
    sums = list(map(operator.add, accumulators, clocks))  # NaN where either is missing
    carried = list(itertools.compress(range(len(sums)), map(operator.eq, sums, sums)))
    if len(carried) < 2:
        return None
    first_acc, first_clock = accumulators[carried[0]], clocks[carried[0]]
    last_acc, last_clock = accumulators[carried[-1]], clocks[carried[-1]]
    elapsed = last_clock - first_clock
    delta = last_acc - first_acc
    if wrap is not None:
        delta %= wrap
    if elapsed <= 0 or delta < 0:  # a clock that did not move, or a reset accumulator (driver reload)
        return None
    return delta / elapsed * factor
