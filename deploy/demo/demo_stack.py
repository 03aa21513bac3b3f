#!/usr/bin/env python3
"""The demo exporter beside a real Prometheus and Alertmanager, so a thermal excursion ends in a page.

    python deploy/demo/demo_stack.py            # or: make demo-stack
    python deploy/demo/demo_stack.py --fast     # the alert's `for:` 30x shorter: pages within ~30 s
    python deploy/demo/demo_stack.py --fleet 8xMI300X \
        --scenario thermal-excursion:start=20,hot=600,peak=102,gpus=0+1+2+3+4+5+6+7
        # a whole node's cooling fails: ~2.5 min later one page (AMDGPUTemperatureCritical) for the node,
        # listing all eight GPUs; their warnings are inhibited

Starts, all on 127.0.0.1 with their data in one temporary folder:
  - amdgpu-exporter --demo with a thermal excursion on one GCD, pushing its own alerts to Alertmanager
    (--alertmanager.url): the one page for the excursion (Prometheus's forwarded AMDGPUDaemonAlert
    stands back while the push gets through; --no-push makes it the page);
  - Debian's prometheus, scraping it every second and evaluating the shipped
    deploy/prometheus/amdgpu-exporter.rules.yml;
  - Debian's prometheus-alertmanager with the shipped deploy/alertmanager/alertmanager.yml routing tree,
    every receiver pointed at
  - a small webhook receiver in this process that prints each page to the terminal.
Ctrl-C, SIGTERM or SIGHUP stops everything. Needs the Debian packages prometheus and prometheus-alertmanager.

Only the standard library and PyYAML: this file does not import the exporter (it runs its command), so
tests/integration/test_alerting_e2e.py can reuse the config generation and the Stack class as they are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_RULES = ROOT / "deploy" / "prometheus" / "amdgpu-exporter.rules.yml"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
DAEMON_RULES = ROOT / "exporter" / "alerting" / "default_rules.yaml"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
# The shipped rules assume this scrape job name (AMDGPUExporterDown selects on it).
SCRAPE_JOB = "amdgpu-exporter"
# Long enough that the GPU is still hot when Prometheus's page arrives with the shipped `for:` (1m + 1m).
DEFAULT_SCENARIO = "thermal-excursion:start=20,hot=600"
FAST_FOR_SCALE = 1 / 30  # 1m -> 2s
# The alerts a thermal excursion is about. Shortening every `for:` would also page on what the long ones
# exist to ignore (AMDGPUTemperatureSwing at 20 s instead of 10 min fires on the warm-up ramp).
FAST_ALERTS = ("AMDGPUDaemonAlert",)
READY_TIMEOUT_S = 30.0

# --------------------------------------------------------------------------------------- durations

_DURATION_UNITS_S = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")


def duration_seconds(value: Any) -> float:
    """A Prometheus duration ("1m", "1h30m", "500ms") or a number of seconds -> seconds; ValueError if neither."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    text = str(value).strip()
    parts = list(_DURATION_PART.finditer(text))
    if not parts or "".join(p.group(0) for p in parts) != text:
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(p.group(1)) * _DURATION_UNITS_S[p.group(2)] for p in parts)


def scaled_duration(value: Any, scale: float) -> str:
    """A duration times `scale`, to the millisecond (at least 1 ms), in a form both Prometheus and the exporter read."""
    milliseconds = max(1, round(duration_seconds(value) * scale * 1000))
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


# ----------------------------------------------------------------------------------- config files


def prometheus_rules_with_scaled_for(rules_text: str, scale: float, alerts: Collection[str] | None = None) -> str:
    """The Prometheus rules file with the `for:` of the named alerts (None: every alert) multiplied by `scale`;
    expressions, labels and annotations untouched. Every group loses its own `interval:` and so runs at
    the stack's evaluation interval: a shipped group runs as often as the `for:` it serves needs (up to
    5 minutes), which a `for:` made 30 times shorter would otherwise wait out."""
    document = yaml.safe_load(rules_text)
    for group in document["groups"]:
        group.pop("interval", None)
        for rule in group["rules"]:
            if "for" in rule and (alerts is None or rule.get("alert") in alerts):
                rule["for"] = scaled_duration(rule["for"], scale)
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000)


def daemon_rules_with_scaled_for(rules_text: str, scale: float) -> str:
    """The exporter's rules file with every rule's `for` multiplied by `scale`.

    A clock_down action's step_interval is kept when the file sets it (so the suggestion stays at one
    step while a short demo or test looks at it); where it defaults to `for` it is pinned to the old `for`.
    """
    document = yaml.safe_load(rules_text)
    for rule in document["rules"]:
        if "for" not in rule:
            continue
        action = rule.get("action")
        if isinstance(action, dict) and "step_interval" not in action:
            action["step_interval"] = scaled_duration(rule["for"], 1.0)
        rule["for"] = scaled_duration(rule["for"], scale)
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000)


def _set_timings(route: dict[str, Any], group_wait: str, group_interval: str, is_root: bool) -> None:
    # A child route inherits the root's timings unless it sets its own, so only override what is set.
    if is_root or "group_wait" in route:
        route["group_wait"] = group_wait
    if is_root or "group_interval" in route:
        route["group_interval"] = group_interval
    for child in route.get("routes", []):
        _set_timings(child, group_wait, group_interval, is_root=False)


def alertmanager_config_for_webhook(config_text: str, webhook_url: str, group_wait: str, group_interval: str) -> str:
    """The shipped Alertmanager config, its routing and inhibition as they are, with every receiver
    replaced by one webhook (`webhook_url`) and the group timings shortened."""
    document = yaml.safe_load(config_text)
    for receiver in document["receivers"]:
        for key in [k for k in receiver if k.endswith("_configs")]:
            del receiver[key]
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    # No mail is sent: the SMTP settings of the example would only point at example.org.
    for key in [k for k in document.get("global", {}) if k.startswith("smtp_")]:
        del document["global"][key]
    _set_timings(document["route"], group_wait, group_interval, is_root=True)
    return yaml.safe_dump(document, sort_keys=False, width=1000)


def prometheus_config(
    exporter: str, alertmanager: str, rules_file: Path, interval: str = "1s", node: str | None = None
) -> str:
    """Prometheus scraping one exporter (host:port) and sending to one Alertmanager (host:port).

    Every alert names its node by the target label `node` (docs/alert-labels.md). The README's scrape
    config takes it from the target's host name; here the target is 127.0.0.1, so it is a static
    label: this machine's host name, the name the exporter's own push uses by default.
    """
    target: dict[str, Any] = {"targets": [exporter], "labels": {"node": node or socket.gethostname()}}
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(rules_file)],
            "alerting": {"alertmanagers": [{"api_version": "v2", "static_configs": [{"targets": [alertmanager]}]}]},
            "scrape_configs": [{"job_name": SCRAPE_JOB, "static_configs": [target]}],
        },
        sort_keys=False,
    )


# --------------------------------------------------------------------------------- page receiver


@dataclass(frozen=True)
class Page:
    """One alert of one notification Alertmanager sent to the webhook."""

    received_at: float  # time.time() when the notification arrived
    receiver: str  # the Alertmanager receiver (route) that sent it
    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]

    @property
    def path(self) -> str:
        """How the alert reached Alertmanager: Prometheus adds the scrape `job` label, the exporter's push does not."""
        return "via Prometheus" if "job" in self.labels else "pushed by the exporter"

    def text(self) -> str:
        at = datetime.fromtimestamp(self.received_at).strftime("%H:%M:%S")
        name = self.labels.get("alertname", "?")
        where = " ".join(f"{k}={self.labels[k]}" for k in ("node", "gpu", "severity", "instance") if k in self.labels)
        lines = [f"{at} PAGE {self.status.upper()} {name} {where} ({self.path}, receiver {self.receiver})"]
        for key in ("summary", "suggestion", "description"):
            value = " ".join(self.annotations.get(key, "").split())
            if value and (key != "description" or "suggestion" not in self.annotations):
                lines.append(f"    {key}: {value}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Notification:
    """One webhook notification: one Alertmanager group (node and cause) and the alerts it lists."""

    received_at: float
    receiver: str
    status: str  # firing | resolved: the group's
    group_key: str
    group_labels: dict[str, str]
    alerts: tuple[Page, ...]


class PageReceiver:
    """An HTTP server taking Alertmanager webhook notifications: records every alert, prints it to `out`."""

    def __init__(self, port: int = 0, out: TextIO | None = None) -> None:
        self.pages: list[Page] = []
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        self._out = out
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received_at = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    receiver.record(received_at, json.loads(body))
                except (ValueError, KeyError, TypeError) as error:
                    self.send_error(400, f"not an Alertmanager notification: {error}")
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                with receiver._lock:
                    body = json.dumps([p.__dict__ for p in receiver.pages], indent=1).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self.server.serve_forever, name="page-receiver", daemon=True)
        self._thread.start()

    def record(self, received_at: float, notification: dict[str, Any]) -> None:
        pages = [
            Page(received_at, notification["receiver"], alert["status"], alert["labels"], alert.get("annotations", {}))
            for alert in notification["alerts"]
        ]
        sent = Notification(
            received_at,
            notification["receiver"],
            notification["status"],
            notification.get("groupKey", ""),
            dict(notification.get("groupLabels", {})),
            tuple(pages),
        )
        with self._lock:
            self.pages.extend(pages)
            self.notifications.append(sent)
            if self._out is not None:
                for page in pages:
                    print(page.text(), file=self._out, flush=True)

    def received(self, **labels: str) -> list[Page]:
        """Pages whose labels include all the given ones, in arrival order."""
        with self._lock:
            return [p for p in self.pages if all(p.labels.get(k) == v for k, v in labels.items())]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_exporter() -> str:
    """amdgpu-exporter beside this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "amdgpu-exporter"
    return str(beside) if beside.exists() else (shutil.which("amdgpu-exporter") or str(beside))


@dataclass
class StackConfig:
    workdir: Path
    exporter: str = field(default_factory=default_exporter)
    prometheus: str = PROMETHEUS
    alertmanager: str = ALERTMANAGER
    fleet: str = "4xMI250X"
    scenario: str = DEFAULT_SCENARIO
    interval: str = "1s"  # exporter poll, Prometheus scrape and rule evaluation
    # 1.0 runs the shipped rules as they are; less shortens the `for:` of the in-daemon rules and of the
    # Prometheus alerts in fast_alerts (None: all), in copies written to workdir.
    for_scale: float = 1.0
    # False: every rule group at the stack's interval, its `for:` kept (a test that runs seconds, not minutes)
    shipped_group_intervals: bool = True
    fast_alerts: tuple[str, ...] | None = FAST_ALERTS
    push: bool = True  # the exporter also pages Alertmanager directly (--alertmanager.url)
    # Long enough for the GPUs of one node that share a fault to land in one notification (shipped: 30 s).
    group_wait: str = "3s"
    group_interval: str = "10s"
    exporter_port: int = 0  # 0: any free port
    prometheus_port: int = 0
    alertmanager_port: int = 0
    receiver_port: int = 0
    exporter_args: tuple[str, ...] = ()
    page_log: TextIO | None = None


class Stack:
    """Receiver, Alertmanager, Prometheus and the demo exporter, started in that order, stopped in reverse."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.workdir = config.workdir
        self.ports = {
            "exporter": config.exporter_port or free_port(),
            "prometheus": config.prometheus_port or free_port(),
            "alertmanager": config.alertmanager_port or free_port(),
        }
        self.exporter_url = f"http://127.0.0.1:{self.ports['exporter']}"
        self.prometheus_url = f"http://127.0.0.1:{self.ports['prometheus']}"
        self.alertmanager_url = f"http://127.0.0.1:{self.ports['alertmanager']}"
        # The `instance` label of what the exporter pushes itself (its host name and port).
        self.push_instance = f"{socket.gethostname()}:{self.ports['exporter']}"
        self.scrape_instance = f"127.0.0.1:{self.ports['exporter']}"
        # The `node` label of every alert on either path (docs/alert-labels.md).
        self.node = socket.gethostname()
        self.receiver: PageReceiver | None = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.exporter_started_at: float | None = None
        self.files: dict[str, Path] = {}

    # Files --------------------------------------------------------------------------------------
    def write_configs(self, receiver_url: str) -> dict[str, Path]:
        c = self.config
        self.workdir.mkdir(parents=True, exist_ok=True)
        files = {
            "alertmanager": self.workdir / "alertmanager.yml",
            "prometheus": self.workdir / "prometheus.yml",
            "prometheus_rules": PROMETHEUS_RULES,
        }
        files["alertmanager"].write_text(
            alertmanager_config_for_webhook(
                ALERTMANAGER_CONFIG.read_text(encoding="utf-8"), receiver_url, c.group_wait, c.group_interval
            ),
            encoding="utf-8",
        )
        files["daemon_rules"] = DAEMON_RULES
        if c.for_scale != 1.0 or not c.shipped_group_intervals:
            files["prometheus_rules"] = self.workdir / "amdgpu-exporter.rules.yml"
            files["prometheus_rules"].write_text(
                prometheus_rules_with_scaled_for(
                    PROMETHEUS_RULES.read_text(encoding="utf-8"), c.for_scale, c.fast_alerts
                ),
                encoding="utf-8",
            )
        if c.for_scale != 1.0:
            files["daemon_rules"] = self.workdir / "daemon-rules.yaml"
            files["daemon_rules"].write_text(
                daemon_rules_with_scaled_for(DAEMON_RULES.read_text(encoding="utf-8"), c.for_scale), encoding="utf-8"
            )
        files["prometheus"].write_text(
            prometheus_config(
                self.scrape_instance,
                f"127.0.0.1:{self.ports['alertmanager']}",
                files["prometheus_rules"],
                c.interval,
                node=self.node,
            ),
            encoding="utf-8",
        )
        return files

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        try:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()  # the child holds its own copy
        self.processes[name] = process
        return process

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, name: str, url: str, timeout: float = READY_TIMEOUT_S) -> None:
        process = self.processes[name]
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready at {url} within {timeout:.0f} s:\n{self.log_tail(name)}")
            time.sleep(0.05)

    # Lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        c = self.config
        self.receiver = PageReceiver(c.receiver_port, c.page_log)
        files = self.files = self.write_configs(self.receiver.url)
        self._start(
            "alertmanager",
            [
                c.alertmanager,
                f"--config.file={files['alertmanager']}",
                f"--storage.path={self.workdir / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['alertmanager']}",
                f"--web.external-url={self.alertmanager_url}/",
                "--cluster.listen-address=",  # no gossip port on 0.0.0.0
                "--log.level=warn",
            ],
        )
        self._start(
            "prometheus",
            [
                c.prometheus,
                f"--config.file={files['prometheus']}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['prometheus']}",
                f"--web.external-url={self.prometheus_url}/",
                "--log.level=warn",
            ],
        )
        self.wait_ready("alertmanager", f"{self.alertmanager_url}/-/ready")
        self.wait_ready("prometheus", f"{self.prometheus_url}/-/ready")
        # Last, so the scenario's clock (it starts with the exporter) runs against servers that are up.
        argv = [
            c.exporter,
            "--demo",
            f"--demo.fleet={c.fleet}",
            f"--demo.scenario={c.scenario}",
            f"--interval={c.interval}",
            f"--web.listen-address={self.scrape_instance}",
            "--log.format=json",
        ]
        if files["daemon_rules"] != DAEMON_RULES:
            argv.append(f"--rules.file={files['daemon_rules']}")
        if c.push:
            argv.append(f"--alertmanager.url={self.alertmanager_url}")
        self.exporter_started_at = time.time()
        self._start("exporter", [*argv, *c.exporter_args])
        self.wait_ready("exporter", f"{self.exporter_url}/readyz")

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def exited(self) -> str | None:
        """The name of a server that is no longer running, if any."""
        return next((name for name, p in self.processes.items() if p.poll() is not None), None)

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------- CLI


def _daemon_alert_for(rules_text: str) -> str:
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "AMDGPUDaemonAlert":
                return str(rule.get("for", "0s"))
    return "?"


def banner(stack: Stack) -> str:
    """URLs and what the user will see, read from the rule files the stack runs."""
    c = stack.config
    assert stack.receiver is not None
    files = stack.files
    daemon_rule = yaml.safe_load(files["daemon_rules"].read_text(encoding="utf-8"))["rules"][0]
    prometheus_for = _daemon_alert_for(files["prometheus_rules"].read_text(encoding="utf-8"))
    rules = (
        "shipped rules"
        if c.for_scale == 1.0
        else f"shipped rules, for: of {', '.join(c.fast_alerts or ['all'])} {1 / c.for_scale:.3g}x shorter"
    )
    direct = "pages Alertmanager directly" if c.push else "would page directly with --alertmanager.url"
    return "\n".join(
        [
            f"amdgpu-exporter demo stack: {c.fleet}, scenario {c.scenario}",
            f"  exporter      {stack.exporter_url}/metrics   in-daemon alerts: {stack.exporter_url}/api/v1/alerts",
            f"  prometheus    {stack.prometheus_url}/alerts   ({rules})",
            f"  alertmanager  {stack.alertmanager_url}/#/alerts   (routing of deploy/alertmanager/alertmanager.yml)",
            f"  receiver      {stack.receiver.url}   (every route's receiver posts here; pages print below)",
            f"  configs, data and logs: {stack.workdir}",
            f"What to expect: the excursion's GCD passes {daemon_rule['threshold']:g} °C"
            " within about 10 s of the excursion's start;",
            f"the exporter's {daemon_rule['alert']} fires {daemon_rule['for']} later and {direct};",
            (
                "one page: Prometheus's AMDGPUDaemonAlert stands back while the push gets through."
                if c.push
                else f"Prometheus forwards it as AMDGPUDaemonAlert after its own for: {prometheus_for}."
            ),
            "demo stack ready; Ctrl-C stops everything",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--fast", action="store_true", help="the in-daemon rule's and AMDGPUDaemonAlert's for: 30x shorter (2 s)"
    )
    parser.add_argument("--fleet", default="4xMI250X", help="simulated fleet (default 4xMI250X)")
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"demo scenario (default {DEFAULT_SCENARIO})")
    parser.add_argument("--no-push", action="store_true", help="page only through Prometheus, not from the exporter")
    parser.add_argument("--exporter", default=default_exporter(), help="amdgpu-exporter command")
    parser.add_argument("--exporter-port", type=int, default=9442)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument("--receiver-port", type=int, default=9095)
    parser.add_argument("--workdir", help="keep configs, data and logs here (default: a temporary folder, removed)")
    return parser.parse_args(argv)


def missing_tools(config: StackConfig) -> list[str]:
    return [tool for tool in (config.prometheus, config.alertmanager, config.exporter) if not shutil.which(tool)]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _interrupt(signum: int, frame: object) -> None:
    for sig in STOP_SIGNALS:  # the first one stops everything; a second must not cut the stopping short
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM, SIGINT and SIGHUP all stop the stack the way Ctrl-C does. SIGINT is set too: a shell
    # starts a background job with it ignored, and an ignored signal never reaches a handler.
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    with contextlib.ExitStack() as cleanup:
        workdir = Path(args.workdir) if args.workdir else Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        config = StackConfig(
            workdir=workdir,
            exporter=args.exporter,
            fleet=args.fleet,
            scenario=args.scenario,
            for_scale=FAST_FOR_SCALE if args.fast else 1.0,
            push=not args.no_push,
            exporter_port=args.exporter_port,
            prometheus_port=args.prometheus_port,
            alertmanager_port=args.alertmanager_port,
            receiver_port=args.receiver_port,
            page_log=sys.stdout,
        )
        missing = missing_tools(config)
        if missing:
            servers = [tool for tool in missing if tool != config.exporter]
            how = (
                "; the demo stack needs the Debian packages prometheus and prometheus-alertmanager: as root,"
                " apt-get install prometheus prometheus-alertmanager (`make demo-stack` run as root installs them)"
                if servers
                else "; the exporter: make demo"
            )
            print(f"error: not installed: {', '.join(missing)}{how}", file=sys.stderr)
            return 2
        stack = Stack(config)
        try:
            with stack:
                print(banner(stack), flush=True)
                while (name := stack.exited()) is None:
                    time.sleep(0.5)
                print(f"error: {name} stopped:\n{stack.log_tail(name)}", file=sys.stderr)
                return 1
        except KeyboardInterrupt:
            print("\nstopped: exporter, prometheus, alertmanager and the receiver", flush=True)
            return 0
        except (RuntimeError, OSError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
