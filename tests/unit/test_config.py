"""Settings precedence (flags > env > file > defaults) and one-sentence errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporter.config import ConfigError, add_arguments, parse_duration, parse_listen_address, resolve


def _resolve(argv: list[str], env: dict[str, str] | None = None):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args(argv), env or {})


def test_defaults() -> None:
    s = _resolve([])
    assert s.web_listen_address == (("0.0.0.0", 9442),)
    assert s.web_telemetry_path == "/metrics"
    assert s.interval == 1.0 and s.read_timeout == 2.0
    assert s.source == "auto" and s.demo is False and s.alertmanager_url == ()


def test_precedence_flag_env_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("interval: 5s\nread-timeout: 3s\nsource: sysfs\n")
    s = _resolve(["--config.file", str(cfg), "--interval", "250ms"], {"AMDGPU_EXPORTER_READ_TIMEOUT": "4s"})
    assert s.interval == 0.25  # flag beats file
    assert s.read_timeout == 4.0  # env beats file
    assert s.source == "sysfs"  # file beats default
    assert s.origins["interval"] == "flag" and s.origins["read-timeout"] == "env" and s.origins["source"] == "file"


def test_repeatable_and_env_lists() -> None:
    s = _resolve(["--alertmanager.url", "http://a:9093", "--alertmanager.url", "http://b:9093"])
    assert s.alertmanager_url == ("http://a:9093", "http://b:9093")
    s = _resolve([], {"AMDGPU_EXPORTER_ALERTMANAGER_URL": "http://a:9093, http://b:9093"})
    assert s.alertmanager_url == ("http://a:9093", "http://b:9093")


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--interval", "fast"], {}, "--interval"),
        (["--source", "nvml"], {}, "--source"),
        (["--web.listen-address", "9442"], {}, "--web.listen-address"),
        (["--web.telemetry-path", "/"], {}, "--web.telemetry-path"),
        ([], {"AMDGPU_EXPORTER_INTERVAL": "-1s"}, "AMDGPU_EXPORTER_INTERVAL"),
        ([], {"AMDGPU_EXPORTER_DEMO": "maybe"}, "AMDGPU_EXPORTER_DEMO"),
    ],
)
def test_bad_values_name_where_they_came_from(argv: list[str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        _resolve(argv, env)


def test_bad_config_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("interval: 1s\n  oops: [\n")
    with pytest.raises(ConfigError, match="line"):
        _resolve(["--config.file", str(bad)])
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("intervall: 1s\n")
    with pytest.raises(ConfigError, match="intervall"):
        _resolve(["--config.file", str(unknown)])
    with pytest.raises(ConfigError, match="cannot read"):
        _resolve(["--config.file", str(tmp_path / "missing.yaml")])


def test_parsers() -> None:
    assert parse_duration("500ms") == 0.5 and parse_duration("2m") == 120 and parse_duration("1.5") == 1.5
    assert parse_listen_address("[::1]:9442") == ("::1", 9442)
    assert parse_listen_address("127.0.0.1:1") == ("127.0.0.1", 1)
    for bad in ("", "abc", ":-1", ":70000", "host:"):
        with pytest.raises(ValueError):
            parse_listen_address(bad)


def test_fast_sampler_options() -> None:
    settings = _resolve([])
    assert (settings.fast_interval, settings.window) == (0.1, 15.0)
    assert _resolve(["--fast.interval=0"]).fast_interval == 0.0
    assert _resolve(["--fast.interval=250ms", "--window=1m"]).window == 60.0
    assert _resolve([], {"AMDGPU_EXPORTER_FAST_INTERVAL": "50ms"}).fast_interval == 0.05
    with pytest.raises(ConfigError, match="shorter than 10ms"):
        _resolve(["--fast.interval=5ms"])
    with pytest.raises(ConfigError, match=r"--window \(0.15s\) must hold at least two fast samples"):
        _resolve(["--window=150ms"])
    with pytest.raises(ConfigError, match="--window"):
        _resolve(["--window=0"])
