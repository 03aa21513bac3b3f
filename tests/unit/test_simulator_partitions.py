"""The simulator's MI300-class side: compute/memory partitions laid out as the amdgpu driver lays
them out, gpu_metrics v1_6..v1_8 per-partition blocks and the v1.9 attribute table (encoded here,
decoded by the exporter's own decoder), and the sub-second "alternating" workload whose windows
the truth keeps."""

from __future__ import annotations

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

from exporter.abi.gpu_metrics import FIXED_LAYOUTS, Layout
from exporter.exposition.views import unreported
from exporter.model import DeviceState
from exporter.simulator import Simulator, load_truth_json, parse_fleet, parse_scenario
from exporter.simulator import gpu_metrics_writer as gm
from exporter.simulator.asics import ASICS
from exporter.simulator.fleet import layout
from exporter.sources.gpu_metrics import decode_gpu_metrics
from tests.unit.test_gpu_metrics import read_v1_9_attributes, struct_format


@pytest.fixture
def sysfs(tmp_path: Path) -> Iterator[Path]:
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path / "sys"
        return
    folder = tempfile.mkdtemp(prefix="amdgpu-sim-part-", dir="/dev/shm")
    try:
        yield Path(folder) / "sys"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------------ fleet specs

_PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
# (compute, memory) pairs the driver accepts on an 8-XCD MI300X offering NPS1 and NPS4
_VALID_MODES = [("SPX", "NPS1"), ("DPX", "NPS1"), ("QPX", "NPS1"), ("QPX", "NPS4"), ("CPX", "NPS1"), ("CPX", "NPS4")]


@pytest.mark.parametrize(
    ("spec", "devices", "canonical"),
    [
        ("2xMI300X:CPX", 16, "2xMI300X:CPX"),
        ("2xMI300X:CPX:NPS4", 16, "2xMI300X:CPX:NPS4"),
        ("MI300X:QPX:NPS4", 4, "1xMI300X:QPX:NPS4"),
        ("mi300x:dpx", 2, "1xMI300X:DPX"),
        ("MI300X:SPX:NPS1", 1, "1xMI300X"),
        ("MI300X:CPX:gpu_metrics=1.6", 8, "1xMI300X:CPX:gpu_metrics=1.6"),
        ("MI300X:gpu_metrics=1.7;xcp_names=dot:CPX", 8, "1xMI300X:CPX:gpu_metrics=1.7;xcp_names=dot"),
        ("8xMI300X:CPX", 64, "8xMI300X:CPX"),
        ("MI325X:CPX:NPS4", 8, "1xMI325X:CPX:NPS4"),
        ("MI355X:DPX:NPS2", 2, "1xMI355X:DPX:NPS2"),
        ("MI350X", 1, "1xMI350X"),
        ("1xMI210,2xMI300X:CPX", 17, "1xMI210,2xMI300X:CPX"),
    ],
)
def test_fleet_specs_take_partition_modes(spec: str, devices: int, canonical: str) -> None:
    fleet = parse_fleet(spec)
    assert fleet.device_count == devices
    assert str(fleet) == canonical
    assert parse_fleet(str(fleet)) == fleet


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("MI300X:DPX:NPS4", "MI300X cannot run DPX with NPS4 (the driver rejects it): DPX takes NPS1"),
        ("MI300X:SPX:NPS4", "cannot run SPX with NPS4"),
        ("MI300X:TPX", "MI300X has no compute partition mode 'TPX': it offers SPX, DPX, QPX, CPX"),
        ("MI300X:NPS2", "MI300X has no memory partition mode 'NPS2'"),
        ("MI250X:CPX", "MI250X has no compute partitions: drop 'CPX'"),
        ("MI300X:CPX:QPX", "gives two compute partition modes"),
        ("MI300X:turbo", "unknown option 'turbo' for MI300X"),
        ("MI300X:xcp_names=colon", "bad xcp_names=colon"),
        ("MI355X:gpu_metrics=1.7", "the simulator writes no gpu_metrics 1.7 for MI355X"),
        ("17xMI300X:CPX", "at most 128 DRM render nodes"),
    ],
)
def test_bad_partition_specs_get_one_clear_line(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        parse_fleet(spec)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------------- tree layout


def _kfd_nodes(root: Path) -> dict[int, dict[str, int]]:
    nodes = {}
    for node in (root / "devices/virtual/kfd/kfd/topology/nodes").iterdir():
        props = dict(line.split() for line in (node / "properties").read_text().splitlines())
        nodes[int(node.name)] = {k: int(v) for k, v in props.items()} | {
            "gpu_id": int((node / "gpu_id").read_text()),
            "bank": int(dict(x.split() for x in (node / "mem_banks/0/properties").read_text().splitlines())[
                "size_in_bytes"
            ]),
            "links": len(list((node / "io_links").iterdir())),
        }  # fmt: skip
    return nodes


@pytest.mark.parametrize(("compute", "memory"), _VALID_MODES)
def test_partitions_are_laid_out_as_the_driver_does(sysfs: Path, compute: str, memory: str) -> None:
    sim = Simulator(sysfs, f"2xMI300X:{compute}:{memory}:gpu_metrics=1.7", "idle")
    sim.write_tree()
    n = _PARTITIONS[compute]
    devices = sim.truth()
    assert len(devices) == 2 * n
    assert [d.gpu for d in devices] == list(range(2 * n))
    platform = sysfs / "devices/platform"
    expected_xcp = {f"amdgpu_xcp_{i}" for i in range(2 * (n - 1))}
    found_xcp = {p.name for p in platform.iterdir()} if platform.exists() else set()
    assert found_xcp == expected_xcp
    cards = sorted(p.name for p in (sysfs / "class/drm").iterdir())
    assert cards == sorted([f"card{i}" for i in range(2 * n)] + [f"renderD{128 + i}" for i in range(2 * n)])
    nodes = _kfd_nodes(sysfs)
    gpu_nodes = {k: v for k, v in nodes.items() if v["gpu_id"]}
    assert len(gpu_nodes) == 2 * n
    for gcd in sim.gcds:
        dev = sysfs / gcd.device_relpath
        assert (dev / "current_compute_partition").read_text() == f"{compute}\n"
        assert (dev / "current_memory_partition").read_text() == f"{memory}\n"
        offered = "SPX, DPX, QPX, CPX" if memory == "NPS1" else "QPX, CPX"
        assert (dev / "available_compute_partition").read_text() == f"{offered}\n"
        assert (dev / "available_memory_partition").read_text() == "NPS1, NPS4\n"
        assert int((dev / "mem_info_vram_total").read_text()) == 192 * 1024**3  # device-wide in every mode
        socket_nodes = [gpu_nodes[p.kfd_node] for p in gcd.partitions]
        assert sum(node["simd_count"] for node in socket_nodes) == 1216
        assert sum(node["num_xcc"] for node in socket_nodes) == 8
        assert {node["unique_id"] for node in socket_nodes} == {gcd.unique_id}
        assert {node["domain"] for node in socket_nodes} == {0}
        for part, node in zip(gcd.partitions, socket_nodes, strict=True):
            assert node["location_id"] == (part.index << 28) | (gcd.bus << 8)
            assert node["bank"] == 192 * 1024**3 // (4 if memory == "NPS4" else 1)
            # every other partition of the hive is one io_link away, plus the PCIe link to the CPU
            assert node["links"] == 1 + 2 * n - 1
            # drm_render_minor names the partition's own render node, and it exists
            render = sysfs / "class/drm" / f"renderD{node['drm_render_minor']}"
            assert render.exists()
            home = dev if part.index == 0 else platform / part.platform_device
            assert os.path.realpath(render / "device") == os.path.realpath(home)
            assert (render / "dev").read_text() == f"226:{node['drm_render_minor']}\n"
            if part.index:
                assert (home / "modalias").read_text() == f"platform:amdgpu_xcp_{part.platform_device[11:]}\n"
                assert (home / "uevent").read_text().startswith("MODALIAS=platform:amdgpu_xcp_")
                assert not (home / "gpu_metrics").exists() and not (home / "hwmon").exists()
                link = sysfs / "bus/platform/devices" / part.platform_device
                assert os.path.realpath(link) == os.path.realpath(home)
    for device in devices:  # the truth's topology is the KFD node's io_links, one per link file
        assert device.partition is not None
        assert len(device.identity.topology) == gpu_nodes[device.partition.kfd_node]["links"]
        assert gpu_nodes[device.partition.kfd_node]["gpu_id"] == device.partition.gpu_id
        weights = sorted(link.weight for link in device.identity.topology if link.link_type == "xgmi")
        assert weights == [13] * (n - 1) + [15] * n
    # gpu_ids are unique across the node, drm minors are handed out socket by socket
    assert len({node["gpu_id"] for node in gpu_nodes.values()}) == 2 * n
    assert [p.card_minor for g in sim.gcds for p in g.partitions] == list(range(2 * n))
    hw = Path(devices[0].identity.hwmon_dir)
    assert (hw / "power1_label").read_text() == "PPT\n"


def test_the_dotted_platform_device_spelling(sysfs: Path) -> None:
    sim = Simulator(sysfs, "MI300X:CPX:xcp_names=dot", "idle")
    sim.write_tree()
    names = sorted(p.name for p in (sysfs / "devices/platform").iterdir())
    assert names == [f"amdgpu_xcp.{i}" for i in range(7)]
    # platform_device_register_simple("amdgpu_xcp", id): the modalias carries the bare name
    assert (sysfs / "devices/platform/amdgpu_xcp.3/modalias").read_text() == "platform:amdgpu_xcp\n"
    assert os.path.realpath(sysfs / "class/drm/card4/device") == str(sysfs.resolve() / "devices/platform/amdgpu_xcp.3")


def test_partition_truth_matches_the_tree_and_survives_json(sysfs: Path) -> None:
    sim = Simulator(sysfs, "2xMI300X:CPX:NPS4:gpu_metrics=1.6", "training", seed=2)
    sim.write_tree()
    sim.tick(9.0)
    devices = sim.truth()
    for device in devices:
        part = device.partition
        assert part is not None
        assert device.identity.pci_bus_id == sim.gcds[device.gpu // 8].bdf
        assert device.identity.compute_partition == "CPX" and device.identity.memory_partition == "NPS4"
        assert part.socket_gpu == device.gpu - part.index
        assert os.path.realpath(sysfs / "class/drm" / part.card / "device") == part.device_dir
        if part.index == 0:
            assert device.gpu_metrics is not None and device.sample.power_watts is not None
        else:
            # socket-wide values are exported once per socket, on partition 0
            assert device.gpu_metrics is None and device.sample.power_watts is None
            # its own busy: gfx of its XCCs, media of its decoders (which the simulator leaves at 0)
            assert dict(device.sample.busy) == {"gfx": part.gfx_busy, "media": 0.0}
        assert device.sample.busy["gfx"] == part.gfx_busy  # partition 0's too
    sim.write_truth_json(sysfs.parent / "truth.json")
    assert load_truth_json(sysfs.parent / "truth.json") == devices


# ------------------------------------------------------------------------- gpu_metrics tables


def _fixed_layout(blob: bytes) -> Layout:
    size, fmt, content = struct.unpack_from("<HBB", blob)
    (found,) = [x for x in FIXED_LAYOUTS if (x.format_revision, x.content_revision, x.size) == (fmt, content, size)]
    return found


def _unpack(blob: bytes, fields: tuple, size: int, offset: int = 0) -> dict[str, tuple[int, ...]]:
    """Every field of one (sub)layout as stored, using the exporter's layout tables."""
    ordered = sorted(fields, key=lambda f: f.offset)
    flat = struct.unpack_from(struct_format(tuple(ordered), size), blob, offset)
    out, i = {}, 0
    for f in ordered:
        out[f.name] = flat[i : i + f.count]
        i += f.count
    return out


def _expected(value: object, count: int, width: int) -> tuple[int, ...]:
    numbers = [value] if isinstance(value, int) else list(value)  # type: ignore[call-overload]
    ones = (1 << (8 * width)) - 1
    return tuple(n & ones for n in numbers) + (ones,) * (count - len(numbers))


@pytest.mark.parametrize(
    "fleet",
    [
        "MI300X:gpu_metrics=1.6",
        "MI300X:CPX:gpu_metrics=1.6",
        "MI300X:QPX:NPS4:gpu_metrics=1.7",
        "2xMI325X:DPX:gpu_metrics=1.7",
        "MI355X:CPX:gpu_metrics=1.8",
        "MI355X:QPX:gpu_metrics=1.8",
    ],
)
def test_every_value_written_is_where_the_exporter_layout_reads_it(sysfs: Path, fleet: str) -> None:
    sim = Simulator(sysfs, fleet, "thermal-excursion:start=1,hot=30,peak=99", seed=4)
    sim.write_tree()
    sim.tick(14.0)
    primary = sim.truth()[0]
    assert primary.gpu_metrics is not None and primary.partition is not None
    blob = (Path(primary.identity.device_dir) / "gpu_metrics").read_bytes()
    table = _fixed_layout(blob)
    raw = _unpack(blob, table.fields, table.size)
    widths = {f.name: f.size // f.count for f in table.fields}
    written = dict(primary.gpu_metrics)
    blocks = written.pop("xcp_stats")
    for name, value in written.items():
        assert raw[name] == _expected(value, len(raw[name]), widths[name]), name
    assert table.partition_block is not None
    block_widths = {f.name: f.size // f.count for f in table.partition_block.fields}
    n = primary.partition.count
    assert raw["num_partition"] == (n,) and len(blocks) == n
    for index in range(table.partition_count):
        offset = table.partitions_offset + index * table.partition_block.size
        got = _unpack(blob, table.partition_block.fields, table.partition_block.size, offset)
        for name, values in got.items():
            if index >= n:  # unused slots stay all-ones
                assert set(values) == {(1 << (8 * block_widths[name])) - 1}, name
            else:
                assert values == _expected(blocks[index][name], len(values), block_widths[name]), name
    # the decoder's view agrees: per-partition busy, partition count, socket values
    decoded = decode_gpu_metrics(blob)
    devices = sim.truth()[:n]
    assert decoded.num_partitions == n
    assert decoded.partition_gfx_busy == tuple(d.partition.gfx_busy_per_xcc for d in devices if d.partition)
    assert decoded.power_watts == primary.sample.power_watts
    assert decoded.energy_joules == primary.sample.energy_joules
    assert dict(decoded.temperatures) == dict(primary.sample.temperatures)
    # the excursion throttles gfx: the thermal residency counts milliseconds, the PPT one does not
    assert raw["socket_thm_residency_acc"][0] > 1000 and raw["ppt_residency_acc"] == (0,)
    assert raw["accumulation_counter"] == (14000,)


_V1_9_FLEETS = ["MI300X:gpu_metrics=1.9", "MI355X:CPX:gpu_metrics=1.9", "MI300X:QPX:gpu_metrics=1.9"]


@pytest.mark.parametrize("fleet", _V1_9_FLEETS)
def test_v1_9_attribute_table_reads_back_through_the_exporter(sysfs: Path, fleet: str) -> None:
    sim = Simulator(sysfs, fleet, "training", seed=5)
    sim.write_tree()
    sim.tick(11.0)
    devices = sim.truth()
    primary = devices[0]
    assert primary.gpu_metrics is not None
    blob = (Path(primary.identity.device_dir) / "gpu_metrics").read_bytes()
    assert struct.unpack_from("<HBBi", blob) == (len(blob), 1, 9, len(gm.V1_9_FIELDS))
    records = read_v1_9_attributes(blob)
    assert [r.name for r in records] == [name for name, *_ in gm.V1_9_FIELDS]
    for record, (name, unit, kind, count) in zip(records, gm.V1_9_FIELDS, strict=True):
        assert (record.unit, record.value_type.value, len(record.values)) == (unit, gm.ATTR_TYPES[kind], count)
        value = primary.gpu_metrics.get(name)
        width = struct.calcsize(kind)
        expected = _expected(value if value is not None else [], count, width)
        assert record.values == expected, name
    assert "num_partition" not in primary.gpu_metrics  # v1.9 carries no partition count
    decoded = decode_gpu_metrics(blob)
    per_xcc = tuple(v for d in devices if d.partition for v in d.partition.gfx_busy_per_xcc)
    assert decoded.partition_gfx_busy == (per_xcc,)
    assert decoded.power_watts == primary.sample.power_watts
    assert decoded.energy_joules == primary.sample.energy_joules
    assert dict(decoded.xgmi_read_bytes) == dict(primary.sample.xgmi_read_bytes)


def test_v1_9_encoding_follows_the_kernel_macro() -> None:
    # AMDGPU_METRICS_ENC_ATTR(unit, type, id, instances): unit 31..24, type 23..20, id 19..10, count 9..0
    assert gm.attr_encoding(gm.UNIT_CELSIUS, "H", "temperature_hotspot", 1) == (2 << 24) | (2 << 20) | 1
    assert gm.attr_encoding(gm.UNIT_KB, "Q", "xgmi_read_data_acc", 8) == (9 << 24) | (6 << 20) | (29 << 10) | 8
    # SMU_13_0_6_METRICS_FIELDS: 47 attributes, 1150 bytes, units as declared (quirks included)
    assert len(gm.V1_9_FIELDS) == 47 and gm.V1_9_SIZE == 1150
    fields = {name: (unit, kind, count) for name, unit, kind, count in gm.V1_9_FIELDS}
    assert fields["pcie_bandwidth_acc"] == (10, "Q", 1) and fields["pcie_link_speed"] == (7, "H", 1)
    assert fields["jpeg_busy"] == (10, "H", 40) and fields["xgmi_link_status"] == (0, "H", 8)
    assert fields["firmware_timestamp"] == (5, "Q", 1) and fields["gfx_below_host_limit_total_acc"] == (0, "Q", 8)
    blob = gm.encode((1, 9), {"curr_socket_power": 612})
    assert len(blob) == gm.V1_9_SIZE == 8 + sum(8 + struct.calcsize(k) * n for _, _, k, n in gm.V1_9_FIELDS)
    with pytest.raises(KeyError):
        gm.encode((1, 9), {"num_partition": 8})


def test_mi355x_fills_the_v1_8_host_limit_counters(sysfs: Path) -> None:
    sim = Simulator(sysfs, "MI355X:CPX:gpu_metrics=1.8", "idle", seed=1)
    sim.write_tree()
    sim.tick(5.0)
    blocks = sim.truth()[0].gpu_metrics["xcp_stats"]  # type: ignore[index]
    assert len(blocks) == 8
    for block in blocks:
        # idle: every partition's single XCC counts low-utilisation time, 1 ms per tick
        assert block["gfx_low_utilization_acc"] == [5000]
        assert block["gfx_below_host_limit_total_acc"] == [5000]
        assert len(block["jpeg_busy"]) == 10 and len(block["vcn_busy"]) == 1


# --------------------------------------------------------------------- alternating workload


def test_alternating_scenario_options() -> None:
    s = parse_scenario("alternating:period=0.6,duty=0.5,swing=8,window=5")
    assert (s.period, s.duty, s.swing, s.window, s.tick_interval) == (0.6, 0.5, 8.0, 5.0, pytest.approx(0.03))
    assert parse_scenario(str(s)) == s
    assert parse_scenario("alternating").period == 0.8
    for bad, message in [
        ("alternating:duty=1", "between 0.05 and 0.95"),
        ("alternating:period=0.01", "0.1 to 60 s"),
        ("alternating:swing=50", "at most 30"),
        ("alternating:tick=5", "0.01 to 1 s"),
        ("training:duty=0.5", "bad option"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_scenario(bad)


def test_alternating_values_change_within_a_second_and_windows_hold_them(sysfs: Path) -> None:
    sim = Simulator(sysfs, "MI300X:DPX:gpu_metrics=1.7", "alternating:period=0.8,duty=0.6,swing=6,window=4", seed=3)
    sim.write_tree()
    tick = sim.scenario.tick_interval
    dev = sysfs / sim.gcds[0].device_relpath
    hw = Path(sim.truth()[0].identity.hwmon_dir)
    seen: list[tuple[float, int, int, int]] = []
    own_busy: list[float] = []  # partition 0's own gfx busy (its xcp_stats block), what its device reports
    steps = round(40.0 / tick)
    for k in range(1, steps + 1):
        sim.tick(k * tick)
        if k * tick > 36.0:  # the last 4 s: steady state, the window
            busy = int((dev / "gpu_busy_percent").read_text())
            power = int((hw / "power1_input").read_text()) // 1_000_000
            junction = int((hw / "temp2_input").read_text()) // 1000
            seen.append((k * tick, busy, power, junction))
            own_busy.append(sim.truth()[0].sample.busy["gfx"])
    # within any one second both phases show: busy and power swing, the hotspot swings ~swing °C
    last_second = [row for row in seen if row[0] > 39.0]
    assert max(r[1] for r in last_second) - min(r[1] for r in last_second) > 50
    assert max(r[2] for r in last_second) - min(r[2] for r in last_second) > 80
    assert 4 <= max(r[3] for r in seen) - min(r[3] for r in seen) <= 9
    windows = sim.windows()
    assert windows is not None and windows["seconds"] == 4.0
    socket = windows["devices"][0]
    assert socket["busy"]["gfx"]["max"] == max(own_busy)
    assert socket["busy"]["gfx"]["min"] == min(own_busy)
    assert socket["power"]["socket"]["max"] == max(r[2] for r in seen)
    assert socket["temperature"]["junction"]["min"] == min(r[3] for r in seen)
    assert socket["temperature"]["junction"]["max"] == max(r[3] for r in seen)
    # every value holds one tick: the time-weighted mean is the mean of the ticks shown
    mean_busy = sum(r[1] for r in seen) / len(seen) / 100
    assert socket["busy"]["gfx"]["mean"] == pytest.approx(mean_busy, abs=0.01)
    # the accumulators give the mean of the signal itself; it agrees with what was shown
    assert socket["busy"]["gfx"]["mean_acc"] == pytest.approx(socket["busy"]["gfx"]["mean"], abs=0.02)
    assert socket["power"]["socket"]["mean_acc"] == pytest.approx(socket["power"]["socket"]["mean"], rel=0.01)
    # the duty cycle shows in the mean: 60 % near 98 % busy, 40 % near 30 %
    assert 0.65 < socket["busy"]["gfx"]["mean"] < 0.80
    # the second partition has its own window, from its own xcp_stats block
    assert windows["devices"][1]["busy"]["gfx"]["max"] > 0.9
    assert "mean_acc" in windows["devices"][1]["busy"]["gfx"]


def test_alternating_run_ticks_faster_than_asked_and_writes_windows(sysfs: Path) -> None:
    sim = Simulator(sysfs, "MI300X", "alternating:period=0.4", seed=1)
    stop = threading.Event()
    truth = sysfs.parent / "truth.json"
    thread = threading.Thread(target=sim.run, args=(1.0, stop, truth), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while (sim.history is None or len(sim.history) < 20) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert sim.history is not None and len(sim.history) >= 20  # 20 ticks well inside 10 s at 1.0 s asked
    document = json.loads(truth.read_text())
    assert document["windows"]["seconds"] == 15.0
    gfx = document["windows"]["devices"][0]["busy"]["gfx"]
    assert gfx["min"] <= gfx["mean"] <= gfx["max"]


def test_layout_numbers_minors_and_kfd_nodes_socket_by_socket() -> None:
    gcds = layout(parse_fleet("1xMI300X:QPX,1xMI300X,1xMI210"))
    minors = [(g.index, p.index, p.card_minor, p.render_minor, p.kfd_node) for g in gcds for p in g.partitions]
    assert minors == [
        (0, 0, 0, 128, 2),
        (0, 1, 1, 129, 3),
        (0, 2, 2, 130, 4),
        (0, 3, 3, 131, 5),
        (1, 0, 4, 132, 6),
        (2, 0, 5, 133, 7),
    ]
    assert [p.platform_device for p in gcds[0].partitions] == ["", "amdgpu_xcp_0", "amdgpu_xcp_1", "amdgpu_xcp_2"]
    assert gcds[1].card == "card4" and gcds[2].render_minor == 133


# ------------------------------------------------------------ throttling and links for alerts


def test_a_power_limited_mi300x_counts_ppt_residency_and_holds_its_cap(sysfs: Path) -> None:
    sim = Simulator(sysfs, "MI300X:gpu_metrics=1.7", "training:load=1.15", seed=1)
    sim.write_tree()
    sim.tick(10.0)
    first = sim.truth()[0]
    sim.tick(20.0)
    later = sim.truth()[0]
    assert first.gpu_metrics is not None and later.gpu_metrics is not None
    grown = later.gpu_metrics["ppt_residency_acc"] - first.gpu_metrics["ppt_residency_acc"]
    ticks = later.gpu_metrics["accumulation_counter"] - first.gpu_metrics["accumulation_counter"]
    assert ticks == 10_000
    assert 0.5 * ticks < grown <= ticks  # power-limited through the compute phases of each step
    assert later.gpu_metrics["xcp_stats"][0]["gfx_below_host_limit_acc"] == [later.gpu_metrics["ppt_residency_acc"]] * 8
    assert later.sample.power_watts is not None and later.sample.power_watts <= 750


def test_an_xgmi_link_goes_down_and_stops_counting(sysfs: Path) -> None:
    sim = Simulator(sysfs, "8xMI300X:gpu_metrics=1.7", "training:xgmi_down=2.3,down_at=6", seed=1)
    sim.write_tree()
    sim.tick(6.0)
    before = sim.truth()[2]
    sim.tick(16.0)
    after = sim.truth()[2]
    assert dict(after.sample.xgmi_link_up) == {i: i not in (3, 7) for i in range(8)}
    assert after.sample.xgmi_read_bytes[3] == before.sample.xgmi_read_bytes[3]
    assert after.sample.xgmi_read_bytes[2] > before.sample.xgmi_read_bytes[2]
    blob = (Path(after.identity.device_dir) / "gpu_metrics").read_bytes()
    assert decode_gpu_metrics(blob).xgmi_link_up == after.sample.xgmi_link_up
    assert all(sim.truth()[1].sample.xgmi_link_up[i] for i in range(7))  # the other GPUs keep theirs
    with pytest.raises(ValueError, match=re.escape("expected GCD.LINK")):
        parse_scenario("training:xgmi_down=3")


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_partitions_carry_their_own_xcp_metrics_when_the_driver_has_them(sysfs: Path, version: str) -> None:
    sim = Simulator(sysfs, f"MI300X:CPX:gpu_metrics=1.7;xcp_metrics={version}", "training", seed=6)
    sim.write_tree()
    sim.tick(12.0)
    for device in sim.truth():
        part = device.partition
        assert part is not None and part.xcp_metrics is not None
        blob = (Path(part.device_dir) / "xcp/xcp_metrics").read_bytes()
        if version == "1.0":
            # amdgpu_partition_metrics_v1_0: gfx_busy_inst at 48, gfx_busy_acc at 168, 488 bytes
            assert struct.unpack_from("<HBB", blob) == (488, 1, 0) and gm.PARTITION_V1_0.size == 488
            busy = struct.unpack_from("<8I", blob, 48)
            acc = struct.unpack_from("<8Q", blob, 168)
        else:
            assert struct.unpack_from("<HBB", blob)[1:] == (1, 1)
            records = {r.name: r.values for r in read_v1_9_attributes(blob[:2] + b"\x01\x09" + blob[4:])}
            busy, acc = records["gfx_busy_inst"], records["gfx_busy_acc"]
        # a CPX partition has one XCC: slot 0 holds its values, the rest are all-ones
        assert busy == (round(part.gfx_busy * 100),) + (0xFFFFFFFF,) * 7  # type: ignore[operator]
        assert acc[0] == part.gfx_busy_acc_per_xcc[0] and acc[1] == 2**64 - 1
    assert not (sysfs / "devices/platform/amdgpu_xcp_0/gpu_metrics").exists()


def test_xcp_nodes_all_preallocates_seven_per_socket_like_the_driver(sysfs: Path) -> None:
    # amdgpu_xcp_dev_alloc allocates xcp nodes 1..7 at load whatever the mode: an SPX socket still
    # has eight DRM card/render pairs, and only KFD says which of them are partitions in use
    sim = Simulator(sysfs, "2xMI300X:DPX:xcp_nodes=all", "idle")
    sim.write_tree()
    assert str(sim.fleet) == "2xMI300X:DPX:xcp_nodes=all"
    assert len([p for p in (sysfs / "class/drm").iterdir() if p.name.startswith("renderD")]) == 16
    assert len(list((sysfs / "devices/platform").iterdir())) == 14
    devices = sim.truth()
    assert [d.partition.card for d in devices if d.partition] == ["card0", "card1", "card8", "card9"]
    assert [d.partition.platform_device for d in devices if d.partition] == ["", "amdgpu_xcp_0", "", "amdgpu_xcp_7"]
    minors = sorted(n["drm_render_minor"] for n in _kfd_nodes(sysfs).values() if n["gpu_id"])
    assert minors == [128, 129, 136, 137]
    # an unused node is a bare platform device with DRM minors
    idle = sysfs / "devices/platform/amdgpu_xcp_3"
    assert sorted(p.name for p in (idle / "drm").iterdir()) == ["card4", "renderD132"]
    with pytest.raises(ValueError, match="needs 136 DRM render nodes"):
        parse_fleet("17xMI300X:xcp_nodes=all")


_EVERY_DEMO_SHAPE = [
    f"{model}{mode}:gpu_metrics={a}.{b}"
    for model, asic in ASICS.items()
    for a, b in asic.metrics_versions
    for mode in ["", *(f":{m.strip()}" for m in asic.compute_partitions.split(",") if m.strip())]
]


@pytest.mark.parametrize("fleet", _EVERY_DEMO_SHAPE)
def test_every_demo_device_shows_power_and_busy_or_says_why_not(sysfs: Path, fleet: str) -> None:
    sim = Simulator(sysfs, f"2x{fleet}", "training", seed=1)
    sim.write_tree()
    sim.tick(10.0)
    for device in sim.truth():
        state = DeviceState(identity=device.identity, gpu=device.gpu, sample=device.sample, up=True)
        why = unreported(state)
        assert device.sample.power_watts is not None or "power" in why, (fleet, device.gpu)
        assert "gfx" in device.sample.busy or "busy" in why, (fleet, device.gpu)
