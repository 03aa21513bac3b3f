"""The health alerts through the real servers: amdgpu-exporter --demo with an uncorrectable ECC fault on
GCD 1, scraped by Debian's prometheus evaluating deploy/prometheus/amdgpu-health.rules.yml, its
alerts routed by the shipped Alertmanager config to a webhook in this test (deploy/demo/demo_stack.py's
Stack, as test_alerting_e2e.py runs it).

The page must name the GPU and the check, go to the critical route, carry the exporter's drain and taint
commands and their undo, and resolve once the check has cleared by its rule (the counter stopped
growing for its window). Shortened: the daemon's window is 8 s (a rule file of the run) and the
alerts' `for:` 30x shorter (1m -> 2s), in copies written into the temp dir; expressions, labels,
annotations and routing are the shipped ones.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.realtools import free_port, require_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
HEALTH_RULES = ROOT / "deploy" / "prometheus" / "amdgpu-health.rules.yml"
# The health alerts join the identity the exporter rules record: Prometheus loads both, as shipped.
EXPORTER_RULES = ROOT / "deploy" / "prometheus" / "amdgpu-exporter.rules.yml"
FAULTY_GPU = "1"  # not 0, so a page naming the wrong GPU shows
SCENARIO = f"training:faults=ecc_ue.{FAULTY_GPU},fault_at=6,fault_for=8"
DAEMON_RULES = "rules: []\nhealth:\n  checks:\n    ecc_uncorrectable: {window: 8s}\n"
PAGE_TIMEOUT_S = 120.0


def load_demo_stack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_stack", ROOT / "deploy" / "demo" / "demo_stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_a_failing_check_pages_with_the_drain_command_and_resolves_when_it_clears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = load_demo_stack()
    demo.free_port = free_port  # the servers bind ports from this pytest-xdist worker's share
    prometheus, alertmanager = require_tool("/usr/bin/prometheus"), require_tool("/usr/bin/prometheus-alertmanager")
    rules = tmp_path / "amdgpu-exporter-and-health.rules.yml"
    health = yaml.safe_load(HEALTH_RULES.read_text())["groups"]
    both = yaml.safe_dump({"groups": yaml.safe_load(EXPORTER_RULES.read_text())["groups"] + health}, sort_keys=False)
    health_alerts = {rule["alert"] for group in health for rule in group["rules"] if "alert" in rule}
    rules.write_text(demo.prometheus_rules_with_scaled_for(both, 1 / 30, health_alerts), encoding="utf-8")
    monkeypatch.setattr(demo, "PROMETHEUS_RULES", rules)  # the rule file the stack's Prometheus loads
    daemon_rules = tmp_path / "daemon-rules.yaml"
    daemon_rules.write_text(DAEMON_RULES, encoding="utf-8")
    config = demo.StackConfig(
        workdir=tmp_path / "stack",
        exporter=str(Path(sys.executable).parent / "amdgpu-exporter"),
        prometheus=prometheus,
        alertmanager=alertmanager,
        fleet="1xMI250X",
        scenario=SCENARIO,
        push=False,
        group_wait="1s",
        group_interval="2s",
        exporter_args=(f"--rules.file={daemon_rules}", "--slow-interval=1s"),
    )
    with demo.Stack(config) as stack:
        wanted = {"alertname": "AMDGPUHealthCheckFailing", "gpu": FAULTY_GPU, "check": "ecc_uncorrectable"}
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while not [p for p in stack.receiver.received(**wanted) if p.status == "resolved"]:
            assert stack.exited() is None, f"{stack.exited()} exited:\n{stack.log_tail(stack.exited())}"
            assert time.monotonic() < deadline, (
                f"no resolved page within {PAGE_TIMEOUT_S} s:\n{stack.log_tail('exporter')}"
            )
            time.sleep(0.2)
        pages = stack.receiver.received(**wanted)
        firing = [p for p in pages if p.status == "firing"]
        assert firing, pages
        page = firing[0]
        assert page.receiver == "gpu-oncall-pager" and page.labels["severity"] == "critical"
        assert page.labels["node"] == stack.node and page.labels["pci_bus_id"]
        notes = page.annotations
        assert notes["summary"].endswith("is not fit: ecc_uncorrectable") and f"GPU {FAULTY_GPU} " in notes["summary"]
        assert " since " in notes["description"] and "/api/v1/health" in notes["description"]
        reason = f"amdgpu-exporter: gpu {FAULTY_GPU}: ecc_uncorrectable"
        assert notes["slurm_command"] == f'scontrol update nodename={stack.node} state=drain reason="{reason}"'
        assert notes["slurm_undo_command"] == f"scontrol update nodename={stack.node} state=resume"
        assert notes["kubernetes_command"] == (
            f"kubectl taint node {stack.node} amd.com/gpu-unhealthy=gpu{FAULTY_GPU}:NoSchedule --overwrite"
        )
        assert notes["kubernetes_undo_command"] == f"kubectl taint node {stack.node} amd.com/gpu-unhealthy:NoSchedule-"
        assert notes["runbook_url"] == "docs/runbooks.md#amdgpuhealthcheckfailing"
        # only the faulty GPU paged
        assert {p.labels["gpu"] for p in stack.receiver.received(alertname="AMDGPUHealthCheckFailing")} == {FAULTY_GPU}
