"""End to end: `amdgpu-exporter --demo --demo.fleet=2xMI300X:CPX` as a real process serves 16
partition devices, and every per-device series equals the simulator's truth for that partition.

A scrape is compared only when it is known to come from one state of the tree: the truth file
did not change between just before and just after the scrape, and every device's sample was
read after that truth was written. Then the comparison is exact (same series, same values)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition.metrics import DEVICE_METRICS
from exporter.simulator.truth import SimulatedDevice, load_truth_json
from tests.realtools import start_exporter, wait_for_cycles, wait_ready

pytestmark = pytest.mark.integration

Labels = tuple[tuple[str, str], ...]
# Derived by the exporter from two consecutive reads (residency growth): a single truth cannot say.
DERIVED_FROM_TWO_READS = {"amdgpu_throttle_active"}
# Read now that `collectors.include=*` shows them (the collector concept reads what is shown), but not
# modelled per partition by the simulator's truth; tests/oracles/test_xcc_modern_tools.py holds them to
# amd-smi's figures instead.
NOT_IN_THE_PARTITION_TRUTH = {"amdgpu_xcc_below_host_limit_seconds", "amdgpu_media_engine_busy_ratio"}


def _series(text: str) -> dict[tuple[str, Labels], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _expected(device: SimulatedDevice) -> dict[tuple[str, Labels], float]:
    """Every per-device series the truth's sample implies, through the metric table's own getters."""
    expected = {}
    for spec in DEVICE_METRICS:
        if spec.name in DERIVED_FROM_TWO_READS or spec.name in NOT_IN_THE_PARTITION_TRUTH:
            continue
        assert spec.sample_getter is not None
        for labels, value in spec.sample_getter(device.sample):
            names = spec.labels[1:]
            expected[
                (spec.exposed_name, tuple(sorted(zip(("gpu", *names), (str(device.gpu), *labels), strict=True))))
            ] = value
    return expected


# a current kernel's table (v1.9), a fixed layout with per-partition blocks (v1_7), and 6.7-6.12's
# v1_5, which has no per-partition figures at all
@pytest.fixture(scope="module", params=["2xMI300X:CPX", "2xMI300X:CPX:gpu_metrics=1.7", "2xMI300X:CPX:gpu_metrics=1.5"])
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    truth = tmp_path_factory.mktemp("demo-cpx") / "truth.json"
    proc, port = start_exporter(
        "--demo",
        f"--demo.fleet={request.param}",
        "--demo.scenario=training",
        f"--demo.truth-file={truth}",
        "--collectors.include=*",  # every family, the ones off by default too: each is held to the truth
        "--window.all-series",
        "--interval=1s",
        "--slow-interval=1s",
    )
    try:
        wait_ready(port, proc, timeout=30)
        yield f"http://127.0.0.1:{port}", truth
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _consistent_scrape(url: str, truth_path: Path) -> tuple[list[SimulatedDevice], dict[tuple[str, Labels], float]]:
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        before = truth_path.read_bytes()
        text = httpx.get(url + "/metrics", timeout=5).text
        if truth_path.read_bytes() != before:
            continue
        devices = load_truth_json(truth_path)
        series = _series(text)
        written = min(d.sample.timestamp for d in devices)
        stamps = [series.get(("amdgpu_sample_timestamp_seconds", (("gpu", str(d.gpu)),))) for d in devices]
        if all(s is not None and s >= written for s in stamps):
            return devices, series
        time.sleep(0.1)
    raise AssertionError("no scrape of one consistent tree state within 40 s")


def test_sixteen_partitions_equal_the_truth(demo: tuple[str, Path]) -> None:
    url, truth_path = demo
    # two more poll cycles: throttle_active needs a previous read, slow layer refreshed
    wait_for_cycles(int(url.rsplit(":", 1)[1]), 3)
    devices, series = _consistent_scrape(url, truth_path)
    assert len(devices) == 16
    assert [d.gpu for d in devices] == list(range(16))
    for device in devices:
        gpu = str(device.gpu)
        ident = device.identity
        assert series[("amdgpu_up", (("gpu", gpu),))] == 1.0
        info = [dict(labels) for (name, labels) in series if name == "amdgpu_device_info" and ("gpu", gpu) in labels]
        assert len(info) == 1, gpu
        assert info[0]["pci_bus_id"] == ident.pci_bus_id and info[0]["unique_id"] == ident.unique_id
        assert info[0]["partition"] == str(ident.partition) == str(device.gpu % 8)
        assert info[0]["compute_partition"] == "CPX" and info[0]["memory_partition"] == ident.memory_partition
        assert info[0]["card"] == ident.card and info[0]["package"] == ident.package
        ours = {
            key: value
            for key, value in series.items()
            if ("gpu", gpu) in key[1]
            and any(key[0] == spec.exposed_name for spec in DEVICE_METRICS)
            and key[0] not in DERIVED_FROM_TWO_READS
            and key[0].removesuffix("_total") not in NOT_IN_THE_PARTITION_TRUTH
        }
        expected = _expected(device)
        assert set(ours) == set(expected), (gpu, sorted(set(ours) - set(expected)), sorted(set(expected) - set(ours)))
        for key, value in expected.items():
            assert ours[key] == pytest.approx(value, rel=1e-9), (gpu, key)
        if ident.partition > 0:
            # socket-wide values are exported once per socket, on partition 0
            assert not any(name in ("amdgpu_power_watts", "amdgpu_energy_joules_total") for name, _ in ours)
    # sum() over the node counts each socket once
    power = sum(v for (name, _), v in series.items() if name == "amdgpu_power_watts")
    assert power == sum(d.sample.power_watts or 0 for d in devices) and power > 0
    # topology: once per socket, partition 0 to partition 0 (the peer is a gpu index, not a BDF)
    links = {
        (dict(labels)["gpu"], dict(labels)["peer"], dict(labels)["type"])
        for (name, labels) in series
        if name == "amdgpu_topology_link_info"
    }
    assert links == {("0", "cpu", "pcie"), ("0", "8", "xgmi"), ("8", "cpu", "pcie"), ("8", "0", "xgmi")}


def test_mi300_throttle_series_come_from_residency(demo: tuple[str, Path]) -> None:
    url, truth_path = demo
    devices, series = _consistent_scrape(url, truth_path)
    versions = {d.identity.gpu_metrics_version for d in devices}
    throttle = {dict(labels)["reason"] for (name, labels) in series if name == "amdgpu_throttle_active"}
    if versions == {"1.5"}:
        assert throttle == set()  # v1_5 carries no throttle information at all
        return
    assert throttle == {"prochot", "ppt", "socket_thermal", "vr_thermal", "hbm_thermal"}
    sockets = {dict(labels)["gpu"] for (name, labels) in series if name == "amdgpu_throttle_active"}
    assert sockets == {"0", "8"}  # socket-wide: partition 0 only


def test_every_partition_shows_busy_or_says_why_not(demo: tuple[str, Path]) -> None:
    url, _truth = demo
    devices = httpx.get(url + "/api/v1/devices", timeout=5).json()["devices"]
    assert len(devices) == 16
    for device in devices:
        sample, why = device["sample"], device["unreported"]
        version = device["identity"]["gpu_metrics_version"]
        if device["identity"]["partition"] == 0:
            assert why == {} and sample["power_watts"] > 0 and "gfx" in sample["busy"]
            continue
        assert why["power"] == "on partition 0"
        if version == "1.5":
            assert sample["busy"] == {} and why["busy"] == "not in gpu_metrics 1.5"
        else:
            assert "gfx" in sample["busy"] and "busy" not in why
    page = httpx.get(url + "/", timeout=5).text
    assert page.count("on partition 0") == 14
    assert page.count("not in gpu_metrics 1.5") == (14 if devices[1]["identity"]["gpu_metrics_version"] == "1.5" else 0)
