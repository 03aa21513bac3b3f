"""The folder standing for /sys: --path.sysfs, or with --demo the simulator run in-process on a
temporary folder."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from exporter.config import ConfigError, Settings
from exporter.log import get_logger
from exporter.simulator.simulator import Simulator

log = get_logger("exporter.demo")


@contextlib.contextmanager
def sysfs_tree(settings: Settings) -> Iterator[str]:
    """Yields the folder standing for /sys; a --demo tree keeps ticking until the block is left."""
    if not settings.demo:
        yield settings.path_sysfs
        return
    # tmpfs where there is one: the simulator rewrites a few files per GCD every tick.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="amdgpu-exporter-demo-", dir=shm) as tmp:
        root = Path(tmp) / "sys"
        try:
            simulator = Simulator(root, fleet=settings.demo_fleet, scenario=settings.demo_scenario)
        except ValueError as error:
            raise ConfigError(f"--demo.fleet/--demo.scenario: {error}") from error
        if settings.collector_processes:
            simulator.simulate_processes()  # kfd/proc with processes coming and going
        stop = threading.Event()
        truth = Path(settings.demo_truth_file) if settings.demo_truth_file else None
        thread = threading.Thread(
            target=simulator.run, args=(min(settings.interval, 1.0), stop, truth), name="simulator", daemon=True
        )
        # Written here first so discovery never races the thread (run() writes the same t=0 tree again).
        simulator.write_tree()
        if truth is not None:
            simulator.write_truth_json(truth)
        thread.start()
        log.info("demo_started", sysfs=str(root), fleet=settings.demo_fleet, scenario=settings.demo_scenario)
        try:
            yield str(root)
        finally:
            stop.set()
            thread.join(timeout=0.5)  # a tick in progress ends within it; the thread is a daemon
