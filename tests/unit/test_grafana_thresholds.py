"""grafana/builder/thresholds.py: the dashboards' colour levels come from the shipped rule files."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grafana import builder
from grafana.builder import thresholds
from grafana.builder.thresholds import RulesError

ROOT = Path(__file__).resolve().parents[2]


def shipped(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def write(path: Path, document: Any) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def prometheus_alert(document: Any, name: str) -> dict[str, Any]:
    (rule,) = [r for g in document["groups"] for r in g["rules"] if r.get("alert") == name]
    return dict(rule)


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            yield panel


def test_the_shipped_rules_give_the_levels_their_alerts_state() -> None:
    daemon = shipped(thresholds.DAEMON_RULES)
    (junction,) = [r for r in daemon["rules"] if r["alert"] == "GpuJunctionTemperatureHigh"]
    levels = thresholds.load()
    assert levels.junction_hot_celsius == junction["threshold"]
    assert levels.junction_cool_celsius == junction["clear_threshold"]
    prometheus = shipped(thresholds.PROMETHEUS_RULES)
    assert f"> {levels.stale_after_seconds:g}" in prometheus_alert(prometheus, "AMDGPUSamplesStale")["expr"]
    assert f">= {levels.power_at_cap_ratio:g} *" in prometheus_alert(prometheus, "AMDGPUPowerAtCap")["expr"]


@pytest.fixture
def rules(tmp_path: Path) -> tuple[Any, Any, Path, Path]:
    """Editable copies of both shipped rule files and the paths to write them to."""
    return (
        shipped(thresholds.DAEMON_RULES),
        shipped(thresholds.PROMETHEUS_RULES),
        tmp_path / "daemon.yaml",
        tmp_path / "prometheus.yml",
    )


def test_changed_rules_change_every_temperature_panel_and_the_stale_default(rules: tuple[Any, Any, Path, Path]) -> None:
    daemon, prometheus, daemon_path, prometheus_path = rules
    daemon["rules"][0] |= {"threshold": 91, "clear_threshold": 86.5}
    stale = prometheus_alert(prometheus, "AMDGPUSamplesStale")
    for group in prometheus["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "AMDGPUSamplesStale":
                rule["expr"] = stale["expr"].replace("> 60", "> 120")
    levels = thresholds.load(write(daemon_path, daemon), write(prometheus_path, prometheus))
    assert (levels.junction_hot_celsius, levels.junction_cool_celsius, levels.stale_after_seconds) == (91, 86.5, 120)

    generated = builder.dashboards(levels)
    celsius_panels = [
        p for d in generated.values() for p in panels(d) if p["fieldConfig"]["defaults"]["unit"] == "celsius"
    ]
    assert len(celsius_panels) >= 5
    for panel in celsius_panels:
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[1:] == [{"color": "orange", "value": 86.5}, {"color": "red", "value": 91}], panel["title"]
    described = [p["description"] for p in celsius_panels if "°C" in p["description"]]
    assert described and all("91 °C" in text and "85" not in text for text in described)
    (variable,) = [v for v in generated["amdgpu-fleet.json"]["templating"]["list"] if v["name"] == "stale_after"]
    assert variable["query"] == variable["current"]["value"] == "120"


def test_a_renamed_alert_is_found_by_its_expression(rules: tuple[Any, Any, Path, Path]) -> None:
    daemon, prometheus, daemon_path, prometheus_path = rules
    daemon["rules"][0]["alert"] = "JunctionHot"
    for group in prometheus["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "AMDGPUSamplesStale":
                rule["alert"] = "AMDGPUDeviceSamplesStale"
                rule["expr"] = "(time() - amdgpu_sample_timestamp_seconds{job='amdgpu-exporter'}) > 90"
            if rule.get("alert") == "AMDGPUPowerAtCap":
                rule["alert"] = "AMDGPUPowerCapped"
                rule["expr"] = "avg_over_time(amdgpu_power_watts[5m]) / (amdgpu_power_cap_watts > 0) >= 0.9"
    levels = thresholds.load(write(daemon_path, daemon), write(prometheus_path, prometheus))
    assert (levels.junction_hot_celsius, levels.stale_after_seconds, levels.power_at_cap_ratio) == (85, 90, 0.9)


def test_a_rule_without_hysteresis_gives_a_single_red_step(rules: tuple[Any, Any, Path, Path]) -> None:
    daemon, prometheus, daemon_path, prometheus_path = rules
    del daemon["rules"][0]["clear_threshold"]
    levels = thresholds.load(write(daemon_path, daemon), write(prometheus_path, prometheus))
    node = builder.dashboards(levels)["amdgpu-node.json"]
    (panel,) = [p for p in panels(node) if p["title"] == "Junction temperature"]
    assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1:] == [{"color": "red", "value": 85}]


def test_a_missing_rule_is_a_one_line_error_naming_the_file(rules: tuple[Any, Any, Path, Path]) -> None:
    daemon, prometheus, daemon_path, prometheus_path = rules
    for group in prometheus["groups"]:
        group["rules"] = [r for r in group["rules"] if r.get("alert") != "AMDGPUSamplesStale"]
    write(daemon_path, daemon)
    write(prometheus_path, prometheus)
    with pytest.raises(RulesError, match=r"prometheus\.yml: no alert AMDGPUSamplesStale nor any alert of the form"):
        thresholds.load(daemon_path, prometheus_path)
    command = [sys.executable, str(ROOT / "grafana" / "build_dashboards.py"), "--check"]
    result = subprocess.run(
        [*command, f"--daemon-rules={daemon_path}", f"--prometheus-rules={prometheus_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "AMDGPUSamplesStale" in result.stderr, result.stderr


def test_unnamed_alerts_that_disagree_are_an_error(rules: tuple[Any, Any, Path, Path]) -> None:
    daemon, prometheus, daemon_path, prometheus_path = rules
    group = prometheus["groups"][0]
    group["rules"] += [
        {"alert": "StaleWarning", "expr": "time() - amdgpu_sample_timestamp_seconds > 60"},
        {"alert": "StaleCritical", "expr": "time() - amdgpu_sample_timestamp_seconds > 300"},
    ]
    for g in prometheus["groups"]:
        g["rules"] = [r for r in g["rules"] if r.get("alert") != "AMDGPUSamplesStale"]
    with pytest.raises(RulesError, match=r"disagree: StaleCritical \(300\), StaleWarning \(60\)"):
        thresholds.load(write(daemon_path, daemon), write(prometheus_path, prometheus))


def test_two_junction_rules_without_the_usual_name_are_an_error(rules: tuple[Any, Any, Path, Path]) -> None:
    daemon, prometheus, daemon_path, prometheus_path = rules
    daemon["rules"][0]["alert"] = "HotA"
    daemon["rules"].append(daemon["rules"][0] | {"alert": "HotB", "threshold": 95})
    with pytest.raises(RulesError, match="found HotA, HotB"):
        thresholds.load(write(daemon_path, daemon), write(prometheus_path, prometheus))


def test_the_generator_check_passes_on_the_committed_json() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "grafana" / "build_dashboards.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
