"""One collector concept (issue 30): each family is declared with its collector in the metric table;
--collector.NAME / --no-collector.NAME and the collectors/families lists decide what is read as well
as what is shown; the old read flags are deprecated spellings; each collector reports its success."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from exporter import config
from exporter.config import Settings
from exporter.exposition import selection
from exporter.exposition.metrics import METRICS, MetricSpec
from exporter.exposition.render import render
from exporter.exposition.selection import (
    COLLECTOR_NAMES,
    DEFAULTS,
    EVERYTHING,
    exposition_options,
    read_fields,
)
from exporter.model import Published, Snapshot
from exporter.simulator import Simulator
from exporter.sources.sysfs import SysfsSource
from exporter.sources.sysfs import files as sysfs_files
from exporter.sources.sysfs.table import OPTIONAL_FIELDS


def _settings(*argv: str, env: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, COLLECTOR_NAMES)
    return config.resolve(parser.parse_args(list(argv)), env or {})


def test_every_family_has_a_collector_named_in_the_table_only() -> None:
    assert all(spec.collector for spec in METRICS)
    assert set(COLLECTOR_NAMES) == {spec.collector for spec in METRICS}
    source = Path(selection.__file__).read_text()
    named = [spec.name for spec in METRICS if f'"{spec.name}"' in source]
    assert set(named) <= set(selection.DEFAULT_WINDOW_SERIES), "selection.py names a family beyond its window series"
    assert "process" not in COLLECTOR_NAMES  # one word, one collector: process_* are the exporter's own


def test_at_defaults_the_families_off_are_not_read() -> None:
    wanted = read_fields(DEFAULTS.families)
    skipped = OPTIONAL_FIELDS - wanted
    assert {"board_temperatures", "baseboard_temperatures", "clocks_min_hertz"} <= skipped
    assert {"media_engine_busy", "xcc_below_host_limit_seconds"} <= skipped
    assert {"node_power_watts", "xcc_busy", "temperature_thresholds"} <= wanted
    assert read_fields(EVERYTHING.families) >= OPTIONAL_FIELDS  # every optional field has a family


def test_a_collector_switched_off_is_neither_shown_nor_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings("--no-collector.board", "--no-collector.temperature")
    shown = exposition_options(settings).families
    assert not {name for name in shown if name.startswith(("amdgpu_node_", "amdgpu_baseboard_"))}
    assert "amdgpu_temperature_threshold_celsius" not in shown
    root = tmp_path / "sys"
    Simulator(root, "1xMI355X", "idle", seed=1).write_tree()
    opened: list[str] = []
    real_open = sysfs_files._open

    def counted(path: str) -> int | None:
        opened.append(path)
        return real_open(path)

    monkeypatch.setattr(sysfs_files, "_open", counted)
    source = SysfsSource(root, wanted=read_fields(shown))
    try:
        (device,) = source.discover()
        opened.clear()
        sample = source.read(device)
    finally:
        source.close()
    assert not [path for path in opened if "/board/" in path]  # node power, limits, sensors: none read
    assert sample.node_power_watts is None and not sample.temperature_thresholds
    assert sample.temperatures  # what the rules and the verdict read is read all the same


def test_a_collector_switched_on_shows_and_reads_its_families_off_by_default(tmp_path: Path) -> None:
    shown = exposition_options(_settings("--collector.board")).families
    assert {"amdgpu_board_temperature_celsius", "amdgpu_baseboard_temperature_celsius"} <= shown
    root = tmp_path / "sys"
    Simulator(root, "1xMI355X", "idle", seed=1).write_tree()
    source = SysfsSource(root, wanted=read_fields(shown))
    try:
        (device,) = source.discover()
        sample = source.read(device)
    finally:
        source.close()
    assert sample.board_temperatures and sample.baseboard_temperatures


def test_the_old_read_flags_are_deprecated_spellings() -> None:
    settings = _settings("--collector.board-temperatures")
    assert "amdgpu_board_temperature_celsius" in exposition_options(settings).families
    assert len(settings.warnings) == 1 and "deprecated" in settings.warnings[0]
    # --collector.xcc is the xcc collector's own flag now: no warning; as a variable it is deprecated
    flag = _settings("--collector.xcc")
    assert "amdgpu_media_engine_busy_ratio" in exposition_options(flag).families and not flag.warnings
    env = _settings(env={"AMDGPU_EXPORTER_COLLECTOR_XCC": "true"})
    assert "amdgpu_xcc_below_host_limit_seconds" in exposition_options(env).families and env.warnings


def test_the_processes_collector_is_one_switch_whichever_way_it_is_said(tmp_path: Path) -> None:
    assert not _settings().collector_processes
    by_flag = _settings("--collector.processes")
    assert by_flag.collector_processes and "amdgpu_process_memory_bytes" in exposition_options(by_flag).families
    config_file = tmp_path / "c.yaml"
    config_file.write_text("collectors:\n  include: [processes]\n")
    assert _settings(f"--config.file={config_file}").collector_processes
    assert not _settings("--collector.processes", "--no-collector.processes").collector_processes


def test_a_family_that_fails_is_left_out_and_its_collector_reports_it() -> None:
    def broken(_published: Published) -> list[tuple[tuple[str, ...], float]]:
        raise RuntimeError("a bug in a getter")

    with pytest.MonkeyPatch.context() as patch:
        specs = tuple(
            replace(spec, values=broken) if spec.name == "amdgpu_exporter_discoveries" else spec for spec in METRICS
        )
        patch.setattr("exporter.exposition.render.METRICS", specs)
        text = render(Published(Snapshot(taken_at=1.0)), EVERYTHING).text.decode()
    assert 'amdgpu_exporter_collector_success{collector="exporter"} 0.0' in text
    assert 'amdgpu_exporter_collector_success{collector="device"} 1.0' in text
    assert "amdgpu_exporter_discoveries" not in text and "amdgpu_exporter_build_info" in text
    assert 'amdgpu_exporter_collector_duration_seconds{collector="exporter"}' in text


def test_the_outcome_families_are_declared_in_the_table() -> None:
    outcome: list[MetricSpec] = [spec for spec in METRICS if spec.outcome is not None]
    assert [spec.name for spec in outcome] == [
        "amdgpu_exporter_collector_success",
        "amdgpu_exporter_collector_duration_seconds",
    ]
    assert METRICS[-2:] == tuple(outcome)  # last: made from rendering every family above


def test_a_sighup_tells_the_source_what_the_families_now_shown_are_made_of(tmp_path: Path) -> None:
    from collections import Counter

    from exporter.cycle import Pipeline
    from exporter.daemon import Reloader

    config_file = tmp_path / "config.yaml"
    config_file.write_text("collectors:\n  exclude: [board]\n")
    settings = _settings(f"--config.file={config_file}", "--demo")
    source = SysfsSource(tmp_path, wanted=read_fields(exposition_options(settings).families))
    assert {"node_power_watts", "board_temperatures"} <= source.skip
    counts: Counter[tuple[str, str]] = Counter()
    pipeline = Pipeline(source_name="sysfs", source_reason="test", rules=(), reloads=lambda: counts)
    config_file.write_text("collectors:\n  include: [board]\n")
    Reloader(settings, pipeline, counts, source).reload()
    assert counts["config", "success"] == 1
    assert not {"node_power_watts", "board_temperatures", "baseboard_temperatures"} & source.skip
    source.close()
