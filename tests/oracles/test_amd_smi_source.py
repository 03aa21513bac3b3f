"""`--source amd-smi`: our amd-smi worker (Debian sid's `amdsmi` module over libamd-smi27, 27.1.0)
run inside the sid chroot against simulated trees. With the sysfs fallback under it, its samples
equal the sysfs source's field by field, partitions included; alone, every value the library
itself provides equals the simulator's truth (and it provides most of them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.simulator import Simulator
from exporter.sources.amd_smi.source import AmdSmiSource
from exporter.sources.sysfs import SysfsSource
from tests.oracles.runner import Chroot
from tests.oracles.test_rocm_smi_source_6x import FLEETS, _differences, _read_all
from tests.oracles.worker_in_chroot import ChrootWorkerPrefix

pytestmark = pytest.mark.integration

LIBRARY_VERSION = "27.1.0"


@pytest.fixture(params=FLEETS)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Simulator, Path]:
    root = tmp_path / "sys"
    simulator = Simulator(root, fleet=request.param, scenario="training", seed=7)
    simulator.write_tree()
    simulator.tick(21.0)
    return simulator, root


@pytest.fixture
def prefix(chroots: dict[str, Chroot], tree: tuple[Simulator, Path]) -> Iterator[ChrootWorkerPrefix]:
    made = ChrootWorkerPrefix(chroots["sid"], tree[1])
    yield made
    made.close()


def test_amd_smi_source_equals_sysfs(tree: tuple[Simulator, Path], prefix: ChrootWorkerPrefix) -> None:
    _simulator, root = tree
    sysfs = SysfsSource(root, slow_interval=60)
    source = AmdSmiSource(SysfsSource(root, slow_interval=60), worker_prefix=prefix.argv, call_timeout=10)
    try:
        expected_devices = list(sysfs.discover())
        devices = list(source.discover())
        assert source.supervisor.library_version == LIBRARY_VERSION, source.supervisor.last_error
        assert [(d.pci_bus_id, d.partition) for d in devices] == [(d.pci_bus_id, d.partition) for d in expected_devices]
        for ours, theirs in zip(devices, expected_devices, strict=True):
            assert _differences(theirs, ours, skip=()) == {}, ours.pci_bus_id
        theirs = _read_all(sysfs, expected_devices)
        ours = _read_all(source, devices)
        for key, sample in theirs.items():
            # pcie_bw (MI200's upper bound) comes from a background reader per source: whether a
            # figure exists yet at this read depends on timing, not on the source.
            skip = ("timestamp", "pcie_bandwidth_bytes_per_second", "pcie_bandwidth_upper_bound_bytes_per_second")
            assert _differences(sample, ours[key], skip=skip) == {}, key
        assert source.supervisor.starts == 1 and source.supervisor.restarts == 0
    finally:
        source.close()
        sysfs.close()


def test_amd_smi_alone_reads_what_it_provides_equal_to_the_truth(
    tree: tuple[Simulator, Path], prefix: ChrootWorkerPrefix
) -> None:
    simulator, _root = tree
    truth = {t.identity.pci_bus_id: t for t in simulator.truth() if t.identity.partition == 0}
    source = AmdSmiSource(None, worker_prefix=prefix.argv, call_timeout=10)
    try:
        devices = list(source.discover())
        assert [d.pci_bus_id for d in devices] == sorted(truth)
        for device in devices:
            expected = truth[device.pci_bus_id].identity
            for name in ("unique_id", "device_id", "serial", "vbios", "compute_partition", "memory_partition"):
                assert getattr(device, name) == getattr(expected, name), (device.pci_bus_id, name)
        for (bdf, _partition), sample in _read_all(source, devices).items():
            expected = truth[bdf].sample
            checked = []
            for field in dataclasses.fields(sample):
                value = getattr(sample, field.name)
                if field.name == "timestamp" or value is None or (hasattr(value, "items") and not value):
                    continue
                want = getattr(expected, field.name)
                if hasattr(value, "items"):
                    assert {k: want.get(k) for k in value} == dict(value), (bdf, field.name)
                elif isinstance(value, float):
                    assert value == pytest.approx(want, rel=1e-9), (bdf, field.name)
                else:
                    assert value == want, (bdf, field.name)
                checked.append(field.name)
            assert len(checked) >= 12, (bdf, checked)
    finally:
        source.close()
