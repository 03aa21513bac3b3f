"""The whole /metrics of a frozen, seeded simulator tree, as the golden test and `make golden` render it.

The bytes go through the code path a scrape takes: the simulator writes a sysfs tree, the daemon's
own source selection picks the sysfs source, the poller discovers and reads it, the daemon's
Pipeline evaluates the shipped rules and renders, and the bytes are what /metrics would send.

Everything is a function of (FLEET, SCENARIO, SEED, ELAPSED, the rules) except a few values that are wall
clock by nature. Exactly those are replaced, by `normalise`, with WALL_CLOCK:
- amdgpu_sample_timestamp_seconds (time.time() of each read),
- amdgpu_exporter_last_poll_timestamp_seconds (time.time() when the cycle ended),
- process_* (the exporter process's own CPU, memory, file descriptors and start time),
- amdgpu_exporter_collector_duration_seconds (how long rendering each collector's families took),
- amdgpu_exporter_poll_duration_seconds: _sum and the _bucket counts below +Inf (which
  bucket a cycle lands in depends on how fast this machine is). _count and le="+Inf" stay: they
  count cycles, which is deterministic.
Each replaced value must still parse as a float, so a broken value is not hidden by the substitution.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from importlib import resources
from pathlib import Path

from exporter import config
from exporter.alerting.rulefile import parse_rule_file
from exporter.alerting.rules import Rule
from exporter.cycle import Pipeline
from exporter.exposition.selection import EVERYTHING, ExpositionOptions
from exporter.pipeline.poller import Poller
from exporter.simulator import Simulator
from exporter.sources.select import select_source

FLEET = "1xMI210,2xMI250X,1xMI300X:gpu_metrics=1.5"  # the tables of the golden tree, pinned
SCENARIO = "thermal-excursion:start=5,hot=60,gpus=1"  # GPU 1 hot at both cycles
SEED = 9
ELAPSED = (30.0, 31.0)  # the simulator's clock at the two poll cycles
# The shipped rules with `for: 1s` instead of 60 s: the hot GPU's alert is pending after the first
# cycle and firing (with its clock-down suggestion) at the second, which runs FOR_SECONDS later in
# wall-clock time. Every other rule setting is the shipped one.
FOR_SECONDS = 1.0
WALL_CLOCK = "<wall-clock>"
GOLDEN_DIR = Path(__file__).resolve().parent
GOLDEN_FILES = {False: GOLDEN_DIR / "metrics.txt", True: GOLDEN_DIR / "metrics.openmetrics.txt"}

_WALL_CLOCK_SAMPLE = re.compile(
    r"^(?P<series>"
    r"amdgpu_sample_timestamp_seconds\{[^}]*\}"
    r"|amdgpu_exporter_last_poll_timestamp_seconds"
    r"|amdgpu_exporter_poll_duration_seconds_sum"
    r"|amdgpu_exporter_collector_duration_seconds\{[^}]*\}"
    r"|process_[a-z_]+"
    r'|amdgpu_exporter_poll_duration_seconds_bucket\{le="(?!\+Inf")[^"]*"\}'
    r") (?P<value>\S+)$"
)


def normalise(body: str) -> str:
    """`body` with the documented wall-clock sample values (and only those) replaced by WALL_CLOCK."""
    lines = []
    for line in body.split("\n"):
        match = _WALL_CLOCK_SAMPLE.match(line)
        if match is not None:
            float(match["value"])  # a value that is not a number is a bug, not wall-clock noise
            line = f"{match['series']} {WALL_CLOCK}"
        lines.append(line)
    return "\n".join(lines)


def _settings(sysfs_root: Path) -> config.Settings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.resolve(
        parser.parse_args(
            # slow fields (thresholds, caps, ECC ...) read once: a slow machine must not refresh them between cycles
            [f"--path.sysfs={sysfs_root}", "--source=auto", "--slow-interval=1h"]
        ),
        environ={},
    )


def _wait_for_pcie_bandwidth(source: object, timeout: float = 10.0) -> None:
    # The sysfs source reads pcie_bw on a background thread (a real read blocks ~1 s); its first
    # figure lands some time after the first read. Wait for it so the second cycle always has it.
    # A private attribute: if a refactor renames it, fail here rather than render a racy golden.
    readers = [state.pcie for state in getattr(source, "_devices", {}).values() if state.pcie is not None]
    assert readers, "the sysfs source has no pcie_bw readers to wait for (renamed?): adapt the golden"
    deadline = time.monotonic() + timeout
    while any(reader.bytes_per_second is None for reader in readers):
        if time.monotonic() > deadline:
            raise AssertionError(f"the pcie_bw readers gave no figure within {timeout} s")
        time.sleep(0.01)


def golden_rules() -> tuple[Rule, ...]:
    shipped = resources.files("exporter.alerting").joinpath("default_rules.yaml").read_text(encoding="utf-8")
    assert shipped.count("    for: 60s\n") == 1, "the shipped rules changed: adapt golden_rules()"
    return parse_rule_file(shipped.replace("    for: 60s\n", f"    for: {FOR_SECONDS:g}s\n"), "golden").rules


async def _poll(poller: Poller, simulator: Simulator, pipeline: Pipeline) -> None:
    poller.discover()
    for cycle, elapsed in enumerate(ELAPSED):
        simulator.tick(elapsed)
        snapshot = await poller.poll_once()
        pipeline.on_snapshot(snapshot)
        if cycle == 0:
            _wait_for_pcie_bandwidth(poller.source)
            # the rules measure `for` on the snapshots' wall-clock taken_at
            await asyncio.sleep(max(0.0, snapshot.taken_at + FOR_SECONDS + 0.05 - time.time()))


def render_golden(exposition: ExpositionOptions = EVERYTHING) -> dict[bool, str]:
    """{openmetrics: normalised /metrics body} for the frozen tree, every family on (the families off by
    default included: the golden covers every family's rendering; tests/unit/test_series_budget.py the defaults)."""
    # On disk, not on a tmpfs (the unit tests' TMPDIR): the exporter emits the RAS blocks of a device in
    # the order its folder lists them, which is the filesystem's (ext4: creation order, tmpfs: reversed).
    on_disk = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryDirectory(prefix="amdgpu-golden-", dir=on_disk) as tmp:
        root = Path(tmp) / "sys"
        simulator = Simulator(root, FLEET, SCENARIO, seed=SEED)
        simulator.write_tree()
        settings = _settings(root)
        source, name, reason = select_source(settings.source_choice(), str(root))
        poller = Poller(source, interval=settings.interval, read_timeout=10.0, source_name=name)
        pipeline = Pipeline(source_name=name, source_reason=reason, rules=golden_rules(), exposition=exposition)
        try:
            asyncio.run(_poll(poller, simulator, pipeline))
        finally:
            poller.close()
        rendered = pipeline.state.metrics
        assert rendered is not None
        return {openmetrics: normalise(rendered.body(openmetrics, False).decode()) for openmetrics in (False, True)}
