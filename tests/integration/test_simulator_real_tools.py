"""The simulator's tree read by real, unmodified tools: Debian's rocm-smi and librocm_smi64 5.2.3
and prometheus-node-exporter 1.5.0. Whatever they report must equal Simulator.truth().

The tree is frozen (write_tree + one tick, no updater) so every tool sees the same values.
GCD 1 (an MI250X primary die) is in a thermal excursion at that moment: hot, throttling and
running below its top gfxclk, which exercises the three-line pp_dpm_sclk format.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import SimulatedDevice, Simulator
from exporter.simulator.physics import ENERGY_TICK_J
from exporter.simulator.tree import CPU_NODE_DISTANCE
from tests.realtools import (
    NODE_EXPORTER,
    ROCM_SMI_LIBRARY,
    free_port,
    require_file,
    require_tool,
    run_in_sysfs_namespace,
    start_in_sysfs_namespace,
    stop,
    wait_for_port,
)

pytestmark = pytest.mark.integration

FLEET = "1xMI210,2xMI250X"
SCENARIO = "thermal-excursion:start=4,hot=40,gpus=1"
ELAPSED = 28.0
ROCM_SMI_FLAGS = [
    "--showtemp",
    "--showpower",
    "--showmaxpower",
    "--showuse",
    "--showmemuse",
    "--showmeminfo",
    "vram",
    "gtt",
    "--showclocks",
    "--showvoltage",
    "--showuniqueid",
    "--showserial",
    "--showbus",
    "--showfwinfo",
    "--showproductname",
    "--showvbios",
    "--showdriverversion",
    "--showenergycounter",
    "--showmemvendor",
    "--showperflevel",
    "-b",
    "--showreplaycount",
    "--showtopo",
]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Simulator:
    simulator = Simulator(tmp_path_factory.mktemp("sim") / "sys", FLEET, SCENARIO, seed=7)
    simulator.write_tree()
    simulator.tick(ELAPSED)
    return simulator


@pytest.fixture(scope="module")
def truth(sim: Simulator) -> list[SimulatedDevice]:
    devices = sim.truth()
    # the scenario must put the conditions this file checks on the table
    assert devices[1].sample.temperatures["junction"] >= 88
    assert devices[1].sample.throttle["temp_gpu"]
    assert devices[1].sample.clocks_hertz["gfx"] < devices[1].sample.clocks_max_hertz["gfx"]
    assert [d.identity.die for d in devices] == [0, 0, 1, 0, 1]
    return devices


@pytest.fixture(scope="module")
def rocm_smi_json(sim: Simulator) -> dict[str, dict[str, str]]:
    rocm_smi = require_tool("rocm-smi")
    result = run_in_sysfs_namespace(sim.root, [rocm_smi, *ROCM_SMI_FLAGS, "--json"], timeout=60)
    # rocm-smi exits with the last unsupported status (e.g. firmware blocks the board lacks);
    # what matters is that it ran to the end and printed its report
    assert "Traceback" not in result.stderr, result.stderr
    report: dict[str, dict[str, str]] = json.loads(result.stdout)
    return report


def _card(report: dict[str, dict[str, str]], device: SimulatedDevice) -> dict[str, str]:
    return report[device.identity.card]


def test_rocm_smi_sees_every_gcd_at_its_pci_address(
    rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]
) -> None:
    assert sorted(k for k in rocm_smi_json if k.startswith("card")) == [f"card{i}" for i in range(len(truth))]
    for device in truth:
        assert _card(rocm_smi_json, device)["PCI Bus"].lower() == device.identity.pci_bus_id


def test_rocm_smi_temperatures(rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]) -> None:
    names = {"edge": "edge", "junction": "junction", "memory": "memory"}
    names.update({f"hbm{k}": f"HBM {k}" for k in range(4)})
    for device in truth:
        card = _card(rocm_smi_json, device)
        for sensor, label in names.items():
            assert float(card[f"Temperature (Sensor {label}) (C)"]) == device.sample.temperatures[sensor]


def test_rocm_smi_power_energy_and_secondary_die(
    rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]
) -> None:
    for device in truth:
        card = _card(rocm_smi_json, device)
        sample = device.sample
        if device.identity.die == 0:
            assert sample.power_watts is not None and sample.energy_joules is not None
            assert float(card["Average Graphics Package Power (W)"]) == sample.power_watts
            assert float(card["Max Graphics Package Power (W)"]) == sample.power_cap_watts
            assert int(card["Energy counter"]) == round(sample.energy_joules / ENERGY_TICK_J)
        else:
            # Aldebaran's second die reads 0 for power, cap and energy; rocm-smi names it
            assert sample.power_watts is None and sample.energy_joules is None
            assert card["Average Graphics Package Power (W)"] == "N/A (Secondary die)"
            assert float(card["Max Graphics Package Power (W)"]) == 0.0
            assert int(card["Energy counter"]) == 0


def test_rocm_smi_use_and_memory(rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]) -> None:
    for device in truth:
        card = _card(rocm_smi_json, device)
        sample = device.sample
        assert int(card["GPU use (%)"]) == round(sample.busy["gfx"] * 100)
        assert int(card["GPU memory use (%)"]) == round(sample.busy["memory"] * 100)
        assert int(card["VRAM Total Memory (B)"]) == sample.memory_total_bytes["vram"]
        assert int(card["VRAM Total Used Memory (B)"]) == sample.memory_used_bytes["vram"]
        assert int(card["GTT Total Memory (B)"]) == sample.memory_total_bytes["gtt"]
        assert int(card["GTT Total Used Memory (B)"]) == sample.memory_used_bytes["gtt"]


def test_rocm_smi_clocks_and_voltage(rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]) -> None:
    domains = {"sclk": "gfx", "mclk": "memory", "fclk": "fabric", "socclk": "soc"}
    for device in truth:
        card = _card(rocm_smi_json, device)
        for clock, domain in domains.items():
            speed = re.fullmatch(r"\((\d+)Mhz\)", card[f"{clock} clock speed:"])
            assert speed, card[f"{clock} clock speed:"]
            assert int(speed.group(1)) * 1e6 == device.sample.clocks_hertz[domain]
        assert int(card["Voltage (mV)"]) == round(device.sample.voltages_volts["gfx"] * 1000)
    # the throttled die shows its gfxclk as the middle of three fine-grained levels
    assert _card(rocm_smi_json, truth[1])["sclk clock level:"] == "1"


def test_rocm_smi_identity_and_firmware(rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]) -> None:
    assert rocm_smi_json["system"]["Driver version"] == truth[0].identity.driver_version
    for device in truth:
        card = _card(rocm_smi_json, device)
        ident = device.identity
        assert int(card["Unique ID"], 16) == int(ident.unique_id, 16)
        assert card["Serial Number"] == ident.serial
        assert card["VBIOS version"] == ident.vbios
        assert card["Card series"] == ident.product
        assert card["Card SKU"] == ident.vbios.split("-")[1][:6]
        firmware = {
            key.removesuffix(" firmware version").lower().replace(" ", "_"): _firmware_number(value)
            for key, value in card.items()
            if key.endswith(" firmware version")
        }
        assert firmware == {block: int(version, 16) for block, version in ident.firmware.items()}


def _firmware_number(text: str) -> int:
    """rocm-smi prints firmware as hex (0x...), decimal, or dotted bytes (SMC, TA)."""
    if text.startswith("0x"):
        return int(text, 16)
    if "." in text:
        return int.from_bytes(bytes(int(part) for part in text.split(".")), "big")
    return int(text)


def test_rocm_smi_pcie(rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]) -> None:
    for device in truth:
        card = _card(rocm_smi_json, device)
        sample = device.sample
        assert sample.pcie_bandwidth_upper_bound_bytes_per_second is not None
        estimate = float(card["Estimated maximum PCIe bandwidth over the last second (MB/s)"])
        # rocm-smi computes (received + sent) x max payload / 2^20 and labels it MB/s
        assert estimate == pytest.approx(sample.pcie_bandwidth_upper_bound_bytes_per_second / 2**20, abs=0.001)
        assert int(card["PCIe Replay Count"]) == sample.pcie_replays
        gts = (sample.pcie_link_transfers_per_second or 0) / 1e9
        assert card["pcie clock level"].endswith(f"({gts:.1f}GT/s x{sample.pcie_link_width})")


def _rocm_smi_pairs(truth: list[SimulatedDevice]) -> dict[tuple[int, int], tuple[str, int, int]]:
    """GPU pairs as rocm_smi 5.2.3 derives them from the KFD io_links: an XGMI link is one hop
    with its own weight; any other pair goes through the CPU node(s): hops 2 on one NUMA node, 3
    across, weight = both GPUs' CPU-link weights (+ the CPU-CPU distance across)."""
    index = {d.identity.pci_bus_id: d.gpu for d in truth}
    cpu_weight = {d.gpu: next(ln.weight for ln in d.identity.topology if not ln.peer_pci_bus_id) for d in truth}
    pairs = {}
    for a in truth:
        xgmi = {index[ln.peer_pci_bus_id]: ln.weight for ln in a.identity.topology if ln.link_type == "xgmi"}
        for b in truth:
            if b.gpu <= a.gpu:
                continue
            if b.gpu in xgmi:
                pairs[(a.gpu, b.gpu)] = ("XGMI", 1, xgmi[b.gpu])
            elif a.identity.numa_node == b.identity.numa_node:
                pairs[(a.gpu, b.gpu)] = ("PCIE", 2, cpu_weight[a.gpu] + cpu_weight[b.gpu])
            else:
                distance = CPU_NODE_DISTANCE
                pairs[(a.gpu, b.gpu)] = ("PCIE", 3, cpu_weight[a.gpu] + cpu_weight[b.gpu] + distance)
    return pairs


def test_rocm_smi_topology(rocm_smi_json: dict[str, dict[str, str]], truth: list[SimulatedDevice]) -> None:
    system = rocm_smi_json["system"]
    pairs = _rocm_smi_pairs(truth)
    assert len(pairs) == len(truth) * (len(truth) - 1) // 2
    for (a, b), (link_type, hops, weight) in pairs.items():
        pair = f"between DRM devices {a} and {b}"
        assert system[f"(Topology) Link type {pair}"] == link_type
        assert int(system[f"(Topology) Hops {pair}"]) == hops
        assert int(system[f"(Topology) Weight {pair}"]) == weight
    # the MI250X package's two dies are one XGMI hop apart; the MI210 reaches them over PCIe
    assert pairs[(1, 2)] == ("XGMI", 1, 15) and pairs[(0, 1)][0] == "PCIE"
    assert {w for kind, _h, w in pairs.values() if kind == "XGMI"} == {15, 30}
    for device in truth:
        assert int(_card(rocm_smi_json, device)["(Topology) Numa Node"]) == device.identity.numa_node


def test_rocm_smi_retired_pages(sim: Simulator, truth: list[SimulatedDevice]) -> None:
    rocm_smi = require_tool("rocm-smi")
    result = run_in_sysfs_namespace(sim.root, [rocm_smi, "--showretiredpages"], timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    pages: dict[int, int] = {}
    gpu = -1
    for line in result.stdout.splitlines():
        header = re.match(r"GPU\[(\d+)\]", line)
        if header:
            gpu = int(header.group(1))
        elif re.match(r"\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+reserved", line):
            pages[gpu] = pages.get(gpu, 0) + 1
    assert pages == {d.gpu: d.sample.ras_retired_pages for d in truth if d.sample.ras_retired_pages}
    assert sum(pages.values()) >= 1


_LIBRARY_PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
out = {"init": lib.rsmi_init(ctypes.c_uint64(0))}
count = ctypes.c_uint32()
out["count_rc"] = lib.rsmi_num_monitor_devices(ctypes.byref(count))
out["count"] = count.value
class Ecc(ctypes.Structure):
    _fields_ = [("correctable_err", ctypes.c_uint64), ("uncorrectable_err", ctypes.c_uint64)]
devices = []
for i in range(count.value):
    d = {}
    bdf = ctypes.c_uint64()
    lib.rsmi_dev_pci_id_get(i, ctypes.byref(bdf)); d["bdf"] = bdf.value
    temps = {}
    for sensor, kind in (("edge", 0), ("junction", 1), ("memory", 2)):
        t = ctypes.c_int64()
        temps[sensor] = (lib.rsmi_dev_temp_metric_get(i, kind, 0, ctypes.byref(t)), t.value)
    d["temps"] = temps
    p = ctypes.c_uint64()
    d["power"] = (lib.rsmi_dev_power_ave_get(i, 0, ctypes.byref(p)), p.value)
    busy = ctypes.c_uint32()
    d["busy"] = (lib.rsmi_dev_busy_percent_get(i, ctypes.byref(busy)), busy.value)
    e, r, ts = ctypes.c_uint64(), ctypes.c_float(), ctypes.c_uint64()
    d["energy"] = (lib.rsmi_dev_energy_count_get(i, ctypes.byref(e), ctypes.byref(r), ctypes.byref(ts)), e.value)
    ecc = Ecc()
    d["umc"] = (lib.rsmi_dev_ecc_count_get(i, 1, ctypes.byref(ecc)), ecc.correctable_err, ecc.uncorrectable_err)
    devices.append(d)
out["devices"] = devices
print(json.dumps(out))
"""


def test_librocm_smi64_reads_the_tree(sim: Simulator, truth: list[SimulatedDevice]) -> None:
    library = require_file(ROCM_SMI_LIBRARY, "Debian's librocm-smi64-1")
    result = run_in_sysfs_namespace(sim.root, [sys.executable, "-c", _LIBRARY_PROBE, library], timeout=60)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["init"] == 0 and probe["count_rc"] == 0
    assert probe["count"] == len(truth) == 5
    for device, seen in zip(truth, probe["devices"], strict=True):
        bus, dev_fn = device.identity.pci_bus_id[5:7], 0
        assert seen["bdf"] == (int(bus, 16) << 8) | dev_fn
        for sensor, (rc, millidegrees) in seen["temps"].items():
            assert rc == 0 and millidegrees == device.sample.temperatures[sensor] * 1000
        assert seen["busy"] == [0, round(device.sample.busy["gfx"] * 100)]
        rc, microwatts = seen["power"]
        assert rc == 0 and microwatts == (device.sample.power_watts or 0) * 1_000_000
        rc, ticks = seen["energy"]
        energy = device.sample.energy_joules
        assert rc == 0 and ticks == (round(energy / ENERGY_TICK_J) if energy is not None else 0)
        rc, correctable, uncorrectable = seen["umc"]
        assert rc == 0
        assert correctable == device.sample.ecc_errors[("umc", "correctable")]
        assert uncorrectable == device.sample.ecc_errors[("umc", "uncorrectable")]


def test_a_server_in_the_namespace_sees_the_tree_as_sys(sim: Simulator, truth: list[SimulatedDevice]) -> None:
    script = "cat /sys/class/drm/card3/device/unique_id; ls /dev/shm | wc -l; exec sleep 30"
    process = start_in_sysfs_namespace(sim.root, ["sh", "-c", script])
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == truth[3].identity.unique_id + "\n"
        assert process.stdout.readline() == "0\n"  # a private, empty /dev/shm
        assert process.poll() is None
    finally:
        stop(process)
    assert process.returncode is not None


# ------------------------------------------------------------------------------ node_exporter
Series = dict[tuple[tuple[str, str], ...], float]
Scrape = Callable[[Path], dict[str, Series]]


@pytest.fixture
def node_exporter() -> Iterator[Scrape]:
    binary = require_tool(NODE_EXPORTER)
    started: list[subprocess.Popen[str]] = []

    def start(sys_dir: Path) -> dict[str, Series]:
        port = free_port()
        process = subprocess.Popen(
            [
                binary,
                f"--path.sysfs={sys_dir}",
                "--collector.disable-defaults",
                "--collector.drm",
                "--collector.hwmon",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        wait_for_port(port, process)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        series: dict[str, Series] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                series.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        return series

    yield start
    for process in started:
        stop(process)


def _by_label(series: Series, **match: str) -> Series:
    return {k: v for k, v in series.items() if all(dict(k).get(name) == value for name, value in match.items())}


def _chip(device: SimulatedDevice) -> str:
    # node_exporter names a hwmon chip "<parent dir>_<device dir>" with '.' -> '_'
    return device.identity.pci_bus_id.replace(".", "_")


def test_node_exporter_drm_and_hwmon(sim: Simulator, truth: list[SimulatedDevice], node_exporter: Scrape) -> None:
    series = node_exporter(sim.root)
    assert _by_label(series["node_scrape_collector_success"], collector="drm") and all(
        v == 1 for v in series["node_scrape_collector_success"].values()
    )
    for device in truth:
        card = device.identity.card
        sample = device.sample
        (busy,) = _by_label(series["node_drm_gpu_busy_percent"], card=card).values()
        assert busy == round(sample.busy["gfx"] * 100)
        drm_memory = {
            "node_drm_memory_vram_used_bytes": sample.memory_used_bytes["vram"],
            "node_drm_memory_vram_size_bytes": sample.memory_total_bytes["vram"],
            "node_drm_memory_vis_vram_used_bytes": sample.memory_used_bytes["visible_vram"],
            "node_drm_memory_vis_vram_size_bytes": sample.memory_total_bytes["visible_vram"],
            "node_drm_memory_gtt_used_bytes": sample.memory_used_bytes["gtt"],
            "node_drm_memory_gtt_size_bytes": sample.memory_total_bytes["gtt"],
        }
        for name, expected in drm_memory.items():
            assert list(_by_label(series[name], card=card).values()) == [expected], name
        (info,) = _by_label(series["node_drm_card_info"], card=card)
        assert dict(info)["unique_id"] == device.identity.unique_id

        chips = {dict(k)["chip"] for k in _by_label(series["node_hwmon_chip_names"], chip_name="amdgpu")}
        (chip,) = [c for c in chips if c.endswith(_chip(device))]
        labels = {dict(k)["label"]: dict(k)["sensor"] for k in _by_label(series["node_hwmon_sensor_label"], chip=chip)}
        for sensor, label in (("edge", "edge"), ("junction", "junction"), ("memory", "mem")):
            hw = labels[label]
            assert _by_label(series["node_hwmon_temp_celsius"], chip=chip, sensor=hw) == {
                (("chip", chip), ("sensor", hw)): sample.temperatures[sensor]
            }
            (crit,) = _by_label(series["node_hwmon_temp_crit_celsius"], chip=chip, sensor=hw).values()
            assert crit == sample.temperature_thresholds[(sensor, "critical")]
        (power,) = _by_label(series["node_hwmon_power_average_watt"], chip=chip).values()
        assert power == (sample.power_watts or 0.0)
        (volts,) = _by_label(series["node_hwmon_in_volts"], chip=chip, sensor=labels["vddgfx"]).values()
        assert volts == pytest.approx(sample.voltages_volts["gfx"])
    assert len(chips) == len(truth)


def test_node_exporter_misses_card10_and_above_on_a_16_gcd_node(tmp_path: Path, node_exporter: Scrape) -> None:
    simulator = Simulator(tmp_path / "sys", "8xMI250X", "training", seed=3)
    simulator.write_tree()
    truth = simulator.truth()
    assert len(truth) == 16
    series = node_exporter(simulator.root)
    cards = {dict(k)["card"] for k in series["node_drm_card_info"]}
    # its drm collector globs class/drm/card[0-9]: card10..card15 are never read
    assert cards == {f"card{i}" for i in range(10)}
    busy_cards = {dict(k)["card"] for k in series["node_drm_gpu_busy_percent"]}
    assert busy_cards == cards
    # the hwmon collector walks class/hwmon and still sees all 16 GCDs
    chips = _by_label(series["node_hwmon_chip_names"], chip_name="amdgpu")
    assert len(chips) == 16
