"""A CPX node (2 x MI300X, 16 partitions, gpu_metrics v1_7) as amd-smi 10.1 and rocm-smi 6.4.1 see
it and as we serve it: the same partitions in the same order (gpu index, PCI bus, partition id),
the same compute and memory modes, and every value amd-smi metric reports for a socket (its
partition 0) equal to ours. For partitions 1..N-1 both tools read only the partition's platform
device and answer N/A for nearly everything (their known limitation); we serve their own busy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from exporter.simulator import Simulator
from tests.harness import scrape
from tests.oracles.compare import OurDevice
from tests.oracles.runner import Chroot, run_json
from tests.oracles.test_crosscheck_modern_tools import compare_amd_smi_metric
from tests.realtools import start_exporter, wait_ready

pytestmark = pytest.mark.integration

FLEET = "2xMI300X:CPX:gpu_metrics=1.7"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oracle-cpx") / "sys"
    simulator = Simulator(root, fleet=FLEET, scenario="training", seed=11)
    simulator.write_tree()
    simulator.tick(23.0)
    return root


@pytest.fixture(scope="module")
def ours(tree: Path) -> Iterator[dict[str, OurDevice]]:
    """Our devices by `gpu`, as the daemon serves them on the frozen tree."""
    proc, port = start_exporter(f"--path.sysfs={tree}", "--source=sysfs", "--interval=200ms", "--collectors.include=*")
    try:
        wait_ready(port, proc)
        time.sleep(0.3)
        series = scrape(f"http://127.0.0.1:{port}/metrics")
        api = httpx.get(f"http://127.0.0.1:{port}/api/v1/devices", timeout=5).json()
    finally:
        proc.terminate()
        proc.wait(10)
    identities = {str(d["gpu"]): d["identity"] for d in api["devices"]}
    devices = {}
    for name, labels in series:
        if name == "amdgpu_device_info":
            info = dict(labels)
            devices[info["gpu"]] = OurDevice(info["gpu"], info, identities[info["gpu"]], series)
    yield devices


@pytest.fixture(scope="module")
def reports(tree: Path, chroots: dict[str, Chroot]) -> dict[str, Any]:
    sid = chroots["sid"]
    return {
        "list": run_json(sid, tree, ["amd-smi", "list", "--json"]),
        "partition": run_json(sid, tree, ["amd-smi", "partition", "--json"]),
        "metric": run_json(sid, tree, ["amd-smi", "metric", "--json"]),
        "rocm-smi": run_json(sid, tree, ["rocm-smi", "--showbus", "--showcomputepartition", "--showmemorypartition",
                                         "--json"]),
    }  # fmt: skip


def test_amd_smi_lists_our_partitions_in_our_order(reports: dict[str, Any], ours: dict[str, OurDevice]) -> None:
    theirs = [(str(g["gpu"]), g["bdf"].lower(), str(g["partition_id"])) for g in reports["list"]]
    mine = sorted(((d.gpu, d.info["pci_bus_id"], d.info["partition"]) for d in ours.values()), key=lambda t: int(t[0]))
    assert len(mine) == 16
    assert theirs == mine


def test_rocm_smi_6_4_1_lists_the_same_partitions(reports: dict[str, Any], ours: dict[str, OurDevice]) -> None:
    cards = sorted((int(name[4:]), card) for name, card in reports["rocm-smi"].items() if name.startswith("card"))
    assert [card["PCI Bus"].lower() for _, card in cards] == [ours[str(i)].info["pci_bus_id"] for i in range(16)]
    for index, card in cards:
        info = ours[str(index)].info
        if info["partition"] == "0":
            assert (card["Compute Partition"], card["Memory Partition"]) == (
                info["compute_partition"],
                info["memory_partition"],
            )
        else:
            assert "Compute Partition" not in card  # the tool reads the partition's empty platform device


def test_amd_smi_partition_modes_equal_ours(reports: dict[str, Any], ours: dict[str, OurDevice]) -> None:
    for entry in reports["partition"]["current_partition"]:
        info = ours[str(entry["gpu_id"])].info
        assert str(entry["partition_id"]) == info["partition"]
        if info["partition"] == "0":
            assert (entry["accelerator_type"], entry["memory"]) == (info["compute_partition"], info["memory_partition"])
        else:
            assert entry["accelerator_type"] == "N/A"  # amd-smi's limitation on partitions 1..N-1
            assert info["compute_partition"] == "CPX"  # ours carries the socket's mode on every partition


def _socket_gfx_busy(ours: dict[str, OurDevice], bdf: str) -> float:
    """The socket's gfx busy from our series: the mean of its partitions' own busy."""
    values = [d.value("amdgpu_busy_ratio", engine="gfx") for d in ours.values() if d.info["pci_bus_id"] == bdf]
    assert len(values) == 8 and all(v is not None for v in values)
    return sum(v for v in values if v is not None) / len(values)


def test_amd_smi_metric_reports_our_socket_values(reports: dict[str, Any], ours: dict[str, OurDevice]) -> None:
    """Every value amd-smi metric reports for a socket equals ours. One differs by design: for
    partition 0 amd-smi reports the socket's gfx activity (average_gfx_activity), we partition 0's
    own (its xcp_stats block); amd-smi's equals the mean of our partitions' (within the kernel's
    whole-percent rounding), and with that value in place of ours every other value is compared."""
    by_gpu = {str(g["gpu"]): g for g in reports["metric"]["gpu_data"]}
    assert set(by_gpu) == set(ours)
    for gpu, device in ours.items():
        if device.info["partition"] != "0":
            continue
        theirs = by_gpu[gpu]["usage"]["gfx_activity"]
        socket = _socket_gfx_busy(ours, device.info["pci_bus_id"])
        assert abs(float(theirs["value"] if isinstance(theirs, dict) else theirs) / 100 - socket) <= 0.01
        series = dict(device.series)
        series[("amdgpu_busy_ratio", tuple(sorted({"gpu": gpu, "engine": "gfx"}.items())))] = round(socket * 100) / 100
        as_socket = OurDevice(device.gpu, device.info, device.identity, series)
        compare_amd_smi_metric(by_gpu[gpu], as_socket).finish()
