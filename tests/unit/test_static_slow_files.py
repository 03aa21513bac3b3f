"""The slow layer's static rows (limits, totals, link maxima) are read once after each discovery;
the rest of it (the power cap, the trained link, RAS counts ...) at every slow refresh.

Shown by rewriting files between refreshes: a static file's new text is seen only after the next
discovery, a changing file's at the next refresh; a static file that failed is read again at the
next refresh, not left missing until a discovery."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.model import DeviceIdentity
from exporter.simulator import Simulator
from exporter.sources.sysfs import SysfsSource
from exporter.sources.sysfs.table import SLOW_FILES


def first_gcd(tmp_path: Path) -> tuple[SysfsSource, DeviceIdentity]:
    Simulator(tmp_path / "sys", fleet="1xMI250X", seed=3).write_tree()
    source = SysfsSource(tmp_path / "sys", slow_interval=0.0)  # every read refreshes the slow layer
    device = next(d for d in source.discover() if d.die == 0)
    return source, device


def rewrite(path: str, text: str) -> None:
    # in place, as a sysfs attribute changes (the kept descriptors of the hot path are not involved)
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def test_static_rows_are_the_limits_totals_and_link_maxima() -> None:
    static = {row.file for row in SLOW_FILES if row.static}
    assert static == {
        *(f"temp{i}_{s}" for i in (1, 2, 3) for s in ("crit", "emergency")),
        "power1_cap_max",
        "mem_info_vram_total",
        "mem_info_vis_vram_total",
        "mem_info_gtt_total",
        "max_link_speed",
        "max_link_width",
    }


def test_a_static_file_is_read_after_discovery_a_changing_one_every_refresh(tmp_path: Path) -> None:
    source, device = first_gcd(tmp_path)
    hwmon = device.hwmon_dir
    before = source.read(device)
    rewrite(os.path.join(hwmon, "temp2_crit"), "77000\n")
    rewrite(os.path.join(hwmon, "power1_cap"), "123000000\n")
    rewrite(os.path.join(device.device_dir, "max_link_width"), "8\n")
    after = source.read(device)
    assert after.power_cap_watts == 123.0  # re-read at the refresh
    assert after.temperature_thresholds == before.temperature_thresholds  # kept
    assert after.pcie_max_link_width == before.pcie_max_link_width == 16
    (device,) = [d for d in source.discover() if d.pci_bus_id == device.pci_bus_id and d.die == 0]
    rediscovered = source.read(device)
    assert rediscovered.temperature_thresholds[("junction", "critical")] == 77.0
    assert rediscovered.pcie_max_link_width == 8


def test_a_static_file_that_failed_is_read_again_at_the_next_refresh(tmp_path: Path) -> None:
    source, device = first_gcd(tmp_path)
    path = os.path.join(device.hwmon_dir, "power1_cap_max")
    good = Path(path).read_text()
    rewrite(path, "not a number\n")
    failed = source.read(device)
    assert failed.power_cap_max_watts is None
    assert ("hwmon/power1_cap_max", "parse") in failed.file_errors or any(
        file.endswith("power1_cap_max") and reason == "parse" for file, reason in failed.file_errors
    )
    rewrite(path, good)
    assert source.read(device).power_cap_max_watts is not None  # no discovery in between
