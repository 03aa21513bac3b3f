"""The status page as the server renders it (before any script runs): a tile per device with its
values, package and partition, alerts, links; nothing loaded from anywhere else."""

from __future__ import annotations

import re

from exporter.model import AlertState, DeviceIdentity, DeviceState, Sample, Snapshot, frozen_map
from exporter.web.status_page import render_status_page


def _device(gpu: int, package: str, die: int = 0, partition: str = "", up: bool = True) -> DeviceState:
    identity = DeviceIdentity(
        pci_bus_id=f"0000:{gpu:02x}:00.0",
        card=f"card{gpu}",
        device_dir="/x",
        product="AMD Instinct <MI300X>",  # escaped, never interpreted
        serial=package,
        package=package,
        die=die,
        compute_partition=partition,
        partition=gpu if partition else 0,  # the hand-made sockets start at gpu 0
        memory_partition="NPS1" if partition else "",
    )
    sample = Sample(
        timestamp=1.0,
        temperatures=frozen_map({"junction": 61.0, "edge": 50.0, "memory": 55.0}),
        power_watts=None if die else 412.0,
        power_cap_watts=None if die else 750.0,
        busy=frozen_map({"gfx": 0.5}),
        memory_used_bytes=frozen_map({"vram": 96 * 1024**3}),
        memory_total_bytes=frozen_map({"vram": 192 * 1024**3}),
    )
    return DeviceState(identity=identity, gpu=gpu, sample=sample, up=up, down_reason="" if up else "timeout")


def test_tiles_values_groups_and_alerts() -> None:
    devices = (
        _device(0, "S0", partition="DPX"),
        _device(1, "S0", partition="DPX"),
        _device(2, "P1", die=0),
        _device(3, "P1", die=1, up=False),
    )
    alert = AlertState(
        gpu=2,
        alert="GpuJunctionTemperatureHigh",
        severity="warning",
        firing=True,
        since=0.0,
        suggestion="lower the gfx clock <now>",
    )
    page = render_status_page(
        Snapshot(taken_at=1.0, devices=devices, cycle=7),
        (alert,),
        version="0.1.0",
        source="sysfs",
        refresh_seconds=2,
        host="node-1",
    )
    tiles = re.findall(r'<article class="([^"]*)" id="gpu-(\d)"', page)
    assert [gpu for _, gpu in tiles] == ["0", "1", "2", "3"]
    assert "AMD Instinct &lt;MI300X&gt; · socket S0 · DPX/NPS1 · 2 partitions" in page
    assert "AMD Instinct &lt;MI300X&gt; · package P1 · 2 dies" in page
    assert "0000:01:00.0 · partition 1" in page and "0000:03:00.0 · die 1" in page
    assert 'data-field="junction">61 °C' in page and 'data-field="power">412 / 750 W' in page
    assert 'data-field="power">on die 0' in page and 'data-field="vram">96.0 / 192 GiB' in page
    assert 'data-field="busy">50 %' in page and 'style="width:50.0%"' in page
    assert dict((gpu, classes) for classes, gpu in tiles) == {
        "0": "tile",
        "1": "tile",
        "2": "tile alerting",
        "3": "tile down",
    }
    assert "GpuJunctionTemperatureHigh (firing): lower the gfx clock &lt;now&gt;" in page
    assert "down: timeout" in page and "cycle 7" in page and 'data-refresh-ms="2000"' in page
    for link in ("metrics", "api/v1/devices", "api/v1/alerts", "healthz", "readyz"):
        assert f'<a href="{link}">' in page


def test_nothing_is_loaded_from_elsewhere() -> None:
    page = render_status_page(None, version="0.1.0", source="sysfs", host="h")
    assert "Waiting for the first poll cycle" in page
    # every src/href is relative or data:, no @import, no url() to a host, no protocol-relative //
    for attribute in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert not re.match(r"^(?:[a-z]+:)?//", attribute) and not attribute.startswith("/"), attribute
    assert "@import" not in page and "http://" not in page and "https://" not in page
    assert 'data-waveform-url=""' in page
    assert "%%" not in page  # every placeholder filled


def test_only_sampled_devices_ask_for_their_waveform() -> None:
    devices = (_device(0, "A"), _device(1, "B"))
    page = render_status_page(
        Snapshot(taken_at=1.0, devices=devices),
        version="0.1.0",
        source="sysfs",
        waveform_url="api/v1/waveform?gpu={gpu}&seconds=15",
        waveform_gpus={1},
        waveform_seconds=15,
        host="h",
    )
    assert 'data-waveform-url="api/v1/waveform?gpu={gpu}&amp;seconds=15"' in page
    assert 'id="gpu-0" data-gpu="0" data-pci' in page and 'id="gpu-1" data-gpu="1" data-waveform="1"' in page
    assert "sparklines show the last 15 s of fast samples" in page
