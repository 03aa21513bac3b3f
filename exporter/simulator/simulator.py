"""Simulator: a fleet running a scenario, written as a sysfs tree that real tools read."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from exporter.simulator.atomic_tree import AtomicTree
from exporter.simulator.fleet import FleetSpec, GcdLayout, layout, parse_fleet
from exporter.simulator.kfd_proc import KfdProcWriter
from exporter.simulator.physics import DieReading, PackageModel
from exporter.simulator.render import dynamic_files, hwmon_dir
from exporter.simulator.tree import write_static
from exporter.simulator.truth import SimulatedDevice, identity, sample, to_jsonable
from exporter.simulator.workload import Scenario, parse_scenario


class Simulator:
    """Writes DIR (standing for /sys) for `fleet` running `scenario`.

    write_tree() creates everything for t=0; tick(elapsed) rewrites the files whose content
    changed; truth() says what the tree currently says, in the exporter's data model.
    """

    def __init__(
        self, sysfs_root: Path, fleet: FleetSpec | str = "4xMI250X", scenario: str = "idle", seed: int = 0
    ) -> None:
        self.root = Path(sysfs_root)
        self.fleet = parse_fleet(fleet) if isinstance(fleet, str) else fleet
        self.scenario: Scenario = parse_scenario(scenario)
        self.seed = int(seed)
        self.gcds: list[GcdLayout] = layout(self.fleet)
        self._packages: list[PackageModel] = []
        by_package: dict[int, list[GcdLayout]] = {}
        for gcd in self.gcds:
            by_package.setdefault(gcd.package_index, []).append(gcd)
        for dies in by_package.values():
            self._packages.append(PackageModel(dies, self.scenario, self.seed, len(self.gcds)))
        self._tree = AtomicTree(self.root)
        self._lock = threading.Lock()
        self._readings: list[DieReading] = []
        self._elapsed = 0.0
        self._written_at = 0.0
        self._started_wall: float | None = None
        self._identities: list | None = None
        # kfd/proc/<pid>/ (processes coming and going): off unless asked for, see kfd_proc.py.
        self.kfd_proc: KfdProcWriter | None = None

    def simulate_processes(self) -> None:
        self.kfd_proc = KfdProcWriter(self.root, self.gcds, self.seed)

    @property
    def elapsed(self) -> float:
        return self._elapsed

    @property
    def files_written(self) -> int:
        return self._tree.writes

    def write_tree(self) -> None:
        """Create sysfs_root with every static file and the dynamic ones for t=0."""
        self.root.mkdir(parents=True, exist_ok=True)
        write_static(self._tree, self.gcds)
        self._started_wall = time.time()
        self.tick(0.0)

    def tick(self, elapsed: float) -> None:
        """Recompute the fleet at `elapsed` seconds after write_tree and rewrite what changed."""
        if self._started_wall is None:
            raise RuntimeError("write_tree() must run before tick()")
        readings: list[DieReading] = []
        for package in self._packages:
            readings.extend(package.readings(float(elapsed)))
        for gcd, reading in zip(self.gcds, readings, strict=True):
            for rel, content in dynamic_files(gcd, reading).items():
                self._tree.write(rel, content)
        if self.kfd_proc is not None:
            self.kfd_proc.write(float(elapsed))
        with self._lock:
            self._readings = readings
            self._elapsed = float(elapsed)
            self._written_at = time.time()

    def truth(self) -> list[SimulatedDevice]:
        """Per GCD in BDF order: identity as discovery should find it and the current sample."""
        with self._lock:
            readings, written_at = self._readings, self._written_at
        if not readings:
            raise RuntimeError("write_tree() must run before truth()")
        if self._identities is None:
            self._identities = [
                identity(
                    gcd,
                    self.gcds,
                    os.path.realpath(self.root / gcd.device_relpath),
                    os.path.realpath(self.root / hwmon_dir(gcd)),
                )
                for gcd in self.gcds
            ]
        return [
            SimulatedDevice(gcd.index, ident, sample(gcd, reading, written_at))
            for gcd, ident, reading in zip(self.gcds, self._identities, readings, strict=True)
        ]

    def write_truth_json(self, path: Path) -> None:
        """Atomically write truth() as JSON (truth.load_truth_json reads it back)."""
        path = Path(path)
        data = json.dumps(
            {
                "fleet": str(self.fleet),
                "scenario": str(self.scenario),
                "seed": self.seed,
                "elapsed": self._elapsed,
                "devices": to_jsonable(self.truth()),
            },
            indent=1,
        )
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_text(data, encoding="utf-8")
        os.replace(temp, path)

    def run(self, interval: float, stop: threading.Event, truth_file: Path | None = None) -> None:
        """write_tree, then tick every `interval` seconds (on a fixed schedule) until `stop` is set.

        With truth_file, the truth JSON is rewritten after every tick.
        """
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.write_tree()
        start = time.monotonic()
        if truth_file is not None:
            self.write_truth_json(truth_file)
        beat = 0
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
            if truth_file is not None:
                self.write_truth_json(truth_file)
