"""Our /metrics against the real readers on the same frozen tree.

The daemon runs as a real process (`--source sysfs --path.sysfs TREE`); Debian's rocm-smi reads
the same tree bind-mounted over /sys in a private mount namespace; node_exporter's drm and hwmon
collectors read it with --path.sysfs. Every value they report must equal ours after unit
conversion: if they disagree, we are wrong until shown otherwise.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exporter.simulator import Simulator
from tests.harness import Series, free_port, scrape, start_exporter, value, wait_ready
from tests.realtools import require_tool, run_in_sysfs_namespace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crosscheck") / "sys"
    simulator = Simulator(root, fleet="1xMI210,2xMI250X", scenario="training", seed=11)
    simulator.write_tree()
    simulator.tick(23.0)  # mid-training: busy, warm, energy accumulated; then frozen
    return root


@pytest.fixture(scope="module")
def ours(tree: Path) -> Iterator[tuple[Series, dict]]:
    proc, port = start_exporter(f"--path.sysfs={tree}", "--source=sysfs", "--interval=200ms")
    try:
        wait_ready(port, proc)
        time.sleep(0.5)
        series = scrape(f"http://127.0.0.1:{port}/metrics")
        devices = httpx.get(f"http://127.0.0.1:{port}/api/v1/devices", timeout=5).json()
        yield series, {d["identity"]["pci_bus_id"]: d for d in devices["devices"]}
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def rocm_smi(tree: Path) -> dict[str, dict[str, str]]:
    tool = require_tool("rocm-smi")
    flags = ["--showtemp", "--showpower", "--showuse", "--showmemuse", "--showmeminfo", "vram", "gtt",
             "--showclocks", "--showuniqueid", "--showbus", "--showenergycounter", "--showvoltage",
             "--showmaxpower"]  # fmt: skip
    result = run_in_sysfs_namespace(tree, [tool, "--json", *flags], timeout=60)
    start = result.stdout.index("{")
    report = json.loads(result.stdout[start:])
    return {card["PCI Bus"].lower(): card for name, card in report.items() if name.startswith("card")}


def _gpu_of(series: Series) -> dict[str, str]:
    return {dict(labels)["pci_bus_id"]: dict(labels)["gpu"] for name, labels in series if name == "amdgpu_device_info"}


def test_rocm_smi_reports_our_values(ours: tuple[Series, dict], rocm_smi: dict[str, dict[str, str]]) -> None:
    series, _ = ours
    gpus = _gpu_of(series)
    assert set(rocm_smi) == set(gpus), "rocm-smi and we must see the same GCDs"
    for bdf, card in rocm_smi.items():
        gpu = gpus[bdf]
        assert card["Unique ID"] == "0x" + dict(
            next(labels for name, labels in series if name == "amdgpu_device_info" and ("gpu", gpu) in labels)
        )["unique_id"].lstrip("0")
        for sensor, key in (("edge", "edge"), ("junction", "junction"), ("memory", "memory"),
                            ("hbm0", "HBM 0"), ("hbm1", "HBM 1"), ("hbm2", "HBM 2"), ("hbm3", "HBM 3")):  # fmt: skip
            assert value(series, "amdgpu_temperature_celsius", gpu=gpu, sensor=sensor) == float(
                card[f"Temperature (Sensor {key}) (C)"]
            ), (bdf, sensor)
        power = card["Average Graphics Package Power (W)"]
        ours_power = value(series, "amdgpu_power_watts", gpu=gpu)
        if power.startswith("N/A"):  # the secondary die of an MI250X
            assert ours_power is None and value(series, "amdgpu_energy_joules_total", gpu=gpu) is None
        else:
            assert ours_power == float(power)
            # Same accumulator; we apply the kernel's exact 2^-16 J tick, rocm-smi 15.3 uJ (0.27 % high).
            assert value(series, "amdgpu_energy_joules_total", gpu=gpu) == int(card["Energy counter"]) * 2.0**-16
            assert float(card["Accumulated Energy (uJ)"]) == pytest.approx(int(card["Energy counter"]) * 15.3)
            assert value(series, "amdgpu_power_cap_max_watts", gpu=gpu) is not None
        assert value(series, "amdgpu_busy_ratio", gpu=gpu, engine="gfx") == int(card["GPU use (%)"]) / 100
        assert value(series, "amdgpu_busy_ratio", gpu=gpu, engine="memory") == int(card["GPU memory use (%)"]) / 100
        assert value(series, "amdgpu_memory_total_bytes", gpu=gpu, pool="vram") == int(card["VRAM Total Memory (B)"])
        assert value(series, "amdgpu_memory_used_bytes", gpu=gpu, pool="vram") == int(
            card["VRAM Total Used Memory (B)"]
        )
        assert value(series, "amdgpu_memory_total_bytes", gpu=gpu, pool="gtt") == int(card["GTT Total Memory (B)"])
        assert value(series, "amdgpu_memory_used_bytes", gpu=gpu, pool="gtt") == int(card["GTT Total Used Memory (B)"])
        for domain, key in (("gfx", "sclk"), ("memory", "mclk"), ("fabric", "fclk"), ("soc", "socclk")):
            mhz = float(card[f"{key} clock speed:"].strip("()").removesuffix("Mhz"))
            assert value(series, "amdgpu_clock_hertz", gpu=gpu, domain=domain) == mhz * 1e6, (bdf, domain)
        assert value(series, "amdgpu_voltage_volts", gpu=gpu, rail="gfx") == pytest.approx(
            int(card["Voltage (mV)"]) / 1000
        )
        speed, width = card["pcie clock level"].split("(")[1].rstrip(")").split(" x")
        assert (
            value(series, "amdgpu_pcie_current_link_transfers_per_second", gpu=gpu)
            == float(speed.removesuffix("GT/s")) * 1e9
        )
        assert value(series, "amdgpu_pcie_current_link_width", gpu=gpu) == int(width)


@pytest.fixture(scope="module")
def node_exporter(tree: Path) -> Iterator[Series]:
    tool = require_tool("prometheus-node-exporter")
    port = free_port()
    proc = subprocess.Popen(
        [tool, f"--path.sysfs={tree}", "--collector.disable-defaults", "--collector.drm", "--collector.hwmon",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                yield scrape(f"http://127.0.0.1:{port}/metrics")
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)


def test_node_exporter_reports_our_values(ours: tuple[Series, dict], node_exporter: Series) -> None:
    series, devices = ours
    gpus = _gpu_of(series)
    checked = 0
    for bdf, gpu in gpus.items():
        card = devices[bdf]["identity"]["card"]
        drm = {
            "gpu_busy_percent": value(node_exporter, "node_drm_gpu_busy_percent", card=card),
            "vram_size": value(node_exporter, "node_drm_memory_vram_size_bytes", card=card),
            "vram_used": value(node_exporter, "node_drm_memory_vram_used_bytes", card=card),
            "gtt_used": value(node_exporter, "node_drm_memory_gtt_used_bytes", card=card),
        }
        assert drm["gpu_busy_percent"] is not None, f"node_exporter lost {card}"
        assert value(series, "amdgpu_busy_ratio", gpu=gpu, engine="gfx") == drm["gpu_busy_percent"] / 100
        assert value(series, "amdgpu_memory_total_bytes", gpu=gpu, pool="vram") == drm["vram_size"]
        assert value(series, "amdgpu_memory_used_bytes", gpu=gpu, pool="vram") == drm["vram_used"]
        assert value(series, "amdgpu_memory_used_bytes", gpu=gpu, pool="gtt") == drm["gtt_used"]
        # hwmon: node_exporter names the chip after the PCI path; find ours by its device BDF.
        chip = next(
            dict(labels)["chip"]
            for name, labels in node_exporter
            if name == "node_hwmon_chip_names" and dict(labels)["chip"].endswith(bdf.replace(".", "_"))
        )
        for sensor, hwmon in (("edge", "temp1"), ("junction", "temp2"), ("memory", "temp3")):
            assert value(series, "amdgpu_temperature_celsius", gpu=gpu, sensor=sensor) == value(
                node_exporter, "node_hwmon_temp_celsius", chip=chip, sensor=hwmon
            ), (bdf, sensor)
            assert value(series, "amdgpu_temperature_threshold_celsius", gpu=gpu, sensor=sensor,
                       threshold="critical") == value(node_exporter, "node_hwmon_temp_crit_celsius", chip=chip,
                                                    sensor=hwmon)  # fmt: skip
        their_power = value(node_exporter, "node_hwmon_power_average_watt", chip=chip, sensor="power1")
        our_power = value(series, "amdgpu_power_watts", gpu=gpu)
        assert our_power == their_power or (our_power is None and their_power == 0), (bdf, our_power, their_power)
        their_cap = value(node_exporter, "node_hwmon_power_cap_watt", chip=chip, sensor="power1")
        assert value(series, "amdgpu_power_cap_watts", gpu=gpu) == (their_cap or None)
        assert value(series, "amdgpu_voltage_volts", gpu=gpu, rail="gfx") == pytest.approx(
            value(node_exporter, "node_hwmon_in_volts", chip=chip, sensor="in0")
        )
        checked += 1
    assert checked == 5


# --- the health signals rocm-smi 5.2.3 reads: RAS counts per block, retired and pending pages ------

# `rocm-smi --showrasinfo all` rows of an enabled block: name, status, correctable, uncorrectable
RAS_ROW = re.compile(r"^\s*([A-Z0-9_]+)\s+ENABLED\s+([0-9]+)\s+([0-9]+)\s*$")
# `--showretiredpages` / `--showpendingpages` rows: address, size, status
PAGE_ROW = re.compile(r"^\s*0x[0-9a-f]+\s+0x[0-9a-f]+\s+(reserved|pending|unreservable)\s*$")


def per_gpu(text: str) -> dict[str, list[str]]:
    """rocm-smi's text output cut into its GPU[N] sections (N is rocm-smi's index, which is our `gpu`)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"^GPU\[([0-9]+)\]", line)
        if match:
            current = match.group(1)
        if current is not None:
            sections.setdefault(current, []).append(line)
    return sections


def page_statuses(lines: list[str]) -> Counter[str]:
    return Counter(m.group(1) for line in lines if (m := PAGE_ROW.match(line)))


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Series]]:
    """A tree frozen mid-fault (ECC errors, pages pending and retired; no "de:" line, which this
    librocm_smi refuses), and our /metrics of it."""
    root = tmp_path_factory.mktemp("crosscheck-faults") / "sys"
    faults = "ecc_ue.0+ecc_ce.1+bad_pages.0+bad_pages.2,fault_at=2,fault_for=10"
    simulator = Simulator(root, fleet="1xMI210,1xMI250X", scenario=f"training:faults={faults}", seed=11)
    simulator.write_tree()
    simulator.tick(8.0)
    proc, port = start_exporter(f"--path.sysfs={root}", "--source=sysfs", "--interval=200ms")
    try:
        wait_ready(port, proc)
        yield root, scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.terminate()
        proc.wait(10)


def test_rocm_smi_reads_our_ras_counts_and_bad_pages(faulted: tuple[Path, Series]) -> None:
    root, series = faulted
    tool = require_tool("rocm-smi")
    result = run_in_sysfs_namespace(root, [tool, "--showrasinfo", "all"], timeout=60)
    rows = 0
    for gpu, lines in per_gpu(result.stdout).items():
        for line in lines:
            if match := RAS_ROW.match(line):
                block = match.group(1).lower()
                assert value(series, "amdgpu_ecc_errors_total", gpu=gpu, block=block, type="correctable") == int(
                    match.group(2)
                ), (gpu, block)
                assert value(series, "amdgpu_ecc_errors_total", gpu=gpu, block=block, type="uncorrectable") == int(
                    match.group(3)
                ), (gpu, block)
                rows += 1
    assert rows >= 21  # the seven enabled blocks of three GCDs
    result = run_in_sysfs_namespace(root, [tool, "--showretiredpages", "--showpendingpages"], timeout=60)
    sections = per_gpu(result.stdout)
    moved = 0
    for gpu in _gpu_of(series).values():
        statuses = page_statuses(sections.get(gpu, []))
        assert statuses["reserved"] == value(series, "amdgpu_ras_retired_pages", gpu=gpu), gpu
        assert statuses["pending"] == value(series, "amdgpu_ras_pending_pages", gpu=gpu), gpu
        moved += statuses["pending"]
    assert moved > 0
