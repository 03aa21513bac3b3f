"""Alerting end to end with the real servers, and the delay from a thermal crossing to the page.

One stack (deploy/demo/demo_stack.py's Stack, the one `make demo-stack` runs), all on 127.0.0.1 with its
data in a temporary folder:

    amdgpu-exporter --demo (4 x MI250X, thermal excursion on GCD 3)
      |-- scraped every 1 s by Debian's prometheus, evaluating deploy/prometheus/amdgpu-exporter.rules.yml
      |     every 1 s -> AMDGPUDaemonAlert --------------------------------------------.
      '-- --alertmanager.url: pushes its own GpuJunctionTemperatureHigh -----------------+-> prometheus-alertmanager
                                                                                         (shipped routing tree)
                                                                                          -> webhook in this test

With the push on (the demo stack's default) the push is the page and Prometheus's forwarded copy stands
back (its expression drops the alerts of an exporter that pushes and whose posts get through): one
thermal excursion is exactly one notification. A second stack without the push (Prometheus only)
pages through AMDGPUDaemonAlert, with the suggested command and its undo. The pages must name GPU 3
and carry the clock-down suggestion.

Shortened `for:`: the shipped in-daemon rule waits 60 s and the shipped AMDGPUDaemonAlert 1 m, so one
page would take over two minutes. The stack runs copies, written into the temp dir by demo_stack, with
those two `for:` durations 30x shorter (2 s each); thresholds, expressions, labels, annotations and the
routing are the shipped ones. Alertmanager's group_wait is 100 ms here instead of the shipped 30 s.

Beside that stack: the shipped routing in a real Alertmanager with alerts posted as both paths send them
(grouping per node and cause, inhibitions, silences across paths); a second stack where a whole
8-GPU node's cooling fails, which must page once; and a third where one XGMI link goes down.

The crossing is read from the simulator itself (--demo.truth-file: the true junction temperature of
each tick, with the tick's wall time); the page time is when the webhook got the notification. Both
delays are printed (pytest -s) and written to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from exporter.alerting.alertmanager import alert_labels
from exporter.alerting.rulefile import default_rule_file, load_rules
from exporter.alerting.rules import Rule
from exporter.model import AlertState, DeviceIdentity, DeviceState
from tests.harness import free_port, wait_until
from tests.realtools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
HOT_GPU = 3  # not GCD 0, so a page naming the wrong GPU (or every GPU) shows
# The excursion starts 6 s after the exporter; the junction passes 85 °C about 8 s later and stays hot
# for the rest of the test.
SCENARIO = f"thermal-excursion:start=6,hot=90,gpus={HOT_GPU}"
FOR_SCALE = 1 / 30


def load_demo_stack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_stack", ROOT / "deploy" / "demo" / "demo_stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


demo = load_demo_stack()
# The stack's servers bind the ports it picks: under pytest-xdist, from this worker's share.
demo.free_port = free_port


# ------------------------------------------------------------------------------- the simulator's truth


@dataclass(frozen=True)
class Tick:
    tick: int  # the simulator's tick count: consecutive ticks differ by one
    elapsed: float  # simulator seconds since it started
    wall: float  # time.time() when the tick's files were written
    junction: float  # °C of the watched GCD
    gfx_mhz: float  # its gfx clock


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
            if self.ticks and truth["ticks"] == self.ticks[-1].tick:
                continue
            (device,) = [d for d in truth["devices"] if d["gpu"] == self.gpu]
            sample = device["sample"]
            gfx_mhz = sample["clocks_hertz"]["gfx"] / 1e6
            self.ticks.append(
                Tick(truth["ticks"], truth["elapsed"], sample["timestamp"], sample["temperatures"]["junction"], gfx_mhz)
            )

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

        wait_until(lambda: pages() or self.stack.exited(), f"a page of {alertname} from {instance}")
        exited = self.stack.exited()
        if exited:
            pytest.fail(f"{exited} exited:\n{self.stack.log_tail(exited)}")
        return pages()[0]

    def crossing(self) -> tuple[Tick, Tick]:
        seen = self.truth.crossing(self.daemon_rule)
        assert seen is not None, f"the simulator's truth never crossed {self.daemon_rule.threshold}: {self.truth.ticks}"
        before, after = seen
        # Consecutive ticks (a loaded simulator may skip beats, which moves its clock, not the crossing);
        # a tick the watcher missed between them would make the crossing time vague.
        assert after.tick == before.tick + 1, f"truth ticks missed around the crossing: {before}, {after}"
        return before, after

    def api_alert(self) -> dict[str, Any]:
        """The hot GPU's in-daemon alert as /api/v1/alerts shows it."""
        alerts = httpx.get(f"{self.stack.exporter_url}/api/v1/alerts", timeout=5).json()["alerts"]
        (found,) = [a for a in alerts if a["gpu"] == HOT_GPU and a["alert"] == self.daemon_rule.alert]
        return dict(found)

    def truth_device(self) -> dict[str, Any]:
        truth = json.loads(self.truth.path.read_text(encoding="utf-8"))
        (device,) = [d for d in truth["devices"] if d["gpu"] == HOT_GPU]
        return dict(device)


def firing_notifications(stack: Any, alertname: str) -> list[Any]:
    """The webhook notifications (groups sent) that list this alert firing."""
    return [
        n
        for n in stack.receiver.notifications
        if n.status == "firing" and any(a.labels.get("alertname") == alertname for a in n.alerts)
    ]


def quiet_until(since: float, seconds: float) -> None:
    """Wait until `seconds` after the wall time `since`: by then a notification that was going to
    follow the one at `since` has come, so its absence means something."""
    time.sleep(max(0.0, since + seconds - time.time()))


# Alertmanager timings of the stacks below (the shipped routing tree's are 30 s / 5 m).
GROUP_WAIT_S = 0.1
GROUP_INTERVAL_S = 1.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The demo stack as `demo_stack.py --fast` runs it: the exporter pushes, Prometheus forwards."""
    yield from start_run(tmp_path_factory, push=True)


@pytest.fixture(scope="module")
def forwarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The same without the push (`--no-push`): Prometheus's AMDGPUDaemonAlert is the page."""
    yield from start_run(tmp_path_factory, push=False)


def start_run(tmp_path_factory: pytest.TempPathFactory, push: bool) -> Iterator[Run]:
    prometheus = require_tool(demo.PROMETHEUS)
    alertmanager = require_tool(demo.ALERTMANAGER)
    exporter = Path(sys.executable).parent / "amdgpu-exporter"
    assert exporter.exists(), f"{exporter} is missing: pip install -e . into the venv"
    workdir = tmp_path_factory.mktemp("alerting-e2e-push" if push else "alerting-e2e-forwarded")
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
        push=push,
        group_wait=demo.scaled_duration(GROUP_WAIT_S, 1.0),
        group_interval=demo.scaled_duration(GROUP_INTERVAL_S, 1.0),
        exporter_args=(f"--demo.truth-file={truth_file}", "--alerting.clock-tool=rocm-smi"),
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
    shipped = default_rule_file().rules[0]
    assert run.daemon_rule.alert == shipped.alert and run.daemon_rule.threshold == shipped.threshold
    assert shipped.clock_down is not None
    # The same 5 % step every 60 s; the restore advice's hold defaults to `for`, so it is shortened too.
    assert run.daemon_rule.clock_down == dataclasses.replace(
        shipped.clock_down, restore_after_seconds=shipped.clock_down.restore_after_seconds * FOR_SCALE
    )
    assert run.daemon_rule.for_seconds == pytest.approx(shipped.for_seconds * FOR_SCALE)
    assert run.prometheus_for == pytest.approx(60 * FOR_SCALE)
    # Prometheus loaded every group of the shipped file, and nothing failed to evaluate.
    shipped_groups = [g["name"] for g in demo.yaml.safe_load(demo.PROMETHEUS_RULES.read_text())["groups"]]
    loaded = httpx.get(f"{run.stack.prometheus_url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert sorted(g["name"] for g in loaded) == sorted(shipped_groups)
    broken = [(r["name"], r["lastError"]) for g in loaded for r in g["rules"] if r.get("health") == "err"]
    assert not broken


def test_prometheus_path_pages_the_hot_gpu_with_the_clock_down_suggestion(forwarded: Run) -> None:
    run = forwarded
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

    # The description carries the exporter's suggestion, as /api/v1/alerts has it (one step: the next
    # is 60 s away).
    api_alert = run.api_alert()
    ceiling_hertz, ratio = api_alert["suggested_gfx_clock_max_hertz"], api_alert["clock_down_ratio"]
    humanized = f"{ceiling_hertz / 1e9:.4g}G"  # Prometheus's humanize: %.4g with an SI prefix
    assert f"Suggested gfx clock ceiling: {humanized}Hz ({ratio * 100:.4g}% below the maximum)" in (
        " ".join(annotations["description"].split())
    )
    # ... and the command and its undo, as the exporter wrote them.
    assert annotations["suggested_command"] == api_alert["suggested_command"]
    assert annotations["suggested_command"].startswith(f"rocm-smi -d {HOT_GPU} --autorespond yes --setsrange 500 ")
    assert annotations["undo_command"] == api_alert["undo_command"] == f"rocm-smi -d {HOT_GPU} --resetclocks"
    # The page names the node (the scrape target's `node` label) and the device by index and PCI address.
    assert labels["node"] == stack.node
    pci_bus_id = run.truth_device()["identity"]["pci_bus_id"]
    assert labels["pci_bus_id"] == pci_bus_id
    assert annotations["summary"] == f"GPU {HOT_GPU} ({pci_bus_id}) on {stack.node} fires {run.daemon_rule.alert}"
    assert annotations["runbook_url"] == "docs/runbooks.md#amdgpudaemonalert"
    # Only the hot GCD pages; the other seven stay below the threshold.
    paged = {p.labels["gpu"] for p in stack.receiver.received(alertname="AMDGPUDaemonAlert")}
    assert paged == {str(HOT_GPU)}
    quiet_until(page.received_at, 2)  # two group_intervals: a second notification would have come
    assert len(firing_notifications(stack, "AMDGPUDaemonAlert")) == 1  # one page on this path
    assert f"PAGE FIRING AMDGPUDaemonAlert node={stack.node} gpu={HOT_GPU} severity=warning" in run.page_log.getvalue()

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
    assert labels["node"] == stack.node and labels["alert"] == run.daemon_rule.alert
    assert labels["sensor"] == "junction"
    assert "job" not in labels  # it did not come through Prometheus
    assert annotations["summary"].startswith(f"GPU {HOT_GPU} ({identity['pci_bus_id']}) on {stack.node}: junction ")
    assert stack.node in annotations["description"]
    assert annotations["runbook_url"] == "docs/runbooks.md#amdgpudaemonalert"  # the Prometheus rules' base

    # The suggestion is the one /api/v1/alerts shows: 5 % below the gfx clock the hot GPU was running
    # (never above it), whole MHz, a command that runs without rocm-smi's prompt, and the one undo.
    clock_down = run.daemon_rule.clock_down
    assert clock_down is not None
    command = annotations["suggested_command"]
    smi_index = int(command.split()[2])
    prefix = f"rocm-smi -d {smi_index} --autorespond yes --setsrange {clock_down.range_min_hertz / 1e6:g} "
    assert command.startswith(prefix), command
    ceiling_mhz = int(command.removeprefix(prefix))
    clocks_seen = {tick.gfx_mhz for tick in run.truth.ticks}
    assert any(ceiling_mhz == int(mhz * (1 - clock_down.step_ratio)) for mhz in clocks_seen), (ceiling_mhz, clocks_seen)
    assert ceiling_mhz <= device["sample"]["clocks_max_hertz"]["gfx"] * (1 - clock_down.step_ratio) / 1e6
    assert annotations["undo_command"] == f"rocm-smi -d {smi_index} --resetclocks"
    api_alert = run.api_alert()
    assert api_alert["firing"] and api_alert["suggested_command"] == command
    assert api_alert["undo_command"] == annotations["undo_command"]
    paged = {p.labels["gpu"] for p in stack.receiver.received(alertname=run.daemon_rule.alert)}
    assert paged == {str(HOT_GPU)}
    quiet_until(page.received_at, 2)
    assert len(firing_notifications(stack, run.daemon_rule.alert)) == 1  # one page on this path

    delay = report("direct push", run, page, run.daemon_rule.for_seconds, "push, Alertmanager")
    assert delay >= run.daemon_rule.for_seconds - 0.1


def prometheus_query(stack: Any, query: str) -> list[dict[str, Any]]:
    reply = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": query}, timeout=5).json()
    assert reply["status"] == "success", reply
    return list(reply["data"]["result"])


def test_one_thermal_excursion_is_one_notification(run: Run) -> None:
    """The demo stack with the push on: the exporter's push pages, Prometheus's forwarded copy stands back."""
    stack = run.stack
    page = run.wait_for_page(run.daemon_rule.alert, stack.push_instance)
    hot = f'gpu="{HOT_GPU}"'
    # Prometheus sees the in-daemon alert firing and that the exporter pushes with no failed post.
    wait_until(
        lambda: prometheus_query(stack, f"amdgpu_alert_firing{{{hot}}} == 1"), "amdgpu_alert_firing in Prometheus"
    )
    seen_firing_at = time.time()
    [failed] = prometheus_query(stack, 'amdgpu_exporter_alertmanager_notifications_total{result="failed"}')
    assert failed["value"][1] == "0"
    # Were the forwarded copy going to page, it would fire one for: after Prometheus saw the series
    # (plus one evaluation interval), reach Alertmanager at once and be sent group_wait later. The
    # margin (1 s plus another evaluation) covers the scrape and the webhook's own delivery.
    interval = demo.duration_seconds(stack.config.interval)
    margin = 1.0 + interval
    quiet_until(seen_firing_at, run.prometheus_for + interval + GROUP_WAIT_S + margin)
    # The rule ran all along and stood back: nothing pending or firing, no error.
    assert prometheus_query(stack, 'ALERTS{alertname="AMDGPUDaemonAlert"}') == []
    rules = httpx.get(f"{stack.prometheus_url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    [forwarding] = [r for g in rules for r in g["rules"] if r["name"] == "AMDGPUDaemonAlert"]
    assert forwarding["health"] == "ok" and forwarding["state"] == "inactive", forwarding
    # Still hot, and exactly one notification about it reached any receiver: the push, with the command.
    assert prometheus_query(stack, f"amdgpu_alert_firing{{{hot}}} == 1")
    about_the_hot_gpu = [
        n
        for n in stack.receiver.notifications
        if n.status == "firing" and any(a.labels.get("gpu") == str(HOT_GPU) for a in n.alerts)
    ]
    assert len(about_the_hot_gpu) == 1, [(n.receiver, n.group_labels) for n in about_the_hot_gpu]
    [alert] = about_the_hot_gpu[0].alerts
    assert alert.labels["alertname"] == run.daemon_rule.alert and alert.received_at == page.received_at
    assert alert.annotations["suggested_command"] and alert.annotations["undo_command"]


IDENTIFYING_LABELS = ("node", "gpu", "pci_bus_id")  # docs/alert-labels.md


def test_both_paths_page_the_hot_gpu_with_the_same_identifying_labels(run: Run, forwarded: Run) -> None:
    through_prometheus = forwarded.wait_for_page("AMDGPUDaemonAlert", forwarded.stack.scrape_instance)
    pushed_page = run.wait_for_page(run.daemon_rule.alert, run.stack.push_instance)
    assert {k: through_prometheus.labels.get(k) for k in IDENTIFYING_LABELS} == {
        k: pushed_page.labels.get(k) for k in IDENTIFYING_LABELS
    }
    assert pushed_page.labels.get("alert") == through_prometheus.labels["alert"]


# ------------------------------------------------------------------------------ the demo-stack command


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# Ctrl-C in a terminal signals the whole group; `kill -TERM` signals the script alone, which a shell
# started as a background job (`make demo-stack &`, a script) with SIGINT ignored.
@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm-background"])
def test_demo_stack_command_serves_everything_and_stops(tmp_path: Path, stop: str) -> None:
    require_tool(demo.PROMETHEUS)
    require_tool(demo.ALERTMANAGER)
    ports = {name: demo.free_port() for name in ("exporter", "prometheus", "alertmanager", "receiver")}
    argv = [sys.executable, str(ROOT / "deploy" / "demo" / "demo_stack.py"), f"--workdir={tmp_path}"]
    argv += [f"--{name}-port={port}" for name, port in ports.items()]
    # Its own process group, like a shell job.
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if stop == "sigterm-background" else None,
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

        if stop == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=20)
        assert process.returncode == 0, banner + rest
        assert "stopped" in rest
        assert not [name for name, port in ports.items() if listening(port)]
    finally:
        # The group we started: the script and any server it left behind (none, when it works).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)


# --------------------------------------------- the shipped routing in a real Alertmanager, posted alerts
#
# Alerts with the labels of docs/alert-labels.md, posted to Alertmanager's v2 API as the two paths send
# them (Prometheus: + instance, job; the daemon's push: the labels its pusher makes, alert_labels()),
# through the shipped routing tree and inhibitions.


@dataclass
class Routing:
    alertmanager_url: str
    receiver: Any  # demo_stack.PageReceiver

    def post(self, alerts: list[dict[str, Any]]) -> None:
        body = [{"labels": a["labels"], "annotations": a.get("annotations", {})} for a in alerts]
        response = httpx.post(f"{self.alertmanager_url}/api/v2/alerts", json=body, timeout=5)
        assert response.status_code == 200, response.text

    def state(self, **labels: str) -> list[dict[str, Any]]:
        alerts = httpx.get(f"{self.alertmanager_url}/api/v2/alerts", timeout=5).json()
        return [a for a in alerts if all(a["labels"].get(k) == v for k, v in labels.items())]


@pytest.fixture(scope="module")
def routing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routing]:
    alertmanager = require_tool(demo.ALERTMANAGER)
    workdir = tmp_path_factory.mktemp("routing")
    receiver = demo.PageReceiver()
    config = workdir / "alertmanager.yml"
    # group_wait 2 s instead of 30 s; group_interval long, so a group notifies once during a test.
    config.write_text(
        demo.alertmanager_config_for_webhook(demo.ALERTMANAGER_CONFIG.read_text(), receiver.url, "2s", "5m")
    )
    port = demo.free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [
            alertmanager,
            f"--config.file={config}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        wait_until(lambda: _ready(f"{url}/-/ready") or process.poll() is not None, "a ready Alertmanager")
        assert process.poll() is None, (workdir / "alertmanager.log").read_text()
        yield Routing(url, receiver)
    finally:
        process.terminate()
        process.wait(timeout=10)
        receiver.close()


def _ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=1).status_code == 200
    return False


def via_prometheus(alertname: str, node: str, severity: str, gpu: int | None = None, **labels: str) -> dict[str, Any]:
    found = {"alertname": alertname, "node": node, "severity": severity, "job": demo.SCRAPE_JOB}
    found["instance"] = f"10.42.0.{sum(map(ord, node)) % 250}:9442"  # the pod IP: not identity
    if gpu is not None:
        found |= {"gpu": str(gpu), "pci_bus_id": f"0000:{0xC1 + gpu:02x}:00.0"}
    return {"labels": found | labels}


def pushed(rule: str, node: str, severity: str, gpu: int) -> dict[str, Any]:
    """What the daemon's pusher sends for this rule on this GPU of this node (its own label function)."""
    (shipped,) = [r for r in default_rule_file().rules if r.alert == rule]
    state = AlertState(gpu=gpu, alert=rule, severity=severity, firing=True, since=0.0)
    pci_bus_id = f"0000:{0xC1 + gpu:02x}:00.0"
    identity = DeviceIdentity(pci_bus_id=pci_bus_id, card=f"card{gpu}", device_dir="", serial=f"SN{gpu}")
    device = DeviceState(identity=identity, gpu=gpu, sample=None, up=True)
    labels = alert_labels(state, device, node=node, instance=f"{node}-pod:9442", rule=shipped)
    assert {labels["node"], labels["gpu"], labels["pci_bus_id"], labels["alert"]} == {node, str(gpu), pci_bus_id, rule}
    return {"labels": labels}


def notified(routing: Routing, **group: str) -> list[Any]:
    return [
        n
        for n in routing.receiver.notifications
        if n.status == "firing" and all(n.group_labels.get(k) == v for k, v in group.items())
    ]


def test_a_whole_node_cooling_fault_is_one_page_and_silences_its_warnings_on_both_paths(routing: Routing) -> None:
    node = "gpu-node-cooling"
    gpus = range(8)
    critical = [via_prometheus("AMDGPUTemperatureCritical", node, "critical", g, sensor="junction") for g in gpus]
    warnings = [via_prometheus("AMDGPUTemperatureNearCritical", node, "warning", g, sensor="junction") for g in gpus]
    warnings += [
        via_prometheus("AMDGPUDaemonAlert", node, "warning", g, alert="GpuJunctionTemperatureHigh") for g in gpus
    ]
    warnings += [pushed("GpuJunctionTemperatureHigh", node, "warning", g) for g in gpus]
    # Another node's warning on the same GPU index must not be silenced by this node's critical.
    elsewhere = via_prometheus("AMDGPUTemperatureNearCritical", "gpu-node-fine", "warning", 0, sensor="junction")
    posted_at = time.time()
    routing.post([*warnings, elsewhere])
    routing.post(critical)

    wait_until(lambda: notified(routing, node=node), f"a page for {node}")
    quiet_until(posted_at, 4)  # two group_waits: anything else that was going to be sent has been
    pages = notified(routing, node=node)
    assert len(pages) == 1, [(p.receiver, p.group_labels, len(p.alerts)) for p in pages]
    [page] = pages
    assert page.receiver == "gpu-oncall-pager"
    assert page.group_labels == {"node": node, "alertname": "AMDGPUTemperatureCritical"}
    assert sorted(int(a.labels["gpu"]) for a in page.alerts) == list(gpus)
    # Every warning of the node, from either path, is inhibited by its GPU's critical.
    for alert in warnings:
        [state] = routing.state(**alert["labels"])
        assert state["status"]["state"] == "suppressed" and state["status"]["inhibitedBy"], alert["labels"]
    [other] = notified(routing, node="gpu-node-fine")
    assert other.receiver == "gpu-team-email" and len(other.alerts) == 1


def test_a_silence_on_node_and_gpu_matches_both_paths(routing: Routing) -> None:
    node = "gpu-node-silenced"
    alerts = [
        via_prometheus("AMDGPUDaemonAlert", node, "warning", 2, alert="GpuJunctionTemperatureHigh"),
        pushed("GpuJunctionTemperatureHigh", node, "warning", 2),
    ]
    silence = {
        "matchers": [
            {"name": "node", "value": node, "isRegex": False},
            {"name": "gpu", "value": "2", "isRegex": False},
            {"name": "alert", "value": "GpuJunctionTemperatureHigh", "isRegex": False},
        ],
        "startsAt": "2000-01-01T00:00:00Z",
        "endsAt": "2999-01-01T00:00:00Z",
        "createdBy": "test",
        "comment": "fan replacement on GPU 2",
    }
    response = httpx.post(f"{routing.alertmanager_url}/api/v2/silences", json=silence, timeout=5)
    assert response.status_code == 200, response.text
    posted_at = time.time()
    routing.post(alerts)
    wait_until(lambda: all(routing.state(**a["labels"]) for a in alerts), "the posted alerts")
    for alert in alerts:
        [state] = routing.state(**alert["labels"])
        assert state["status"]["state"] == "suppressed" and state["status"]["silencedBy"], alert["labels"]
    quiet_until(posted_at, 3)  # past the group_wait: a page would have been sent
    assert not notified(routing, node=node)


def test_a_node_or_its_exporter_down_silences_its_gpus(routing: Routing) -> None:
    # node A: the exporter is down; what the daemon pushed before stays in Alertmanager until it expires.
    exporter_node, dead_node = "gpu-node-noexporter", "gpu-node-dead"
    exporter_down = via_prometheus("AMDGPUExporterDown", exporter_node, "warning")
    leftovers = [pushed("GpuJunctionTemperatureHigh", exporter_node, "warning", g) for g in (0, 1)]
    # node B: the node itself is down (kube-prometheus's alert carries `node`).
    node_down = {"labels": {"alertname": "KubeNodeNotReady", "node": dead_node, "severity": "warning"}}
    dead_exporter = via_prometheus("AMDGPUExporterDown", dead_node, "warning")
    posted_at = time.time()
    routing.post([exporter_down, *leftovers, node_down, dead_exporter])

    wait_until(lambda: notified(routing, node=dead_node), f"the page for {dead_node}")
    quiet_until(posted_at, 4)
    for target in (*leftovers, dead_exporter):
        [state] = routing.state(**target["labels"])
        assert state["status"]["inhibitedBy"], target["labels"]
    assert [n.group_labels["alertname"] for n in notified(routing, node=exporter_node)] == ["AMDGPUExporterDown"]
    assert [n.group_labels["alertname"] for n in notified(routing, node=dead_node)] == ["KubeNodeNotReady"]


# ------------------------------------------------------- a whole-node cooling fault through the real stack

ALL_GPUS = tuple(range(8))  # an 8 x MI300X node
# Every GPU's cooling fails at once and the junction settles at 99-100 °C, at the MI300X's 100 °C
# critical limit (measured on the simulator): within 3 °C of it, so AMDGPUTemperatureCritical (and
# before it the near-critical warning and the in-daemon 85 °C rule) fires on all eight.
NODE_FAULT = f"thermal-excursion:start=6,hot=300,peak=102,gpus={'+'.join(map(str, ALL_GPUS))}"
NODE_FAULT_ALERTS = ("AMDGPUDaemonAlert", "AMDGPUTemperatureNearCritical", "AMDGPUTemperatureCritical")


def test_a_whole_node_cooling_fault_on_8_gpus_pages_once(tmp_path: Path) -> None:
    """Exporter (simulated 8-GPU node) -> Prometheus with the shipped rules (the `for:` of the thermal
    alerts 30x shorter) -> Alertmanager with the shipped routing (group_wait 3 s instead of 30 s) -> the
    pager webhook: one notification, for the node, listing all eight GPUs; the node's warnings inhibited."""
    config = demo.StackConfig(
        workdir=tmp_path,
        exporter=str(Path(sys.executable).parent / "amdgpu-exporter"),
        prometheus=require_tool(demo.PROMETHEUS),
        alertmanager=require_tool(demo.ALERTMANAGER),
        fleet="8xMI300X",
        scenario=NODE_FAULT,
        for_scale=FOR_SCALE,
        fast_alerts=NODE_FAULT_ALERTS,
        group_wait="3s",
        group_interval="5m",
        push=True,  # the daemon pages its own junction rule too: inhibited across the paths
    )
    with demo.Stack(config) as stack:
        receiver = stack.receiver

        def pages() -> list[Any]:
            return [n for n in receiver.notifications if n.receiver == "gpu-oncall-pager" and n.status == "firing"]

        wait_until(lambda: pages() or stack.exited(), "a page for the node's cooling fault", 90)
        assert not stack.exited(), stack.log_tail(stack.exited())
        quiet_until(pages()[0].received_at, 6)  # two more group_waits: a second page would have been sent by now
        [page] = pages()
        assert page.group_labels == {"node": stack.node, "alertname": "AMDGPUTemperatureCritical"}
        assert sorted(int(a.labels["gpu"]) for a in page.alerts) == list(ALL_GPUS)
        assert {a.labels["node"] for a in page.alerts} == {stack.node}
        assert len({a.labels["pci_bus_id"] for a in page.alerts}) == len(ALL_GPUS)
        assert all(a.annotations["summary"].endswith("is at its junction critical limit") for a in page.alerts)

        # The same GPUs' warnings through Prometheus (near critical) and pushed by the daemon itself (its
        # junction rule; the forwarded copy stands back while the push gets through) are inhibited now:
        # nothing more reaches anyone for this node while the critical holds.
        alerts = httpx.get(f"{stack.alertmanager_url}/api/v2/alerts", timeout=5).json()
        warnings = [a for a in alerts if a["labels"].get("node") == stack.node and a["labels"]["severity"] == "warning"]
        names = {a["labels"]["alertname"] for a in warnings}
        assert (
            names >= {"AMDGPUTemperatureNearCritical", "GpuJunctionTemperatureHigh"}
            and "AMDGPUDaemonAlert" not in names
        )
        loose = [(a["labels"]["alertname"], a["labels"]["gpu"]) for a in warnings if not a["status"]["inhibitedBy"]]
        assert not loose
        assert len(pages()) == 1


def test_an_xgmi_link_going_down_pages_its_gpu_and_not_the_cableless_slot(tmp_path: Path) -> None:
    """8 x MI300X with gpu_metrics v1_7 (per-link status): slot 7 has no peer on any GPU, and GPU 0's
    link 2 goes down 3 s in. Through real Prometheus (AMDGPUXGMILinkDown's `for:` 30x shorter) and
    Alertmanager: one notification for the node, naming GPU 0 and link 2 only."""
    config = demo.StackConfig(
        workdir=tmp_path,
        exporter=str(Path(sys.executable).parent / "amdgpu-exporter"),
        prometheus=require_tool(demo.PROMETHEUS),
        alertmanager=require_tool(demo.ALERTMANAGER),
        fleet="8xMI300X:gpu_metrics=1.7",
        scenario="training:xgmi_down=0.2,down_at=3",
        for_scale=FOR_SCALE,
        fast_alerts=("AMDGPUXGMILinkDown",),
        push=False,
    )
    with demo.Stack(config) as stack:
        receiver = stack.receiver

        def link_pages() -> list[Any]:
            return [
                n
                for n in receiver.notifications
                if n.status == "firing" and n.group_labels.get("alertname") == "AMDGPUXGMILinkDown"
            ]

        wait_until(lambda: link_pages() or stack.exited(), "a page for the XGMI link")
        assert not stack.exited(), stack.log_tail(stack.exited())
        quiet_until(link_pages()[0].received_at, 6)
        [page] = link_pages()
        assert page.group_labels == {"node": stack.node, "alertname": "AMDGPUXGMILinkDown"}
        assert page.receiver == "gpu-team-email"
        [alert] = page.alerts
        assert alert.labels["gpu"] == "0" and alert.labels["pci_bus_id"]
        description = " ".join(alert.annotations["description"].split())
        assert f"GPU 0 ({alert.labels['pci_bus_id']}) on node {stack.node} has 6 XGMI link(s) up" in description
        assert "(down: link 2)" in description
