"""Simulated sysfs trees for the bench, and the hung GCD.

A tree is written once by exporter.simulator and left still while it is measured, so every tool
reads the same values and no simulator process competes for the two cores. The soak is the one
phase that keeps a simulator ticking (in its own process), so values move as on a busy node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exporter.simulator import Simulator

# Files whose reads are SMU round trips (or hwmon reads that become them): when a GPU's firmware
# hangs, these block. A named pipe with no writer blocks open() the same way.
_HUNG_DEVICE_FILES = ("gpu_metrics", "gpu_busy_percent", "mem_busy_percent")
_HUNG_HWMON_PREFIXES = ("temp", "power1_average", "power1_input", "freq", "in0_input")


def write_tree(base: Path, fleet: str, scenario: str = "training", seed: int = 0) -> Path:
    """Write a simulated tree under base; returns the folder that stands for /sys."""
    sysfs = base / "sys"
    simulator = Simulator(sysfs, fleet=fleet, scenario=scenario, seed=seed)
    simulator.write_tree()
    # Let the workload run a little so the values are those of a node mid-training.
    simulator.tick(30.0)
    return sysfs


def card_device_dir(sysfs: Path, card: int) -> Path:
    return Path(os.path.realpath(sysfs / "class" / "drm" / f"card{card}" / "device"))


def hang_gcd(sysfs: Path, card: int) -> list[Path]:
    """Turn card's SMU-backed files into named pipes nobody writes: every open of them blocks.

    Returns the pipes, for release_hung().
    """
    device = card_device_dir(sysfs, card)
    targets = [device / name for name in _HUNG_DEVICE_FILES if (device / name).exists()]
    hwmon_root = device / "hwmon"
    for hwmon in sorted(hwmon_root.iterdir()) if hwmon_root.is_dir() else []:
        for entry in sorted(hwmon.iterdir()):
            smu_backed = entry.name.endswith("_input") or entry.name == "power1_average"
            if smu_backed and entry.name.startswith(_HUNG_HWMON_PREFIXES):
                targets.append(entry)
    for path in targets:
        path.unlink()
        os.mkfifo(path, 0o444)
    return targets


def release_hung(pipes: list[Path]) -> None:
    """Let every reader blocked on the pipes go (they read EOF), so their processes can exit."""
    for path in pipes:
        for _ in range(64):  # one open per blocked reader, until no reader is left
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                break  # ENXIO: no reader has the pipe open
            os.close(fd)


def start_ticking_simulator(sysfs: Path, fleet: str, interval: float, log: Path) -> subprocess.Popen[bytes]:
    """The simulator CLI in its own process, rewriting the tree every `interval` seconds."""
    argv = [
        sys.executable,
        "-m",
        "exporter.simulator",
        f"--path.sysfs={sysfs}",
        f"--fleet={fleet}",
        "--scenario=training",
        f"--interval={interval}",
    ]
    with open(log, "wb") as handle:
        return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
