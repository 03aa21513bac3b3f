"""Simulator: a fleet running a scenario, written as a sysfs tree that real tools read."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading
import time
from pathlib import Path

from exporter.simulator.atomic_tree import AtomicTree
from exporter.simulator.board import BoardReading, board_files, board_readings
from exporter.simulator.file_contents import dynamic_files, gpu_metrics_values, hwmon_dir, partition_metrics_values
from exporter.simulator.fleet import FleetSpec, GcdLayout, layout, parse_fleet
from exporter.simulator.kfd_proc import KfdProcWriter
from exporter.simulator.physics import DieReading, PackageModel
from exporter.simulator.tree import remove_devcoredump, write_devcoredump, write_static
from exporter.simulator.truth import (
    SimulatedDevice,
    identity,
    partition_sample,
    partition_truth,
    sample,
    to_jsonable,
)
from exporter.simulator.window_truth import WindowHistory, window_point
from exporter.simulator.workload import Scenario, parse_scenario


class Simulator:
    """Writes DIR (standing for /sys) for `fleet` running `scenario`.

    write_tree() creates everything for t=0; tick(elapsed) rewrites the files whose content
    changed; truth() says what the tree currently says, in the exporter's data model. For a
    sub-second scenario ("alternating") every tick is also kept for `scenario.window` seconds so
    windows() can give the min / max / mean of what the tree showed over that window.
    """

    def __init__(
        self, sysfs_root: Path, fleet: FleetSpec | str = "4xMI250X", scenario: str = "idle", seed: int = 0
    ) -> None:
        self.root = Path(sysfs_root)
        self.fleet = parse_fleet(fleet) if isinstance(fleet, str) else fleet
        self.scenario: Scenario = parse_scenario(scenario)
        self.seed = int(seed)
        self.gcds: list[GcdLayout] = layout(self.fleet)
        # layout() lists a package's dies together
        self._packages = [
            PackageModel(list(dies), self.scenario, self.seed, len(self.gcds))
            for _package, dies in itertools.groupby(self.gcds, key=lambda gcd: gcd.package_index)
        ]
        self._tree = AtomicTree(self.root)
        self._lock = threading.Lock()
        self._readings: list[DieReading] = []
        self._boards: list[BoardReading | None] = []
        self._elapsed = 0.0
        self._ticks = 0  # tick() calls so far: a reader of the truth file can tell it missed one
        self._written_at = 0.0
        self._started_wall: float | None = None
        self._started_monotonic = 0.0
        self._dumps: set[int] = set()  # GCD indices whose device coredump is in the tree
        # a reset fault's dump is devcdN, N its place among the GCDs given one
        self._dump_index = {
            gcd: n for n, gcd in enumerate(sorted({g for kind, g in self.scenario.faults if kind == "reset"}))
        }
        self._identities: list | None = None
        self._truth_cache: tuple[list[DieReading], tuple[SimulatedDevice, ...]] | None = None
        self.history: WindowHistory | None = WindowHistory(self.scenario.window) if self.scenario.fast else None
        # kfd/proc/<pid>/ (processes coming and going): off unless asked for, see kfd_proc.py.
        self.kfd_proc: KfdProcWriter | None = None

    def simulate_processes(self) -> None:
        self.kfd_proc = KfdProcWriter(self.root, self.gcds, self.seed)

    @property
    def files_written(self) -> int:
        return self._tree.writes

    def write_tree(self) -> None:
        """Create sysfs_root with every static file and the dynamic ones for t=0."""
        self.root.mkdir(parents=True, exist_ok=True)
        write_static(self._tree, self.gcds)
        self._started_wall = time.time()
        self._started_monotonic = time.monotonic()
        self.tick(0.0)

    def tick(self, elapsed: float) -> None:
        """Recompute the fleet at `elapsed` seconds after write_tree and rewrite what changed."""
        if self._started_wall is None:
            raise RuntimeError("write_tree() must run before tick()")
        readings: list[DieReading] = []
        for package in self._packages:
            readings.extend(package.readings(float(elapsed)))
        boards = board_readings(self.gcds, readings)
        for gcd, reading, board in zip(self.gcds, readings, boards, strict=True):
            for rel, content in dynamic_files(gcd, reading, self._started_wall).items():
                self._tree.write(rel, content)
            if board is not None:
                for rel, content in board_files(gcd, board, round(reading.t * 1000)).items():
                    self._tree.write(rel, content)
            self._write_devcoredump(gcd, reading)
        if self.kfd_proc is not None:
            self.kfd_proc.write(float(elapsed))
        with self._lock:
            self._readings = readings
            self._boards = boards
            self._elapsed = float(elapsed)
            self._ticks += 1
            self._written_at = time.time()
        if self.history is not None:
            points = [window_point(d, self._readings_by_gpu[d.gpu]) for d in self.truth()]
            self.history.add(float(elapsed), self._written_at, points)

    def _write_devcoredump(self, gcd: GcdLayout, reading: DieReading) -> None:
        index = self._dump_index.get(gcd.index)
        if index is None:
            return
        if reading.reset_at is not None and gcd.index not in self._dumps:
            write_devcoredump(self._tree, index, gcd, self._started_monotonic + reading.reset_at)
            self._dumps.add(gcd.index)
        elif reading.reset_at is None and gcd.index in self._dumps:
            remove_devcoredump(self._tree, index, gcd)
            self._dumps.discard(gcd.index)

    def truth(self) -> list[SimulatedDevice]:
        """Per GCD in BDF order: identity as discovery should find it and the current sample."""
        with self._lock:
            readings, boards, written_at = self._readings, self._boards, self._written_at
        if not readings:
            raise RuntimeError("write_tree() must run before truth()")
        cached = self._truth_cache
        if cached is not None and cached[0] is readings:
            return list(cached[1])
        if self._identities is None:
            self._identities = []
            for gcd in self.gcds:
                for part in gcd.partitions:
                    primary = part.index == 0
                    device_dir = gcd.device_relpath if primary else part.platform_relpath
                    self._identities.append(
                        identity(
                            gcd,
                            self.gcds,
                            os.path.realpath(self.root / device_dir),
                            os.path.realpath(self.root / hwmon_dir(gcd)) if primary else "",
                            part.index,
                        )
                    )
        devices: list[SimulatedDevice] = []
        for gcd, reading, board in zip(self.gcds, readings, boards, strict=True):
            socket_sample = sample(gcd, reading, written_at, board, self._started_wall or 0.0)
            mi300 = bool(gcd.model.compute_partitions)
            metrics = gpu_metrics_values(gcd, reading) if mi300 else None
            socket_gpu = len(devices)
            for part in gcd.partitions:
                gpu = len(devices)
                ident = self._identities[gpu]
                if not mi300:
                    devices.append(SimulatedDevice(gpu, ident, socket_sample))
                    continue
                info = partition_truth(gcd, part.index, reading, socket_gpu, ident.device_dir, metrics)
                if gcd.xcp_metrics_version is not None:
                    info = dataclasses.replace(info, xcp_metrics=partition_metrics_values(gcd, reading, part.index))
                own = partition_sample(gcd, info, socket_sample)
                devices.append(SimulatedDevice(gpu, ident, own, info, metrics if part.index == 0 else None))
        self._truth_cache = (readings, tuple(devices))
        return devices

    @property
    def _readings_by_gpu(self) -> list[DieReading]:
        """The reading behind each device of truth(), in `gpu` order (partitions share their socket's)."""
        return [r for gcd, r in zip(self.gcds, self._readings, strict=True) for _ in gcd.partitions]

    def windows(self) -> dict | None:
        """min / max / time-weighted mean of every value the tree showed over the last window, per
        device (None unless the scenario keeps a window)."""
        return self.history.stats() if self.history is not None else None

    def write_truth_json(self, path: Path) -> None:
        """Atomically write truth() as JSON (truth.load_truth_json reads it back)."""
        path = Path(path)
        document = {
            "fleet": str(self.fleet),
            "scenario": str(self.scenario),
            "seed": self.seed,
            "elapsed": self._elapsed,
            "ticks": self._ticks,
            "devices": to_jsonable(self.truth()),
        }
        if self.history is not None:
            document["windows"] = self.history.stats()
        data = json.dumps(document, indent=1)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_text(data, encoding="utf-8")
        os.replace(temp, path)

    def run(self, interval: float, stop: threading.Event, truth_file: Path | None = None) -> None:
        """write_tree, then tick every `interval` seconds (on a fixed schedule) until `stop` is set.

        With truth_file, the truth JSON is rewritten after every tick.
        """
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        # a sub-second workload is written fast enough to show every phase, whatever was asked
        interval = min(interval, self.scenario.tick_interval)
        self.write_tree()
        start = time.monotonic()
        if truth_file is not None:
            self.write_truth_json(truth_file)
        beat = 0
        # the truth file of a fast scenario is rewritten at most 4 times a second (its windows
        # already cover every tick): rewriting 60 KB of JSON 25 times a second costs a core's tenth
        truth_every = 0.25 if self.scenario.fast else 0.0
        truth_written = time.monotonic()
        while True:
            beat += 1
            # sleep to the next beat; a slow tick skips beats instead of drifting
            delay = start + beat * interval - time.monotonic()
            if delay < 0:
                beat += int(-delay // interval) + 1
                delay = start + beat * interval - time.monotonic()
            if stop.wait(max(0.0, delay)):
                return
            self.tick(time.monotonic() - start)
            if truth_file is not None and time.monotonic() - truth_written >= truth_every:
                self.write_truth_json(truth_file)
                truth_written = time.monotonic()
