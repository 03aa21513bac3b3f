"""Simulator trees with the faults operators meet: a hung device, missing files, a degraded PCIe
link. Shared by the snapshot, doctor and status-page tests."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.simulator import Simulator

MIXED_FLEET = "2xMI210,2xMI250X,MI300X"  # 7 devices: 2 single MI210, 2 dual-die MI250X packages, 1 MI300X


def write_tree(root: Path, fleet: str = MIXED_FLEET, scenario: str = "training") -> Simulator:
    """A simulated /sys written once (t=0) under `root`."""
    simulator = Simulator(root, fleet=fleet, scenario=scenario)
    simulator.write_tree()
    return simulator


def device_dir(simulator: Simulator, index: int) -> Path:
    """The PCI device folder of the index-th GCD (gpu label order: BDF order)."""
    return simulator.root / sorted(simulator.gcds, key=lambda g: g.bdf)[index].device_relpath


def hang(path: Path) -> None:
    """Replace `path` with a named pipe nobody writes: every open() of it blocks, as a read behind
    a hung SMU does. Release it with release(path)."""
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo)
    os.replace(fifo, path)


def release(path: Path) -> None:
    """Unblock every reader stuck on a pipe made by hang() (a writer opens and closes it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


def hang_device(simulator: Simulator, index: int) -> Path:
    """Hang the SMU-backed file the first poll of a device reads and discovery does not (its DPM
    table): the device is found, then its read never returns. Returns the hung file."""
    path = device_dir(simulator, index) / "pp_dpm_sclk"
    hang(path)
    return path


def degrade_pcie(simulator: Simulator, index: int, *, width: int | None = None, speed_gts: float | None = None) -> None:
    """Make the index-th device's PCIe link train below its maximum (current_link_*)."""
    folder = device_dir(simulator, index)
    if width is not None:
        (folder / "current_link_width").write_text(f"{width}\n")
    if speed_gts is not None:
        (folder / "current_link_speed").write_text(f"{speed_gts:.1f} GT/s PCIe\n")


def remove(simulator: Simulator, index: int, *names: str) -> None:
    """Delete files (relative to the device folder) as an older kernel or a failed driver would."""
    for name in names:
        (device_dir(simulator, index) / name).unlink()
