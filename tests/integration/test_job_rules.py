"""deploy/prometheus/amdgpu-jobs.rules.yml through the real promtool: the rules load, their unit tests
(deploy/prometheus/tests/jobs/: the daemon's split of a shared package, a shared GPU, a pod) pass, and
they read only families the exporter serves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from exporter.exposition.metrics import all_metric_names
from tests.realtools import require_tool

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "amdgpu-jobs.rules.yml"
TESTS = sorted((REPO / "deploy" / "prometheus" / "tests" / "jobs").glob("*.yml"))


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_accepts_the_job_rules_and_their_unit_tests_pass() -> None:
    result = run([require_tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    assert TESTS
    for path in TESTS:
        result = run([require_tool("promtool"), "test", "rules", path.name], cwd=path.parent)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_job_rules_read_only_served_families() -> None:
    served = set(all_metric_names())
    text = RULES.read_text()
    recorded = set(re.findall(r"record: (\S+)", text))
    for name in set(re.findall(r"(?<![:\w])amdgpu_[a-z0-9_]+", text)):
        assert name in served, f"{name} is not a family the exporter serves"
    assert "instance_job_id:amdgpu_energy_joules:rate5m" in recorded
    assert "instance_namespace_pod:amdgpu_energy_joules:rate5m" in recorded
