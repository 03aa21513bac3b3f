"""The MI350-class board/ group and the SR-IOV guest: the simulated trees as the kernel writes them,
the parsers (pure, never failing any other way than TextParseError), the sysfs source against the
simulator's truth, and how /metrics shows node-wide values and a guest's identity."""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.abi.board import (
    BASEBOARD_TEMP,
    GPUBOARD_TEMP,
    NODE_SENSORS,
    SYSTEM_SENSORS,
    VR_SENSORS,
)
from exporter.exposition.metrics import BY_NAME
from exporter.model import DeviceState, Published, Snapshot
from exporter.simulator import Simulator, parse_fleet
from exporter.simulator.board import encode_temp_table
from exporter.sources import textfiles as tf
from exporter.sources.sysfs import SysfsSource
from exporter.sources.sysfs.board import parse_npm_status, parse_temp_table


def _tree(tmp_path: Path, fleet: str) -> tuple[Simulator, SysfsSource]:
    simulator = Simulator(tmp_path / "sys", fleet, "training", seed=3)
    simulator.write_tree()
    simulator.tick(20.0)
    return simulator, SysfsSource(tmp_path / "sys")


# ----------------------------------------------------------------------------- the board tables


def test_temp_tables_have_the_kernels_sizes() -> None:
    # struct amdgpu_gpuboard_temp_metrics_v1_0: 4 + 2 + 2 + 8 + 12 * 4 + 13 * 4 = 116, aligned to 8
    assert struct.calcsize("<HBBHHQ12I13I") == 116 and GPUBOARD_TEMP.size == 120
    assert struct.calcsize("<HBBHHQ32I") == BASEBOARD_TEMP.size == 144


def test_temp_table_entries_are_found_by_sensor_id_and_unused_ones_skipped() -> None:
    blob = bytearray(encode_temp_table(BASEBOARD_TEMP, {"ubb_front": 41, "ibc": 55}))
    assert parse_temp_table(bytes(blob), BASEBOARD_TEMP) == {"ubb_front": 41.0, "ibc": 55.0}
    # the driver packs present sensors from index 0; the rest stays all-ones
    entries = struct.unpack_from("<32I", blob, 16)
    assert entries[:2] == (1 << 24 | 41, 22 << 24 | 55) and set(entries[2:]) == {0xFFFFFFFF}
    # an id past the kernel's enum is skipped; a negative reading keeps its sign (24-bit field)
    struct.pack_into("<2I", blob, 16, 200 << 24 | 30, 3 << 24 | (-5 & 0xFFFFFF))
    assert parse_temp_table(bytes(blob), BASEBOARD_TEMP) == {"ubb_oam7": -5.0}


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x78\x00", "shorter than the table header"),
        (struct.pack("<HBB", 120, 1, 1) + bytes(116), "table version 1.1"),
        (struct.pack("<HBB", 144, 1, 0) + bytes(140), "not the 120-byte gpuboard_temp"),
        (struct.pack("<HBB", 120, 1, 0) + bytes(50), "54 bytes"),
    ],
)
def test_temp_table_that_is_not_the_table_is_a_parse_error(blob: bytes, message: str) -> None:
    with pytest.raises(tf.TextParseError, match=re.escape(message)):
        parse_temp_table(blob, GPUBOARD_TEMP)


@given(st.binary(max_size=200))
def test_temp_table_parser_never_fails_any_other_way(blob: bytes) -> None:
    for table in (GPUBOARD_TEMP, BASEBOARD_TEMP):
        try:
            temps = parse_temp_table(blob, table)
        except tf.TextParseError:
            continue
        assert all(-(2**23) <= v < 2**23 for v in temps.values())


def test_npm_status() -> None:
    assert parse_npm_status("enabled\n") is True and parse_npm_status("disabled\n") is False
    with pytest.raises(tf.TextParseError):
        parse_npm_status("on\n")


# ---------------------------------------------------------------------------- the simulated trees


def test_mi350_class_trees_have_the_board_group_and_mi300_class_ones_do_not(tmp_path: Path) -> None:
    simulator, _ = _tree(tmp_path, "1xMI300X,1xMI325X,1xMI350X,1xMI355X")
    files = {"baseboard_temp", "gpuboard_temp", "npm_status", "cur_node_power_limit", "max_node_power_limit",
             "node_power", "global_ppt_resid", "baseboard_power", "baseboard_power_limit"}  # fmt: skip
    for gcd in simulator.gcds:
        board = simulator.root / gcd.device_relpath / "board"
        if gcd.model.name in ("MI350X", "MI355X"):
            assert set(os.listdir(board)) == files
            assert (board / "npm_status").read_text() == "enabled\n"
            assert re.fullmatch(r"[0-9]+\n", (board / "node_power").read_text())
        else:
            assert not board.exists()


def test_board_values_read_back_as_the_truth_and_node_values_agree(tmp_path: Path) -> None:
    simulator, source = _tree(tmp_path, "2xMI355X")
    try:
        devices = source.discover()
        samples = [source.read(device) for device in devices]
    finally:
        source.close()
    truth = simulator.truth()
    for sample, expected in zip(samples, truth, strict=True):
        for name in ("board_temperatures", "baseboard_temperatures"):
            assert dict(getattr(sample, name)) == dict(getattr(expected.sample, name))
        for name in (
            "node_power_watts",
            "node_power_limit_watts",
            "node_power_limit_max_watts",
            "baseboard_power_watts",
            "baseboard_power_limit_watts",
        ):
            assert getattr(sample, name) == getattr(expected.sample, name)
        assert sample.node_power_management_enabled is True
        assert set(sample.board_temperatures) == {*NODE_SENSORS, *VR_SENSORS}
        assert set(sample.baseboard_temperatures) == set(SYSTEM_SENSORS)
        assert not sample.file_errors
    # one node, one baseboard: both GPUs read the same node-wide figures
    assert samples[0].node_power_watts == samples[1].node_power_watts
    assert samples[0].baseboard_temperatures == samples[1].baseboard_temperatures
    assert samples[0].node_power_limit_max_watts == 8 * 1400
    assert samples[0].baseboard_power_watts is not None and samples[0].node_power_watts is not None
    assert samples[0].baseboard_power_watts < samples[0].node_power_watts  # the node is the baseboard and more


# ------------------------------------------------------------------------------------ the guest


def test_guest_fleet_option() -> None:
    fleet = parse_fleet("4xMI300X:guest,1xMI325X:VF")
    assert [e.guest for e in fleet.entries] == [True, True]
    assert str(fleet) == "4xMI300X:guest,1xMI325X:guest" and parse_fleet(str(fleet)) == fleet
    with pytest.raises(ValueError, match="MI355X has no simulated virtual function"):
        parse_fleet("MI355X:guest")
    with pytest.raises(ValueError, match="MI250X has no simulated virtual function"):
        parse_fleet("MI250X:guest")


def test_guest_tree_has_what_a_vf_shows(tmp_path: Path) -> None:
    simulator, source = _tree(tmp_path, "2xMI300X:guest")
    try:
        devices = source.discover()
        samples = [source.read(device) for device in devices]
    finally:
        source.close()
    for gcd in simulator.gcds:
        dev = simulator.root / gcd.device_relpath
        assert (dev / "device").read_text() == "0x74b5\n"
        assert (dev / "vbios_version").read_text() == "113-MI3SRIOV-001\n"
        assert (dev / "unique_id").read_text() == ""  # the kernel prints nothing for an id of 0
        for absent in ("serial_number", "product_name", "product_number", "fw_version", "board"):
            assert not (dev / absent).exists(), absent
        hwmon = simulator.root / gcd.device_relpath / "hwmon" / f"hwmon{gcd.hwmon_index}"
        names = set(os.listdir(hwmon))
        assert "power1_input" in names and "temp2_input" in names and "temp3_input" in names
        assert not names & {"temp1_input", "fan1_input", "in0_input", "pwm1"}  # no edge, fan, voltage
    assert [d.deployment for d in devices] == ["guest", "guest"]
    assert [d.identity_source for d in devices] == ["pci_bus_id", "pci_bus_id"]
    assert len({d.key for d in devices}) == 2  # the BDF keeps them apart
    assert {d.unique_id for d in devices} == {""} and {d.product for d in devices} == {"AMD Instinct MI300X VF"}
    for sample, expected in zip(samples, simulator.truth(), strict=True):
        assert not sample.file_errors  # what a VF lacks is absent, not a fault
        assert dataclasses.replace(sample, timestamp=0) == dataclasses.replace(expected.sample, timestamp=0)
        assert sample.power_watts is not None and "edge" not in sample.temperatures and not sample.voltages_volts


# ------------------------------------------------------------------------------------ exposition


def _published(tmp_path: Path, fleet: str) -> Published:
    _simulator, source = _tree(tmp_path, fleet)
    try:
        devices = source.discover()
        states = tuple(DeviceState(identity=d, gpu=i, sample=source.read(d), up=True) for i, d in enumerate(devices))
    finally:
        source.close()
    return Published(snapshot=Snapshot(taken_at=0.0, devices=states))


def test_node_wide_values_are_shown_once_without_a_gpu_label(tmp_path: Path) -> None:
    published = _published(tmp_path, "2xMI355X")
    power = list(BY_NAME["amdgpu_node_power_watts"].values(published))
    assert len(power) == 1 and power[0][0] == ()
    baseboard = list(BY_NAME["amdgpu_baseboard_temperature_celsius"].values(published))
    assert [labels for labels, _ in baseboard] == [(s,) for s in sorted(SYSTEM_SENSORS)]
    board = list(BY_NAME["amdgpu_board_temperature_celsius"].values(published))
    assert {labels[0] for labels, _ in board} == {"0", "1"}  # each GPU's own board
    assert list(BY_NAME["amdgpu_node_power_management_active"].values(published)) == [((), 1.0)]


def test_device_info_says_guest_and_where_identity_comes_from(tmp_path: Path) -> None:
    published = _published(tmp_path, "1xMI300X,1xMI300X:guest")
    spec = BY_NAME["amdgpu_device_info"]
    rows = [dict(zip(spec.labels, labels, strict=True)) for labels, _ in spec.values(published)]
    assert [(r["deployment"], r["identity_source"]) for r in rows] == [
        ("baremetal", "unique_id"),
        ("guest", "pci_bus_id"),
    ]
    assert rows[1]["unique_id"] == "" and rows[1]["serial"] == ""
    for family in ("amdgpu_node_power_watts", "amdgpu_baseboard_temperature_celsius"):
        assert list(BY_NAME[family].values(published)) == []  # no board/ on MI300X: no series
