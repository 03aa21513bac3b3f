"""The sysfs source reads exactly what the simulator wrote, field by field, for every ASIC and every
gpu_metrics version the simulator can write (its encoder and our decoder were written apart, from
the kernel header, so they check each other); and the daemon exports the MI300X-only families."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import Simulator
from exporter.simulator.workload import FAULT_KINDS
from exporter.sources.sysfs import SysfsSource
from tests.realtools import start_exporter

FLEETS = [
    "1xMI210,2xMI250X",
    "2xMI300X",  # a current kernel's table (v1.9)
    "MI300X:gpu_metrics=1.4",
    "MI300X:gpu_metrics=1.5",
    "MI300X:gpu_metrics=1.6",
    "MI300X:gpu_metrics=1.7",
    # compute partitions: one device per partition, both platform device spellings, every table version
    "2xMI300X:CPX",
    "2xMI300X:CPX:gpu_metrics=1.5",  # no per-partition figures: the degraded case
    "2xMI300X:CPX:gpu_metrics=1.6",
    "MI300X:CPX:gpu_metrics=1.8",
    "MI300X:DPX:NPS1:gpu_metrics=1.7:xcp_names=dot",
    "MI325X:QPX:NPS4:gpu_metrics=1.9",
    "MI300X:CPX:xcp_nodes=all:gpu_metrics=1.7",
    "MI350X:CPX",
    "MI355X:DPX",
    "2xMI355X",  # the board/ group: two GPUs of one node
    "2xMI300X:guest,1xMI325X:guest",  # SR-IOV virtual functions: no FRU, no firmware versions, no unique id
]


# every fault on the first two GCDs, read while they last (the CPER records, pending pages, the
# coredump, the downtrained link ...)
ALL_FAULTS = "+".join(f"{kind}.{gcd}" for gcd in (0, 1) for kind in FAULT_KINDS)
SCENARIOS = [
    ("idle", 0.0),
    ("training", 17.0),
    ("thermal-excursion", 40.0),
    (f"training:faults={ALL_FAULTS},fault_at=5,fault_for=20", 16.0),
]


@pytest.mark.parametrize("fleet", FLEETS)
@pytest.mark.parametrize(("scenario", "elapsed"), SCENARIOS)
def test_every_field_equals_the_truth(tmp_path: Path, fleet: str, scenario: str, elapsed: float) -> None:
    try:
        simulator = Simulator(tmp_path / "sys", fleet=fleet, scenario=scenario, seed=5)
    except ValueError as error:
        pytest.fail(f"simulator rejected {fleet}: {error}")
    simulator.write_tree()
    simulator.tick(elapsed)
    source = SysfsSource(tmp_path / "sys", slow_interval=60)
    try:
        found = source.discover()
        truth = simulator.truth()
        assert [d.pci_bus_id for d in found] == [t.identity.pci_bus_id for t in truth]
        for identity, expected in zip(found, truth, strict=True):
            for f in dataclasses.fields(identity):
                assert getattr(identity, f.name) == getattr(expected.identity, f.name), (fleet, f.name)
            sample = source.read(identity)
            # pcie_bw is read in the background; wait for its first read before comparing.
            deadline = time.monotonic() + 5
            bound = "pcie_bandwidth_upper_bound_bytes_per_second"
            while getattr(sample, bound) is None and getattr(expected.sample, bound):
                assert time.monotonic() < deadline, "background pcie_bw reader never reported"
                time.sleep(0.02)
                sample = source.read(identity)
            for f in dataclasses.fields(sample):
                if f.name == "timestamp":
                    continue
                ours, theirs = getattr(sample, f.name), getattr(expected.sample, f.name)
                if isinstance(theirs, float):
                    assert ours == pytest.approx(theirs, rel=1e-9), (fleet, identity.pci_bus_id, f.name)
                else:
                    assert (dict(ours) if hasattr(ours, "items") else ours) == (
                        dict(theirs) if hasattr(theirs, "items") else theirs
                    ), (fleet, identity.pci_bus_id, f.name)
    finally:
        source.close()


@pytest.mark.integration
def test_daemon_exports_mi300x_fields(tmp_path: Path) -> None:
    simulator = Simulator(tmp_path / "sys", fleet="2xMI300X", scenario="training", seed=1)
    simulator.write_tree()
    simulator.tick(9.0)
    proc, port = start_exporter(f"--path.sysfs={tmp_path / 'sys'}", "--interval=200ms", "--collectors.include=*")
    try:
        text = ""
        deadline = time.monotonic() + 20
        while "amdgpu_xgmi_read_bytes_total" not in text:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                continue
        series = {
            (m.name, tuple(sorted(m.labels.items()))): m.value
            for family in text_string_to_metric_families(text)
            for m in family.samples
        }
        for expected in simulator.truth():
            gpu, sample = str(expected.gpu), expected.sample
            assert series[("amdgpu_pcie_bandwidth_bytes_per_second", (("gpu", gpu),))] == (
                sample.pcie_bandwidth_bytes_per_second
            )
            for link, read in sample.xgmi_read_bytes.items():
                assert series[("amdgpu_xgmi_read_bytes_total", (("gpu", gpu), ("link", str(link))))] == read
            for link, written in sample.xgmi_write_bytes.items():
                assert series[("amdgpu_xgmi_write_bytes_total", (("gpu", gpu), ("link", str(link))))] == written
            assert series[("amdgpu_xgmi_link_width", (("gpu", gpu),))] == sample.xgmi_link_width
            link_rate = sample.xgmi_link_speed_bytes_per_second
            assert series[("amdgpu_xgmi_link_speed_bytes_per_second", (("gpu", gpu),))] == link_rate
            assert series[("amdgpu_pcie_recoveries_total", (("gpu", gpu),))] == sample.pcie_recoveries
            # MI300X: every device measures its own power (no secondary die)
            assert series[("amdgpu_power_watts", (("gpu", gpu),))] == sample.power_watts
        assert 'compute_partition="SPX"' in text and 'memory_partition="NPS1"' in text
    finally:
        proc.terminate()
        proc.wait(10)
