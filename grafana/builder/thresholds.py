"""The numbers the dashboards colour by, read from the rules the project ships.

Temperature colours come from the in-daemon rule set (exporter/alerting/default_rules.yaml): red from the
junction alert's threshold, orange from its clear threshold. The stale-sample age and the
power-at-cap share come from the Prometheus rules (deploy/prometheus/amdgpu-exporter.rules.yml).

Each value is found by its alert's name first; if that name is gone (rules get renamed) the one
alert whose expression has the expected shape is used instead, so a rename keeps working and a
changed number changes the dashboards. A rule that cannot be found, or two that disagree, stop the
build with a one-line error naming the file. The few levels no rule defines are constants below.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _shipped_daemon_rules() -> Path:
    """exporter/alerting/default_rules.yaml, or wherever below exporter/ a restructuring has moved it."""
    usual = ROOT / "exporter" / "alerting" / "default_rules.yaml"
    found = [usual] if usual.exists() else sorted((ROOT / "exporter").glob("**/default_rules.yaml"))
    return found[0] if len(found) == 1 else usual  # none or several: the error names the usual place


DAEMON_RULES = _shipped_daemon_rules()
PROMETHEUS_RULES = ROOT / "deploy" / "prometheus" / "amdgpu-exporter.rules.yml"

# Levels no shipped rule defines: dashboard colours only.
POWER_CAP_WARNING_RATIO = 0.8
VRAM_USED_WARNING_RATIO = 0.9
VRAM_USED_CRITICAL_RATIO = 0.97
RETIRED_PAGES_CRITICAL = 64.0

_NUMBER = r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
_SELECTOR = r"(?:\{[^}]*\})?"


class RulesError(ValueError):
    """A shipped rule file lacks a rule the dashboards take a threshold from."""


@dataclass(frozen=True)
class PrometheusThreshold:
    """A number inside one alert's expression: the alert's usual name and the expression's shape."""

    alert: str
    shapes: tuple[str, ...]  # regular expressions over the whitespace-folded expr; group 1 is the number
    what: str  # for the error message

    def value_in(self, expr: str) -> float | None:
        folded = " ".join(expr.split())
        for shape in self.shapes:
            match = re.search(shape, folded)
            if match:
                return float(match.group(1))
        return None


SAMPLES_STALE = PrometheusThreshold(
    "AMDGPUSamplesStale",
    (rf"time\(\) - amdgpu_sample_timestamp_seconds{_SELECTOR}\)? >=? {_NUMBER}",),
    "time() - amdgpu_sample_timestamp_seconds > N",
)
POWER_AT_CAP = PrometheusThreshold(
    "AMDGPUPowerAtCap",
    (
        rf"amdgpu_power_watts\b.* >=? {_NUMBER} \* \(?amdgpu_power_cap_watts",
        rf"amdgpu_power_watts\b.* / .*amdgpu_power_cap_watts{_SELECTOR}\)*(?: > 0\))? >=? {_NUMBER}",
    ),
    "amdgpu_power_watts >= N * amdgpu_power_cap_watts",
)


@dataclass(frozen=True)
class Thresholds:
    junction_hot_celsius: float  # in-daemon junction alert: fires above this (red)
    junction_cool_celsius: float  # its clear threshold (orange); equal to hot when it has none
    stale_after_seconds: float  # a sample older than this is stale
    power_at_cap_ratio: float  # power at or above this share of the cap counts as at the cap (red)


def load(daemon_rules: Path = DAEMON_RULES, prometheus_rules: Path = PROMETHEUS_RULES) -> Thresholds:
    hot, cool = junction_alert(_read(daemon_rules), daemon_rules)
    alerts = prometheus_alerts(_read(prometheus_rules), prometheus_rules)
    return Thresholds(
        junction_hot_celsius=hot,
        junction_cool_celsius=cool,
        stale_after_seconds=prometheus_threshold(alerts, SAMPLES_STALE, prometheus_rules),
        power_at_cap_ratio=prometheus_threshold(alerts, POWER_AT_CAP, prometheus_rules),
    )


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise RulesError(f"{path}: cannot read rules: {error}") from None


def junction_alert(document: Any, path: Path, name: str = "GpuJunctionTemperatureHigh") -> tuple[float, float]:
    """(threshold, clear threshold) of the in-daemon rule on a high junction temperature."""
    rules = document.get("rules") if isinstance(document, Mapping) else None
    if not isinstance(rules, list):
        raise RulesError(f"{path}: no `rules:` list")
    candidates = [
        rule
        for rule in rules
        if isinstance(rule, Mapping)
        and rule.get("metric") == "temperature_celsius"
        and rule.get("sensor") == "junction"
        and rule.get("comparison") in (">", ">=")
    ]
    named = [rule for rule in candidates if rule.get("alert") == name]
    chosen = named or candidates
    if len(chosen) != 1:
        found = "none" if not chosen else ", ".join(str(rule.get("alert")) for rule in chosen)
        raise RulesError(
            f"{path}: want one rule on metric temperature_celsius, sensor junction, comparison > "
            f"(named {name}); found {found}"
        )
    (rule,) = chosen
    try:
        hot = float(rule["threshold"])
        cool = float(rule.get("clear_threshold", hot))
    except (KeyError, TypeError, ValueError):
        raise RulesError(f"{path}: rule {rule.get('alert')}: threshold and clear_threshold must be numbers") from None
    return hot, cool


def prometheus_alerts(document: Any, path: Path) -> dict[str, str]:
    """Alert name -> expression, over every group."""
    groups = document.get("groups") if isinstance(document, Mapping) else None
    if not isinstance(groups, list):
        raise RulesError(f"{path}: no `groups:` list")
    alerts: dict[str, str] = {}
    for group in groups:
        rules = group.get("rules") if isinstance(group, Mapping) else None
        for rule in rules or ():
            if isinstance(rule, Mapping) and "alert" in rule:
                alerts[str(rule["alert"])] = str(rule.get("expr", ""))
    return alerts


def prometheus_threshold(alerts: Mapping[str, str], wanted: PrometheusThreshold, path: Path) -> float:
    if wanted.alert in alerts:
        value = wanted.value_in(alerts[wanted.alert])
        if value is not None:
            return value
    found = {name: value for name, expr in alerts.items() if (value := wanted.value_in(expr)) is not None}
    if len(set(found.values())) == 1:
        return next(iter(found.values()))
    if not found:
        raise RulesError(f"{path}: no alert {wanted.alert} nor any alert of the form {wanted.what}")
    listed = ", ".join(f"{name} ({value:g})" for name, value in sorted(found.items()))
    raise RulesError(f"{path}: no alert {wanted.alert}, and alerts of the form {wanted.what} disagree: {listed}")


# The field notes' checks (engineers training on MI210/MI250): PCIe bandwidth should reach 80 % of
# the link's theoretical figure, and the junction should swing less than 5 °C during communication
# bursts (the AMDGPUTemperatureSwing alert's level).
PCIE_EFFICIENCY_TARGET_RATIO = 0.8
TEMPERATURE_SWING_LIMIT_CELSIUS = 5.0
