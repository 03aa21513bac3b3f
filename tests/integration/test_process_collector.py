"""The process collector on the simulator's kfd/proc tree: processes coming and going, matched through KFD topology."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from exporter.attribution.attribute import attribute
from exporter.attribution.processes import ProcessCollector
from exporter.model import DeviceState
from exporter.simulator import Simulator
from exporter.simulator.kfd_proc import processes_at
from exporter.sources.sysfs import SysfsSource
from tests.realtools import require_tool, run_in_sysfs_namespace

pytestmark = pytest.mark.integration


def _devices(root: Path) -> list[DeviceState]:
    source = SysfsSource(str(root))
    try:
        return [DeviceState(identity, gpu, None, True) for gpu, identity in enumerate(source.discover())]
    finally:
        source.close()


def _expected(sim: Simulator, elapsed: float) -> dict[tuple[int, int], int]:
    """(gpu, pid) -> VRAM bytes, from the simulator's own model (gpu = GCD index in BDF order)."""
    by_gpu_id = {gcd.gpu_id: gcd.index for gcd in sim.gcds}
    return {
        (by_gpu_id[gpu_id], process.pid): vram
        for process in processes_at(sim.gcds, elapsed, sim.seed)
        for gpu_id, vram in process.vram_by_gpu_id().items()
    }


def test_processes_come_and_go_and_match_their_gpus(tmp_path: Path) -> None:
    sim = Simulator(tmp_path / "sys", fleet="2xMI250X")
    sim.simulate_processes()
    sim.write_tree()
    devices = _devices(tmp_path / "sys")
    assert len(devices) == 4
    collector = ProcessCollector(str(tmp_path / "sys"), procfs_root=str(tmp_path / "no-proc"))

    seen_pids: list[set[int]] = []
    for elapsed in (0.0, 13.0, 29.0, 47.0):
        sim.tick(elapsed)
        report = collector.read_once()
        assert report.up
        result = attribute(devices, (), process_report=report)
        got = {(p.gpu, p.pid): p.vram_bytes for p in result.processes}
        assert got == _expected(sim, elapsed)
        assert all(p.cu_occupancy is not None and p.sdma_seconds is not None for p in result.processes)
        seen_pids.append({pid for _gpu, pid in got})
        assert result.sources_up == {"processes": True}
    # Processes came and went between reads; the multi-GPU launcher stayed on both dies of package 0.
    assert any(a - b for a, b in itertools.pairwise(seen_pids))
    assert any(b - a for a, b in itertools.pairwise(seen_pids))
    assert all(9001 in pids for pids in seen_pids)

    capped = attribute(devices, (), process_report=collector.report, process_top=1)
    assert sorted(p.gpu for p in capped.processes) == [0, 1, 2, 3]


def test_no_kfd_is_down(tmp_path: Path) -> None:
    report = ProcessCollector(str(tmp_path)).read_once()
    assert not report.up and "cannot list" in report.error


def test_rocm_smi_showpids_reports_the_same_pids_vram_and_sdma(tmp_path: Path) -> None:
    rocm_smi = require_tool("rocm-smi")
    sim = Simulator(tmp_path / "sys", fleet="1xMI250X,1xMI210")  # the launcher spans the MI250X's two dies
    sim.simulate_processes()
    sim.write_tree()
    sim.tick(13.0)
    result = run_in_sysfs_namespace(sim.root, [rocm_smi, "--showpids", "--json"], timeout=60)
    assert "Traceback" not in result.stderr and "NOT_SUPPORTED" not in result.stderr, result.stderr
    # {"system": {"PID10000": "<name>, <number of GPUs>, <VRAM bytes>, <SDMA us>, <CU occupancy>"}}
    theirs = {}
    for key, value in json.loads(result.stdout)["system"].items():
        _name, gpus, vram, sdma, _cu = (field.strip() for field in value.split(","))
        theirs[int(key.removeprefix("PID"))] = (int(gpus), int(vram), float(sdma) / 1e6)

    report = ProcessCollector(str(sim.root), procfs_root=str(tmp_path / "no-proc")).read_once()
    ours: dict[int, tuple[int, int, float]] = {}
    for usage in attribute(_devices(sim.root), (), process_report=report).processes:
        gpus, vram, sdma = ours.get(usage.pid, (0, 0, 0.0))
        ours[usage.pid] = (gpus + 1, vram + (usage.vram_bytes or 0), sdma + (usage.sdma_seconds or 0.0))
    assert len(ours) >= 8 and ours[9001][0] == 2
    # rocm-smi sums a process's GPUs; the exporter has one series per GPU.
    assert theirs == ours
