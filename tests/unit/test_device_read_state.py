"""The sysfs source's per-device read state: made by discovery, dropped whole when the device goes."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from exporter.simulator import Simulator
from exporter.sources.base import SourceError
from exporter.sources.sysfs import SysfsSource
from exporter.sources.sysfs.source import DeviceReadState

ROUNDS = 100


def descriptors_under(*folders: str) -> list[str]:
    """What this process's open descriptors name inside any of `folders`."""
    named = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if any(target.startswith(folder + os.sep) for folder in folders):
            named.append(target)
    return named


def read_all(source: SysfsSource) -> set[str]:
    """One cycle over every device discovery finds; the BDFs read fine."""
    read = set()
    for device in source.discover():
        try:
            source.read(device)
            read.add(device.pci_bus_id)
        except SourceError:
            pass
    return read


def test_a_device_that_comes_and_goes_leaves_no_state_thread_or_descriptor(tmp_path: Path) -> None:
    simulator = Simulator(tmp_path / "sys", fleet="2xMI250X", seed=3)  # MI200: pcie_bw read in the background
    simulator.write_tree()
    source = SysfsSource(tmp_path / "sys", slow_interval=0.0, pcie_bw_interval=0.05)
    identities = [truth.identity for truth in simulator.truth()]
    leaving = identities[1]
    away = str(tmp_path / "away")
    everyone = {identity.pci_bus_id for identity in identities}
    try:
        assert read_all(source) == everyone
        states: list[DeviceReadState] = []
        for _ in range(ROUNDS):
            state = source._devices[leaving.pci_bus_id]
            assert state.pcie is not None and state.kept._fds, "the device is read with its own reader and files"
            states.append(state)
            shutil.move(leaving.device_dir, away)  # off the bus
            source.read(leaving)  # a read racing the discovery that finds it gone
            assert read_all(source) == everyone - {leaving.pci_bus_id}
            assert leaving.pci_bus_id not in source._devices
            shutil.move(away, leaving.device_dir)  # and back
            assert read_all(source) == everyone
        states.append(source._devices[leaving.pci_bus_id])  # the state of its last return goes too
        shutil.move(leaving.device_dir, away)
        assert read_all(source) == everyone - {leaving.pci_bus_id}

        assert set(source._devices) == everyone - {leaving.pci_bus_id}
        assert leaving.pci_bus_id not in source._identifying
        assert len({id(state) for state in states}) == ROUNDS + 1, "a device back is a new state"
        deadline = time.monotonic() + 10.0
        for state in states:
            assert state.closed and not state.kept._fds
            assert state.pcie is not None
            state.pcie.join(timeout=max(deadline - time.monotonic(), 0.0))
            assert not state.pcie.is_alive(), "a gone device's pcie_bw reader ends"
        threads = [thread.name for thread in threading.enumerate()]
        assert not [name for name in threads if leaving.device_dir in name or away in name]
        mine = [name for name in threads if name.startswith("pcie_bw:") and str(tmp_path) in name]  # not other tests'
        assert len(mine) == len(everyone) - 1
        assert not descriptors_under(leaving.device_dir, away)
        staying = [identity.device_dir for identity in identities if identity is not leaving]
        assert descriptors_under(*staying), "the devices still there keep their files open"
    finally:
        source.close()
    kept_threads = [state.pcie for state in source._devices.values() if state.pcie is not None]
    for thread in kept_threads:
        thread.join(timeout=10.0)
    assert not any(thread.is_alive() for thread in kept_threads)
    assert not descriptors_under(str(tmp_path))
