"""Alerting end to end with the real servers, and the delay from a thermal crossing to the page.

One stack (deploy/demo/demo_stack.py's Stack, the one `make demo-stack` runs), all on 127.0.0.1 with its
data in a temporary folder:

    amdgpu-exporter --demo (4 x MI250X, thermal excursion on GCD 3)
      |-- scraped every 1 s by Debian's prometheus, evaluating deploy/prometheus/amdgpu-exporter.rules.yml
      |     every 1 s -> AMDGPUDaemonAlert --------------------------------------------.
      '-- --alertmanager.url: pushes its own GpuJunctionTemperatureHigh -----------------+-> prometheus-alertmanager
                                                                                         (shipped routing tree)
                                                                                          -> webhook in this test

Both paths run at once from one exporter; their alerts differ by alertname and instance, so Alertmanager
keeps them apart (in production one would use one path or the other). The pages must name GPU 3 and carry
the clock-down suggestion.

Shortened `for:`: the shipped in-daemon rule waits 60 s and the shipped AMDGPUDaemonAlert 1 m, so one
page would take over two minutes. The stack runs copies, written into the temp dir by demo_stack, with
those two `for:` durations 30x shorter (2 s each); thresholds, expressions, labels, annotations and the
routing are the shipped ones. Alertmanager's group_wait is 100 ms here instead of the shipped 30 s.

The crossing is read from the simulator itself (--demo.truth-file: the true junction temperature of
each tick, with the tick's wall time); the page time is when the webhook got the notification. Both
delays are printed (pytest -s) and written to stderr.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from exporter.alerting.rulefile import default_rules, load_rules
from exporter.alerting.rules import Rule
from tests.realtools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
HOT_GPU = 3  # not GCD 0, so a page naming the wrong GPU (or every GPU) shows
# The excursion starts 6 s after the exporter; the junction passes 85 °C about 8 s later and stays hot
# for the rest of the test.
SCENARIO = f"thermal-excursion:start=6,hot=90,gpus={HOT_GPU}"
FOR_SCALE = 1 / 30
PAGE_TIMEOUT_S = 60.0


def load_demo_stack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_stack", ROOT / "deploy" / "demo" / "demo_stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


demo = load_demo_stack()


# ------------------------------------------------------------------------------- the simulator's truth


@dataclass(frozen=True)
class Tick:
    elapsed: float  # simulator seconds since it started
    wall: float  # time.time() when the tick's files were written
    junction: float  # °C of the watched GCD


class TruthWatcher:
    """Reads the simulator's truth file every 50 ms (it is rewritten once a tick, atomically) and keeps
    the junction temperature of one GCD for every tick seen."""

    def __init__(self, path: Path, gpu: int) -> None:
        self.path, self.gpu = path, gpu
        self.ticks: list[Tick] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="truth-watcher", daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            try:
                truth = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # not written yet
            if self.ticks and truth["elapsed"] == self.ticks[-1].elapsed:
                continue
            (device,) = [d for d in truth["devices"] if d["gpu"] == self.gpu]
            sample = device["sample"]
            self.ticks.append(Tick(truth["elapsed"], sample["timestamp"], sample["temperatures"]["junction"]))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def crossing(self, rule: Rule) -> tuple[Tick, Tick] | None:
        """(last tick not breaching the rule, first tick breaching it), once the crossing was seen."""
        for before, after in zip(self.ticks, self.ticks[1:], strict=False):
            if not rule.breaches(before.junction) and rule.breaches(after.junction):
                return before, after
        return None


# ------------------------------------------------------------------------------------------- the stack


@dataclass
class Run:
    stack: Any  # demo_stack.Stack
    truth: TruthWatcher
    page_log: io.StringIO
    daemon_rule: Rule  # the rule the exporter runs (the shipped one, `for` shortened)
    prometheus_for: float  # seconds, AMDGPUDaemonAlert in the rules Prometheus runs

    def wait_for_page(self, alertname: str, instance: str) -> Any:
        """The first firing notification of this alert from this instance (a demo_stack.Page)."""
        receiver = self.stack.receiver

        def pages() -> list[Any]:
            return [p for p in receiver.received(alertname=alertname, instance=instance) if p.status == "firing"]

        wait_until(lambda: pages() or self.stack.exited(), PAGE_TIMEOUT_S, f"a page of {alertname} from {instance}")
        exited = self.stack.exited()
        if exited:
            pytest.fail(f"{exited} exited:\n{self.stack.log_tail(exited)}")
        return pages()[0]

    def crossing(self) -> tuple[Tick, Tick]:
        seen = self.truth.crossing(self.daemon_rule)
        assert seen is not None, f"the simulator's truth never crossed {self.daemon_rule.threshold}: {self.truth.ticks}"
        before, after = seen
        # Ticks are 1 s apart: a longer gap means the watcher missed ticks and the crossing time is vague.
        assert after.elapsed - before.elapsed < 2.5, f"truth ticks missed around the crossing: {before}, {after}"
        return before, after

    def truth_device(self) -> dict[str, Any]:
        truth = json.loads(self.truth.path.read_text(encoding="utf-8"))
        (device,) = [d for d in truth["devices"] if d["gpu"] == HOT_GPU]
        return dict(device)


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prometheus = require_tool(demo.PROMETHEUS)
    alertmanager = require_tool(demo.ALERTMANAGER)
    exporter = Path(sys.executable).parent / "amdgpu-exporter"
    assert exporter.exists(), f"{exporter} is missing: pip install -e . into the venv"
    workdir = tmp_path_factory.mktemp("alerting-e2e")
    truth_file = workdir / "truth.json"
    page_log = io.StringIO()
    config = demo.StackConfig(
        workdir=workdir,
        exporter=str(exporter),
        prometheus=prometheus,
        alertmanager=alertmanager,
        fleet="4xMI250X",
        scenario=SCENARIO,
        interval="1s",
        for_scale=FOR_SCALE,
        push=True,
        group_wait="100ms",
        group_interval="1s",
        exporter_args=(f"--demo.truth-file={truth_file}",),
        page_log=page_log,
    )
    stack = demo.Stack(config)
    truth = TruthWatcher(truth_file, HOT_GPU)
    truth.start()
    try:
        stack.start()
        (daemon_rule,) = load_rules(stack.files["daemon_rules"])
        prometheus_rules = stack.files["prometheus_rules"].read_text(encoding="utf-8")
        prometheus_for = demo.duration_seconds(
            next(
                rule["for"]
                for group in demo.yaml.safe_load(prometheus_rules)["groups"]
                for rule in group["rules"]
                if rule.get("alert") == "AMDGPUDaemonAlert"
            )
        )
        yield Run(stack, truth, page_log, daemon_rule, prometheus_for)
    finally:
        truth.stop()
        stack.stop()


def report(path: str, run: Run, page: Any, for_seconds: float, route: str) -> float:
    """Print and return the delay from the crossing to the page."""
    before, after = run.crossing()
    delay = page.received_at - after.wall
    line = (
        f"\ncrossing-to-page delay, {path}: {delay:.2f} s "
        f"(GPU {HOT_GPU} junction {before.junction:g} -> {after.junction:g} °C at simulator t={after.elapsed:.1f} s; "
        f"for-durations {for_seconds:g} s; polling, {route}: {delay - for_seconds:.2f} s)"
    )
    print(line, file=sys.stderr, flush=True)
    return delay


# ----------------------------------------------------------------------------------------------- tests


def test_the_stack_runs_the_shipped_rules_with_only_the_for_durations_shortened(run: Run) -> None:
    shipped = default_rules()[0]
    assert run.daemon_rule.alert == shipped.alert and run.daemon_rule.threshold == shipped.threshold
    assert run.daemon_rule.clock_down == shipped.clock_down  # the same 5 % step every 60 s
    assert run.daemon_rule.for_seconds == pytest.approx(shipped.for_seconds * FOR_SCALE)
    assert run.prometheus_for == pytest.approx(60 * FOR_SCALE)
    # Prometheus loaded every group of the shipped file, and nothing failed to evaluate.
    shipped_groups = [g["name"] for g in demo.yaml.safe_load(demo.PROMETHEUS_RULES.read_text())["groups"]]
    loaded = httpx.get(f"{run.stack.prometheus_url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert sorted(g["name"] for g in loaded) == sorted(shipped_groups)
    broken = [(r["name"], r["lastError"]) for g in loaded for r in g["rules"] if r.get("health") == "err"]
    assert not broken


def test_prometheus_path_pages_the_hot_gpu_with_the_clock_down_suggestion(run: Run) -> None:
    stack = run.stack
    page = run.wait_for_page("AMDGPUDaemonAlert", stack.scrape_instance)
    labels, annotations = page.labels, page.annotations
    assert labels["gpu"] == str(HOT_GPU)
    assert labels["alert"] == run.daemon_rule.alert
    assert labels["severity"] == run.daemon_rule.severity
    assert labels["job"] == demo.SCRAPE_JOB
    # The shipped routing decides the receiver: ask the real amtool what it routes these labels to.
    routed = subprocess.run(
        [require_tool("amtool"), "config", "routes", "test", f"--config.file={stack.files['alertmanager']}"]
        + [f"{k}={v}" for k, v in labels.items()],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert page.receiver == routed.stdout.strip()

    # The description carries the exporter's suggestion: one 5 % step below the GPU's own gfx clock max.
    device = run.truth_device()
    clock_down = run.daemon_rule.clock_down
    assert clock_down is not None
    ceiling_hertz = device["sample"]["clocks_max_hertz"]["gfx"] * (1 - clock_down.step_ratio)
    humanized = f"{ceiling_hertz / 1e9:.4g}G"  # Prometheus's humanize: %.4g with an SI prefix
    assert f"Suggested gfx clock ceiling: {humanized}Hz ({clock_down.step_ratio * 100:g}% below the maximum)" in (
        " ".join(annotations["description"].split())
    )
    assert annotations["summary"] == f"GPU {HOT_GPU} on {stack.scrape_instance} fires {run.daemon_rule.alert}"
    assert "--setsrange" in annotations["runbook"]
    # Only the hot GCD pages; the other seven stay below the threshold.
    paged = {p.labels["gpu"] for p in stack.receiver.received(alertname="AMDGPUDaemonAlert")}
    assert paged == {str(HOT_GPU)}
    assert f"PAGE FIRING AMDGPUDaemonAlert gpu={HOT_GPU} severity=warning" in run.page_log.getvalue()

    for_seconds = run.daemon_rule.for_seconds + run.prometheus_for
    delay = report("through Prometheus", run, page, for_seconds, "scrape, evaluation, Alertmanager")
    # Nothing can page before both for-durations ran (0.1 s: the truth's tick time is taken after its writes).
    assert delay >= for_seconds - 0.1


def test_direct_push_pages_the_hot_gpu_with_the_clock_down_suggestion(run: Run) -> None:
    stack = run.stack
    page = run.wait_for_page(run.daemon_rule.alert, stack.push_instance)
    labels, annotations = page.labels, page.annotations
    device = run.truth_device()
    identity = device["identity"]
    assert labels["gpu"] == str(HOT_GPU)
    assert labels["severity"] == run.daemon_rule.severity
    assert labels["pci_bus_id"] == identity["pci_bus_id"]
    assert labels["serial"] == identity["serial"]
    assert labels["die"] == str(identity["die"])
    assert "job" not in labels  # it did not come through Prometheus
    assert annotations["summary"].startswith(f"GPU {HOT_GPU} junction temperature ")

    # The suggestion is the one /api/v1/alerts shows, and its command sets the ceiling one step down.
    clock_down = run.daemon_rule.clock_down
    assert clock_down is not None
    command = annotations["suggested_command"]
    ceiling_mhz = device["sample"]["clocks_max_hertz"]["gfx"] * (1 - clock_down.step_ratio) / 1e6
    assert command.endswith(f" --setsrange {clock_down.range_min_hertz / 1e6:g} {ceiling_mhz:g}"), command
    alerts = httpx.get(f"{stack.exporter_url}/api/v1/alerts", timeout=5).json()["alerts"]
    (api_alert,) = [a for a in alerts if a["gpu"] == HOT_GPU and a["alert"] == run.daemon_rule.alert]
    assert api_alert["firing"] and api_alert["suggested_command"] == command
    paged = {p.labels["gpu"] for p in stack.receiver.received(alertname=run.daemon_rule.alert)}
    assert paged == {str(HOT_GPU)}

    delay = report("direct push", run, page, run.daemon_rule.for_seconds, "push, Alertmanager")
    assert delay >= run.daemon_rule.for_seconds - 0.1


# ------------------------------------------------------------------------------ the demo-stack command


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_demo_stack_command_serves_everything_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    require_tool(demo.PROMETHEUS)
    require_tool(demo.ALERTMANAGER)
    ports = {name: demo.free_port() for name in ("exporter", "prometheus", "alertmanager", "receiver")}
    argv = [sys.executable, str(ROOT / "deploy" / "demo" / "demo_stack.py"), f"--workdir={tmp_path}"]
    argv += [f"--{name}-port={port}" for name, port in ports.items()]
    # Its own process group, like a shell job: Ctrl-C in a terminal signals the whole group.
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    output: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:  # the banner ends with the ready line
            output.append(line)
            if "demo stack ready" in line:
                break
        banner = "".join(output)
        assert "demo stack ready" in banner, banner
        for name, path in (("exporter", "/readyz"), ("prometheus", "/-/ready"), ("alertmanager", "/-/ready")):
            assert f"127.0.0.1:{ports[name]}/" in banner
            assert httpx.get(f"http://127.0.0.1:{ports[name]}{path}", timeout=5).status_code == 200, name
        assert httpx.get(f"http://127.0.0.1:{ports['receiver']}/", timeout=5).json() == []  # no page yet
        # Without --fast: the shipped rule files as they are.
        assert demo.yaml.safe_load((tmp_path / "prometheus.yml").read_text())["rule_files"] == [
            str(demo.PROMETHEUS_RULES)
        ]
        assert not (tmp_path / "daemon-rules.yaml").exists()

        os.killpg(process.pid, signal.SIGINT)
        rest, _ = process.communicate(timeout=20)
        assert process.returncode == 0, banner + rest
        assert "stopped" in rest
        assert not [name for name, port in ports.items() if listening(port)]
    finally:
        # The group we started: the script and any server it left behind (none, when it works).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)
