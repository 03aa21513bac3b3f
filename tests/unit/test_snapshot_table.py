"""The snapshot table on hand-made devices: partitions under their socket, dies under their
package, a down device, throttling and a long suggestion wrapped, never wider than 80 columns."""

from __future__ import annotations

from exporter.exposition.views import group_devices
from exporter.model import AlertState, DeviceIdentity, DeviceState, Sample, frozen_map
from exporter.operator.snapshot_table import WIDTH, pcie_link, render_table


def _state(gpu: int, package: str, *, die: int = 0, partition: str = "", up: bool = True, **sample) -> DeviceState:
    identity = DeviceIdentity(
        pci_bus_id=f"0000:{gpu:02x}:00.0",
        card=f"card{gpu}",
        device_dir="/x",
        product="AMD Instinct MI300X" if partition else "AMD Instinct MI250X",
        serial=package,
        package=package,
        die=die,
        compute_partition=partition,
        partition=gpu if partition else 0,  # the hand-made sockets start at gpu 0
        memory_partition="NPS4" if partition else "",
    )
    values = {
        "temperatures": frozen_map({"edge": 40.0, "junction": 55.5, "memory": 50.0}),
        "power_watts": 300.4,
        "power_cap_watts": 750.0,
        "busy": frozen_map({"gfx": 0.97}),
        "memory_used_bytes": frozen_map({"vram": 20 * 1024**3}),
        "memory_total_bytes": frozen_map({"vram": 24 * 1024**3}),
        "clocks_hertz": frozen_map({"gfx": 2.1e9, "memory": 1.3e9}),
        "pcie_link_transfers_per_second": 32e9,
        "pcie_max_link_transfers_per_second": 32e9,
        "pcie_link_width": 16,
        "pcie_max_link_width": 16,
    }
    values.update(sample)
    return DeviceState(
        identity=identity,
        gpu=gpu,
        sample=Sample(timestamp=1000.0, **values),
        up=up,
        down_reason="" if up else "timeout",
    )


def test_partitions_sit_under_their_socket_and_dies_under_their_package() -> None:
    devices = [_state(i, "SOCKET-A", partition="CPX") for i in range(8)]
    devices += [_state(8, "PKG-B", die=0), _state(9, "PKG-B", die=1, up=False)]
    groups = group_devices(devices)
    assert [len(g.devices) for g in groups] == [8, 2]
    assert groups[0].partitioned and not groups[1].partitioned
    table = render_table(devices, source="sysfs", taken_at=1003.0)
    lines = table.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert "socket SOCKET-A · CPX/NPS4 · 8 partitions" in lines[2]
    assert [line[4:6] for line in lines[3:11]] == [f"p{i}" for i in range(8)]
    assert "package PKG-B · 2 dies" in lines[11]
    assert lines[12].startswith("  8 d0") and "56" in lines[12] and " 300/750" in lines[12] and "97%" in lines[12]
    assert "20.0/24" in lines[12] and "2100/1300" in lines[12] and "32GT x16" in lines[12]
    assert lines[13] == "  9 d1  DOWN (timeout, last sample 3 s ago)"
    assert "(1 down)" in lines[0]


def test_throttling_and_a_long_suggestion_are_wrapped() -> None:
    device = _state(0, "P", throttle=frozen_map({"temp_gpu": True, "ppt0": True, "apcc": False}))
    alert = AlertState(
        gpu=0,
        alert="GpuJunctionTemperatureHigh",
        severity="warning",
        firing=True,
        since=1.0,
        suggestion="junction 92 °C is above 85 °C: lower the gfx clock ceiling by 5 % to 1995 MHz, e.g. "
        "rocm-smi -d 0 --setsrange 500 1995 (a suggestion only; the exporter never changes settings)",
    )
    lines = render_table([device], [alert], taken_at=1000.0).splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert any(line.strip() == "throttling: ppt0, temp_gpu" for line in lines)
    joined = " ".join(line.strip() for line in lines)
    assert "! GpuJunctionTemperatureHigh (warning, firing): junction 92 °C" in joined
    assert "rocm-smi -d 0 --setsrange 500 1995" in joined


def test_pcie_link_shows_the_maximum_only_when_below_it() -> None:
    full = Sample(
        timestamp=0,
        pcie_link_transfers_per_second=16e9,
        pcie_max_link_transfers_per_second=16e9,
        pcie_link_width=16,
        pcie_max_link_width=16,
    )
    assert pcie_link(full) == "16GT x16"
    slow = Sample(
        timestamp=0,
        pcie_link_transfers_per_second=2.5e9,
        pcie_max_link_transfers_per_second=16e9,
        pcie_link_width=8,
        pcie_max_link_width=16,
    )
    assert pcie_link(slow) == "2.5/16GT x8/16"
    assert pcie_link(Sample(timestamp=0)) == "-"


def test_terminal_safe_escapes_every_control_character_and_lone_surrogate() -> None:
    from exporter.operator.snapshot_table import terminal_safe

    assert terminal_safe("\x1b]0;PWN\x07") == "\\x1b]0;PWN\\x07"
    assert terminal_safe("a\nb\x7f\x9b") == "a\\x0ab\\x7f\\x9b"
    assert terminal_safe("j\ud800rg 训练") == "j\ufffdrg 训练"
