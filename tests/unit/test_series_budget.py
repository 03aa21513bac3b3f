"""The series budget (docs/design.md): every demo fleet's /metrics, rendered through the real pipeline,
stays within BUDGET series per device at defaults; a new job adds a handful of series, not a copy of
each GPU's; and the selection of collectors and families from the config file does what it says."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from exporter import config
from exporter.config import ConfigError
from exporter.configcheck import check_config, exposition_of, reload_settings
from exporter.exposition.metrics import METRICS
from exporter.exposition.selection import (
    COLLECTOR_NAMES,
    DEFAULT_WINDOW_SERIES,
    DEFAULTS,
    EVERYTHING,
    OFF_BY_DEFAULT,
    Selection,
    collector_of,
)
from tests.series_budget import (
    ATTRIBUTION_FAMILIES,
    BUDGET,
    JOB_LABELS,
    POD_LABELS,
    WITHOUT_ATTRIBUTION,
    count,
    demo_fleets,
    new_series_for_a_new_job,
    published_node,
    series,
)

NAMES = {spec.name for spec in METRICS}


def test_every_family_is_in_a_collector_and_the_default_lists_name_real_families() -> None:
    assert not [spec.name for spec in METRICS if not collector_of(spec.name)]
    assert set(COLLECTOR_NAMES) == {collector_of(spec.name) for spec in METRICS}, "a collector without families"
    assert OFF_BY_DEFAULT <= NAMES and set(DEFAULT_WINDOW_SERIES) <= NAMES


def test_the_demo_fleets_cover_every_model_and_partition_mode() -> None:
    fleets = demo_fleets()
    assert {"8xMI210", "4xMI250X", "8xMI300X", "8xMI300X:CPX", "8xMI355X:CPX", "8xMI325X"} <= set(fleets)


@pytest.mark.parametrize("fleet", demo_fleets())
def test_every_demo_fleet_stays_within_the_budget_and_a_new_job_adds_only_its_info_series(fleet: str) -> None:
    published = published_node(fleet)
    for options in (WITHOUT_ATTRIBUTION, DEFAULTS):
        counted = count(published, options)
        assert counted.per_device <= BUDGET, f"{fleet}: {counted.per_device:.1f} series per device"
        assert counted.worst_device <= BUDGET, f"{fleet}: a device has {counted.worst_device} series"
    # Who holds a GPU is said by amdgpu_allocation_info and amdgpu_job_info only.
    holder_labels = set(POD_LABELS) | set(JOB_LABELS)
    labelled = {name for name, labels in series(published) if holder_labels & labels.keys()}
    assert labelled <= set(ATTRIBUTION_FAMILIES) and {"amdgpu_allocation_info", "amdgpu_job_info"} <= labelled
    assert new_series_for_a_new_job(published) == 1  # the new job's amdgpu_job_info
    # As an option, the labels go on every per-GPU series again: a new job then copies them all.
    on_every_series = replace(DEFAULTS, attribution_labels=True)
    assert new_series_for_a_new_job(published, on_every_series) > 10


def test_defaults_render_the_window_series_the_dashboards_read_and_all_of_them_on_request() -> None:
    published = published_node("1xMI300X")
    windows = Counter(
        (name, labels.get("sensor") or labels.get("engine") or labels.get("domain") or "", labels["stat"])
        for name, labels in series(published)
        if "stat" in labels
    )
    assert set(windows) == {
        ("amdgpu_temperature_window_celsius", "junction", "min"),
        ("amdgpu_temperature_window_celsius", "junction", "max"),
        ("amdgpu_power_window_watts", "", "min"),
        ("amdgpu_power_window_watts", "", "max"),
        ("amdgpu_power_window_watts", "", "mean"),
        ("amdgpu_busy_window_ratio", "gfx", "min"),
        ("amdgpu_busy_window_ratio", "gfx", "max"),
        ("amdgpu_busy_window_ratio", "gfx", "mean"),
        ("amdgpu_clock_window_hertz", "gfx", "min"),
        ("amdgpu_clock_window_hertz", "gfx", "max"),
    }
    every = {(n, labels.get("sensor"), labels.get("stat")) for n, labels in series(published, EVERYTHING)}
    assert ("amdgpu_temperature_window_celsius", "junction", "mean") in every
    assert len({key for key in every if key[0] == "amdgpu_temperature_window_celsius"}) > 3
    names = {name for name, _labels in series(published)}
    assert not names & {"amdgpu_firmware_info", "amdgpu_topology_link_info", "amdgpu_clock_max_hertz"}


def test_firmware_is_said_once_per_package_not_on_every_die_or_partition() -> None:
    published = published_node("2xMI250X,1xMI300X:CPX")
    firmware = [labels for name, labels in series(published, EVERYTHING) if name == "amdgpu_firmware_info"]
    devices = published.snapshot.devices
    package = {str(d.gpu): d.identity.package for d in devices}
    by_package = Counter(package[labels["gpu"]] for labels in firmware)
    blocks = {d.identity.package: len(d.identity.firmware) for d in devices}
    assert by_package == blocks  # one series per block per package (the dies' and partitions' versions agree)
    first_of_package = {d.identity.package: str(d.gpu) for d in reversed(devices)}
    assert {labels["gpu"] for labels in firmware} == set(first_of_package.values())


def test_selection_family_lists_beat_collector_lists_and_exclude_beats_include() -> None:
    everything = Selection(collectors_include=("*",)).families()
    assert everything == NAMES
    assert "amdgpu_firmware_info" in Selection(collectors_include=("firmware",)).families()
    xgmi_traffic = Selection(families_include=("amdgpu_xgmi_*_bytes_total",)).families()
    assert {"amdgpu_xgmi_read_bytes", "amdgpu_xgmi_write_bytes"} <= xgmi_traffic
    without_pcie = Selection(collectors_exclude=("pcie",), families_include=("amdgpu_pcie_replays",)).families()
    assert {n for n in without_pcie if n.startswith("amdgpu_pcie_")} == {"amdgpu_pcie_replays"}
    only = Selection(collectors_exclude=("*",), families_include=("amdgpu_up", "amdgpu_power_watts")).families()
    assert only == {"amdgpu_up", "amdgpu_power_watts"}
    assert "amdgpu_up" not in Selection(families_include=("amdgpu_up",), families_exclude=("amdgpu_u*",)).families()


def _settings(config_file: Path, *argv: str) -> config.Settings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.resolve(parser.parse_args([f"--config.file={config_file}", "--demo", *argv]), {})


def test_the_config_file_selects_collectors_and_families_and_a_reload_changes_them(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        "collectors:\n  include: [topology]\n  exclude: [pcie]\nfamilies:\n  exclude: ['amdgpu_voltage_*']\n"
    )
    settings = _settings(config_file)
    assert (settings.collectors_include, settings.collectors_exclude) == (("topology",), ("pcie",))
    chosen = exposition_of(settings).families
    assert "amdgpu_topology_link_info" in chosen and "amdgpu_voltage_volts" not in chosen
    assert not {n for n in chosen if n.startswith("amdgpu_pcie_")}
    config_file.write_text("families.include: [amdgpu_firmware_info]\nwindow.all-series: true\n")
    reloaded = exposition_of(reload_settings(settings))
    assert "amdgpu_firmware_info" in reloaded.families and "amdgpu_pcie_replays" in reloaded.families
    assert reloaded.all_window_series and "amdgpu_topology_link_info" not in reloaded.families


def test_check_config_rejects_a_name_that_matches_nothing_with_the_nearest(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    for text, message in [
        ("collectors:\n  exclude: [xgml]\n", "collectors.exclude: 'xgml' matches no collector; did you mean xgmi?"),
        ("families:\n  include: [amdgpu_firmware_infos]\n", "did you mean amdgpu_firmware_info?"),
        ("families:\n  include: [amdgpu_nothing_*]\n", "families.include: 'amdgpu_nothing_*' matches no family"),
        ("families:\n  includes: [amdgpu_up]\n", "unknown option 'families.includes'"),
    ]:
        config_file.write_text(text)
        with pytest.raises(ConfigError) as error:
            check_config(str(config_file), dict(os.environ))
        assert message in str(error.value), str(error.value)
    config_file.write_text("families:\n  include: ['amdgpu_xgmi_*_bytes_total']\n")
    rendered = len(METRICS) - len(OFF_BY_DEFAULT) + 2  # the two xgmi traffic families on
    assert check_config(str(config_file), {}) == (
        f"{config_file}: OK, 1 option(s); {rendered} of {len(METRICS)} metric families rendered"
    )
