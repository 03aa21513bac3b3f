"""Poller: parallel reads, deadlines, a stuck read never re-issued, recovery without restart."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

from exporter.model import DeviceIdentity, Sample, Snapshot, SourceStats, frozen_map
from exporter.pipeline.poller import Poller
from exporter.sources.base import Source, SourceError
from tests.realtools import wait_until


class ScriptedSource(Source):
    """A source whose reads block on an event for chosen devices (a hung GPU) or fail."""

    name = "scripted"

    def __init__(self, count: int) -> None:
        self.devices = [
            DeviceIdentity(pci_bus_id=f"0000:{i + 1:02x}:00.0", card=f"card{i}", device_dir="") for i in range(count)
        ]
        self.hung: set[str] = set()
        self.failing: set[str] = set()
        self.release = threading.Event()
        self.calls: Counter[str] = Counter()
        self.rendezvous: threading.Barrier | None = None

    def discover(self):
        return self.devices

    def read(self, device: DeviceIdentity) -> Sample:
        self.calls[device.pci_bus_id] += 1
        if device.pci_bus_id in self.hung:
            self.release.wait()
        if device.pci_bus_id in self.failing:
            raise SourceError("io_error", "EIO")
        if self.rendezvous is not None:
            self.rendezvous.wait()
        return Sample(timestamp=time.time(), temperatures=frozen_map({"junction": 50.0}))

    def stats(self) -> SourceStats:
        return SourceStats()

    def close(self) -> None:
        self.release.set()


def test_a_slow_read_brings_in_another_reader() -> None:
    source = ScriptedSource(8)
    # Every read waits for a second read to be running beside it: on one reader thread none returns.
    source.rendezvous = threading.Barrier(2, timeout=10)
    poller = Poller(source, interval=1, read_timeout=30)
    poller.discover()
    snapshot = asyncio.run(poller.poll_once())
    poller.close()
    assert all(d.up for d in snapshot.devices), [d.down_reason for d in snapshot.devices]
    assert [d.gpu for d in snapshot.devices] == list(range(8))


def test_hung_device_goes_down_is_not_reissued_and_comes_back() -> None:
    source = ScriptedSource(4)
    hung = source.devices[2].pci_bus_id
    source.hung.add(hung)
    # The hung read never returns by itself, so only it can miss the deadline; 2 s (the default)
    # leaves the healthy in-memory reads room on a loaded machine (0.2 s did not). Only the first
    # cycle waits it out: from the second on the hung device is "stuck", not read again.
    poller = Poller(source, interval=0.05, read_timeout=2.0)
    poller.discover()
    threads_before = threading.active_count()

    async def cycles(n: int):
        return [await poller.poll_once() for _ in range(n)]

    snapshots = asyncio.run(cycles(50))
    first, last = snapshots[0], snapshots[-1]
    assert [d.up for d in first.devices] == [True, True, False, True]
    assert first.devices[2].down_reason == "timeout"
    assert last.devices[2].down_reason == "stuck"
    assert last.devices[2].read_timeouts == 1
    assert source.calls[hung] == 1, "a stuck read must not be re-issued"
    assert source.calls[source.devices[0].pci_bus_id] == 50, "the others keep being read"
    assert threading.active_count() - threads_before <= len(source.devices) + 2
    source.hung.clear()
    source.release.set()  # the GPU answers again
    wait_until(lambda: not any(t.read_in_flight for t in poller._devices))
    after = asyncio.run(cycles(2))
    assert after[-1].devices[2].up
    poller.close()


def test_read_errors_are_counted_by_reason() -> None:
    source = ScriptedSource(2)
    source.failing.add(source.devices[1].pci_bus_id)
    poller = Poller(source, interval=1, read_timeout=1)
    poller.discover()

    async def cycles():
        return [await poller.poll_once() for _ in range(3)]

    snapshots = asyncio.run(cycles())
    poller.close()
    bad = snapshots[-1].devices[1]
    assert not bad.up and bad.down_reason == "io_error" and bad.read_errors["io_error"] == 3
    assert snapshots[-1].devices[0].up


def test_vanished_device_is_kept_and_marked_gone() -> None:
    source = ScriptedSource(3)
    poller = Poller(source, interval=1, read_timeout=1)
    poller.discover()
    source.devices = source.devices[:2]
    poller.discover()
    snapshot = asyncio.run(poller.poll_once())
    poller.close()
    assert len(snapshot.devices) == 3
    assert snapshot.devices[2].down_reason == "gone" and not snapshot.devices[2].up


def test_run_loop_publishes_every_cycle_in_order_and_stops() -> None:
    source = ScriptedSource(2)
    seen = []
    poller = Poller(source, interval=0.01, read_timeout=0.5)
    poller.discover()

    def on_snapshot(snapshot: Snapshot) -> None:
        seen.append(snapshot)
        if len(seen) == 5:
            stop.set()

    poller.on_snapshot = on_snapshot
    stop = asyncio.Event()
    asyncio.run(asyncio.wait_for(poller.run(stop), 30))
    poller.close()
    assert [s.cycle for s in seen] == [1, 2, 3, 4, 5]  # the loop ends on the stop, not a cycle later
    assert source.calls == {d.pci_bus_id: 5 for d in source.devices}
