"""Daemon wiring: source selection, the listener, and the Pipeline between poller and web."""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest

from exporter import config
from exporter.alerting.rulefile import default_rule_file
from exporter.cycle import Pipeline
from exporter.daemon import alertmanager_pusher, discover_at_start, open_listener
from exporter.model import AlertmanagerStats, AlertState, Published, Snapshot, SourceStats
from exporter.pipeline.poller import Poller
from exporter.sources.base import StartupError
from exporter.sources.select import select_source
from exporter.sources.sysfs import SysfsSource
from tests.unit.test_rules import device


def settings(*flags: str) -> config.Settings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.resolve(parser.parse_args(list(flags)), environ={})


def test_sysfs_is_chosen_with_a_reason(tmp_path: Path) -> None:
    source, name, why = select_source(settings("--source=sysfs").source_choice(), str(tmp_path))
    assert isinstance(source, SysfsSource) and source.root == str(tmp_path)
    assert (name, why) == ("sysfs", "flag")
    source, name, why = select_source(settings("--source=auto", "--slow-interval=3s").source_choice(), str(tmp_path))
    assert isinstance(source, SysfsSource) and source.slow_interval == 3.0
    details: dict[str, str] = {}
    source, name, why = select_source(settings("--source=auto").source_choice(), str(tmp_path), details)
    # a stable code for /metrics and /, the sentence for the log only
    assert (name, why) == ("sysfs", "auto_sysfs_root_not_sys") and "/sys" in details["detail"]


def test_rocm_smi_asked_for_where_it_cannot_work_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"^--source=rocm-smi was asked for but .*: librocm_smi64 reads /sys only"):
        select_source(settings("--source=rocm-smi").source_choice(), str(tmp_path))


def test_a_taken_port_is_a_startup_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            open_listener("127.0.0.1", port)
    listener = open_listener("127.0.0.1", 0)
    try:
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        listener.close()


class RecordingPusher:
    """Stands where the Alertmanager pusher goes: records what each cycle hands it."""

    def __init__(self) -> None:
        self.updates: list[tuple[Snapshot, tuple[AlertState, ...]]] = []

    def update(self, snapshot: Snapshot, alerts: Sequence[AlertState]) -> None:
        self.updates.append((snapshot, tuple(alerts)))

    @property
    def stats(self) -> AlertmanagerStats:
        return AlertmanagerStats(sent=len(self.updates), failed=1)


def test_each_cycle_publishes_one_immutable_result_and_hands_alerts_on() -> None:
    pusher = RecordingPusher()
    pipeline = Pipeline(
        source_name="rocm-smi", source_reason="auto: ok", rules=default_rule_file().rules, pusher=pusher
    )
    assert pipeline.state.published is None and pipeline.state.metrics is None
    hot = Snapshot(
        taken_at=100.0,
        monotonic_at=100.0,
        devices=(device(0, junction=99.0),),
        poll_duration_seconds=0.003,
        source_stats=SourceStats(worker_restarts=2),
    )
    pipeline.on_snapshot(hot)
    first = pipeline.state
    assert first.published is not None
    (alert,) = first.published.alerts
    assert alert.alert == "GpuJunctionTemperatureHigh" and alert.pending_since == 100.0
    assert pusher.updates == [(first.published.snapshot, first.published.alerts)]
    stats = first.published.stats
    assert (stats.source, stats.source_reason) == ("rocm-smi", "auto: ok")
    assert stats.alertmanager == AlertmanagerStats(sent=1, failed=1)
    assert stats.poll_durations.count == 1 and stats.poll_durations.total == 0.003
    text = first.metrics.text.decode()
    assert "amdgpu_exporter_worker_restarts_total 2.0" in text
    assert 'amdgpu_exporter_alertmanager_notifications_total{result="sent"} 1.0' in text
    assert 'amdgpu_exporter_poll_duration_seconds_bucket{le="0.005"} 1.0' in text
    pipeline.on_snapshot(
        Snapshot(taken_at=200.0, monotonic_at=200.0, devices=(device(0, junction=99.0),), poll_duration_seconds=0.2)
    )
    second = pipeline.state
    assert second is not first and second.published is not first.published
    assert second.published.alerts[0].firing, "the rule's for (60 s) has passed between the cycles"
    # The first cycle's result is untouched by the second.
    assert first.published.stats.poll_durations.count == 1 and not first.published.alerts[0].firing
    assert "amdgpu_exporter_poll_duration_seconds_count 1.0" in first.metrics.text.decode()
    assert "amdgpu_exporter_poll_duration_seconds_count 2.0" in second.metrics.text.decode()
    assert isinstance(second.published, Published)


def test_start_up_discovery_with_no_gpu_says_how_to_try_the_demo(tmp_path: Path) -> None:
    poller = Poller(SysfsSource(tmp_path), source_name="sysfs")
    with pytest.raises(StartupError, match=f"no AMD GPU found: no card under {tmp_path}/class/drm .* --demo$"):
        asyncio.run(discover_at_start(poller, str(tmp_path), read_timeout=1.0))
    poller.close()


def test_the_pusher_exists_only_with_an_alertmanager_url_and_checks_it() -> None:
    assert alertmanager_pusher(settings(), 9442, default_rule_file().rules) is None
    pusher = alertmanager_pusher(settings("--alertmanager.url=http://am:9093"), 9442, default_rule_file().rules)
    assert pusher is not None and pusher.endpoints == ("http://am:9093/api/v2/alerts",)
    # A bad URL is refused when the settings are resolved, before discovery, once.
    with pytest.raises(config.ConfigError, match=r"^--alertmanager\.url: 'am:9093' is not an http:// or https:// URL"):
        settings("--alertmanager.url=am:9093")


def test_the_fast_sampler_follows_its_flags_and_the_pipeline_joins_its_windows(tmp_path: Path) -> None:
    from exporter.daemon import sampler_of
    from tests.unit.test_sampler import make_devices

    assert sampler_of(settings("--fast.interval=0")) is None
    fast = sampler_of(settings("--fast.interval=50ms", "--window=2s"))
    assert fast is not None and (fast.interval, fast.window) == (0.05, 2.0)
    (gpu, identity), *_ = make_devices(tmp_path, 1)
    pipeline = Pipeline(source_name="sysfs", source_reason="test", rules=default_rule_file().rules, sampler=fast)
    state = device()
    state = type(state)(identity=identity, gpu=gpu, sample=state.sample, up=True)
    pipeline.on_snapshot(Snapshot(taken_at=1000.0, devices=(state,)))  # the sampler learns the device
    fast.sample_once()
    pipeline.on_snapshot(Snapshot(taken_at=1001.0, monotonic_at=fast._clock(), devices=(state,)))
    published = pipeline.state.published
    assert published is not None and published.snapshot.windows is not None
    (window,) = published.snapshot.windows.devices
    assert window.gpu == gpu and window.stats[("temperature", "junction")].maximum == 60.0
    fast.stop()


def test_sighup_reloads_are_counted_by_what_failed_and_reach_metrics(tmp_path: Path) -> None:
    from collections import Counter

    from exporter.cycle import Pipeline
    from exporter.daemon import Reloader
    from exporter.model import Snapshot

    rules, config_file = tmp_path / "rules.yaml", tmp_path / "config.yaml"
    rules.write_text("rules:\n  - alert: Hot\n    metric: power_watts\n    comparison: '>'\n    threshold: 1\n")
    config_file.write_text(f"rules.file: {rules}\n")
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    settings = config.resolve(parser.parse_args([f"--config.file={config_file}", "--demo"]), {})
    counts: Counter[tuple[str, str]] = Counter()
    pipeline = Pipeline(
        source_name="sysfs", source_reason="test", rules=default_rule_file().rules, reloads=lambda: counts
    )
    reloader = Reloader(settings, pipeline, counts)
    reloader.reload()  # both good
    config_file.write_text(f"rules.file: {rules}\ninterval: soon\n")
    reloader.reload()  # the config file is bad: the rules are not read
    config_file.write_text(f"rules.file: {rules}\n")
    rules.write_text("rules: [\n")
    reloader.reload()  # the rule file is bad
    pipeline.on_snapshot(Snapshot(taken_at=1.0))
    assert pipeline.state.metrics is not None
    lines = [
        line for line in pipeline.state.metrics.text.decode().splitlines() if line.startswith("amdgpu_exporter_reloads")
    ]
    assert lines == [
        'amdgpu_exporter_reloads_total{result="failure",what="config"} 1.0',
        'amdgpu_exporter_reloads_total{result="success",what="config"} 2.0',
        'amdgpu_exporter_reloads_total{result="failure",what="rules"} 1.0',
        'amdgpu_exporter_reloads_total{result="success",what="rules"} 1.0',
    ]
