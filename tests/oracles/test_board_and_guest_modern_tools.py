"""The MI350-class board/ group and an SR-IOV guest, our /metrics against the modern tools.

- MI355X: amd-smi 10.1's `amdsmi` module (sid) reads board/gpuboard_temp and board/baseboard_temp
  (its GPUBOARD_* and BASEBOARD_* temperature types) and the node's NPM info (limit, status); every
  sensor it reads is one we export, with the same value, and no sensor of ours is one it lacks.
  Its CLI shows the same: `amd-smi metric -b -G` per GPU, `amd-smi node` once for the node (NPM
  limit, status and the baseboard's power threshold, the baseboard sensors). Node power, baseboard
  power and max_node_power_limit it does not show: held to the tree in the unit tests.
- MI300X:guest (an MI300X VF, 0x74b5): rocm-smi 6.1.2, 6.4.1 and amd-smi static report no serial
  (N/A), a unique id of 0, no voltage, fan or edge temperature, and "Current Socket Graphics Package
  Power"; we export no series for those, empty serial and unique_id labels, deployment="guest"
  and identity_source="pci_bus_id", and the same power.

The exporter runs as a real process; the tools in chroots with the tree as /sys (runner.py).
Under CI=true a chroot that cannot be built fails the test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.simulator import Simulator
from tests.harness import Series, scrape
from tests.oracles.runner import Chroot, run_json
from tests.realtools import start_exporter, wait_ready

pytestmark = pytest.mark.integration

PROBE = Path(__file__).with_name("board_probe.py").read_text()


def _tree(tmp_path_factory: pytest.TempPathFactory, fleet: str) -> Path:
    root = tmp_path_factory.mktemp("oracle-board") / "sys"
    simulator = Simulator(root, fleet=fleet, scenario="training", seed=11)
    simulator.write_tree()
    simulator.tick(23.0)
    return root


def _ours(tree: Path) -> Series:
    proc, port = start_exporter(
        f"--path.sysfs={tree}",
        "--source=sysfs",
        "--interval=200ms",
        "--collector.board-temperatures",
        "--collectors.include=*",
    )
    try:
        wait_ready(port, proc)
        time.sleep(0.3)
        return scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.terminate()
        proc.wait(10)


def _gpu_by_bdf(series: Series) -> dict[str, dict[str, str]]:
    return {
        dict(labels)["pci_bus_id"]: dict(labels) for (name, labels), _ in series.items() if name == "amdgpu_device_info"
    }


@pytest.fixture(scope="module")
def mi355x(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _tree(tmp_path_factory, "2xMI355X")


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _tree(tmp_path_factory, "2xMI300X:guest")


def _sensor(amdsmi_name: str) -> tuple[str, str]:
    """amdsmi's temperature type -> (our family, our sensor label)."""
    if amdsmi_name.startswith("BASEBOARD_"):
        return "amdgpu_baseboard_temperature_celsius", amdsmi_name.removeprefix("BASEBOARD_").lower()
    name = amdsmi_name.removeprefix("GPUBOARD_")
    return "amdgpu_board_temperature_celsius", name.removeprefix("NODE_").lower()


def test_amdsmi_reads_the_board_sensors_we_export(mi355x: Path, chroots: dict[str, Chroot]) -> None:
    ours = _ours(mi355x)
    report: list[dict[str, Any]] = run_json(chroots["sid"], mi355x, ["python3", "-c", PROBE])
    gpus = _gpu_by_bdf(ours)
    assert sorted(d["bdf"] for d in report) == sorted(gpus)
    for device in report:
        gpu = gpus[device["bdf"]]["gpu"]
        theirs: dict[tuple[str, str], float] = {}
        for kind, result in device["temps"].items():
            if "ok" in result:
                theirs[_sensor(kind)] = float(result["ok"])
            else:
                assert "NOT_SUPPORTED" in result["error"], (kind, result)
        mine = {
            (name, labels["sensor"]): value
            for (name, label_items), value in ours.items()
            if name.endswith("board_temperature_celsius") and (labels := dict(label_items)).get("gpu", gpu) == gpu
        }
        assert len(theirs) == 42  # 6 board + 13 regulator sensors, 23 on the baseboard
        assert theirs == mine
    # amdsmi's NPM info is the node's: it answers it through one GPU of the node (NOT_SUPPORTED on the others)
    npm = [device["npm"]["ok"] for device in report if "ok" in device["npm"]]
    assert len(npm) >= 1
    for info in npm:
        assert info["limit"] == ours[("amdgpu_node_power_limit_watts", ())]
        assert info["status"] == 1 and ours[("amdgpu_node_power_management_active", ())] == 1.0


def _cli_temperatures(section: dict[str, Any], family: str) -> dict[tuple[str, str], float]:
    """amd-smi's `{"temperature": {"UBB_FPGA": {"value": 28, "unit": "°C"}, ...}}` as ours are keyed."""
    found = {}
    for name, reading in section["temperature"].items():
        if isinstance(reading, dict):
            sensor = (
                name.removeprefix("NODE_").lower() if family == "amdgpu_board_temperature_celsius" else name.lower()
            )
            found[(family, sensor)] = float(reading["value"])
    return found


def test_amd_smi_cli_shows_the_board_and_the_node_as_we_do(mi355x: Path, chroots: dict[str, Chroot]) -> None:
    # `amd-smi metric -b -G` per GPU, `amd-smi node` once per node: the node-wide values shown once, as ours
    ours = _ours(mi355x)
    gpus = sorted(_gpu_by_bdf(ours).values(), key=lambda info: int(info["gpu"]))
    metric = run_json(chroots["sid"], mi355x, ["amd-smi", "metric", "-b", "-G", "--json"])
    for info, gpu in zip(gpus, metric["gpu_data"], strict=True):
        board = _cli_temperatures(gpu["gpu_board"], "amdgpu_board_temperature_celsius")
        baseboard = _cli_temperatures(gpu["base_board"], "amdgpu_baseboard_temperature_celsius")
        assert len(board) == 19 and len(baseboard) == 23
        for (family, sensor), value in {**board, **baseboard}.items():
            labels = (("gpu", info["gpu"]), ("sensor", sensor)) if "_board_" in family else (("sensor", sensor),)
            assert ours[(family, labels)] == value, (family, sensor)
    node = run_json(chroots["sid"], mi355x, ["amd-smi", "node", "--json"])
    assert len(node) == 1
    management = node[0]["node"]["power_management"]
    assert management["limit"]["value"] == ours[("amdgpu_node_power_limit_watts", ())]
    assert management["status"] == "ENABLED" and ours[("amdgpu_node_power_management_active", ())] == 1.0
    # its "threshold" is board/baseboard_power_limit (amdsmi_npm_info_t.ubb_power_threshold)
    assert management["threshold"]["value"] == ours[("amdgpu_baseboard_power_limit_watts", ())]
    shown = _cli_temperatures(node[0]["node"]["base_board"], "amdgpu_baseboard_temperature_celsius")
    assert {sensor: value for (_f, sensor), value in shown.items()} == {
        dict(labels)["sensor"]: value
        for (name, labels), value in ours.items()
        if name == "amdgpu_baseboard_temperature_celsius"
    }


def test_a_guest_shows_what_the_tools_show(guest: Path, chroots: dict[str, Chroot]) -> None:
    ours = _ours(guest)
    gpus = _gpu_by_bdf(ours)
    for info in gpus.values():
        assert (info["deployment"], info["identity_source"]) == ("guest", "pci_bus_id")
        assert info["serial"] == info["unique_id"] == "" and info["vbios"] == "113-MI3SRIOV-001"
        assert info["product"] == "AMD Instinct MI300X VF"
    assert len(gpus) == 2 and len({info["gpu"] for info in gpus.values()}) == 2
    families = {name for name, _ in ours}
    assert not families & {"amdgpu_voltage_volts", "amdgpu_firmware_info"}
    assert not [
        labels for (name, labels) in ours if name == "amdgpu_temperature_celsius" and ("sensor", "edge") in labels
    ]
    # the daemon found nothing unreadable: a VF's missing files are not faults
    assert not [key for key in ours if key[0] == "amdgpu_exporter_file_errors_total"]
    flags = [
        "--showserial",
        "--showuniqueid",
        "--showvoltage",
        "--showtemp",
        "--showpower",
        "--showfan",
        "--showfwinfo",
    ]
    for chroot in (chroots["trixie"], chroots["sid"]):
        report = run_json(chroot, guest, ["rocm-smi", "--json", *flags])
        cards = [card for key, card in report.items() if key.startswith("card")]
        assert len(cards) == 2
        power = sorted(value for (name, _), value in ours.items() if name == "amdgpu_power_watts")
        assert sorted(float(c["Current Socket Graphics Package Power (W)"]) for c in cards) == power
        for card in cards:
            assert card["Serial Number"] == "N/A" and card["Unique ID"] in ("0x0", "N/A")
            assert not [key for key in card if "edge" in key or "Fan" in key or "Voltage" in key or "FW" in key]
    static = run_json(chroots["sid"], guest, ["amd-smi", "static", "--json"])
    for gpu in static["gpu_data"]:
        assert gpu["asic"]["asic_serial"] == gpu["board"]["product_serial"] == gpu["board"]["model_number"] == "N/A"
        assert gpu["asic"]["device_id"] == "0x74b5" and gpu["ifwi"]["part_number"] == "113-MI3SRIOV-001"
