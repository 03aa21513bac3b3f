"""Per-XCC figures as amd-smi 10.1 reads them and as we serve them (with --collector.xcc): every XCC's
busy, every VCN and JPEG ring's busy, the four clock-below-host-limit counters per XCC, each clock
domain's lowest level, the VRAM's peak bandwidth and the PCIe replay rollovers and link-partner
recoveries, on an MI300X whose load holds it at its power limit (so the power counters move; the
simulator's PCIe counters read 0).

Trees: an SPX socket (one device, 8 XCCs, gpu_metrics v1_8) and a CPX socket with per-partition
xcp_metrics, whose partition 0 amd-smi shows from the socket table's first block. amd-smi shows no
other partition's figures: for partitions 1..7 it reads their nearly empty platform device (N/A),
and in the socket table it misplaces v1_8 blocks 1..7 (its values land at other XCC indices of
other blocks), so those are not compared."""

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
from tests.realtools import start_exporter, wait_ready

pytestmark = pytest.mark.integration

FLEETS = {"SPX": "1xMI300X:gpu_metrics=1.8", "CPX": "1xMI300X:CPX:gpu_metrics=1.8;xcp_metrics=1.0"}
# amd-smi metric's throttle keys -> our reason label
COUNTERS = {
    "gfx_clk_below_host_limit_power_accumulated": "power",
    "gfx_clk_below_host_limit_thermal_accumulated": "thermal",
    "low_utilization_accumulated": "low_utilization",
    "total_gfx_clk_below_host_limit_accumulated": "total",
}
# amd-smi metric's clock entries -> our domain label
CLOCKS = {"gfx_0": "gfx", "mem_0": "memory", "fclk_0": "fabric", "socclk_0": "soc", "vclk_0": "video",
          "dclk_0": "decode"}  # fmt: skip
PROBE = (
    "import amdsmi as s, json; s.amdsmi_init(s.AmdSmiInitFlags.INIT_AMD_GPUS);"
    " print(json.dumps([s.amdsmi_get_gpu_metrics_info(s.amdsmi_get_processor_handles()[0])['vram_max_bandwidth']]))"
)


@pytest.fixture(scope="module", params=sorted(FLEETS))
def tree(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"oracle-xcc-{request.param}") / "sys"
    simulator = Simulator(root, fleet=FLEETS[request.param], scenario="training:load=1.6", seed=11)
    simulator.write_tree()
    simulator.tick(23.0)
    return root


@pytest.fixture(scope="module")
def ours(tree: Path) -> Iterator[OurDevice]:
    """Partition 0 of the socket (the whole socket in SPX), as the daemon serves it with --collector.xcc."""
    proc, port = start_exporter(
        f"--path.sysfs={tree}", "--source=sysfs", "--interval=200ms", "--collector.xcc", "--collectors.include=*"
    )
    try:
        wait_ready(port, proc)
        time.sleep(0.3)
        series = scrape(f"http://127.0.0.1:{port}/metrics")
        api = httpx.get(f"http://127.0.0.1:{port}/api/v1/devices", timeout=5).json()
    finally:
        proc.terminate()
        proc.wait(10)
    identity = next(d["identity"] for d in api["devices"] if str(d["gpu"]) == "0")
    info = next(dict(labels) for name, labels in series if name == "amdgpu_device_info" and dict(labels)["gpu"] == "0")
    yield OurDevice("0", info, identity, series)


@pytest.fixture(scope="module")
def reports(tree: Path, chroots: dict[str, Chroot]) -> dict[str, Any]:
    sid = chroots["sid"]
    metric = run_json(sid, tree, ["amd-smi", "metric", "--json"])
    return {"metric": metric["gpu_data"][0], "vram_max_bandwidth": run_json(sid, tree, ["python3", "-c", PROBE])[0]}


def _supplied(values: list[Any]) -> dict[int, float]:
    """amd-smi's per-instance list: index -> value where it shows one (a number, or {"value": n})."""
    found = {}
    for index, value in enumerate(values):
        if isinstance(value, dict):
            value = value.get("value")
        if isinstance(value, int | float):
            found[index] = float(value)
    return found


def _ours(device: OurDevice, name: str, label: str, scale: float, **labels: str) -> dict[int, float]:
    found = {}
    for (series_name, pairs), value in device.series.items():
        got = dict(pairs)
        if series_name == name and got.get("gpu") == "0" and all(got.get(k) == v for k, v in labels.items()):
            found[int(got[label])] = round(value * scale, 6)
    return found


def test_amd_smi_shows_our_per_xcc_busy(reports: dict[str, Any], ours: OurDevice) -> None:
    theirs = _supplied(reports["metric"]["usage"]["gfx_busy_inst"]["xcp_0"])
    assert theirs and theirs == _ours(ours, "amdgpu_xcc_busy_ratio", "xcc", 100)


def test_amd_smi_shows_our_decoder_busy(reports: dict[str, Any], ours: OurDevice) -> None:
    usage = reports["metric"]["usage"]
    for engine in ("vcn", "jpeg"):
        theirs = _supplied(usage[f"{engine}_busy"]["xcp_0"])
        assert theirs, engine
        assert theirs == _ours(ours, "amdgpu_media_engine_busy_ratio", "engine_index", 100, engine=engine), engine


def test_amd_smi_shows_our_host_limit_counters(reports: dict[str, Any], ours: OurDevice) -> None:
    throttle = reports["metric"]["throttle"]
    for key, reason in COUNTERS.items():
        theirs = _supplied(throttle[key]["xcp_0"])
        # ticks of accumulation_counter, 1 ms each
        assert theirs == _ours(ours, "amdgpu_xcc_below_host_limit_seconds_total", "xcc", 1000, reason=reason), key
    assert _supplied(throttle["gfx_clk_below_host_limit_power_accumulated"]["xcp_0"])[0] > 0


def test_amd_smi_shows_our_minimum_clocks(reports: dict[str, Any], ours: OurDevice) -> None:
    clock = reports["metric"]["clock"]
    for entry, domain in CLOCKS.items():
        assert clock[entry]["min_clk"]["value"] * 1e6 == ours.value("amdgpu_clock_min_hertz", domain=domain), entry


def test_amdsmi_gives_our_vram_max_bandwidth(reports: dict[str, Any], ours: OurDevice) -> None:
    bandwidth = ours.value("amdgpu_memory_max_bandwidth_bytes_per_second")
    assert bandwidth is not None and reports["vram_max_bandwidth"] * 1e9 == bandwidth


def test_amd_smi_shows_our_pcie_rollovers_and_other_end_recoveries(reports: dict[str, Any], ours: OurDevice) -> None:
    pcie = reports["metric"]["pcie"]
    assert pcie["replay_roll_over_count"] == ours.value("amdgpu_pcie_replay_rollovers_total")
    assert pcie["lc_perf_other_end_recovery_count"] == ours.value("amdgpu_pcie_other_end_recoveries_total")
