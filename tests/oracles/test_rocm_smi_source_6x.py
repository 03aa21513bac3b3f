"""`--source rocm-smi` on the 6.x libraries: our worker, run inside the trixie (librocm_smi64 6.1.2,
version 7.2.0) and sid (6.4.1, version 7.6.0) chroots against simulated trees, with the 6.x
struct layouts it chose from rsmi_version_get. The source's samples equal the sysfs source's on
the same frozen tree, field by field, partitions included; without the sysfs fallback, every
value the library itself provides equals the simulator's truth. An unknown version is refused
before any struct is handed to the library."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.model import DeviceIdentity, Sample
from exporter.simulator import Simulator
from exporter.sources.rocm_smi.source import RocmSmiSource, probe_rocm_smi
from exporter.sources.sysfs import SysfsSource
from tests.oracles.runner import Chroot
from tests.oracles.worker_in_chroot import ChrootWorkerPrefix

pytestmark = pytest.mark.integration

LIBRARIES = {"6.1.2": ("trixie", "7.2.0"), "6.4.1": ("sid", "7.6.0")}
FLEETS = ["1xMI210,1xMI250X", "1xMI300X:gpu_metrics=1.5", "1xMI300X:CPX:gpu_metrics=1.7", "1xMI300X"]
# an SR-IOV guest (no FRU, firmware versions or unique id) and an MI355X with its board/ group
FLEETS += ["2xMI300X:guest", "1xMI355X"]


def _differences(expected: object, actual: object, skip: tuple[str, ...] = ("timestamp",)) -> dict[str, tuple]:
    out = {}
    for field in dataclasses.fields(expected):  # type: ignore[arg-type]
        if field.name in skip:
            continue
        a, b = getattr(expected, field.name), getattr(actual, field.name)
        if hasattr(a, "items"):
            a, b = dict(a), dict(b)
        if a != b:
            out[field.name] = (a, b)
    return out


@pytest.fixture(params=FLEETS)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Simulator, Path]:
    root = tmp_path / "sys"
    simulator = Simulator(root, fleet=request.param, scenario="training", seed=7)
    simulator.write_tree()
    simulator.tick(21.0)  # then frozen: both sources read the same state
    return simulator, root


@pytest.fixture(params=list(LIBRARIES))
def prefix(request: pytest.FixtureRequest, chroots: dict[str, Chroot], tree: tuple[Simulator, Path]) -> Iterator:
    suite, version = LIBRARIES[request.param]
    made = ChrootWorkerPrefix(chroots[suite], tree[1])
    yield made, version
    made.close()


def _read_all(source: object, devices: list[DeviceIdentity]) -> dict[tuple[str, int], Sample]:
    return {(d.pci_bus_id, d.partition): source.read(d) for d in devices}  # type: ignore[attr-defined]


def test_rocm_smi_6x_source_equals_sysfs(tree: tuple[Simulator, Path], prefix: tuple) -> None:
    _simulator, root = tree
    worker_prefix, version = prefix
    sysfs = SysfsSource(root, slow_interval=60)
    source = RocmSmiSource(SysfsSource(root, slow_interval=60), worker_prefix=worker_prefix.argv, call_timeout=10)
    try:
        expected_devices = list(sysfs.discover())
        devices = list(source.discover())
        assert source.supervisor.library_version == version
        assert [(d.pci_bus_id, d.partition) for d in devices] == [(d.pci_bus_id, d.partition) for d in expected_devices]
        for ours, theirs in zip(devices, expected_devices, strict=True):
            # the library's view of what it can see; folders and KFD links come from sysfs either way
            assert _differences(theirs, ours, skip=()) == {}, ours.pci_bus_id
        theirs = _read_all(sysfs, expected_devices)
        ours = _read_all(source, devices)
        for key, sample in theirs.items():
            assert (
                _differences(
                    sample,
                    ours[key],
                    skip=(
                        "timestamp",
                        "pcie_bandwidth_bytes_per_second",
                        "pcie_bandwidth_upper_bound_bytes_per_second",
                    ),
                )
                == {}
            ), key
        assert source.supervisor.starts == 1 and source.supervisor.restarts == 0
    finally:
        source.close()
        sysfs.close()


def test_rocm_smi_6x_alone_reads_what_it_provides_equal_to_the_truth(
    tree: tuple[Simulator, Path], prefix: tuple
) -> None:
    simulator, _root = tree
    worker_prefix, _version = prefix
    truth = {t.identity.pci_bus_id: t for t in simulator.truth() if t.identity.partition == 0}
    source = RocmSmiSource(None, worker_prefix=worker_prefix.argv, call_timeout=10)
    try:
        devices = list(source.discover())
        assert [d.pci_bus_id for d in devices] == sorted(truth)  # partitions are not the library's to list
        deadline = time.monotonic() + 10
        samples = _read_all(source, devices)
        while (
            any(s.pcie_bandwidth_upper_bound_bytes_per_second is None for s in samples.values())
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)  # the library's PCIe throughput reader runs in the background (MI200 only)
            samples = _read_all(source, devices)
            if all(truth[b].sample.pcie_bandwidth_upper_bound_bytes_per_second is None for b, _p in samples):
                break
        for (bdf, _partition), sample in samples.items():
            expected = truth[bdf].sample
            checked = 0
            for field in dataclasses.fields(sample):
                value = getattr(sample, field.name)
                if field.name == "timestamp" or value is None or (hasattr(value, "items") and not value):
                    continue  # not provided by the library (the fallback serves it in service)
                want = getattr(expected, field.name)
                if hasattr(value, "items"):
                    # every key the library gives equals the truth's (a library may give fewer keys)
                    assert {k: want.get(k) for k in value} == dict(value), (bdf, field.name)
                elif isinstance(value, float):
                    assert value == pytest.approx(want, rel=1e-9), (bdf, field.name)
                else:
                    assert value == want, (bdf, field.name)
                checked += 1
            assert checked >= 10, (bdf, checked)
    finally:
        source.close()


def test_an_unknown_library_version_is_refused_before_any_struct(tmp_path: Path, chroots: dict[str, Chroot]) -> None:
    """The version check runs before rsmi_init: a library version without a known ABI gets no buffer."""
    from exporter.sources.rocm_smi import library as rc

    assert (7, 4, 0) not in rc.KNOWN_VERSIONS
    with pytest.raises(ValueError, match=r"version 7\.4\.0 has struct layouts this exporter does not know"):
        rc.abi_for((7, 4, 0))
    root = tmp_path / "sys"
    Simulator(root, fleet="1xMI210", scenario="idle", seed=1).write_tree()
    made = ChrootWorkerPrefix(chroots["trixie"], root)
    try:
        ok, reason = probe_rocm_smi(str(root), worker_prefix=made.argv)
        assert ok and "version 7.2.0" in reason, reason
    finally:
        made.close()
