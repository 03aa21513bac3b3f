"""The simulator on its own: specs, determinism, atomic writes, tree shape, gpu_metrics layout,
and the shapes of its scenarios. The real tools' view of the tree is in
tests/integration/test_simulator_real_tools.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.model import Sample
from exporter.simulator import SCENARIOS, Simulator, load_truth_json, parse_fleet, parse_scenario
from exporter.simulator import gpu_metrics_writer as gm
from exporter.simulator.fleet import layout
from exporter.simulator.physics import ENERGY_TICK_J, DieReading, PackageModel


@pytest.fixture
def sysfs(tmp_path: Path) -> Iterator[Path]:
    """A folder for a tree, on tmpfs when there is one: sysfs lives in memory, and thousands of
    small renames on a journalling disk would make these tests slow."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path / "sys"
        return
    folder = tempfile.mkdtemp(prefix="amdgpu-sim-test-", dir="/dev/shm")
    try:
        yield Path(folder) / "sys"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _readings(fleet: str, scenario: str, seed: int, times: list[float]) -> list[list[DieReading]]:
    """The physics alone (no files): per time, every GCD's reading in BDF order."""
    gcds = layout(parse_fleet(fleet))
    packages: dict[int, list] = {}
    for gcd in gcds:
        packages.setdefault(gcd.package_index, []).append(gcd)
    models = [PackageModel(dies, parse_scenario(scenario), seed, len(gcds)) for dies in packages.values()]
    return [[r for m in models for r in m.readings(t)] for t in times]


# --------------------------------------------------------------------------------- fleet specs


@pytest.mark.parametrize(
    ("spec", "gcds", "canonical"),
    [
        ("4xMI250X", 8, "4xMI250X"),
        ("MI210", 1, "1xMI210"),
        ("2xMI210", 2, "2xMI210"),
        ("MI300X", 1, "1xMI300X"),
        ("1xMI210,2xMI250X", 5, "1xMI210,2xMI250X"),
        ("8xMI250X", 16, "8xMI250X"),
        ("32xMI250X", 64, "32xMI250X"),
        (" 2 X mi250x , mi210 ", 5, "2xMI250X,1xMI210"),
        ("MI300X:gpu_metrics=1.7", 1, "1xMI300X:gpu_metrics=1.7"),
    ],
)
def test_parse_fleet_accepts(spec: str, gcds: int, canonical: str) -> None:
    fleet = parse_fleet(spec)
    assert fleet.gcd_count == gcds
    assert str(fleet) == canonical
    assert parse_fleet(str(fleet)) == fleet


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty fleet spec"),
        ("   ", "empty fleet spec"),
        ("0xMI250X", "at least 1"),
        ("3xMI999", "unknown GPU model 'MI999'"),
        ("MI250X,", "bad fleet term"),
        ("4*MI250X", "bad fleet term"),
        ("-1xMI210", "bad fleet term"),
        ("MI250X:turbo=1", "unknown option"),
        ("MI210:gpu_metrics=1.5", "writes no gpu_metrics 1.5 for MI210"),
        ("MI300X:gpu_metrics=two", "bad gpu_metrics version"),
        ("65xMI250X", "at most 128"),
    ],
)
def test_parse_fleet_rejects_with_a_clear_message(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_fleet(spec)


def _pieces(*pieces: str) -> st.SearchStrategy[str]:
    """Strings glued from pieces of the grammar: far likelier to get deep into the parser."""
    return st.lists(st.sampled_from(pieces), max_size=12).map("".join)


_FLEET_TEXT = _pieces(
    "MI210", "MI250X", "mi300x", "MI999", "x", "X", "0", "2", "32", "65", "\u0663", ",", ":", ";", "=",
    " ", "gpu_metrics", "1.6", "1.3", "1.", "\u00b2", "\n", "CPX", "dpx", "QPX", "TPX", "NPS4", "NPS1", "MI355X",
    "MI325X", "xcp_names", "dot", "xcp_nodes", "all", "xcp_metrics", "1.1",
)  # fmt: skip
_SCENARIO_TEXT = _pieces(
    "idle", "training", "thermal-excursion", ":", ",", "=", "+", "period", "start", "hot", "peak", "gpus",
    "0", "3", "92", "-1", "nan", "inf", "1e400", ".", " ", "x",
)  # fmt: skip


@given(_FLEET_TEXT | st.text(max_size=40))
def test_parse_fleet_never_fails_any_other_way(text: str) -> None:
    try:
        fleet = parse_fleet(text)
    except ValueError as error:
        assert str(error)
        return
    assert 1 <= fleet.gcd_count <= 128 and fleet.gcd_count <= fleet.device_count <= 128
    assert parse_fleet(str(fleet)) == fleet


@given(
    st.lists(
        st.tuples(st.integers(1, 8), st.sampled_from(["MI210", "mi250x", "MI300X", "MI300X:gpu_metrics=1.6"])),
        min_size=1,
        max_size=4,
    )
)
def test_parse_fleet_counts_gcds(terms: list[tuple[int, str]]) -> None:
    fleet = parse_fleet(",".join(f"{n}x{model}" for n, model in terms))
    assert fleet.gcd_count == sum(n * (2 if model.upper() == "MI250X" else 1) for n, model in terms)


@given(_SCENARIO_TEXT | st.text(max_size=40))
def test_parse_scenario_never_fails_any_other_way(text: str) -> None:
    try:
        scenario = parse_scenario(text)
    except ValueError as error:
        assert str(error)
        return
    assert scenario.name in SCENARIOS
    assert parse_scenario(str(scenario)) == scenario


def test_parse_scenario() -> None:
    assert SCENARIOS == ("idle", "training", "thermal-excursion", "alternating")
    ex = parse_scenario("thermal-excursion:start=10,hot=60,gpus=0+3")
    assert (ex.name, ex.start, ex.hot, ex.gpus) == ("thermal-excursion", 10.0, 60.0, (0, 3))
    assert parse_scenario(str(ex)) == ex
    assert parse_scenario("training:period=6").period == 6.0
    for bad, message in [
        ("gaming", "unknown scenario"),
        ("idle:period=3", "bad option"),
        ("training:period=0", "out of range"),
        ("training:period=fast", "expected a number"),
        ("thermal-excursion:gpus=a", "bad gpus"),
        ("thermal-excursion:peak=200", "between 60 and 105"),
        ("", "empty scenario"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_scenario(bad)


def test_simulator_rejects_bad_specs_before_touching_the_disk(sysfs: Path) -> None:
    with pytest.raises(ValueError):
        Simulator(sysfs, "2xMI250", "idle")
    with pytest.raises(ValueError):
        Simulator(sysfs, "MI210", "benchmark")
    assert not sysfs.exists()


# ------------------------------------------------------------------------------- determinism


def _dynamic_contents(sim: Simulator) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(sim.root):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(sim.root))] = path.read_bytes()
    return out


def _samples_without_time(sim: Simulator) -> list[Sample]:
    return [dataclasses.replace(d.sample, timestamp=0.0) for d in sim.truth()]


def test_values_depend_only_on_seed_and_elapsed_time(sysfs: Path) -> None:
    tmp_path = sysfs.parent
    a = Simulator(tmp_path / "a", "1xMI210,2xMI250X", "training", seed=5)
    b = Simulator(tmp_path / "b", "1xMI210,2xMI250X", "training", seed=5)
    c = Simulator(tmp_path / "c", "1xMI210,2xMI250X", "training", seed=6)
    for sim in (a, b, c):
        sim.write_tree()
    # different tick histories that end at the same elapsed time
    for t in (0.4, 3.3, 7.9, 13.1, 17.25):
        a.tick(t)
    b.tick(17.25)
    c.tick(17.25)
    a_files, b_files = _dynamic_contents(a), _dynamic_contents(b)
    assert a_files == b_files
    assert _samples_without_time(a) == _samples_without_time(b)
    assert _dynamic_contents(c) != a_files  # another seed, another workload
    # going back in time replays the same history
    a.tick(3.3)
    first = _samples_without_time(a)
    b.tick(3.3)
    assert _samples_without_time(b) == first


def test_only_changed_files_are_rewritten(sysfs: Path) -> None:
    sim = Simulator(sysfs, "4xMI250X", "training", seed=1)
    sim.write_tree()
    total_files = sum(len(files) for _d, _s, files in os.walk(sim.root))
    before = sim.files_written
    sim.tick(5.0)
    per_tick = sim.files_written - before
    assert 0 < per_tick < total_files / 3
    before = sim.files_written
    sim.tick(5.0)  # nothing changed
    assert sim.files_written == before


# ----------------------------------------------------------------------------- atomic writes


def test_readers_never_see_partial_content_while_ticking(sysfs: Path) -> None:
    sim = Simulator(sysfs, "2xMI250X", "training", seed=2)
    sim.write_tree()
    gcd = sim.gcds[0]
    dev = sim.root / gcd.device_relpath
    hw = sim.root / gcd.device_relpath / "hwmon" / f"hwmon{gcd.hwmon_index}"
    checks = {
        dev / "gpu_metrics": lambda b: len(b) == 120 and struct.unpack_from("<HBB", b) == (120, 1, 3),
        dev / "gpu_busy_percent": lambda b: re.fullmatch(rb"\d{1,3}\n", b) is not None,
        dev / "mem_info_vram_used": lambda b: re.fullmatch(rb"\d+\n", b) is not None,
        dev / "pp_dpm_sclk": lambda b: re.fullmatch(rb"(\d: \d+Mhz \*?\n){2,3}", b) is not None,
        dev / "pcie_bw": lambda b: re.fullmatch(rb"\d+ \d+ 256\n", b) is not None,
        hw / "temp2_input": lambda b: re.fullmatch(rb"\d+000\n", b) is not None,
        hw / "power1_average": lambda b: re.fullmatch(rb"\d+000000\n", b) is not None,
    }
    stop = threading.Event()
    bad: list[tuple[str, bytes]] = []
    reads = [0]

    def hammer() -> None:
        while not stop.is_set():
            for path, ok in checks.items():
                data = path.read_bytes()
                reads[0] += 1
                if not ok(data):
                    bad.append((path.name, data))

    reader = threading.Thread(target=hammer)
    reader.start()
    try:
        t = 0.0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            t += 0.37
            sim.tick(t)
    finally:
        stop.set()
        reader.join()
    assert not bad, bad[:3]
    assert reads[0] > 200
    assert not list(sim.root.rglob(".*sim-tmp"))  # no temp file left behind


# -------------------------------------------------------------------------------- tree shape


def test_tree_has_the_shape_real_readers_need(sysfs: Path) -> None:
    sim = Simulator(sysfs, "1xMI210,2xMI250X", "idle")
    sim.write_tree()
    root = sim.root
    cards = sorted(p.name for p in (root / "class/drm").glob("card*"))
    assert cards == [f"card{i}" for i in range(5)]  # no gaps: the library probes 0..count-1
    bdfs = []
    for i in range(5):
        link = root / f"class/drm/card{i}"
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        bdf = re.findall(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", os.readlink(link))[-1]
        bdfs.append(bdf)
        dev = link / "device"
        assert (dev / "vendor").read_text() == "0x1002\n"
        assert "DRIVER=amdgpu" in (dev / "uevent").read_text()
        assert f"PCI_SLOT_NAME={bdf}" in (dev / "uevent").read_text()
        for blk in ("umc", "gfx", "sdma", "mmhub", "pcie_bif", "hdp", "xgmi_wafl"):
            lines = (dev / "ras" / f"{blk}_err_count").read_text().splitlines()
            assert [line.split(":")[0] for line in lines] == ["ue", "ce"]
        assert int((dev / "xgmi_error").read_text()) in (0, 1, 2)
        (hwmon,) = list((dev / "hwmon").iterdir())
        assert (hwmon / "name").read_text() == "amdgpu\n"
        assert (hwmon / "in0_label").read_text() == "vddgfx\n"
        labels = {p.read_text() for p in hwmon.glob("temp*_label")}
        assert labels == {"edge\n", "junction\n", "mem\n"}
        assert os.path.realpath(hwmon / "device") == os.path.realpath(dev)
        assert os.path.realpath(root / "class/hwmon" / hwmon.name) == os.path.realpath(hwmon)
    assert bdfs == sorted(bdfs)
    # the k10temp sensors come first, so cardN and hwmonN numbers differ
    assert (root / "class/hwmon/hwmon0/name").read_text() == "k10temp\n"
    nodes = root / "class/kfd/kfd/topology/nodes"
    gpu_nodes = {}
    for node in nodes.iterdir():
        assert (node / "io_links").is_dir()
        gpu_id = int((node / "gpu_id").read_text())
        props = dict(line.split() for line in (node / "properties").read_text().splitlines())
        if gpu_id:
            gpu_nodes[node.name] = props
    assert len(gpu_nodes) == 5
    for name, props in gpu_nodes.items():
        location = int(props["location_id"])
        assert f"0000:{location >> 8:02x}:{(location >> 3) & 0x1F:02x}.{location & 7}" in bdfs
        for link in (nodes / name / "io_links").iterdir():
            lp = dict(line.split() for line in (link / "properties").read_text().splitlines())
            if lp["node_to"] in gpu_nodes:
                assert lp["type"] == "11"  # GPU<->GPU links are XGMI only
    assert (root / "module/amdgpu/initstate").read_text() == "live\n"


def test_identity_in_truth_matches_the_tree(sysfs: Path) -> None:
    sim = Simulator(sysfs, "1xMI210,2xMI250X", "idle")
    sim.write_tree()
    truth = sim.truth()
    assert [d.gpu for d in truth] == list(range(5))
    for device in truth:
        ident = device.identity
        dev = Path(ident.device_dir)
        assert dev.is_dir() and os.path.realpath(sim.root / "class/drm" / ident.card / "device") == str(dev)
        assert Path(ident.hwmon_dir).parent.parent == dev
        assert (dev / "unique_id").read_text() == ident.unique_id + "\n"
        assert (dev / "serial_number").read_text() == ident.serial + "\n"
        for block, version in ident.firmware.items():
            assert (dev / "fw_version" / f"{block}_fw_version").read_text() == version + "\n"
    # both dies of an MI250X share the package serial; dies are numbered in BDF order
    assert truth[1].identity.package == truth[2].identity.package != truth[3].identity.package
    assert [d.identity.die for d in truth] == [0, 0, 1, 0, 1]
    assert truth[0].identity.xgmi_hive_id == ""  # a lone MI210 is in no hive
    assert len({d.identity.xgmi_hive_id for d in truth[1:]}) == 1
    # topology = the KFD io_links of the device's node, in order
    nodes = sim.root / "class/kfd/kfd/topology/nodes"
    props = {n.name: dict(ln.split() for ln in (n / "properties").read_text().splitlines()) for n in nodes.iterdir()}
    bdf_of = {
        name: f"0000:{int(p['location_id']) >> 8:02x}:00.0" if int(p["simd_count"]) else "" for name, p in props.items()
    }
    kinds = {"2": "pcie", "11": "xgmi"}
    for device in truth:
        (node,) = [n for n, b in bdf_of.items() if b == device.identity.pci_bus_id]
        links = []
        for i in range(len(list((nodes / node / "io_links").iterdir()))):
            lp = dict(ln.split() for ln in (nodes / node / "io_links" / str(i) / "properties").read_text().splitlines())
            links.append((bdf_of[lp["node_to"]], kinds[lp["type"]], int(lp["weight"])))
        assert links == [(ln.peer_pci_bus_id, ln.link_type, ln.weight) for ln in device.identity.topology]
    hive_dir = Path(truth[2].identity.device_dir) / "xgmi_hive_info"
    assert hive_dir.is_symlink() and (hive_dir / "xgmi_hive_id").read_text() == truth[2].identity.xgmi_hive_id + "\n"


def test_truth_json_round_trips(sysfs: Path) -> None:
    sim = Simulator(sysfs, "1xMI210,1xMI250X,2xMI300X:gpu_metrics=1.7", "training", seed=4)
    sim.write_tree()
    sim.tick(11.0)
    sim.write_truth_json(sysfs.parent / "truth.json")
    assert load_truth_json(sysfs.parent / "truth.json") == sim.truth()
    # write_tree's own tick and ours: a reader of the file can tell it missed a tick
    assert json.loads((sysfs.parent / "truth.json").read_text())["ticks"] == 2


# --------------------------------------------------------------------------- MI250X die 1


def test_mi250x_secondary_die_reads_zero_power_and_energy(sysfs: Path) -> None:
    sim = Simulator(sysfs, "2xMI250X", "training", seed=3)
    sim.write_tree()
    sim.tick(9.0)
    for device in sim.truth():
        dev = Path(device.identity.device_dir)
        hw = Path(device.identity.hwmon_dir)
        blob = (dev / "gpu_metrics").read_bytes()
        power_w = struct.unpack_from("<H", blob, 22)[0]
        energy = struct.unpack_from("<Q", blob, 24)[0]
        hwmon_power = int((hw / "power1_average").read_text())
        if device.identity.die == 0:
            assert device.sample.power_watts and device.sample.power_watts > 200
            assert power_w == device.sample.power_watts and hwmon_power == power_w * 1_000_000
            assert device.sample.energy_joules and energy * ENERGY_TICK_J == device.sample.energy_joules
            assert int((hw / "power1_cap").read_text()) == 560_000_000
        else:
            assert (power_w, energy, hwmon_power) == (0, 0, 0)
            assert device.sample.power_watts is None and device.sample.energy_joules is None
            assert int((hw / "power1_cap").read_text()) == 0
            assert device.sample.power_cap_watts is None
        assert device.sample.busy["gfx"] > 0.9  # both dies work; only the telemetry differs


# -------------------------------------------------------------------------- scenario shapes


def test_thermal_excursion_crosses_85_and_returns_below_80() -> None:
    times = [i * 0.5 for i in range(0, 181)]
    fleet = _readings("2xMI250X", "thermal-excursion:start=20,hot=40,gpus=2", 1, times)
    hot = [gcds[2].temps["junction"] for gcds in fleet]
    assert max(gcds[0].temps["junction"] for gcds in fleet) < 80  # an unaffected GCD
    before = [j for t, j in zip(times, hot, strict=True) if t < 20]
    during = [j for t, j in zip(times, hot, strict=True) if 35 <= t <= 58]
    after = [j for t, j in zip(times, hot, strict=True) if t >= 75]
    assert max(before) < 80
    assert min(during) > 85 and 90 <= max(during) <= 94
    assert max(after) < 80
    # while it is hot and busy the SMU throttles gfxclk and says so
    hot_and_busy = [g[2] for t, g in zip(times, fleet, strict=True) if 35 <= t <= 58 and g[2].gfx_busy >= 95]
    assert hot_and_busy
    # (the SMU reacts to its own reading at 90 °C; 91 reported is above it whatever the sensor noise)
    throttled = [r for r in hot_and_busy if r.temps["junction"] >= 91]
    assert throttled and all(r.throttlers["temp_gpu"] and r.sclk < 1700 for r in throttled)


def test_thermal_excursion_through_the_tree(sysfs: Path) -> None:
    sim = Simulator(sysfs, "MI210", "thermal-excursion:start=1,hot=6", seed=1)
    sim.write_tree()
    seen = []
    for t in (0.5, 4.0, 5.0, 6.0, 12.0):
        sim.tick(t)
        (device,) = sim.truth()
        hwmon = int((Path(device.identity.hwmon_dir) / "temp2_input").read_text()) / 1000
        assert hwmon == device.sample.temperatures["junction"]
        seen.append(hwmon)
    assert seen[0] < 80 and min(seen[1:4]) > 85 and seen[4] < 80


def test_training_alternates_compute_and_communication() -> None:
    times = [5.0 + i * 0.25 for i in range(140)]
    readings = [gcds[0] for gcds in _readings("MI300X", "training:period=10", 9, times)]
    phases = [r.gfx_busy >= 95 for r in readings]
    assert all(r.gfx_busy >= 95 or r.gfx_busy <= 50 for r in readings)
    compute_share = sum(phases) / len(phases)
    assert 0.6 < compute_share < 0.85
    starts = sum(1 for a, b in itertools.pairwise(phases) if b and not a)
    assert starts in (3, 4)  # ~35 s of a 10 s rhythm
    # communication phases move far more data over PCIe, and memory gets busier
    comm = [r for r, busy in zip(readings, phases, strict=True) if not busy]
    work = [r for r, busy in zip(readings, phases, strict=True) if busy]
    assert min(r.pcie_bw_inst_gbs or 0 for r in comm) > 5 * max(r.pcie_bw_inst_gbs or 0 for r in work)
    assert min(r.mem_busy for r in comm) > max(r.mem_busy for r in work)


def test_training_temperature_swings_stay_under_5c() -> None:
    times = [60 + i * 0.5 for i in range(120)]
    fleet = _readings("1xMI210,1xMI250X,1xMI300X", "training", 2, times)
    for gpu in range(4):
        junction = [gcds[gpu].temps["junction"] for gcds in fleet]
        assert max(junction) - min(junction) < 5
        assert 60 < max(junction) < 80


def test_energy_is_the_integral_of_power(sysfs: Path) -> None:
    sim = Simulator(sysfs, "1xMI250X", "training", seed=8)
    sim.write_tree()
    sim.tick(10.0)
    e0 = sim.truth()[0].sample.energy_joules
    powers = []
    for i in range(1, 201):
        sim.tick(10.0 + i * 0.1)
        powers.append(sim.truth()[0].sample.power_watts)
    e1 = sim.truth()[0].sample.energy_joules
    assert e0 is not None and e1 is not None and all(p is not None for p in powers)
    mean_power = sum(p for p in powers if p is not None) / len(powers)
    assert (e1 - e0) / 20.0 == pytest.approx(mean_power, rel=0.02)
    assert 300 < mean_power < 560


def test_idle_is_quiet(sysfs: Path) -> None:
    sim = Simulator(sysfs, "4xMI250X", "idle", seed=0)
    sim.write_tree()
    sim.tick(30.0)
    for device in sim.truth():
        s = device.sample
        assert s.busy["gfx"] == 0 and s.busy["memory"] == 0
        assert s.clocks_hertz["gfx"] == s.clocks_max_hertz["gfx"] * 500 / 1700
        assert s.temperatures["junction"] < 45
        assert not any(s.throttle.values())
        if device.identity.die == 0:
            assert s.power_watts is not None and s.power_watts < 120


# ------------------------------------------------------------------------------ gpu_metrics

# offsets and sizes from reference/amdgpu-driver-interface.md, tables A and B
_REFERENCE_OFFSETS = {
    (1, 3): {
        "temperature_edge": 4,
        "average_gfx_activity": 16,
        "average_mm_activity": 20,
        "average_socket_power": 22,
        "energy_accumulator": 24,
        "system_clock_counter": 32,
        "average_gfxclk_frequency": 40,
        "current_gfxclk": 54,
        "throttle_status": 68,
        "current_fan_speed": 72,
        "pcie_link_width": 74,
        "pcie_link_speed": 76,
        "padding": 78,
        "gfx_activity_acc": 80,
        "mem_activity_acc": 84,
        "temperature_hbm": 88,
        "firmware_timestamp": 96,
        "voltage_soc": 104,
        "voltage_gfx": 106,
        "voltage_mem": 108,
        "padding1": 110,
        "indep_throttle_status": 112,
    },
    (1, 4): {
        "temperature_hotspot": 4,
        "curr_socket_power": 10,
        "vcn_activity": 16,
        "energy_accumulator": 24,
        "system_clock_counter": 32,
        "throttle_status": 40,
        "gfxclk_lock_status": 44,
        "pcie_link_width": 48,
        "xgmi_link_speed": 54,
        "gfx_activity_acc": 56,
        "pcie_bandwidth_acc": 64,
        "pcie_bandwidth_inst": 72,
        "pcie_l0_to_recov_count_acc": 80,
        "pcie_replay_count_acc": 88,
        "pcie_replay_rover_count_acc": 96,
        "xgmi_read_data_acc": 104,
        "xgmi_write_data_acc": 168,
        "firmware_timestamp": 232,
        "current_gfxclk": 240,
        "current_socclk": 256,
        "current_vclk0": 264,
        "current_dclk0": 272,
        "current_uclk": 280,
        "padding": 282,
    },
    (1, 5): {
        "jpeg_activity": 24,
        "energy_accumulator": 88,
        "system_clock_counter": 96,
        "throttle_status": 104,
        "pcie_link_width": 112,
        "gfx_activity_acc": 120,
        "pcie_bandwidth_acc": 128,
        "pcie_bandwidth_inst": 136,
        "pcie_replay_count_acc": 152,
        "pcie_nak_sent_count_acc": 168,
        "pcie_nak_rcvd_count_acc": 172,
        "xgmi_read_data_acc": 176,
        "xgmi_write_data_acc": 240,
        "firmware_timestamp": 304,
        "current_gfxclk": 312,
        "current_socclk": 328,
        "current_uclk": 352,
        "padding": 354,
    },
    (1, 6): {
        "energy_accumulator": 16,
        "system_clock_counter": 24,
        "accumulation_counter": 32,
        "prochot_residency_acc": 36,
        "hbm_thm_residency_acc": 52,
        "gfxclk_lock_status": 56,
        "pcie_link_width": 60,
        "gfx_activity_acc": 68,
        "pcie_bandwidth_acc": 80,
        "pcie_bandwidth_inst": 88,
        "pcie_nak_sent_count_acc": 120,
        "xgmi_read_data_acc": 128,
        "xgmi_write_data_acc": 192,
        "firmware_timestamp": 256,
        "current_gfxclk": 264,
        "current_uclk": 304,
        "num_partition": 306,
        "xcp_stats": 312,
        "pcie_lc_perf_other_end_recovery": 1656,
    },
    (1, 7): {
        "mem_max_bandwidth": 16,
        "energy_accumulator": 24,
        "system_clock_counter": 32,
        "accumulation_counter": 40,
        "gfxclk_lock_status": 64,
        "pcie_link_width": 68,
        "gfx_activity_acc": 76,
        "pcie_bandwidth_acc": 88,
        "pcie_bandwidth_inst": 96,
        "pcie_nak_sent_count_acc": 128,
        "xgmi_read_data_acc": 136,
        "xgmi_write_data_acc": 200,
        "xgmi_link_status": 264,
        "firmware_timestamp": 288,
        "current_gfxclk": 296,
        "current_uclk": 336,
        "num_partition": 338,
        "xcp_stats": 344,
        "pcie_lc_perf_other_end_recovery": 2200,
    },
}
# v1_8 differs from v1_7 only in its per-partition block (amdgpu_xcp_metrics_v1_2, 440 bytes)
_REFERENCE_OFFSETS[(1, 8)] = {**_REFERENCE_OFFSETS[(1, 7)], "pcie_lc_perf_other_end_recovery": 3864}
_REFERENCE_SIZES = {(1, 3): 120, (1, 4): 288, (1, 5): 360, (1, 6): 1664, (1, 7): 2208, (1, 8): 3872}


# the per-partition blocks: struct size and offsets within one block
_REFERENCE_BLOCKS = {
    (1, 6): (168, {"gfx_busy_inst": 0, "jpeg_busy": 32, "vcn_busy": 96, "gfx_busy_acc": 104}),
    (1, 7): (232, {"vcn_busy": 96, "gfx_busy_acc": 104, "gfx_below_host_limit_acc": 168}),
    (1, 8): (
        440,
        {
            "jpeg_busy": 32,
            "vcn_busy": 112,
            "gfx_busy_acc": 120,
            "gfx_below_host_limit_ppt_acc": 184,
            "gfx_below_host_limit_thm_acc": 248,
            "gfx_low_utilization_acc": 312,
            "gfx_below_host_limit_total_acc": 376,
        },
    ),
}


@pytest.mark.parametrize("version", sorted(_REFERENCE_SIZES))
def test_encoder_writes_every_field_where_the_driver_has_it(version: tuple[int, int]) -> None:
    assert struct.unpack_from("<HBB", gm.encode(version, {})) == (_REFERENCE_SIZES[version], *version)
    for name, offset in _REFERENCE_OFFSETS[version].items():
        if name != "xcp_stats":
            blob = gm.encode(version, {name: 0x4142})
            assert blob[offset : offset + 2] == b"\x42\x41", name
            assert blob.count(b"\x42\x41") == 1, name
    if version in _REFERENCE_BLOCKS:
        size, offsets = _REFERENCE_BLOCKS[version]
        for name, offset in offsets.items():
            blob = gm.encode(version, {"xcp_stats": [{}, {name: 0x4142}]})
            start = _REFERENCE_OFFSETS[version]["xcp_stats"] + size + offset
            assert blob[start : start + 2] == b"\x42\x41", name
            assert blob.count(b"\x42\x41") == 1, name


def test_encoder_fills_unset_fields_with_all_ones() -> None:
    blob = gm.encode((1, 3), {"temperature_edge": 41, "temperature_hbm": [50, 51]})
    assert struct.unpack_from("<HBB", blob) == (120, 1, 3)
    assert struct.unpack_from("<H", blob, 4) == (41,)
    assert struct.unpack_from("<4H", blob, 88) == (50, 51, 0xFFFF, 0xFFFF)
    assert blob[6:88] == b"\xff" * 82
    assert struct.unpack_from("<Q", blob, 112) == (2**64 - 1,)
    # counters wrap like the hardware's; bad input is refused
    assert struct.unpack_from("<I", gm.encode((1, 3), {"gfx_activity_acc": 2**32 + 5}), 80) == (5,)
    with pytest.raises(KeyError):
        gm.encode((1, 3), {"no_such_field": 1})
    with pytest.raises(ValueError):
        gm.encode((1, 3), {"temperature_hbm": [1, 2, 3, 4, 5]})
    with pytest.raises(ValueError):
        gm.encode((1, 10), {})


def test_aldebaran_table_carries_the_truth_and_its_quirks(sysfs: Path) -> None:
    sim = Simulator(sysfs, "1xMI210", "training", seed=1)
    sim.write_tree()
    sim.tick(8.0)
    (device,) = sim.truth()
    s = device.sample
    blob = (Path(device.identity.device_dir) / "gpu_metrics").read_bytes()
    u16 = lambda off: struct.unpack_from("<H", blob, off)[0]  # noqa: E731
    temps = [u16(4 + 2 * i) for i in range(6)]
    assert temps == [s.temperatures[k] for k in ("edge", "junction", "memory", "vr_gfx", "vr_soc", "vr_mem")]
    assert [u16(88 + 2 * i) for i in range(4)] == [s.temperatures[f"hbm{i}"] for i in range(4)]
    assert u16(16) == round(s.busy["gfx"] * 100) and u16(18) == round(s.busy["memory"] * 100)
    assert u16(20) == 0xFFFF  # average_mm_activity: not supplied
    assert u16(22) == s.power_watts
    assert u16(54) * 1e6 == s.clocks_hertz["gfx"] and u16(56) * 1e6 == s.clocks_hertz["soc"]
    assert u16(58) * 1e6 == s.clocks_hertz["memory"]
    assert (u16(64), u16(66)) == (0xFFFF, 0xFFFF)  # vclk1 / dclk1
    assert (u16(104), u16(106), u16(108)) == (0xFFFF, 0xFFFF, 0xFFFF)  # voltages
    assert (u16(74), u16(76)) == (16, 160)


@pytest.mark.parametrize("version", ["1.4", "1.5", "1.6", "1.7"])
def test_mi300x_tables_count_xgmi_traffic_that_grows_with_training(sysfs: Path, version: str) -> None:
    sim = Simulator(sysfs, f"8xMI300X:gpu_metrics={version}", "training", seed=1)
    sim.write_tree()
    sim.tick(10.0)
    first = sim.truth()[3]
    sim.tick(30.0)
    later = sim.truth()[3]
    fmt, content = (int(x) for x in version.split("."))
    offsets = _REFERENCE_OFFSETS[(fmt, content)]
    blob = (Path(later.identity.device_dir) / "gpu_metrics").read_bytes()
    assert struct.unpack_from("<HBB", blob) == (_REFERENCE_SIZES[(fmt, content)], fmt, content)
    reads = struct.unpack_from("<8Q", blob, offsets["xgmi_read_data_acc"])
    assert [kb * 1024.0 for kb in reads] == [later.sample.xgmi_read_bytes[i] for i in range(8)]
    for link in range(7):  # seven peers on an eight-GPU baseboard
        grown = later.sample.xgmi_read_bytes[link] - first.sample.xgmi_read_bytes[link]
        assert grown > 20 * 40e9 * 0.2
    assert later.sample.xgmi_read_bytes[7] == first.sample.xgmi_read_bytes[7]
    assert struct.unpack_from("<Q", blob, offsets["pcie_bandwidth_inst"])[0] * 1e9 == (
        later.sample.pcie_bandwidth_bytes_per_second
    )
    assert struct.unpack_from("<Q", blob, offsets["energy_accumulator"])[0] * ENERGY_TICK_J == (
        later.sample.energy_joules
    )
    if version == "1.7":
        status = struct.unpack_from("<8H", blob, offsets["xgmi_link_status"])
        assert status == (1, 1, 1, 1, 1, 1, 1, 0)
        assert dict(later.sample.xgmi_link_up) == {i: i < 7 for i in range(8)}


def test_mi300x_tree_follows_the_mi300_driver(sysfs: Path) -> None:
    sim = Simulator(sysfs, "MI300X", "idle")
    sim.write_tree()
    (device,) = sim.truth()
    dev = Path(device.identity.device_dir)
    hw = Path(device.identity.hwmon_dir)
    assert not (hw / "temp1_input").exists() and not (hw / "in0_input").exists()
    assert not (hw / "power1_average").exists()
    assert int((hw / "power1_input").read_text()) == device.sample.power_watts * 1_000_000  # type: ignore[operator]
    assert (hw / "temp2_label").read_text() == "junction\n"
    assert (dev / "current_compute_partition").read_text() == "SPX\n"
    assert device.identity.compute_partition == "SPX" and device.identity.memory_partition == "NPS1"
    assert not (dev / "pcie_bw").exists()
    # idle gfx sits in deep sleep: pp_dpm_sclk leads with an S: line
    assert (dev / "pp_dpm_sclk").read_text().startswith("S: 133Mhz *\n0: 500Mhz \n")
    assert device.sample.clocks_hertz["gfx"] == 133e6
    assert "edge" not in device.sample.temperatures


def test_a_tick_rewrites_only_what_changes(sysfs: Path) -> None:
    """A tick rewrites the files whose values move, not the tree (its CPU cost is bench material)."""
    sim = Simulator(sysfs, "32xMI250X", "training", seed=1)
    sim.write_tree()
    sim.tick(1.0)
    before = sim.files_written
    for t in range(2, 7):
        sim.tick(float(t))
    assert (sim.files_written - before) / 5 < 12 * 64


def test_the_demo_flags_help_names_every_scenario_model_and_fleet_option() -> None:
    from exporter.config import OPTIONS
    from exporter.simulator.__main__ import FLEET_HELP
    from exporter.simulator.asics import ASICS
    from exporter.simulator.fleet import _OPTIONS
    from exporter.simulator.workload import SCENARIOS, scenario_help

    helps = {option.name: option.help for option in OPTIONS}
    assert all(scenario in helps["demo.scenario"] for scenario in SCENARIOS)
    # every scenario's options, as the simulator's own --help says them
    assert helps["demo.scenario"].endswith(scenario_help()) and "thermal-excursion: period, start" in scenario_help()
    for text in (helps["demo.fleet"], FLEET_HELP):
        assert all(name in text for name in ASICS), text
        assert all(f"{key}=" in text for key in ("gpu_metrics", *_OPTIONS)), text
        modes = {
            m.strip()
            for model in ASICS.values()
            for m in f"{model.compute_partitions}, {model.memory_partitions}".split(",")
        }
        assert all(mode in text for mode in modes - {""}), text
