"""A step of the wall clock (NTP, `date -s`) changes no duration: readiness, counter wraps, `for:`.

The wall clock is patched (time.time), the monotonic clock is left alone, and the real poller and
pipeline run cycles across a step of an hour forward and back: every answer that depends on how
long something took must come out as it does without the step.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from exporter.alerting.rulefile import load_rules
from exporter.cycle import Pipeline
from exporter.model import DeviceIdentity, Sample, SourceStats, frozen_map
from exporter.pipeline.poller import Poller
from exporter.pipeline.readiness import Readiness
from exporter.sources.base import Source

HOUR = 3600.0
V1_0_ENERGY_WIDTH = 2**32 * 2**-16  # gpu_metrics v1_0's u32 energy accumulator wraps every 65,536 J


class WallClock:
    """time.time() with an offset the test steps; time.monotonic() untouched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + self.offset)


class ScriptedEnergy(Source):
    """One v1_0 device whose readings (energy, junction temperature) the test sets before each cycle."""

    name = "scripted"

    def __init__(self) -> None:
        self.device = DeviceIdentity(pci_bus_id="0000:01:00.0", card="card0", device_dir="", gpu_metrics_version="1.0")
        self.energy = 0.0
        self.junction = 50.0

    def discover(self) -> list[DeviceIdentity]:
        return [self.device]

    def read(self, device: DeviceIdentity) -> Sample:
        return Sample(
            timestamp=time.time(), energy_joules=self.energy, temperatures=frozen_map({"junction": self.junction})
        )

    def stats(self) -> SourceStats:
        return SourceStats()

    def close(self) -> None:
        pass


RULES = """\
rules:
  - alert: GpuJunctionTemperatureHigh
    metric: temperature_celsius
    sensor: junction
    comparison: ">"
    threshold: 85
    for: 60s
"""


def run_cycles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, steps: list[float]) -> list[tuple[object, ...]]:
    """One cycle per entry of `steps` (the wall clock's step before it); what each cycle concluded."""
    clock = WallClock(monkeypatch)
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(RULES, encoding="utf-8")
    source = ScriptedEnergy()
    poller = Poller(source, interval=1.0, read_timeout=2.0)
    readiness = Readiness(interval=1.0, read_timeout=2.0)
    pipeline = Pipeline(source_name="scripted", source_reason="test", rules=load_rules(rules_file), readiness=readiness)
    poller.discover()
    # (energy before the cycle, junction): a reset of the accumulator (driver reload: 1000 J -> 3 J)
    # is a reset only if the elapsed time is ~1 cycle; over an hour 5 kW could have gone round the
    # register. Then a u32 wrap (65,526 J -> 290 J), and a junction over the threshold, pending.
    readings = [(1000.0, 50.0), (3.0, 90.0), (V1_0_ENERGY_WIDTH - 10, 90.0), (290.0, 90.0)]
    seen = []
    try:
        for step, (energy, junction) in zip(steps, readings, strict=True):
            clock.offset += step
            source.energy, source.junction = energy, junction
            pipeline.on_snapshot(asyncio.run(poller.poll_once()))
            published = pipeline.state.published
            assert published is not None
            (device,) = published.snapshot.devices
            assert device.sample is not None
            alert = next((a for a in published.alerts if a.alert == "GpuJunctionTemperatureHigh"), None)
            firing = None if alert is None else alert.firing
            seen.append((device.sample.energy_joules, firing, readiness.readiness(published)))
    finally:
        poller.close()
    return seen


@pytest.mark.parametrize("step", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_wall_clock_step_changes_no_duration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step: float) -> None:
    steady = run_cycles(monkeypatch, tmp_path, [0.0, 0.0, 0.0, 0.0])
    assert [energy for energy, *_ in steady] == [1000.0, 3.0, V1_0_ENERGY_WIDTH - 10, V1_0_ENERGY_WIDTH + 290]
    assert [firing for _, firing, _ in steady][1:] == [False, False, False]  # pending: for 60 s
    assert all(ready == (True, "ready") for *_, ready in steady)
    stepped = run_cycles(monkeypatch, tmp_path, [0.0, step, -step, step])
    assert stepped == steady


def test_readiness_reads_the_monotonic_age_only(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = WallClock(monkeypatch)
    readiness = Readiness(interval=1.0, read_timeout=2.0)
    from exporter.model import Published, Snapshot

    published = Published(snapshot=Snapshot(taken_at=time.time(), monotonic_at=time.monotonic()))
    for offset in (0.0, HOUR, -HOUR, 10 * HOUR):
        clock.offset = offset
        assert readiness.readiness(published) == (True, "ready")
    stale = Published(snapshot=Snapshot(taken_at=time.time(), monotonic_at=time.monotonic() - 10))
    clock.offset = 0.0
    assert readiness.readiness(stale)[0] is False
