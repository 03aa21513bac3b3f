"""deploy/prometheus rules and deploy/alertmanager config, checked by the real tools.

promtool (Debian `prometheus`, 2.42) checks and unit-tests the rules; amtool (Debian
`prometheus-alertmanager`) checks the Alertmanager example and resolves its routes. Around the tools,
this file holds the rules to the project's contract: every alert has a promtool case where it fires
and one where it stays quiet, every metric and label it reads is one the exporter exports, every
alert carries severity, summary and description naming the node and the device, and a runbook_url to
its section of docs/runbooks.md; every per-device alert carries the identifying labels of
docs/alert-labels.md (node, gpu, pci_bus_id); and a recording rule an alert depends on is evaluated
before it in the same group (across groups the order is undefined and the alert would lag).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.exposition.selection import COLLECTOR_NAMES
from tests.realtools import free_port, require_tool

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "amdgpu-exporter.rules.yml"
RULE_TESTS = sorted((REPO / "deploy" / "prometheus" / "tests").glob("*.yml"))
ALERTMANAGER_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_PREFIX = "docs/runbooks.md#"
# Alerts about a node or its exporter as a whole: no gpu label.
NODE_LEVEL_ALERTS = frozenset(
    {
        "AMDGPUExporterDown",
        "AMDGPUExporterPollStalled",
        "AMDGPUExporterWorkerRestarts",
        "AMDGPUNodeBusyDrop",
        "AMDGPUAttributionDown",
    }
)

# The metric contract of DESIGN.md (plus the self-metrics the CLI brief adds): exposed name ->
# labels besides the target's own (instance, job), with the allowed values where the contract
# enumerates them (None = free-form). To be replaced by an import of the exporter's metric table.
_GPU: dict[str, frozenset[str] | None] = {"gpu": None}
_IDENTITY = (
    "card", "pci_bus_id", "unique_id", "serial", "product", "product_number", "asic", "package", "die", "partition",
    "vbios", "driver",
    "compute_partition", "memory_partition",
)  # fmt: skip
_STATS = frozenset({"min", "max", "mean"})
_SENSORS = frozenset({"edge", "junction", "memory", "hbm0", "hbm1", "hbm2", "hbm3", "vr_gfx", "vr_soc", "vr_mem"})
_DOMAINS = frozenset({"gfx", "memory", "fabric", "soc", "video", "decode"})
CONTRACT: dict[str, dict[str, frozenset[str] | None]] = {
    "amdgpu_up": _GPU,
    "amdgpu_device_info": {**_GPU, **dict.fromkeys(_IDENTITY)},
    "amdgpu_sample_timestamp_seconds": _GPU,
    # 1 while amdgpu_up is 0, with the poller's down reason (docs/alert-labels.md)
    "amdgpu_temperature_celsius": {**_GPU, "sensor": _SENSORS},
    "amdgpu_temperature_threshold_celsius": {
        **_GPU,
        "sensor": _SENSORS,
        "threshold": frozenset({"critical", "emergency"}),
    },
    "amdgpu_power_watts": _GPU,
    "amdgpu_gfx_clock_lock_active": _GPU,
    "amdgpu_power_cap_watts": _GPU,
    "amdgpu_power_cap_max_watts": _GPU,
    "amdgpu_energy_joules_total": _GPU,
    "amdgpu_busy_ratio": {**_GPU, "engine": frozenset({"gfx", "memory", "media"})},
    "amdgpu_memory_used_bytes": {**_GPU, "pool": frozenset({"vram", "visible_vram", "gtt"})},
    "amdgpu_memory_total_bytes": {**_GPU, "pool": frozenset({"vram", "visible_vram", "gtt", "partition_vram"})},
    "amdgpu_clock_hertz": {**_GPU, "domain": _DOMAINS},
    "amdgpu_clock_max_hertz": {**_GPU, "domain": _DOMAINS},
    "amdgpu_clock_average_hertz": {**_GPU, "domain": _DOMAINS},
    "amdgpu_voltage_volts": {**_GPU, "rail": None},
    "amdgpu_throttle_active": {**_GPU, "reason": None},
    "amdgpu_throttle_residency_seconds_total": {
        **_GPU,
        "reason": frozenset({"prochot", "ppt", "socket_thermal", "vr_thermal", "hbm_thermal"}),
    },
    "amdgpu_pcie_current_link_transfers_per_second": _GPU,
    "amdgpu_pcie_max_link_transfers_per_second": _GPU,
    "amdgpu_pcie_current_link_width": _GPU,
    "amdgpu_pcie_max_link_width": _GPU,
    "amdgpu_pcie_bandwidth_bytes_per_second": _GPU,
    "amdgpu_pcie_bandwidth_upper_bound_bytes_per_second": _GPU,
    "amdgpu_pcie_link_max_bytes_per_second": _GPU,
    "amdgpu_pcie_replays_total": _GPU,
    "amdgpu_pcie_recoveries_total": _GPU,
    "amdgpu_pcie_naks_total": {**_GPU, "direction": frozenset({"sent", "received"})},
    "amdgpu_xgmi_link_width": _GPU,
    "amdgpu_xgmi_link_speed_bytes_per_second": _GPU,
    "amdgpu_xgmi_link_up": {**_GPU, "link": None},
    "amdgpu_xgmi_read_bytes_total": {**_GPU, "link": None},
    "amdgpu_xgmi_write_bytes_total": {**_GPU, "link": None},
    "amdgpu_xgmi_error_events_total": _GPU,
    "amdgpu_topology_link_info": {**_GPU, "peer": None, "type": None, "hops": None, "weight": None},
    "amdgpu_ecc_errors_total": {
        **_GPU,
        "block": None,
        "type": frozenset({"correctable", "uncorrectable", "deferred"}),
    },
    "amdgpu_ras_retired_pages": _GPU,
    # The raw health signals (docs/health-signals.md)
    "amdgpu_ras_pending_pages": _GPU,
    "amdgpu_ras_bad_page_threshold_pages": _GPU,
    "amdgpu_cper_records": {**_GPU, "severity": frozenset({"fatal", "nonfatal", "corrected"})},
    "amdgpu_cper_newest_record_timestamp_seconds": {**_GPU, "severity": frozenset({"fatal", "nonfatal", "corrected"})},
    "amdgpu_last_reset_timestamp_seconds": _GPU,
    "amdgpu_pcie_aer_errors_total": {
        **_GPU,
        "port": frozenset({"device", "upstream"}),
        "severity": frozenset({"correctable", "nonfatal", "fatal"}),
    },
    # Per-XCC figures, the partition metrics table, gpu_metrics 1.9's fields
    "amdgpu_xcc_busy_ratio": {**_GPU, "xcc": None},
    "amdgpu_media_engine_busy_ratio": {**_GPU, "engine": frozenset({"vcn", "jpeg"}), "engine_index": None},
    "amdgpu_xcc_below_host_limit_seconds_total": {
        **_GPU,
        "xcc": None,
        "reason": frozenset({"power", "thermal", "low_utilization", "total"}),
    },
    "amdgpu_clock_min_hertz": {**_GPU, "domain": None},
    "amdgpu_memory_max_bandwidth_bytes_per_second": _GPU,
    "amdgpu_pcie_other_end_recoveries_total": _GPU,
    "amdgpu_pcie_replay_rollovers_total": _GPU,
    # MI350-class board/ (node-wide families carry no gpu label: shown once per node)
    "amdgpu_board_temperature_celsius": {**_GPU, "sensor": None},
    "amdgpu_baseboard_temperature_celsius": {"sensor": None},
    "amdgpu_node_power_watts": {},
    "amdgpu_node_power_limit_watts": {},
    "amdgpu_node_power_limit_max_watts": {},
    "amdgpu_node_power_management_active": {},
    "amdgpu_baseboard_power_watts": {},
    "amdgpu_baseboard_power_limit_watts": {},
    # issue 13: the fast sampler's sliding windows (min / max / mean over --window)
    "amdgpu_temperature_window_celsius": {**_GPU, "sensor": _SENSORS, "stat": _STATS},
    "amdgpu_power_window_watts": {**_GPU, "stat": _STATS},
    "amdgpu_busy_window_ratio": {**_GPU, "engine": frozenset({"gfx", "memory"}), "stat": _STATS},
    "amdgpu_clock_window_hertz": {**_GPU, "domain": frozenset({"gfx", "memory", "soc"}), "stat": _STATS},
    "amdgpu_firmware_info": {**_GPU, "block": None, "version": None},
    "amdgpu_alert_firing": {**_GPU, "alert": None, "severity": frozenset({"info", "warning", "critical"})},
    "amdgpu_clock_down_suggested_ratio": _GPU,
    "amdgpu_suggested_gfx_clock_max_hertz": _GPU,
    "amdgpu_alert_suggestion_info": {**_GPU, "alert": None, "suggested_command": None, "undo_command": None},
    # The health verdict (docs/health.md); its alerts are in amdgpu-health.rules.yml.
    "amdgpu_health_status": _GPU,
    "amdgpu_health_check": {**_GPU, "check": None, "severity": frozenset({"warning", "critical"})},
    "amdgpu_health_check_since_seconds": {**_GPU, "check": None},
    "amdgpu_health_suggestion_info": {
        "scheduler": frozenset({"slurm", "kubernetes"}),
        "suggested_command": None,
        "undo_command": None,
    },
    # Only with --alertmanager.url: whether the daemon pages itself (the forwarded copy stands back).
    "amdgpu_exporter_alertmanager_notifications_total": {"result": frozenset({"sent", "failed"})},
    "amdgpu_exporter_build_info": {"version": None, "source": frozenset({"sysfs", "rocm-smi"})},
    # The host's versions (the doctor's version matrix), read at start.
    "amdgpu_driver_info": {"version": None, "initstate": None, "kernel": None, "ppfeaturemask": None},
    "amdgpu_rocm_info": {"version": None, "path": None},
    "amdgpu_smi_library_info": {"library": frozenset({"librocm_smi64", "libamd_smi"}), "version": None},
    "amdgpu_exporter_poll_duration_seconds_bucket": {"le": None},
    "amdgpu_exporter_poll_duration_seconds_sum": {},
    "amdgpu_exporter_poll_duration_seconds_count": {},
    "amdgpu_exporter_read_errors_total": {**_GPU, "reason": None},
    "amdgpu_exporter_read_timeouts_total": {**_GPU, "reason": None},
    "amdgpu_exporter_worker_restarts_total": {},
    # a node's life (issue 10): vanished devices, why a device is down, errors as data, stages
    "amdgpu_device_present": _GPU,
    # a down device's reason, 1 while amdgpu_up is 0 (docs/alert-labels.md)
    "amdgpu_device_down_info": {
        **_GPU,
        "reason": frozenset({"gone", "timeout", "stuck", "read_error", "not_read_yet", "identify_timeout"}),
    },
    "amdgpu_exporter_file_errors_total": {**_GPU, "file": None, "reason": None},
    "amdgpu_exporter_discoveries_total": {"result": frozenset({"ok", "failed"})},
    "amdgpu_exporter_stage_failures_total": {"stage": frozenset({"rules", "render", "alertmanager"})},
    "amdgpu_exporter_reloads_total": {
        "what": frozenset({"config", "rules", "web_config"}),
        "result": frozenset({"success", "failure"}),
    },
    "amdgpu_exporter_last_poll_timestamp_seconds": {},
    "amdgpu_exporter_window_seconds": {},
    "amdgpu_exporter_fast_samples_total": _GPU,
    "amdgpu_exporter_fast_read_errors_total": {**_GPU, "reason": None},
    "amdgpu_exporter_fast_cycle_duration_seconds_bucket": {"le": None},
    "amdgpu_exporter_fast_cycle_duration_seconds_sum": {},
    "amdgpu_exporter_fast_cycle_duration_seconds_count": {},
    # Who is on each GPU (issue 12), with --kubernetes / --slurm.state-dir / --collector.processes.
    "amdgpu_allocation_info": {**_GPU, "pod": None, "namespace": None, "container": None, "resource": None},
    "amdgpu_job_info": {**_GPU, "job_id": None, "job_user": None, "job_partition": None},
    "amdgpu_exporter_attribution_up": {"source": frozenset({"kubernetes", "slurm", "processes"})},
    # per-job accounting (docs/accounting.md): two series a running job
    "amdgpu_job_energy_joules_total": {"job_id": None, "scheduler": frozenset({"slurm", "flux", "pbs", "kubernetes"})},
    "amdgpu_job_gpu_seconds_total": {"job_id": None, "scheduler": frozenset({"slurm", "flux", "pbs", "kubernetes"})},
    # the opt-in Slurm action mode and device-plugin health service (no series when off)
    "amdgpu_exporter_actions_total": {
        "action": frozenset({"drain", "resume"}),
        "outcome": frozenset({"done", "dry_run", "refused_share", "refused_foreign", "rate_limited", "failed"}),
    },
    "amdgpu_exporter_device_plugin_calls_total": {"method": frozenset({"List", "GetGPUState"})},
    # each collector's render outcome (off by default: the series budget)
    "amdgpu_exporter_collector_success": {"collector": frozenset(COLLECTOR_NAMES)},
    "amdgpu_exporter_collector_duration_seconds": {"collector": frozenset(COLLECTOR_NAMES)},
    "amdgpu_process_memory_bytes": {**_GPU, "pid": None, "comm": None},
    "amdgpu_process_compute_unit_occupancy_ratio": {**_GPU, "pid": None, "comm": None},
    "amdgpu_process_sdma_seconds_total": {**_GPU, "pid": None, "comm": None},
    # The exporter process itself (prometheus-client's process collector, through the metric table).
    "process_cpu_seconds_total": {},
    "process_resident_memory_bytes": {},
    "process_virtual_memory_bytes": {},
    "process_start_time_seconds": {},
    "process_open_fds": {},
    "process_max_fds": {},
}
# Series the rules read that the exporter does not export yet, planned by open issues (DESIGN.md's
# metric contract): each rule reading one stays quiet while it is absent (a promtool case shows it).
# When the exporter exports one, move it into CONTRACT (test_planned_metrics_are_not_exported_yet).
PLANNED: dict[str, dict[str, frozenset[str] | None]] = {}
# Series Prometheus itself writes for every target.
PROMETHEUS_SERIES: dict[str, dict[str, frozenset[str] | None]] = {"up": {}}
TARGET_LABELS = frozenset({"instance", "job", "node"})

# The exporter's attribution labels (docs/alert-labels.md): on the info series, and on every
# per-GPU series only with the exporter's option.
ATTRIBUTION_LABELS = ("pod", "namespace", "container", "job_id", "job_user", "job_partition")
# The per-GPU identity series the alerts join (amdgpu-recording).
IDENTITY = "gpu:amdgpu_device_info:identity"
# Recorded series alerts read from another group, and why the lag (up to one interval of the
# recording group) does not matter: both change far slower than that interval.
READ_ACROSS_GROUPS = {
    IDENTITY: "changes when the hardware or its partition mode does",
    "node:amdgpu_devices:max1h": "a day's history, recorded every 5 minutes to keep AMDGPUDeviceMissing cheap",
    # Recorded for the dashboards (30 s) and for every 15 s window (15 s), read by once-a-minute
    # alerts over windows of minutes (issue 34: each rule at the interval its consumer needs).
    "instance:amdgpu_busy_ratio:avg": "AMDGPUNodeBusyDrop reads its 5-minute and 1-hour means",
    "gpu:amdgpu_junction_swing_celsius:window": "every 15 s window; AMDGPUTemperatureSwing reads its 2-minute max",
}

SEVERITIES = frozenset({"critical", "warning", "info"})
# Alerts on counted events (any new uncorrectable error, any page retired, ...) fire at once: the
# counter's increase over a window is the debounce. Every other alert must wait at least 2 minutes.
EVENT_ALERTS = frozenset(
    {"AMDGPUECCUncorrectable", "AMDGPUPagesRetired", "AMDGPUXGMIErrors", "AMDGPUExporterWorkerRestarts"}
)
MIN_FOR_SECONDS = 60

# --- a small PromQL reader: enough to list the series an expression selects -----------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*(\{[^{}]*\})?")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')\s*,?')
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"inf", "nan"}
)


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in a PromQL expression: metric name and label matchers.

    Function and aggregation names are followed by '(' and skipped; strings, grouping clauses
    and [range] / offset durations are not names.
    """
    # Hide the strings (they may hold braces or words) but keep matcher values to read back.
    strings: list[str] = []

    def stash(match: re.Match[str]) -> str:
        strings.append(match.group(0))
        return f"\0{len(strings) - 1}\0"

    text = _STRING.sub(stash, expr)
    text = _CLAUSE.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    found = []
    for match in _SELECTOR.finditer(text):
        name, braces = match.group(1), match.group(2)
        rest = text[match.end() :].lstrip()
        if name.lower() in _KEYWORDS or (braces is None and rest.startswith("(")):
            continue
        matchers: list[tuple[str, str, str]] = []
        if braces:
            inner = re.sub(r"\0(\d+)\0", lambda m: strings[int(m.group(1))], braces[1:-1])
            position = 0
            while inner[position:].strip():
                matcher = _MATCHER.match(inner, position)
                assert matcher, f"cannot read the matchers {braces!r} in {expr!r}"
                label, operator, quoted = matcher.groups()
                matchers.append((label, operator, yaml.safe_load(quoted)))
                position = matcher.end()
        found.append(Selector(name, tuple(matchers)))
    return found


def annotation_queries(annotations: dict[str, str]) -> list[str]:
    """The PromQL of `query` calls in annotation templates: the printf format strings, with each
    %q (a label value filled in at alert time) written as the string "%q"."""
    return [
        query.replace("%q", '"%q"')
        for text in annotations.values()
        for query in re.findall(r'printf\s+"((?:[^"\\]|\\.)*)"', text)
    ]


# --- the files under test ---------------------------------------------------------------


@functools.cache
def load_yaml(path: Path) -> Any:
    """Parsed once per run; callers only read it."""
    return yaml.safe_load(path.read_text())


def load_rules() -> list[dict[str, Any]]:
    return load_yaml(RULES)["groups"]


def alerting_rules() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for group in load_rules():
        for rule in group["rules"]:
            if "alert" in rule:
                yield group, rule


def recorded_names() -> set[str]:
    return {rule["record"] for group in load_rules() for rule in group["rules"] if "record" in rule}


def rule_queries(rule: dict[str, Any]) -> list[str]:
    return [rule["expr"], *annotation_queries(rule.get("annotations", {}))]


def source_metrics(rule: dict[str, Any]) -> set[str]:
    """Metric names a rule reads, through recording rules down to exported series."""
    recording = {r["record"]: r for group in load_rules() for r in group["rules"] if "record" in r}
    names: set[str] = set()
    pending = [s.metric for s in selectors(rule["expr"])]
    while pending:
        name = pending.pop()
        if name in names:
            continue
        names.add(name)
        if name in recording:
            pending.extend(s.metric for s in selectors(recording[name]["expr"]))
    return names


def parse_duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(int(n) * units[u] for n, u in parts)


@dataclass
class AlertCases:
    fires: list[str]
    quiet: list[str]  # quiet at an evaluation whose inputs include a series the alert reads


def alert_cases() -> dict[str, AlertCases]:
    """For each alert name in the promtool tests, where it is expected to fire and to stay quiet."""
    rules = {rule["alert"]: rule for _, rule in alerting_rules()}
    cases: dict[str, AlertCases] = {}
    for path in RULE_TESTS:
        document = load_yaml(path)
        for number, test in enumerate(document.get("tests", [])):
            inputs = {series_name(series["series"]) for series in test.get("input_series", [])}
            for case in test.get("alert_rule_test", []):
                name = case["alertname"]
                where = f"{path.name} test {number} at {case['eval_time']}"
                entry = cases.setdefault(name, AlertCases([], []))
                if case.get("exp_alerts"):
                    entry.fires.append(where)
                elif name in rules and inputs & source_metrics(rules[name]):
                    entry.quiet.append(where)
    return cases


def series_name(series: str) -> str:
    return series.split("{", 1)[0].strip()


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


# --- the real tools ---------------------------------------------------------------------


def test_promtool_accepts_the_rules() -> None:
    promtool = require_tool("promtool")
    result = run([promtool, "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr
    # The default lint (duplicate rules) is part of `check rules`; nothing may be left over.
    assert "SUCCESS" in result.stdout, result.stdout
    alerts_and_records = sum(len(group["rules"]) for group in load_rules())
    assert f"{alerts_and_records} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    assert RULE_TESTS, "no promtool tests in deploy/prometheus/tests"
    # promtool resolves rule_files relative to each test file, so run it from their directory.
    result = run([promtool, "test", "rules", *[p.name for p in RULE_TESTS]], cwd=RULE_TESTS[0].parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS), result.stdout


def test_promtool_reports_a_broken_expectation(tmp_path: Path) -> None:
    """The wrapper must notice a failing promtool test: flip one quiet case into a firing one."""
    promtool = require_tool("promtool")
    source = RULE_TESTS[0]
    document = yaml.safe_load(source.read_text())
    document["rule_files"] = [str(RULES)]
    quiet_case = next(
        case for test in document["tests"] for case in test["alert_rule_test"] if not case.get("exp_alerts")
    )
    quiet_case["exp_alerts"] = [{"exp_labels": {"severity": "warning"}}]
    broken = tmp_path / source.name
    broken.write_text(yaml.safe_dump(document, allow_unicode=True))
    result = run([promtool, "test", "rules", str(broken)])
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_amtool_accepts_the_alertmanager_config() -> None:
    amtool = require_tool("amtool")
    result = run([amtool, "check-config", str(ALERTMANAGER_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("severity", "receiver"),
    [("critical", "gpu-oncall-pager"), ("warning", "gpu-team-email"), ("info", "gpu-capacity-webhook")],
)
def test_alertmanager_routes_by_severity(severity: str, receiver: str) -> None:
    amtool = require_tool("amtool")
    labels = [f"severity={severity}", "alertname=AMDGPUDeviceDown", "node=gpu-node-1", "gpu=0"]
    result = run([amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}", *labels])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [receiver]


def test_every_rule_severity_has_its_own_route() -> None:
    """Each severity the rules use resolves (by amtool) to a receiver other than the fallback's."""
    amtool = require_tool("amtool")
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    used = {rule["labels"]["severity"] for _, rule in alerting_rules()} & SEVERITIES
    used |= CONTRACT["amdgpu_alert_firing"]["severity"] or set()  # forwarded daemon alerts
    for severity in sorted(used):
        result = run(
            [amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}", f"severity={severity}"]
        )
        assert result.returncode == 0, result.stdout + result.stderr
        [receiver] = result.stdout.split()
        matched = [r for r in config["route"]["routes"] if f'severity="{severity}"' in r.get("matchers", [])]
        assert matched and matched[0]["receiver"] == receiver, severity


def test_alertmanager_groups_by_node_and_cause_and_inhibits_on_the_identifying_labels() -> None:
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    assert config["route"]["group_by"] == ["node", "alertname"]
    # Child routes inherit it (the info digest groups wider, by cause only).
    for route in config["route"]["routes"]:
        assert set(route.get("group_by", ["node", "alertname"])) <= {"node", "alertname"}, route
    equal = {tuple(rule["equal"]) for rule in config["inhibit_rules"]}
    assert equal <= {("node", "gpu"), ("node",)}, equal
    used = {label for rule in config["inhibit_rules"] for label in rule["equal"]}
    assert "instance" not in used, "instance differs between the two alert paths"


# --- the contract around the tools ------------------------------------------------------


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = alert_cases()
    alerts = [rule["alert"] for _, rule in alerting_rules()]
    assert len(alerts) == len(set(alerts)), "alert names must be unique"
    missing = {
        name: ("no firing case" if not cases.get(name, AlertCases([], [])).fires else "no quiet case")
        for name in alerts
        if not cases.get(name) or not cases[name].fires or not cases[name].quiet
    }
    assert not missing, missing
    unknown = set(cases) - set(alerts)
    assert not unknown, f"promtool cases for alerts that do not exist: {unknown}"


def test_every_test_file_loads_the_shipped_rules() -> None:
    for path in RULE_TESTS:
        document = load_yaml(path)
        loaded = [(path.parent / name).resolve() for name in document["rule_files"]]
        assert loaded == [RULES.resolve()], path.name


def test_every_alert_has_severity_summary_description_and_runbook_url() -> None:
    headings = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(encoding="utf-8"), flags=re.MULTILINE))
    for _, rule in alerting_rules():
        name = rule["alert"]
        severity = rule.get("labels", {}).get("severity", "")
        # The forwarded daemon alerts keep the daemon's own severity label.
        assert severity in SEVERITIES or severity == "{{ $labels.severity }}", name
        annotations = rule.get("annotations", {})
        # The forwarded daemon alerts also carry the daemon's suggested command and its undo.
        advice = {"suggested_command", "undo_command"} if name == "AMDGPUDaemonAlert" else set()
        assert set(annotations) == {"summary", "description", "runbook_url"} | advice, name
        for key in ("summary", "description"):
            text = annotations[key]
            assert len(text.split()) >= 4, f"{name}: {key}"
            assert "{{ or $labels.node $labels.instance }}" in text, f"{name}: {key} does not name the node"
            if name not in NODE_LEVEL_ALERTS:
                assert "$labels.gpu" in text, f"{name}: {key} does not name the device"
        # One configurable prefix (docs/runbooks.md explains it) and a section that exists.
        assert annotations["runbook_url"] == RUNBOOK_PREFIX + name.lower(), name
        assert name in headings, f"docs/runbooks.md has no section '## {name}'"
    # docs/runbooks.md also holds the health alerts' sections (amdgpu-health.rules.yml, tested in test_health_rules)
    health = {r["alert"] for g in load_yaml(RULES.with_name("amdgpu-health.rules.yml"))["groups"] for r in g["rules"]}
    assert headings == {rule["alert"] for _, rule in alerting_rules()} | health, "runbook sections without an alert"


def test_every_firing_case_carries_the_identifying_labels() -> None:
    """What promtool checks the alerts fire with: node always, and gpu with pci_bus_id for a device
    (docs/alert-labels.md); node-level alerts have no gpu."""
    for path in RULE_TESTS:
        for test in load_yaml(path)["tests"]:
            for case in test.get("alert_rule_test", []):
                for expected in case.get("exp_alerts") or []:
                    labels = expected["exp_labels"]
                    where = f"{path.name}: {case['alertname']} at {case['eval_time']}"
                    assert labels.get("node"), where
                    if case["alertname"] in NODE_LEVEL_ALERTS:
                        assert "gpu" not in labels, where
                    elif "gpu" in labels:
                        assert labels.get("pci_bus_id"), where
                    else:
                        assert case["alertname"] == "AMDGPUDeviceMissing", where  # its after-restart shape


def test_per_device_alerts_join_the_pci_address_and_drop_the_attribution_labels() -> None:
    """Keyed by the GPU: the attribution labels (on every series with the exporter's option) are
    aggregated away, so a new pod or job does not start a new alert and restart its `for:`
    (attribution.yml proves it with promtool); the identity labels come from the recorded series."""
    for _, rule in alerting_rules():
        if rule["alert"] in NODE_LEVEL_ALERTS:
            continue
        assert f"group_left (pci_bus_id) {IDENTITY}" in rule["expr"], rule["alert"]
        assert "amdgpu_device_info" not in rule["expr"].replace(IDENTITY, ""), rule["alert"]
        assert f"max without ({', '.join(ATTRIBUTION_LABELS)}) (" in rule["expr"], rule["alert"]


def test_planned_metrics_are_not_exported_yet() -> None:
    """A planned family the exporter now exports belongs in CONTRACT, with its real labels."""
    from exporter.exposition.metrics import all_metric_names

    landed = set(PLANNED) & set(all_metric_names())
    assert not landed, f"move {sorted(landed)} from PLANNED to CONTRACT"


def test_alerts_wait_before_firing() -> None:
    """A one-minute spike must not page: every alert but the counted-event ones has a `for:`."""
    for _, rule in alerting_rules():
        wait = parse_duration(rule["for"]) if "for" in rule else 0
        if rule["alert"] in EVENT_ALERTS:
            assert re.search(r"\b(increase|rate|min_over_time)\(", rule["expr"]), rule["alert"]
        else:
            assert wait >= MIN_FOR_SECONDS, rule["alert"]
        if rule["labels"]["severity"] == "critical" and rule["alert"] not in EVENT_ALERTS:
            assert wait >= 2 * 60, f"{rule['alert']} pages after a 1-minute spike"


def test_rules_read_only_exported_metrics_and_labels() -> None:
    known = {**CONTRACT, **PLANNED, **PROMETHEUS_SERIES}
    recorded = recorded_names()
    problems = []
    for group in load_rules():
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            for query in rule_queries(rule):
                for selector in selectors(query):
                    if selector.metric in recorded:
                        continue
                    if selector.metric not in known:
                        problems.append(f"{name}: {selector.metric} is not exported")
                        continue
                    labels = known[selector.metric]
                    for label, operator, value in selector.matchers:
                        if label in TARGET_LABELS:
                            continue
                        if label not in labels:
                            problems.append(f"{name}: {selector.metric} has no label {label}")
                            continue
                        allowed = labels[label]
                        if allowed is None or "%" in value:
                            continue
                        if operator == "=" and value not in allowed:
                            problems.append(f"{name}: {selector.metric}{{{label}={value!r}}} never exists")
                        if operator == "=~" and not any(re.fullmatch(value, v) for v in allowed):
                            problems.append(f"{name}: {selector.metric}{{{label}=~{value!r}}} matches nothing")
    assert not problems, problems


def test_promtool_inputs_are_exported_metrics() -> None:
    """The unit tests feed only series the exporter (or Prometheus) really produces."""
    known = set(CONTRACT) | set(PLANNED) | set(PROMETHEUS_SERIES) | recorded_names()
    for path in RULE_TESTS:
        for test in load_yaml(path)["tests"]:
            for series in test.get("input_series", []):
                assert series_name(series["series"]) in known, f"{path.name}: {series['series']}"


def test_recording_rules_an_alert_needs_come_first_in_its_group() -> None:
    recorded = recorded_names()
    for group in load_rules():
        defined: set[str] = set(READ_ACROSS_GROUPS)
        for rule in group["rules"]:
            if "record" in rule:
                defined.add(rule["record"])
                continue
            for selector in selectors(rule["expr"]):
                if selector.metric in recorded:
                    assert selector.metric in defined, f"{rule['alert']} reads {selector.metric} across groups"


def test_series_read_across_groups_are_recorded_in_a_group_of_their_own() -> None:
    """What READ_ACROSS_GROUPS names exists, and no alert sits in the group that records it."""
    for name in READ_ACROSS_GROUPS:
        [group] = [g for g in load_rules() if any(r.get("record") == name for r in g["rules"])]
        assert not [r for r in group["rules"] if "alert" in r], group["name"]


def test_promtool_tests_evaluate_the_groups_in_the_rule_files_order() -> None:
    """promtool evaluates groups in an undefined order unless told: the identity group, whose
    series every per-device alert reads, must run first, as after a real first cycle."""
    names = [group["name"] for group in load_rules()]
    assert names[0] == "amdgpu-identity"
    for path in RULE_TESTS:
        assert load_yaml(path).get("group_eval_order") == names, path.name


def test_recorded_aggregates_follow_the_naming_convention() -> None:
    """level:metric:operations (Prometheus's convention): the level names the labels kept, the
    metric is the project's (amdgpu_), and per-GPU attribution never survives a node aggregate."""
    for group in load_rules():
        for rule in group["rules"]:
            if "record" not in rule:
                continue
            name = rule["record"]
            level, metric, operations = name.split(":")
            assert level and operations, name
            assert metric.startswith("amdgpu_") and not metric.endswith("_total"), name
            by_holder = any(label in level for label in ATTRIBUTION_LABELS)  # per namespace, per user
            if level.startswith(("instance", "node")) and not by_holder:
                expr = " ".join(rule["expr"].split())
                aggregates = re.findall(r"\b(?:sum|max|min|avg|count)\s+without\s*\(([^)]*)\)", expr)
                for kept in aggregates:
                    dropped = {label.strip() for label in kept.split(",")}
                    if "gpu" in dropped:
                        assert set(ATTRIBUTION_LABELS) <= dropped, name


def test_promql_reader_finds_selectors_not_functions_or_clauses() -> None:
    """The name check above is only as good as this reader."""
    expr = (
        'sum without (gpu) (rate(amdgpu_energy_joules_total{gpu=~"0|1"}[5m] offset 1h)) '
        "* on (instance, job, gpu) group_left (package) amdgpu_device_info "
        '> 1e9 and label_replace(up{job="a{b}"}, "x", "$1", "y", "(.*)") or vector(1)'
    )
    found = selectors(expr)
    assert [s.metric for s in found] == ["amdgpu_energy_joules_total", "amdgpu_device_info", "up"]
    assert found[0].matchers == (("gpu", "=~", "0|1"),)
    assert found[2].matchers == (("job", "=", "a{b}"),)
    queries = annotation_queries(
        {"d": '{{ with printf "amdgpu_device_info{instance=%q,gpu=%q}" $labels.instance $labels.gpu | query }}'}
    )
    assert queries == ['amdgpu_device_info{instance="%q",gpu="%q"}']
    [selector] = selectors(queries[0])
    assert selector == Selector("amdgpu_device_info", (("instance", "=", "%q"), ("gpu", "=", "%q")))


def test_contract_names_are_the_exporters_metric_table() -> None:
    """The label contract above must name exactly the families the exporter's table exports."""
    from exporter.exposition.metrics import all_metric_names

    contract_families = {name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for name in CONTRACT}
    assert contract_families <= set(all_metric_names())
    missing = set(all_metric_names()) - contract_families
    web_only = {  # the HTTP layer's own families (only with --web.config.file), not in the alert contract
        "amdgpu_exporter_web_config_last_reload_successful",
        "amdgpu_exporter_http_rejections_total",
        "amdgpu_exporter_http_connections",
        "amdgpu_exporter_http_max_connections",
    }
    assert missing <= web_only, missing


# --- every target gets its node label (real Prometheus) ---------------------------------

README = REPO / "README.md"
SERVICE_MONITOR = REPO / "deploy" / "kubernetes" / "servicemonitor.yaml"
_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def readme_scrape_config() -> dict[str, Any]:
    """The scrape config the README's Prometheus section shows (its first yaml block)."""
    section = README.read_text(encoding="utf-8").split("## With Prometheus, Alertmanager and Grafana", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    assert block, "no yaml block in the README's Prometheus section"
    [job] = yaml.safe_load(textwrap.dedent(block.group(1)))["scrape_configs"]
    return dict(job)


def service_monitor_relabel_configs() -> list[dict[str, Any]]:
    """The ServiceMonitor's relabelings as Prometheus relabel_configs (the Operator's translation)."""
    [endpoint] = yaml.safe_load(SERVICE_MONITOR.read_text())["spec"]["endpoints"]
    return [{_RELABEL_KEYS.get(k, k): v for k, v in rule.items()} for rule in endpoint["relabelings"]]


def test_scrape_configs_give_every_target_its_node(tmp_path: Path) -> None:
    """Real Prometheus applies the README's scrape config and the ServiceMonitor's relabelings; the
    targets' labels are read back from its API (no scrape needs to succeed)."""
    prometheus = require_tool("prometheus")
    # What the Prometheus Operator's endpoints discovery gives a DaemonSet pod's endpoint, with the
    # target labels the Operator itself adds before the ServiceMonitor's relabelings run.
    kubernetes_target = {
        "targets": ["10.42.7.19:9442"],
        "labels": {
            "__meta_kubernetes_endpoint_node_name": "gpu-node-7",
            "__meta_kubernetes_pod_node_name": "gpu-node-7",
            "__meta_kubernetes_pod_name": "amdgpu-exporter-x2k9q",
            "__meta_kubernetes_namespace": "amdgpu-exporter",
            "namespace": "amdgpu-exporter",
            "pod": "amdgpu-exporter-x2k9q",
            "container": "amdgpu-exporter",
            "service": "amdgpu-exporter",
            "endpoint": "metrics",
        },
    }
    (tmp_path / "kubernetes.json").write_text(json.dumps([kubernetes_target]))
    readme_job = readme_scrape_config()
    config = {
        "global": {"scrape_interval": "1h"},
        "scrape_configs": [
            readme_job,
            {
                "job_name": "servicemonitor",
                "file_sd_configs": [{"files": [str(tmp_path / "kubernetes.json")]}],
                "relabel_configs": service_monitor_relabel_configs(),
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        expected_count = sum(len(group["targets"]) for group in readme_job["static_configs"]) + 1
        deadline = time.monotonic() + 30
        targets: list[dict[str, Any]] = []
        while len(targets) < expected_count:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, f"targets: {targets}\n{(tmp_path / 'prometheus.log').read_text()}"
            time.sleep(0.2)
            url = f"http://127.0.0.1:{port}/api/v1/targets"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
                targets = json.load(response)["data"]["activeTargets"]
        node_of = {t["labels"]["instance"]: t["labels"].get("node") for t in targets}
        # README: node from the host name, or the label set on an address.
        assert node_of["gpu-node-1:9442"] == "gpu-node-1"
        assert node_of["gpu-node-2:9442"] == "gpu-node-2"
        assert node_of["10.0.0.3:9442"] == "gpu-node-3"
        readme_targets = [t for t in targets if t["scrapePool"] == readme_job["job_name"]]
        assert {t["labels"]["job"] for t in readme_targets} == {"amdgpu-exporter"}
        # ServiceMonitor: the node, the exporter's pod aside, pod/namespace/container free.
        [kubernetes] = [t["labels"] for t in targets if t["scrapePool"] == "servicemonitor"]
        assert kubernetes["node"] == "gpu-node-7"
        assert kubernetes["exporter_pod"] == "amdgpu-exporter-x2k9q"
        assert kubernetes["exporter_namespace"] == "amdgpu-exporter"
        assert not {"pod", "namespace", "container"} & set(kubernetes), kubernetes
    finally:
        process.terminate()
        process.wait(timeout=20)
