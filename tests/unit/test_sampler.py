"""Sample rings, window statistics and the sampler's rules for slow and hung devices."""

from __future__ import annotations

import math
import struct
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.abi import gpu_metrics as layouts
from exporter.model import DeviceIdentity
from exporter.pipeline.sampler import Sampler
from exporter.pipeline.windows import SLOT_BYTES, WIDTH, RingView, SampleRing, ring_slots, window_stats
from exporter.sources.gpu_metrics.sampler_fields import SAMPLER_FIELD_INDEX, SAMPLER_FIELDS
from tests.realtools import wait_until

NAN = math.nan
JUNCTION = SAMPLER_FIELD_INDEX[("temperature", "junction")]
POWER = SAMPLER_FIELD_INDEX[("power", "socket")]
GFX = SAMPLER_FIELD_INDEX[("busy", "gfx")]
ENERGY = SAMPLER_FIELD_INDEX[("acc", "energy_joules")]
GFX_ACC = SAMPLER_FIELD_INDEX[("acc", "gfx_activity")]
CLOCK = SAMPLER_FIELD_INDEX[("acc", "clock_seconds")]


def row(**values: float) -> tuple[float, ...]:
    out = [NAN] * WIDTH
    names = {"junction": JUNCTION, "power": POWER, "gfx": GFX, "energy": ENERGY, "gfx_acc": GFX_ACC, "clock": CLOCK}
    for name, value in values.items():
        out[names[name]] = value
    return tuple(out)


# --- the ring ----------------------------------------------------------------------------------


def test_ring_keeps_the_newest_slots_oldest_first_across_the_wrap() -> None:
    ring = SampleRing(4)
    for t in range(10):
        ring.append(float(t), row(junction=float(t)))
    view = ring.view()
    assert view.times.tolist() == [6.0, 7.0, 8.0, 9.0]
    assert view.column(JUNCTION) == [6.0, 7.0, 8.0, 9.0]
    assert len(ring) == 4
    assert ring.nbytes == 4 * SLOT_BYTES


def test_ring_view_since_keeps_the_sample_before_the_window_opens() -> None:
    ring = SampleRing(10)
    for t in range(8):
        ring.append(float(t), row(junction=float(t)))
    assert ring.view(since=4.5).times.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert ring.view(since=4.0).times.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert ring.view(since=100.0).times.tolist() == [7.0]


@given(st.integers(2, 12), st.lists(st.floats(-50, 150), max_size=40))
@settings(max_examples=200, deadline=None)
def test_ring_is_the_tail_of_what_was_appended(slots: int, values: list[float]) -> None:
    ring = SampleRing(slots)
    for t, value in enumerate(values):
        ring.append(float(t), row(junction=value))
    view = ring.view()
    assert view.column(JUNCTION) == values[-slots:]
    assert list(view.times) == [float(t) for t in range(len(values))][-slots:]


def test_ring_slots_cover_the_window_and_the_sample_before_it() -> None:
    assert ring_slots(15.0, 0.1) == 152
    assert ring_slots(1.0, 0.3) == 6


# --- window statistics -----------------------------------------------------------------------


def view_of(samples: list[tuple[float, tuple[float, ...]]]) -> RingView:
    ring = SampleRing(len(samples) + 1)
    for t, values in samples:
        ring.append(t, values)
    return ring.view()


def test_min_max_mean_of_the_samples_inside_the_window() -> None:
    samples = [(float(t), row(junction=j)) for t, j in enumerate([99.0, 60.0, 70.0, 90.0, 80.0])]
    window = window_stats(3, view_of(samples), now=4.0, seconds=3.5)  # 0.5 .. 4.0: the 99 is outside
    stat = window.stats[("temperature", "junction")]
    assert (stat.minimum, stat.maximum, stat.mean, stat.exact_mean) == (60.0, 90.0, 75.0, False)
    assert window.samples == 4
    assert window.gpu == 3
    assert ("power", "socket") not in window.stats  # never supplied: absent, not zero


def test_power_mean_comes_from_the_energy_accumulator_over_the_device_clock() -> None:
    # Sampled power alternates 100 / 500 W, but the energy says 350 W on average.
    samples = []
    for i in range(11):
        samples.append((1000.0 + i, row(power=100.0 if i % 2 else 500.0, energy=5000.0 + 350.0 * i, clock=20.0 + i)))
    window = window_stats(0, view_of(samples), now=1010.0, seconds=10.0)
    stat = window.stats[("power", "socket")]
    assert stat.exact_mean
    assert stat.mean == pytest.approx(350.0)
    assert (stat.minimum, stat.maximum) == (100.0, 500.0)


def test_busy_mean_from_the_activity_accumulator_wraps_at_32_bits() -> None:
    start = float((1 << 32) - 150)  # 60 % for 5 s is 300 %·s: the counter wraps on the way
    samples = [(float(t), row(gfx=0.6, gfx_acc=(start + 60.0 * t) % (1 << 32), clock=float(t))) for t in range(6)]
    stat = window_stats(0, view_of(samples), now=5.0, seconds=5.0).stats[("busy", "gfx")]
    assert stat.exact_mean
    assert stat.mean == pytest.approx(0.6)


def test_a_reset_accumulator_falls_back_to_the_sample_mean() -> None:
    samples = [(0.0, row(power=200.0, energy=9e6, clock=1.0)), (1.0, row(power=300.0, energy=10.0, clock=2.0))]
    stat = window_stats(0, view_of(samples), now=1.0, seconds=5.0).stats[("power", "socket")]
    assert not stat.exact_mean
    assert stat.mean == 250.0


def test_stats_first_read_after_the_ring_moved_on_are_those_of_their_instant() -> None:
    ring = SampleRing(4)
    for t in range(4):
        ring.append(float(t), row(junction=60.0 + t, power=300.0))
    early = window_stats(0, ring.view(0.0), now=3.0, seconds=3.0)
    junction = early.stats[("temperature", "junction")]  # one channel read, as a rule does
    for t in range(4, 8):
        ring.append(float(t), row(junction=99.0, power=500.0))
    assert early.stats[("temperature", "junction")] is junction
    assert (junction.minimum, junction.maximum) == (60.0, 63.0)
    assert early.stats[("power", "socket")].maximum == 300.0  # first read now, of the samples then
    assert list(early.stats) == [("temperature", "junction"), ("power", "socket")]


def test_window_stats_are_those_of_the_samples_in_the_window() -> None:
    # Every window end and length over rings that wrap, distinct values, a few missing (NaN).
    def value(t: int, index: int) -> float:
        return NAN if (t + index) % 5 == 0 or family_of[index] == "acc" else float((t * 7 + index * 3) % 23)

    family_of = [family for family, _ in SAMPLER_FIELDS]
    for slots in (2, 9, 29):
        ring = SampleRing(slots)
        for n in range(1, 32 + 2 * slots):
            ring.append(float(n - 1), tuple(value(n - 1, i) for i in range(WIDTH)))
            kept = range(max(0, n - slots), n)
            for seconds in [s + 0.5 for s in range(n + 1)]:
                now = float(n - 1)
                window = window_stats(0, ring.view(now - seconds), now, seconds)
                inside = [t for t in kept if t >= now - seconds]
                assert window.samples == len(inside)
                expected = {}
                for index, channel in enumerate(SAMPLER_FIELDS):
                    present = [v for t in inside if (v := value(t, index)) == v]  # NaN != NaN: missing
                    if present:
                        expected[channel] = (min(present), max(present), pytest.approx(sum(present) / len(present)))
                assert {k: (v.minimum, v.maximum, v.mean) for k, v in window.stats.items()} == expected


# --- the sampler, on real files ---------------------------------------------------------------


def v1_3_table(junction: int, power: int, energy_ticks: int, clock_ns: int) -> bytes:
    blob = bytearray(b"\xff" * layouts.V1_3.size)
    struct.pack_into("<HBB", blob, 0, layouts.V1_3.size, 1, 3)
    struct.pack_into("<H", blob, 6, junction)
    struct.pack_into("<H", blob, 22, power)
    struct.pack_into("<QQ", blob, 24, energy_ticks, clock_ns)
    return bytes(blob)


def make_devices(tmp_path: Path, count: int, die: int = 0) -> list[tuple[int, DeviceIdentity]]:
    devices = []
    for gpu in range(count):
        device_dir = tmp_path / f"0000:{gpu + 1:02x}:00.0"
        device_dir.mkdir()
        (device_dir / "gpu_metrics").write_bytes(v1_3_table(60 + gpu, 300, 65536 * 1000, 10**9))
        identity = DeviceIdentity(
            pci_bus_id=device_dir.name, card=f"card{gpu}", device_dir=str(device_dir), device_id="0x740c", die=die
        )
        devices.append((gpu, identity))
    return devices


def test_every_device_is_read_once_per_cycle(tmp_path: Path) -> None:
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(make_devices(tmp_path, 3))
    for _ in range(4):
        sampler.sample_once()
    snapshot = sampler.windows()
    assert [w.gpu for w in snapshot.devices] == [0, 1, 2]
    assert dict(snapshot.stats.samples) == {0: 4, 1: 4, 2: 4}
    assert [w.stats[("temperature", "junction")].maximum for w in snapshot.devices] == [60.0, 61.0, 62.0]
    assert snapshot.stats.cycle_durations.count == 4
    sampler.stop()


def test_the_second_die_of_an_mi250x_has_no_power(tmp_path: Path) -> None:
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(make_devices(tmp_path, 1, die=1))
    sampler.sample_once()
    stats = sampler.windows().devices[0].stats
    assert ("power", "socket") not in stats
    assert ("temperature", "junction") in stats
    sampler.stop()


def test_unreadable_and_vanished_tables_are_counted_not_raised(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 2)
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    Path(devices[0][1].device_dir, "gpu_metrics").write_bytes(b"\x01\x02")
    Path(devices[1][1].device_dir, "gpu_metrics").unlink()  # vanishes after it was found
    sampler.sample_once()
    assert dict(sampler.windows().stats.read_errors) == {(0, "unreadable_table"): 1, (1, "gone"): 1}
    sampler.stop()


def test_a_hung_device_is_moved_aside_stalls_nobody_and_holds_one_thread(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 4)
    hung_path = str(Path(devices[1][1].device_dir, "gpu_metrics"))
    release = threading.Event()
    hung_reads = []

    def read(path: str) -> bytes:
        if path == hung_path:
            hung_reads.append(path)
            release.wait(60)
        with open(path, "rb") as handle:
            return handle.read()

    sampler = Sampler(interval=0.01, window=5.0, read_timeout=0.08, read=read)
    sampler.track(devices)
    threads_before = threading.active_count()
    sampler.start()

    def samples() -> dict[int, int]:
        return dict(sampler.windows().stats.samples)

    wait_until(lambda: (1, "timeout") in sampler.windows().stats.read_errors)  # past its read deadline
    stuck_at = samples()
    # The loop that was stuck in it was moved aside: the others go on being sampled.
    wait_until(lambda: min(samples()[gpu] for gpu in (0, 2, 3)) >= min(stuck_at.values()) + 10)
    snapshot = sampler.windows()
    assert hung_reads == [hung_path]  # never re-issued while stuck
    assert dict(snapshot.stats.samples)[1] == 0
    assert [w.gpu for w in snapshot.devices] == [0, 2, 3]  # the hung device has no window
    assert dict(snapshot.stats.read_errors) == {(1, "timeout"): 1}  # counted once
    # the loop, the watcher and the loop that took over: the stuck read holds exactly one thread
    assert threading.active_count() - threads_before == 3
    release.set()
    wait_until(lambda: samples()[1] >= 1)  # back once its read returned
    sampler.stop()


def test_the_loop_samples_every_device_until_stopped(tmp_path: Path) -> None:
    reads: list[str] = []

    def read(path: str) -> bytes:
        reads.append(path)
        return Path(path).read_bytes()

    sampler = Sampler(interval=0.01, window=5.0, read=read)
    sampler.track(make_devices(tmp_path, 2))
    sampler.start()
    wait_until(lambda: sampler.cycles >= 5)
    sampler.stop()
    assert sampler._running is not None and sampler._running.done()  # stop() waited for the loop to end
    count = len(reads)
    assert dict(sampler.windows().stats.samples) == {0: count // 2, 1: count // 2}
    assert count == 2 * sampler.cycles  # whole cycles only


def test_tracking_keeps_rings_of_known_devices_and_drops_gone_ones(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 3)
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    sampler.sample_once()
    sampler.track([devices[0], devices[2]])
    sampler.sample_once()
    assert dict(sampler.windows().stats.samples) == {0: 2, 2: 2}
    sampler.stop()


def test_waveform_columns(tmp_path: Path) -> None:
    clock = [1000.0]
    sampler = Sampler(interval=0.1, window=5.0, clock=lambda: clock[0], wall_clock=lambda: clock[0])
    sampler.track(make_devices(tmp_path, 1))
    for _ in range(5):
        sampler.sample_once()
        clock[0] += 0.1
    wave = sampler.waveform(0, 0.25, now=1000.4)
    assert wave is not None
    assert wave["timestamps"] == pytest.approx([1000.2, 1000.3, 1000.4])
    assert wave["temperatures_celsius"]["junction"] == [60.0, 60.0, 60.0]
    assert wave["power_watts"] == [300.0, 300.0, 300.0]
    assert "gfx" not in wave["busy_ratio"]  # all-ones in this table: not supplied
    assert sampler.waveform(7, 1.0) is None
    sampler.stop()


def test_channels_are_the_window_families_and_accumulators() -> None:
    assert {family for family, _ in SAMPLER_FIELDS} == {"temperature", "power", "busy", "clock", "acc"}


def test_a_device_without_a_table_is_never_sampled(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 2)
    Path(devices[1][1].device_dir, "gpu_metrics").unlink()
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    sampler.sample_once()
    sampler.track(devices)  # the next cycle's tracking does not look again
    sampler.sample_once()
    snapshot = sampler.windows()
    assert dict(snapshot.stats.samples) == {0: 2}
    assert dict(snapshot.stats.read_errors) == {}
    assert sampler.gpus_sampled() == [0]
    sampler.stop()


def test_a_wall_clock_step_back_never_makes_a_waveform_run_backwards(tmp_path: Path) -> None:
    monotonic, wall = [50.0], [1000.0]
    sampler = Sampler(interval=0.1, window=5.0, clock=lambda: monotonic[0], wall_clock=lambda: wall[0])
    sampler.track(make_devices(tmp_path, 1))
    for step in range(6):
        sampler.sample_once()
        monotonic[0] += 0.1
        wall[0] += 0.1 - (7200.0 if step == 2 else 0.0)  # the wall clock is set back two hours mid-way
    wave = sampler.waveform(0, 1.0)
    assert wave is not None and len(wave["timestamps"]) == 6
    assert all(b > a for a, b in zip(wave["timestamps"], wave["timestamps"][1:], strict=False))
    assert wave["timestamps"][-1] == pytest.approx(wall[0] - 0.1)  # shown on today's wall clock
    assert sampler.windows().devices[0].samples == 6  # and the window still spans them all
    sampler.stop()
