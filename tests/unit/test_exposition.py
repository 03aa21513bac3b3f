"""Exposition: one table in, valid Prometheus text and OpenMetrics out, absent means absent."""

from __future__ import annotations

import dataclasses
import gzip

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.exposition.metrics import DEVICE_METRICS, METRICS, all_metric_names
from exporter.exposition.render import render
from exporter.exposition.selection import EVERYTHING
from exporter.model import (
    AlertState,
    DeviceIdentity,
    DeviceState,
    Published,
    Sample,
    Snapshot,
    TopologyLink,
    frozen_map,
)


def _identity(bdf: str, card: str, die: int = 0) -> DeviceIdentity:
    return DeviceIdentity(
        pci_bus_id=bdf,
        card=card,
        device_dir=f"/sys/devices/pci0000:00/{bdf}",
        unique_id="0123456789abcdef",
        product="AMD Instinct MI250X",
        asic="aldebaran",
        serial="PKG1",
        package="PKG1",
        die=die,
        firmware=frozen_map({"smc": "0x00563c00"}),
        topology=(TopologyLink("0000:c2:00.0", "xgmi", 1, 15), TopologyLink("", "pcie", 1, 20)),
    )


def _snapshot() -> Published:
    die0 = Sample(
        timestamp=1000.0,
        temperatures=frozen_map({"junction": 71.0, "hbm0": 60.0}),
        temperature_thresholds=frozen_map({("junction", "critical"): 110.0}),
        power_watts=380.0,
        energy_joules=12345.5,
        busy=frozen_map({"gfx": 0.97}),
        memory_used_bytes=frozen_map({"vram": 2.0**34}),
        ecc_errors=frozen_map({("umc", "correctable"): 3}),
        pcie_naks_sent=4,
    )
    die1 = Sample(timestamp=1000.0, temperatures=frozen_map({"junction": 65.0}), busy=frozen_map({"gfx": 0.5}))
    snapshot = Snapshot(
        taken_at=1001.0,
        devices=(
            DeviceState(_identity("0000:c1:00.0", "card0"), 0, die0, True),
            DeviceState(_identity("0000:c2:00.0", "card1", die=1), 1, die1, True),
            DeviceState(_identity("0000:d1:00.0", "card2"), 2, die1, False, "timeout", read_timeouts=2),
        ),
    )
    return Published(
        snapshot,
        alerts=(AlertState(0, "GpuJunctionHot", "warning", True, 999.0, 86.0, None, 0.1, 1.53e9, "lower"),),
    )


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in parse_text(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_values_labels_and_absence() -> None:
    rendered = render(_snapshot(), EVERYTHING)
    samples = _samples(rendered.text.decode())
    assert samples[("amdgpu_temperature_celsius", (("gpu", "0"), ("sensor", "junction")))] == 71.0
    assert samples[("amdgpu_temperature_celsius", (("gpu", "0"), ("sensor", "hbm0")))] == 60.0
    assert samples[("amdgpu_energy_joules_total", (("gpu", "0"),))] == 12345.5
    assert samples[("amdgpu_ecc_errors_total", (("block", "umc"), ("gpu", "0"), ("type", "correctable")))] == 3
    assert samples[("amdgpu_pcie_naks_total", (("direction", "sent"), ("gpu", "0")))] == 4
    # die 1 supplies no power: no series at all, not a zero
    assert ("amdgpu_power_watts", (("gpu", "1"),)) not in samples
    assert samples[("amdgpu_power_watts", (("gpu", "0"),))] == 380.0
    # the down device: up 0, identity and sample age kept, no stale values served as current
    assert samples[("amdgpu_up", (("gpu", "2"),))] == 0
    assert samples[("amdgpu_sample_timestamp_seconds", (("gpu", "2"),))] == 1000.0
    assert not any(name == "amdgpu_busy_ratio" and ("gpu", "2") in labels for name, labels in samples)
    assert samples[("amdgpu_exporter_read_timeouts_total", (("gpu", "2"),))] == 2
    # why it is down: one series with its reason while down, none for the devices that are up
    assert samples[("amdgpu_device_down_info", (("gpu", "2"), ("reason", "timeout")))] == 1
    assert [labels for name, labels in samples if name == "amdgpu_device_down_info"] == [
        (("gpu", "2"), ("reason", "timeout"))
    ]
    # topology resolves peers to gpu indexes
    key = (
        "amdgpu_topology_link_info",
        (("gpu", "0"), ("hops", "1"), ("peer", "1"), ("type", "xgmi"), ("weight", "15")),
    )
    assert samples[key] == 1
    assert samples[("amdgpu_alert_firing", (("alert", "GpuJunctionHot"), ("gpu", "0"), ("severity", "warning")))] == 1
    assert samples[("amdgpu_clock_down_suggested_ratio", (("gpu", "0"),))] == 0.1
    assert samples[("amdgpu_clock_down_suggested_ratio", (("gpu", "1"),))] == 0.0
    assert samples[("amdgpu_suggested_gfx_clock_max_hertz", (("gpu", "0"),))] == 1.53e9
    info = next(labels for name, labels in samples if name == "amdgpu_device_info" and ("gpu", "1") in labels)
    assert ("die", "1") in info and ("package", "PKG1") in info and ("pci_bus_id", "0000:c2:00.0") in info


def test_openmetrics_and_gzip_forms_carry_the_same_samples() -> None:
    rendered = render(_snapshot())
    assert gzip.decompress(rendered.body(openmetrics=False, gzipped=True)) == rendered.text
    assert gzip.decompress(rendered.body(openmetrics=True, gzipped=True)) == rendered.openmetrics
    assert rendered.openmetrics.endswith(b"# EOF\n")
    om_families = list(parse_openmetrics(rendered.openmetrics.decode()))
    text_families = list(parse_text(rendered.text.decode()))

    def samples(families: list) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in families for s in f.samples}

    om_samples, text_samples = samples(om_families), samples(text_families)
    assert ("amdgpu_energy_joules_total", (("gpu", "0"),), 12345.5) in om_samples
    # Every series, with its labels and value, in both forms, and no _created series in either.
    assert text_samples == om_samples
    assert not any(s[0].endswith("_created") for s in om_samples)
    assert {f.name: f.type for f in text_families} == {f.name: f.type for f in om_families}


def test_every_table_entry_follows_the_naming_conventions() -> None:
    names = all_metric_names()
    assert len(names) == len(set(names))
    unit_suffixes = (
        "_celsius",
        "_watts",
        "_joules",
        "_bytes",
        "_hertz",
        "_volts",
        "_ratio",
        "_seconds",
        "_per_second",
        "_width",
        "_active",
        "_up",
        "_total",
        "_info",
        "_pages",
        "_records",  # a count of error records held by the driver, unitless like _pages
        "_firing",  # a 0/1 state, unitless like _up and _active
        "_present",  # a 0/1 state: amdgpu_device_present
        "_fds",  # process_open_fds / process_max_fds, the process collector's conventional names
        "_connections",  # a count of open HTTP connections, unitless like _fds
        "_successful",  # a 0/1 state, as Prometheus' own prometheus_config_last_reload_successful
        "_success",  # a 0/1 state, as node_exporter's node_scrape_collector_success
        "_status",  # the 0/1 health verdict, amdgpu_health_status (1 = fit), as DCGM's _HEALTH_STATUS
        "_check",  # 1 per failing health check, amdgpu_health_check{check, severity}
    )
    # Every family of the one table: the per-device ones and the exporter's own (identity, alerts, self-metrics).
    assert len(METRICS) > len(DEVICE_METRICS) > 20
    for spec in METRICS:
        name = spec.exposed_name
        # amdgpu_, or process_ for the process collector's conventional names
        assert spec.name.startswith(("amdgpu_", "process_")), name
        assert not spec.name.endswith("_total"), "counters get _total from prometheus-client"
        assert spec.kind in ("gauge", "counter", "histogram"), name
        assert name.endswith(unit_suffixes), name
        assert name.endswith("_total") == (spec.kind == "counter"), f"{name}: _total exactly on counters"
        assert not name.endswith("_info") or spec.kind == "gauge", f"{name}: an _info metric is a gauge"
        assert spec.kind != "histogram" or name.endswith("_seconds"), f"{name}: a histogram of durations in seconds"
        assert all(label.isidentifier() for label in spec.labels), name
        assert spec.help.strip().endswith("."), name
    # The documented unit is the one the name ends in; counts, widths and states have none.
    units = {spec.name: spec.unit for spec in METRICS}
    assert units["amdgpu_pcie_bandwidth_bytes_per_second"] == "bytes_per_second"
    assert units["amdgpu_pcie_current_link_transfers_per_second"] == "transfers_per_second"
    assert (units["amdgpu_energy_joules"], units["amdgpu_exporter_poll_duration_seconds"]) == ("joules", "seconds")
    assert units["amdgpu_pcie_current_link_width"] == units["amdgpu_exporter_read_errors"] == ""


def test_a_device_with_an_empty_sample_renders_without_error() -> None:
    state = DeviceState(_identity("0000:01:00.0", "card0"), 0, Sample(timestamp=5.0), True)
    text = render(Published(Snapshot(taken_at=6.0, devices=(state,)))).text.decode()
    assert 'amdgpu_up{gpu="0"} 1.0' in text
    assert "amdgpu_temperature_celsius{" not in text


def test_bytes_are_rendered_once_per_format_and_only_when_asked() -> None:
    rendered = render(_snapshot())
    assert rendered.cached(True, True) is None, "nothing is rendered before a scrape asks"
    first = rendered.body(openmetrics=True, gzipped=True)
    assert rendered.cached(True, True) is first
    assert rendered.body(True, True) is first, "a second scrape of the same snapshot reuses the bytes"
    assert rendered.cached(False, False) is None, "the text format was never asked for"


def test_a_published_snapshot_renders_its_own_values_later() -> None:
    old = render(_snapshot())
    newer = Published(Snapshot(taken_at=2000.0, devices=_snapshot().snapshot.devices[:1]))
    new = render(newer)
    # rendering order must not matter: each keeps the snapshot it was made from
    assert b'amdgpu_up{gpu="2"}' not in new.text
    assert b'amdgpu_up{gpu="2"} 0.0' in old.text


def test_window_families_pcie_link_max_and_fast_counters() -> None:
    from exporter.model import SAMPLER_CYCLE_BUCKETS, DeviceWindow, Histogram, SamplerStats, WindowSnapshot, WindowStat

    published = _snapshot()
    durations = Histogram(SAMPLER_CYCLE_BUCKETS, (0,) * (len(SAMPLER_CYCLE_BUCKETS) + 1)).observe(0.0004).observe(0.03)
    windows = WindowSnapshot(
        monotonic_at=1001.0,
        window_seconds=15.0,
        interval_seconds=0.1,
        devices=(
            DeviceWindow(
                0,
                150,
                frozen_map(
                    {
                        ("temperature", "junction"): WindowStat(62.0, 91.0, 70.5),
                        ("power", "socket"): WindowStat(300.0, 560.0, 421.25, exact_mean=True),
                        ("busy", "gfx"): WindowStat(0.18, 0.99, 0.6),
                        ("clock", "gfx"): WindowStat(1.5e9, 1.7e9, 1.65e9),
                    }
                ),
            ),
        ),
        stats=SamplerStats(
            samples=frozen_map({0: 1234, 1: 1200}),
            read_errors=frozen_map({(1, "timeout"): 1}),
            cycle_durations=durations,
        ),
    )
    # the link's bandwidth is computed when the snapshot is made (pipeline/pcie.py); render only reads it
    with_link = dataclasses.replace(published.snapshot.devices[0], pcie_link_max_bytes_per_second=31.5077e9)
    snapshot = dataclasses.replace(published.snapshot, windows=windows, devices=(with_link,))
    values = _samples(render(dataclasses.replace(published, snapshot=snapshot), EVERYTHING).text.decode())
    assert values[("amdgpu_temperature_window_celsius", (("gpu", "0"), ("sensor", "junction"), ("stat", "max")))] == 91
    assert values[("amdgpu_power_window_watts", (("gpu", "0"), ("stat", "mean")))] == 421.25
    assert values[("amdgpu_busy_window_ratio", (("engine", "gfx"), ("gpu", "0"), ("stat", "min")))] == 0.18
    assert values[("amdgpu_clock_window_hertz", (("domain", "gfx"), ("gpu", "0"), ("stat", "mean")))] == 1.65e9
    assert values[("amdgpu_exporter_window_seconds", ())] == 15.0
    assert values[("amdgpu_exporter_fast_samples_total", (("gpu", "1"),))] == 1200
    assert values[("amdgpu_exporter_fast_read_errors_total", (("gpu", "1"), ("reason", "timeout")))] == 1
    assert values[("amdgpu_exporter_fast_cycle_duration_seconds_count", ())] == 2
    assert values[("amdgpu_exporter_fast_cycle_duration_seconds_bucket", (("le", "0.0005"),))] == 1
    assert values[("amdgpu_pcie_link_max_bytes_per_second", (("gpu", "0"),))] == pytest.approx(31.5077e9, rel=1e-5)
    # Without the fast sampler: no window series at all, never zeros.
    plain = _samples(render(published, EVERYTHING).text.decode())
    assert not [k for k in plain if "_window_" in k[0] or k[0].startswith("amdgpu_exporter_fast_samples")]


def test_no_family_uses_a_label_prometheus_sets_on_every_target() -> None:
    """An exporter's `instance` or `job` label would be renamed exported_* by Prometheus and lost."""
    from exporter.exposition.metrics import METRICS

    assert not [(spec.name, label) for spec in METRICS for label in spec.labels if label in ("instance", "job")]
