"""The simulator's kfd/proc read by the modern tools in their chroots: amd-smi 10.1 `process` (per GPU)
and rocm-smi 6.1.2 / 6.4.1 `--showpids` (per process, summed over its GPUs) report the pids, VRAM and
SDMA time the exporter's process collector reads from the same tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.attribution.attribute import attribute
from exporter.attribution.processes import ProcessCollector
from exporter.model import DeviceState
from exporter.simulator import Simulator
from exporter.sources.sysfs import SysfsSource
from tests.oracles.runner import Chroot, run_json

pytestmark = pytest.mark.integration

FLEET = "1xMI250X,1xMI210"  # the launcher (pid 9001) spans the MI250X's two dies


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sim = Simulator(tmp_path_factory.mktemp("kfd") / "sys", FLEET)
    sim.simulate_processes()
    sim.write_tree()
    sim.tick(13.0)
    return sim.root


@pytest.fixture(scope="module")
def ours(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], tuple[int, float]]:
    """(gpu, pid) -> (VRAM bytes, SDMA seconds), as the exporter reads them."""
    source = SysfsSource(str(tree))
    try:
        devices = [DeviceState(identity, gpu, None, True) for gpu, identity in enumerate(source.discover())]
    finally:
        source.close()
    report = ProcessCollector(str(tree), procfs_root=str(tmp_path_factory.mktemp("no-proc"))).read_once()
    result = {
        (u.gpu, u.pid): (u.vram_bytes or 0, u.sdma_seconds or 0.0)
        for u in attribute(devices, (), process_report=report).processes
    }
    assert len(result) >= 10 and (0, 9001) in result and (1, 9001) in result
    return result


def test_amd_smi_process_reports_our_pids_vram_and_sdma_per_gpu(
    chroots: dict[str, Chroot], tree: Path, ours: dict[tuple[int, int], tuple[int, float]]
) -> None:
    report = run_json(chroots["sid"], tree, ["amd-smi", "process", "--json"])
    theirs = {}
    for gpu in report:
        for entry in gpu["process_list"]:
            info = entry["process_info"]
            assert info["memory_usage"]["vram_mem"]["unit"] == "B" and info["sdma_usage"]["unit"] == "us"
            vram, sdma_us = info["memory_usage"]["vram_mem"]["value"], info["sdma_usage"]["value"]
            theirs[(gpu["gpu"], info["pid"])] = (vram, sdma_us / 1e6)
    assert theirs == ours


@pytest.mark.parametrize("suite", ["trixie", "sid"])
def test_rocm_smi_showpids_reports_our_pids_vram_and_sdma(
    chroots: dict[str, Chroot], tree: Path, ours: dict[tuple[int, int], tuple[int, float]], suite: str
) -> None:
    report = run_json(chroots[suite], tree, ["rocm-smi", "--showpids", "--json"])
    theirs = {}
    for key, value in report["system"].items():
        _name, gpus, vram, sdma, _cu = (field.strip() for field in value.split(","))
        theirs[int(key.removeprefix("PID"))] = (int(gpus), int(vram), float(sdma) / 1e6)
    summed: dict[int, tuple[int, int, float]] = {}
    for (_gpu, pid), (vram, sdma) in ours.items():
        count, total, seconds = summed.get(pid, (0, 0, 0.0))
        summed[pid] = (count + 1, total + vram, seconds + sdma)
    assert theirs == summed
