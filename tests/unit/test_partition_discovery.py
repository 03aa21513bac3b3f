"""Partition discovery on simulated trees: every partition a device, in amd-smi's order, with its
KFD identity; a compute-mode change at run time picked up by rediscovery under the device key
(pci_bus_id, unique_id, partition); MI300 throttle state from the residency counters."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exporter.pipeline.poller import Poller
from exporter.simulator import Simulator
from exporter.sources.gpu_metrics import decode_gpu_metrics
from exporter.sources.sysfs import SysfsSource
from exporter.sources.sysfs.partitions import (
    PartitionLayout,
    partition_busy,
    partition_figures,
    throttlers_active,
)


def _tree(root: Path, fleet: str, seed: int = 4, elapsed: float = 12.0) -> Simulator:
    if root.exists():
        shutil.rmtree(root)
    simulator = Simulator(root, fleet=fleet, scenario="training", seed=seed)
    simulator.write_tree()
    simulator.tick(elapsed)
    return simulator


@pytest.mark.parametrize("names", ["", ":xcp_names=dot"])
def test_partitions_are_devices_in_socket_then_partition_order(tmp_path: Path, names: str) -> None:
    simulator = _tree(tmp_path / "sys", f"2xMI300X:QPX{names}")
    found = SysfsSource(tmp_path / "sys").discover()
    assert [(d.pci_bus_id, d.partition) for d in found] == [
        (t.identity.pci_bus_id, t.identity.partition) for t in simulator.truth()
    ]
    assert [d.partition for d in found] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert len({d.key for d in found}) == 8 and len({d.pci_bus_id for d in found}) == 2
    assert all(
        d.compute_partition == "QPX" and d.package == found[0 if i < 4 else 4].package for i, d in enumerate(found)
    )
    assert all(d.hwmon_dir == "" for d in found if d.partition > 0)  # hwmon is the socket's, on partition 0


def test_a_mode_change_is_picked_up_by_rediscovery_under_the_same_keys(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    _tree(root, "MI300X:SPX:gpu_metrics=1.7")
    poller = Poller(SysfsSource(root), interval=1.0, read_timeout=2.0, discovery_interval=0)
    try:
        spx = poller.discover()
        assert [d.partition for d in spx] == [0]
        # SPX -> CPX: the driver re-enumerates; the PCI device stays, seven platform devices appear
        _tree(root, "MI300X:CPX:gpu_metrics=1.7")
        cpx = poller.discover()
        assert [d.partition for d in cpx] == list(range(8))
        assert cpx[0].key == spx[0].key and cpx[0].compute_partition == "CPX"
        assert poller.device_count == 8
        # CPX -> DPX: partitions 2..7 left with the mode (dropped, never down), 0 and 1 stay
        _tree(root, "MI300X:DPX:gpu_metrics=1.7")
        dpx = poller.discover()
        assert [d.partition for d in dpx] == [0, 1]
        import asyncio

        snapshot = asyncio.run(poller.poll_once())
        states = {(s.identity.partition): s for s in snapshot.devices}
        assert states[0].up and states[1].up
        assert sorted(states) == [0, 1]
        assert states[1].sample is not None and "gfx" in states[1].sample.busy
    finally:
        poller.close()


def test_v1_9_busy_is_split_by_each_partitions_xcc_count(tmp_path: Path) -> None:
    simulator = _tree(tmp_path / "sys", "MI300X:QPX:gpu_metrics=1.9")
    truth = simulator.truth()
    blob = (Path(truth[0].identity.device_dir) / "gpu_metrics").read_bytes()
    metrics = decode_gpu_metrics(blob)
    layout = PartitionLayout((2, 2, 2, 2))
    for t in truth:
        figures = partition_figures(None, metrics, layout, t.identity.partition)
        assert partition_busy(figures) == {"gfx": pytest.approx(t.partition.gfx_busy)}
        assert figures is not None and figures.gfx_busy == pytest.approx(t.partition.gfx_busy_per_xcc)
        # the device-wide decoder arrays cannot be split between partitions: none of them is given one
        assert figures.vcn_busy == () and figures.jpeg_busy == ()
    # a layout that does not cover the device-wide array says nothing rather than guessing
    assert partition_figures(None, metrics, PartitionLayout((4, 4, 4)), 0) is None


def test_throttlers_are_active_while_their_residency_grows() -> None:
    before = {"ppt": 100, "socket_thm": 7, "prochot": 0xFFFFFFF0}
    after = {"ppt": 180, "socket_thm": 7, "prochot": 0x00000005, "hbm_thm": 3}  # prochot wrapped
    assert throttlers_active(before, after) == {"ppt": True, "socket_thermal": False, "prochot": True}


def test_mi300_throttle_active_after_a_second_read_and_residency_in_seconds(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    # training at a PPT-limited load: the simulator holds the clocks back for power
    simulator = Simulator(root, fleet="MI300X:gpu_metrics=1.7", scenario="training:load=1.6", seed=2)
    simulator.write_tree()
    simulator.tick(20.0)
    source = SysfsSource(root)
    device = source.discover()[0]
    first = source.read(device)
    assert dict(first.throttle) == {}  # nothing to compare with yet
    raw = simulator.truth()[0].gpu_metrics
    assert raw is not None
    assert first.throttle_residency_seconds["ppt"] == pytest.approx(raw["ppt_residency_acc"] / 1000)
    simulator.tick(25.0)
    second = source.read(device)
    raw2 = simulator.truth()[0].gpu_metrics
    assert raw2 is not None
    grew = {name: raw2[f"{acc}_residency_acc"] != raw[f"{acc}_residency_acc"] for acc, name in (
        ("prochot", "prochot"), ("ppt", "ppt"), ("socket_thm", "socket_thermal"), ("vr_thm", "vr_thermal"),
        ("hbm_thm", "hbm_thermal"))}  # fmt: skip
    assert dict(second.throttle) == grew
    assert grew["ppt"], "the scenario should hold the socket at its power limit"
    source.close()


def test_a_mode_change_triggers_rediscovery_without_waiting_for_the_interval(tmp_path: Path) -> None:
    """The slow schedule notices current_compute_partition changed; the poller rediscovers at once
    (its own discovery interval here is an hour)."""
    import asyncio

    root = tmp_path / "sys"
    _tree(root, "MI300X:SPX:gpu_metrics=1.7")
    source = SysfsSource(root, slow_interval=0.05)
    poller = Poller(source, interval=0.05, read_timeout=2.0, discovery_interval=3600)

    async def run() -> list[int]:
        counts = []
        stop = asyncio.Event()
        task = asyncio.create_task(poller.run(stop))
        await asyncio.sleep(0.3)
        counts.append(poller.device_count)
        _tree(root, "MI300X:CPX:gpu_metrics=1.7")  # the driver re-enumerates: 1 device -> 8 partitions
        for _ in range(40):
            await asyncio.sleep(0.05)
            if poller.device_count == 8:
                break
        counts.append(poller.device_count)
        stop.set()
        await task
        return counts

    poller.discover()
    try:
        assert asyncio.run(run()) == [1, 8]
        assert not source.needs_rediscovery()
    finally:
        poller.close()
