"""Re-reading the config file on SIGHUP: flags and environment still win, removed keys go back to defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporter.config import ConfigError, add_arguments, resolve
from exporter.configcheck import changed_options, read_config_file, reload_settings


def settings_for(config: Path, *argv: str, environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args([f"--config.file={config}", *argv]), environ or {})


def test_reload_takes_the_file_but_flags_and_environment_still_win(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("interval: 2s\nread-timeout: 3s\nlog.level: warn\n")
    before = settings_for(config, "--interval=5s", environ={"AMDGPU_EXPORTER_LOG_LEVEL": "error"})
    assert (before.interval, before.read_timeout, before.log_level) == (5.0, 3.0, "error")
    config.write_text("interval: 1s\nslow-interval: 30s\nlog.level: debug\n")
    after = reload_settings(before)
    assert (after.interval, after.log_level) == (5.0, "error")  # the flag, the environment
    assert after.slow_interval == 30.0 and after.origins["slow-interval"] == "file"
    assert after.read_timeout == 2.0 and after.origins["read-timeout"] == "default"  # no longer in the file
    assert changed_options(before, after) == ["read-timeout", "slow-interval"]


def test_config_errors_name_the_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    for text, message in [
        ("interval: 1s\n\nsource: gpu\n", "line 3: source: 'gpu' is not one of auto, sysfs, rocm-smi"),
        ("- interval\n", "line 1: the file must be a mapping of option: value"),
        ("interval: 1s\ninterval: 2s\n", "line 2: option 'interval' is given twice (lines 1 and 2)"),
        ("interval: [1s\n", "line 2 is not valid YAML"),
    ]:
        config.write_text(text)
        with pytest.raises(ConfigError) as error:
            read_config_file(str(config))
        assert str(error.value).startswith(f"config file {config} {message}"), str(error.value)
    config.write_text("")
    assert read_config_file(str(config)) == {}


def test_check_config_and_reload_read_as_boundedly_as_start_up(tmp_path: Path) -> None:
    """One reader for serve, check-config and SIGHUP: the same size, UTF-8 and alias limits."""
    from exporter.config import read_config_values

    config = tmp_path / "config.yaml"
    # one option whose value nests eight anchors of nine aliases each: 9^8 values once expanded
    bomb = "web.listen-address: [&a [x,x,x,x,x,x,x,x,x]"
    for i in range(1, 8):
        bomb += f", &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]"
    config.write_text(bomb + "]\n")
    for read in (read_config_file, read_config_values):
        with pytest.raises(ConfigError, match="alias bomb"):
            read(str(config))
    config.write_bytes(b"interval: 1s\n# " + b"x" * (2 << 20) + b"\n")
    with pytest.raises(ConfigError, match="larger than 256 KiB"):
        read_config_file(str(config))
    config.write_bytes(b"node-name: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_config_file(str(config))


def test_check_config_checks_what_serve_would_start_with(tmp_path: Path) -> None:
    from exporter.configcheck import check_config

    config, web = tmp_path / "config.yaml", tmp_path / "web.yml"
    config.write_text(f"web.config.file: {web}\nweb.listen-address: ['127.0.0.1:9442', '[::1]:0']\n")
    web.write_text("basic_auth_users:\n  alice: $2y$10$0123456789012345678901u7hR5aHBqJBP8dnLgCSJwG1G0pUByA.\n")
    assert check_config(str(config), {}) == (f"{config}: OK, 2 option(s); web.config.file {web}: TLS off, 1 user(s)")
    for text, expected in [
        (f"tls_server_config:\n  cert_file: {tmp_path}/no.pem\n  key_file: {tmp_path}/no.key\n", "cert_file"),
        ("basic_auth_users: [alice]\n", "basic_auth_users"),
    ]:
        web.write_text(text)
        with pytest.raises(ConfigError, match=f"^config file {config}: --web.config.file {web}: .*{expected}"):
            check_config(str(config), {})
    # an address this host does not have: serve could not bind it (checked on a free port)
    config.write_text("web.listen-address: 192.0.2.1:9442\n")
    with pytest.raises(ConfigError, match=r"web\.listen-address 192\.0\.2\.1:9442: cannot listen on 192\.0\.2\.1"):
        check_config(str(config), {})
    # the environment serve would start with: its rule file, and cross-checks of the options
    config.write_text("interval: 1s\n")
    with pytest.raises(ConfigError, match=r"--rules\.file: .* is missing"):
        check_config(str(config), {"AMDGPU_EXPORTER_RULES_FILE": str(tmp_path / "none.yaml")})
    config.write_text("fast.interval: 1s\nwindow: 1s\n")
    with pytest.raises(ConfigError, match="must hold at least two fast samples"):
        check_config(str(config), {})


def test_check_rules_sends_a_prometheus_rule_file_to_promtool() -> None:
    from exporter.alerting.rulefile import RulesConfigError
    from exporter.configcheck import check_rules

    path = Path(__file__).resolve().parents[2] / "deploy/prometheus/amdgpu-exporter.rules.yml"
    with pytest.raises(RulesConfigError, match=f"Prometheus rule file .*: check it with `promtool check rules {path}`"):
        check_rules(str(path))


def test_unknown_environment_variables_are_named_with_the_nearest_option() -> None:
    from exporter.config import unknown_environment

    environ = {
        "AMDGPU_EXPORTER_INTERVALL": "2s",
        "AMDGPU_EXPORTER_INTERVAL": "1s",
        "AMDGPU_EXPORTER_CONFIG_FILE": "/etc/amdgpu-exporter.yml",
        "AMDGPU_EXPORTER_WEB_LISTEN_ADRESS": ":1",
        "AMDGPU_EXPORTER_COFFEE": "yes",
        "HOME": "/root",
    }
    assert unknown_environment(environ) == [
        "unknown environment variable AMDGPU_EXPORTER_COFFEE is ignored",
        "unknown environment variable AMDGPU_EXPORTER_INTERVALL is ignored; did you mean AMDGPU_EXPORTER_INTERVAL?",
        "unknown environment variable AMDGPU_EXPORTER_WEB_LISTEN_ADRESS is ignored; did you mean "
        "AMDGPU_EXPORTER_WEB_LISTEN_ADDRESS?",
    ]


def test_identity_labels_option_takes_labels_of_device_info(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("metrics.identity-labels: [serial, product]\n")
    assert settings_for(config).metrics_identity_labels == ("serial", "product")
    assert settings_for(config, "--metrics.identity-labels=pci_bus_id,serial").metrics_identity_labels == (
        "pci_bus_id",
        "serial",
    )
    config.write_text("")
    assert settings_for(config).metrics_identity_labels == ()
    with pytest.raises(ConfigError, match="AMDGPU_EXPORTER_METRICS_IDENTITY_LABELS: 'sn' is not a label"):
        settings_for(config, environ={"AMDGPU_EXPORTER_METRICS_IDENTITY_LABELS": "serial,sn"})
