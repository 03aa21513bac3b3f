"""The status page as the server renders it (before any script runs): a tile per device with its
values, package and partition, alerts, links; nothing loaded from anywhere else."""

from __future__ import annotations

import dataclasses
import json
import re

from exporter.alerting.rulefile import default_rule_file, parse_rule_file
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
        node="node-1",
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
    page = render_status_page(None, version="0.1.0", source="sysfs", node="h")
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
        node="h",
    )
    assert 'data-waveform-url="api/v1/waveform?gpu={gpu}&amp;seconds=15"' in page
    assert 'id="gpu-0" data-gpu="0" data-asic' in page and 'id="gpu-1" data-gpu="1" data-waveform="1"' in page
    assert "sparklines show the last 15 s of fast samples" in page


# A site's tuned rules: a junction warning and a critical, an MI300X override, a power rule.
TUNED_RULES = parse_rule_file("""
rules:
  - {alert: JunctionWarm, metric: temperature_celsius, sensor: junction, comparison: ">", threshold: 85,
     clear_threshold: 80, for: 60s, severity: warning,
     asic_overrides: {aqua_vanjaram: {threshold: 90, clear_threshold: 88}}}
  - {alert: JunctionHot, metric: temperature_celsius, sensor: junction, comparison: ">=", threshold: 95,
     for: 10s, severity: critical}
  - {alert: PowerHigh, metric: power_watts, comparison: ">", threshold: 700, for: 60s, severity: info}
""").rules


def _hot(gpu: int, junction: float, power: float = 412.0, asic: str = "aldebaran") -> DeviceState:
    device = _device(gpu, f"P{gpu}")
    assert device.sample is not None
    sample = dataclasses.replace(
        device.sample, temperatures=frozen_map({"junction": junction, "edge": 50.0, "memory": 86.0}), power_watts=power
    )
    return dataclasses.replace(device, sample=sample, identity=dataclasses.replace(device.identity, asic=asic))


def _field(page: str, gpu: int, field: str) -> str:
    """The class of one value of one tile, "" for none."""
    tile = page.split(f'id="gpu-{gpu}"')[1].split("</article>")[0]
    found = re.search(rf'<span data-field="{field}"(?: class="([^"]*)")?>', tile)
    assert found is not None, (gpu, field)
    return found.group(1) or ""


def test_values_are_coloured_by_the_loaded_rules() -> None:
    devices = (
        _hot(0, 74.0),
        _hot(1, 91.0, power=720.0),
        _hot(2, 82.0),
        _hot(3, 95.0),
        _hot(4, 89.0, asic="aqua_vanjaram"),  # under its ASIC's own threshold, in its clear band
    )
    page = render_status_page(Snapshot(taken_at=1.0, devices=devices), version="0", source="sysfs", rules=TUNED_RULES)
    assert [_field(page, gpu, "junction") for gpu in range(5)] == [
        "",
        "lvl-warning",
        "lvl-near",
        "lvl-critical",
        "lvl-near",
    ]
    assert [_field(page, gpu, "power") for gpu in range(2)] == ["", "lvl-info"]
    # no rule watches the memory temperature or gfx busy here: never coloured
    assert _field(page, 1, "memory") == "" and _field(page, 1, "busy") == ""
    # the script gets the same limits, per ASIC, to colour the values it refreshes
    rules = json.loads(page.split('<script type="application/json" id="rules">')[1].split("</script>")[0])
    assert rules["limits"]["aqua_vanjaram"]["junction"] == [[">", 90, 88, "warning"], [">=", 95, 95, "critical"]]
    assert rules["limits"]["aldebaran"]["power"] == [[">", 700, 700, "info"]] and rules["units"]["PowerHigh"] == " W"
    # without rules (an empty rule file) nothing is coloured
    plain = render_status_page(Snapshot(taken_at=1.0, devices=devices), version="0", source="sysfs")
    assert "lvl-" not in plain.split("</style>")[1].split("<script")[0]


def test_the_shipped_rules_colour_a_hot_junction() -> None:
    devices = (_hot(0, 74.0), _hot(1, 91.0))
    page = render_status_page(
        Snapshot(taken_at=1.0, devices=devices), version="0", source="sysfs", rules=default_rule_file().rules
    )
    assert (_field(page, 0, "junction"), _field(page, 1, "junction")) == ("", "lvl-warning")


def test_node_name_and_a_banner_of_active_alerts() -> None:
    devices = tuple(_hot(gpu, 91.0 if gpu < 11 else 60.0) for gpu in range(12))
    firing = tuple(AlertState(gpu, "JunctionWarm", "warning", True, 0.0, 91.0) for gpu in range(10))
    hot = AlertState(10, "JunctionHot", "critical", True, 0.0, 97.5, suggestion="lower <it>")
    pending = AlertState(11, "PowerHigh", "info", False, 0.0, 720.0, pending_since=1.0)
    gone = AlertState(11, "JunctionWarm", "warning", False, 0.0, 70.0)
    page = render_status_page(
        Snapshot(taken_at=1.0, devices=devices),
        (*firing, hot, pending, gone),
        version="0",
        source="sysfs",
        node="gpu-node-7",
        rules=TUNED_RULES,
    )
    assert '<h1 id="node">gpu-node-7</h1>' in page and "<title>gpu-node-7 · amdgpu-exporter</title>" in page
    banner = page.split('<section id="banner"')[1].split("</section>")[0]
    assert banner.startswith(' class="banner critical" role="alert"><ul>')  # shown, as its worst firing alert
    items = re.findall(r'<li class="([^"]*)">([^<]*)</li>', banner)
    assert items == [
        ("firing critical", "JunctionHot firing on GPU 10 (97.5 °C): lower &lt;it&gt;"),
        (
            "firing warning",
            "JunctionWarm firing on GPU 0 (91 °C), GPU 1 (91 °C), GPU 2 (91 °C), GPU 3 (91 °C), GPU 4 (91 °C),"
            " GPU 5 (91 °C), GPU 6 (91 °C), GPU 7 (91 °C) and 2 more",
        ),
        ("pending info", "PowerHigh pending on GPU 11 (720 W)"),
    ]
    assert 'main id="devices" class=""' in page  # 12 devices: ordinary tiles
    quiet = render_status_page(Snapshot(taken_at=1.0, devices=devices[:1]), version="0", source="sysfs", node="n")
    assert '<section id="banner" class="banner" role="alert" hidden><ul></ul></section>' in quiet


def test_many_devices_go_dense() -> None:
    devices = tuple(_device(gpu, f"S{gpu // 8}", partition="CPX") for gpu in range(64))
    page = render_status_page(Snapshot(taken_at=1.0, devices=devices), version="0", source="sysfs", node="n")
    assert 'main id="devices" class="dense"' in page and page.count('<article class="tile') == 64
