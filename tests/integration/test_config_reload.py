"""check-config / check-rules as an operator runs them, and SIGHUP on a running daemon (real processes)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import Daemon, free_port, poll_cycles, start_daemon, stop, wait_for_cycles, wait_until

pytestmark = pytest.mark.integration

EXPORTER = [sys.executable, "-m", "exporter.cli"]
REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXPORTER, *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_check_rules_accepts_the_shipped_file_with_one_line() -> None:
    done = run("check-rules", "exporter/alerting/default_rules.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exporter/alerting/default_rules.yaml: OK, 1 rule(s): GpuJunctionTemperatureHigh\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "rules:\n  - alert: X\n    metric: power_watts\n    comparison: '>'\n    threshold: 1\n"
            "    summary: '{value:>200000000}'\n",
            "line 6: 'summary': width or precision 200000000 in {value:>200000000} is more than 100",
        ),
        ("rules:\n  - alert: X\n    metric: power\n", "line 3: unknown metric 'power'"),
        ("rules: [\n", "line 2: not valid YAML"),
    ],
)
def test_check_rules_names_the_line_and_exits_1(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    done = run("check-rules", str(path))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"amdgpu-exporter: error: {path} {expected}"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_check_config_checks_values_lines_and_the_rule_file_it_names(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text((REPO / "exporter/alerting/default_rules.yaml").read_text())
    config = tmp_path / "config.yaml"
    config.write_text(f"interval: 2s\nrules.file: {rules}\n")
    done = run("check-config", str(config))
    assert (done.returncode, done.stdout) == (0, f"{config}: OK, 2 option(s); rules.file {rules}: 1 rule(s)\n")
    for text, expected in [
        ("interval: 2s\nintervall: 3s\n", "line 2: unknown option 'intervall'"),
        ("interval: 2s\nread-timeout: soon\n", "line 2: read-timeout: 'soon' is not a duration"),
        ("source: rocm_smi\n", "line 1: source: 'rocm_smi' is not one of auto, sysfs, rocm-smi"),
        (f"rules.file: {tmp_path / 'missing.yaml'}\n", "rules.file:"),
    ]:
        config.write_text(text)
        done = run("check-config", str(config))
        assert done.returncode == 1, text
        assert done.stderr.startswith(f"amdgpu-exporter: error: config file {config}"), done.stderr
        assert expected in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert run("check-config").returncode == 2  # no FILE: a usage error


def test_check_config_fails_where_serve_would_and_both_warn_of_a_mistyped_variable(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tmp_path}/no.pem\n  key_file: {tmp_path}/no.key\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"web.config.file: {web}\n")
    environ = {**os.environ, "AMDGPU_EXPORTER_INTERVALL": "2s", "AMDGPU_EXPORTER_LOG_FORMAT": "json"}
    warning = (
        "unknown environment variable AMDGPU_EXPORTER_INTERVALL is ignored; did you mean AMDGPU_EXPORTER_INTERVAL?"
    )

    def run_with(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*EXPORTER, *args], capture_output=True, text=True, timeout=60, cwd=REPO, env=environ)

    checked = run_with("check-config", str(config))
    assert (checked.returncode, checked.stdout) == (1, ""), checked.stderr
    assert checked.stderr.splitlines() == [
        f"amdgpu-exporter: warning: {warning}",
        f"amdgpu-exporter: error: config file {config}: --web.config.file {web}: cert_file {tmp_path}/no.pem: "
        "cannot read it: No such file or directory",
    ]
    served = run_with("--demo", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{free_port()}")
    assert served.returncode == 2
    logged = [json.loads(line) for line in served.stderr.splitlines() if line.startswith("{")]
    assert [(e["event"], e["level"], e["message"]) for e in logged] == [
        ("unknown_environment_variable", "warning", warning)
    ]
    assert served.stderr.splitlines()[-1] == checked.stderr.splitlines()[-1].replace(f"config file {config}: ", "")
    web.write_text("")  # a valid, empty web config: both accept it
    checked = run_with("check-config", str(config))
    assert (
        checked.returncode == 0
        and checked.stdout == f"{config}: OK, 1 option(s); web.config.file {web}: TLS off, 0 user(s)\n"
    )


def test_check_rules_sends_a_prometheus_rule_file_to_promtool() -> None:
    done = run("check-rules", "deploy/prometheus/amdgpu-exporter.rules.yml")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "check it with `promtool check rules deploy/prometheus/amdgpu-exporter.rules.yml`" in done.stderr


# ---------------------------------------------------------------------------------------------- SIGHUP


class Reloadable:
    """A config file and a rule file, and the demo daemon started on them (tests.harness)."""

    def __init__(self, tmp_path: Path) -> None:
        self.folder = tmp_path
        self.rules = tmp_path / "rules.yaml"
        self.config = tmp_path / "config.yaml"
        self.daemon: Daemon | None = None

    def start(self) -> subprocess.Popen[bytes]:
        self.daemon = start_daemon(self.folder, "--demo", f"--config.file={self.config}", ready=False, cwd=REPO)
        return self.daemon.process

    @property
    def port(self) -> int:
        assert self.daemon is not None
        return self.daemon.port

    def events(self, name: str) -> list[dict[str, Any]]:
        assert self.daemon is not None
        return self.daemon.events(name)

    def reload_counts(self) -> dict[tuple[str, str], int]:
        body = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        found = re.findall(r'^amdgpu_exporter_reloads_total\{result="(\w+)",what="(\w+)"\} (\S+)$', body, re.MULTILINE)
        return {(what, result): int(float(value)) for result, what, value in found}

    def alert_names(self) -> set[str]:
        alerts = httpx.get(f"http://127.0.0.1:{self.port}/api/v1/alerts", timeout=5).json()["alerts"]
        return {a["alert"] for a in alerts}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Reloadable]:
    found = Reloadable(tmp_path)
    yield found
    if found.daemon is not None:
        stop(found.daemon.process)


EDGE_RULE = (
    "rules:\n  - {alert: EdgeSeen, metric: temperature_celsius, sensor: edge, comparison: '>', threshold: -100}\n"
)


def test_sighup_rereads_rules_and_config_and_an_invalid_file_keeps_the_old(daemon: Reloadable) -> None:
    daemon.rules.write_text((REPO / "exporter/alerting/default_rules.yaml").read_text())
    daemon.config.write_text(f"rules.file: {daemon.rules}\ninterval: 1s\n")
    process = daemon.start()
    wait_until(
        lambda: daemon.alert_names() == {"GpuJunctionTemperatureHigh"}, "the first rules' alerts", process=process
    )

    # New rules: applied from the next cycle, logged.
    daemon.rules.write_text(EDGE_RULE)
    process.send_signal(signal.SIGHUP)
    wait_until(lambda: daemon.alert_names() == {"EdgeSeen"}, "the new rules' alerts", process=process)
    (reloaded,) = wait_until(lambda: daemon.events("reloaded"), "the reloaded log line", process=process)
    assert reloaded["rules"] == 1 and reloaded["changed"] == [] and reloaded["restart_needed"] == []

    # An invalid rule file: the running rules stay, and the log says why with the line.
    daemon.rules.write_text(EDGE_RULE + "  - {alert: Broken, metric: nothing}\n")
    process.send_signal(signal.SIGHUP)
    (failed,) = wait_until(lambda: daemon.events("reload_failed"), "the reload_failed log line", process=process)
    assert f"{daemon.rules} line 3: unknown metric 'nothing'" in failed["error"]
    wait_for_cycles(daemon.port, poll_cycles(daemon.port) + 2)  # a whole cycle after the failed reload
    assert daemon.alert_names() == {"EdgeSeen"} and process.poll() is None

    # The config file: the interval needs a restart and says so; the rule file it names is read.
    daemon.rules.write_text(EDGE_RULE)
    daemon.config.write_text(f"rules.file: {daemon.rules}\ninterval: 2s\n")
    process.send_signal(signal.SIGHUP)
    events = wait_until(lambda: daemon.events("reloaded")[1:], "the second reloaded log line", process=process)
    assert events[0]["changed"] == ["interval"] and events[0]["restart_needed"] == ["interval"]
    # An invalid config file keeps everything too.
    daemon.config.write_text("interval: soon\n")
    process.send_signal(signal.SIGHUP)
    failures = wait_until(lambda: daemon.events("reload_failed")[1:], "the second reload_failed", process=process)
    assert f"{daemon.config} line 1: interval:" in failures[0]["error"]
    # Each re-read is counted by what and result: 3 config files read well, 1 not; rules 2 good, 1 bad.
    expected = {("config", "success"): 3, ("config", "failure"): 1, ("rules", "success"): 2, ("rules", "failure"): 1}
    wait_until(lambda: daemon.reload_counts() == expected, "the reload counts in /metrics", process=process)

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0


def families_served(port: int) -> set[str]:
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return set(re.findall(r"^# TYPE (\S+) ", body, re.MULTILINE))


def test_sighup_changes_the_families_served_and_a_name_that_matches_nothing_keeps_them(daemon: Reloadable) -> None:
    daemon.config.write_text("families:\n  exclude: [amdgpu_voltage_volts]\n")
    process = daemon.start()
    served = wait_until(lambda: families_served(daemon.port), "the first /metrics", process=process)
    assert "amdgpu_voltage_volts" not in served and "amdgpu_firmware_info" not in served  # off by default
    assert "amdgpu_temperature_celsius" in served

    daemon.config.write_text("collectors:\n  include: [firmware]\n  exclude: [pcie]\n")
    process.send_signal(signal.SIGHUP)
    served = wait_until(
        lambda: (found := families_served(daemon.port)) and "amdgpu_firmware_info" in found and found,
        "the firmware families after the reload",
        process=process,
    )
    assert "amdgpu_voltage_volts" in served and not [name for name in served if name.startswith("amdgpu_pcie_")]
    (reloaded,) = wait_until(lambda: daemon.events("reloaded"), "the reloaded log line", process=process)
    assert set(reloaded["changed"]) == {"collectors.include", "collectors.exclude", "families.exclude"}
    assert reloaded["restart_needed"] == []

    daemon.config.write_text("collectors:\n  include: [firmwre]\n")
    process.send_signal(signal.SIGHUP)
    (failed,) = wait_until(lambda: daemon.events("reload_failed"), "the reload_failed log line", process=process)
    assert "collectors.include: 'firmwre' matches no collector; did you mean firmware?" in failed["error"]
    wait_for_cycles(daemon.port, poll_cycles(daemon.port) + 2)
    assert "amdgpu_firmware_info" in families_served(daemon.port)
    expected = {("config", "success"): 1, ("config", "failure"): 1, ("rules", "success"): 1}
    assert {k: v for k, v in daemon.reload_counts().items() if v} == expected

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
