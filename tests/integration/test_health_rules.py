"""deploy/prometheus/amdgpu-health.rules.yml through the real promtool: the rules load, their unit
tests (deploy/prometheus/tests/health/) pass, and every alert carries what the others do (severity,
summary, description, runbook) and reads only families the exporter serves."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

from exporter.exposition.metrics import all_metric_names
from tests.realtools import require_tool

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "amdgpu-health.rules.yml"
TESTS = sorted((REPO / "deploy" / "prometheus" / "tests" / "health").glob("*.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_health_rules() -> None:
    result = run([require_tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_health_rules_pass() -> None:
    assert TESTS
    for path in TESTS:
        result = run([require_tool("promtool"), "test", "rules", path.name], cwd=path.parent)
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_health_alert_has_severity_texts_and_a_runbook_and_is_tested() -> None:
    runbooks = RUNBOOKS.read_text()
    tested = {test["alertname"] for path in TESTS for case in yaml.safe_load(path.read_text())["tests"]
              for test in case["alert_rule_test"]}  # fmt: skip
    for rule in alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"], name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks.md#{name.lower()}", name
        assert f"\n## {name}\n" in runbooks, f"docs/runbooks.md has no entry for {name}"
        assert name in tested, name


def test_the_health_rules_read_only_served_families() -> None:
    served = set(all_metric_names())
    for rule in alerts():
        text = rule["expr"] + " ".join(rule["annotations"].values())
        for name in set(re.findall(r"\bamdgpu_[a-z0-9_]+", text)):
            assert name in served, f"{rule['alert']} reads {name}, which the exporter does not serve"


NPD = REPO / "deploy" / "kubernetes" / "node-problem-detector"


def test_the_node_problem_detector_monitor_names_its_check_script() -> None:
    import json

    monitor = json.loads((NPD / "amdgpu-health-monitor.json").read_text())
    assert monitor["plugin"] == "custom" and monitor["conditions"][0]["type"] == "AMDGPUUnhealthy"
    (rule,) = monitor["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == "AMDGPUUnhealthy"
    script = NPD / Path(rule["path"]).name
    assert script.is_file() and os.access(script, os.X_OK)
    assert run(["sh", "-n", str(script)]).returncode == 0
