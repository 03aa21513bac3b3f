"""AlertmanagerPusher against the real Debian prometheus-alertmanager.

Alertmanager runs on a free 127.0.0.1 port with clustering off and a temporary storage dir; its one
receiver is a webhook to a small HTTP server in this test, so we see exactly what it would page.
Alerts come from the real rules (exporter.alerting.state.evaluate), not hand-made states.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from exporter.alerting.alertmanager import AlertmanagerPusher, alerts_endpoint
from exporter.alerting.rulefile import default_rule_file
from exporter.alerting.state import evaluate
from exporter.model import AlertState, DeviceIdentity, DeviceState, Sample, Snapshot, frozen_map
from tests.realtools import free_port, require_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


class Webhook:
    """The Alertmanager receiver: records every notification body it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with recorder.lock:
                    recorder.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def received(self, instance: str, status: str) -> list[dict[str, Any]]:
        """Alerts of one test run (by instance label) in notifications of the given status."""
        with self.lock:
            return [
                alert
                for note in self.notifications
                if note["status"] == status
                for alert in note["alerts"]
                if alert["labels"].get("instance") == instance
            ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def alertmanager(webhook: Webhook, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = require_tool(ALERTMANAGER)
    workdir = tmp_path_factory.mktemp("alertmanager")
    config = workdir / "alertmanager.yml"
    # Short group timings so a notification (and its resolution) arrives within a second or so.
    config.write_text(
        f"""
route:
  receiver: hook
  group_by: [alertname, instance, gpu]
  group_wait: 100ms
  group_interval: 500ms
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {webhook.url}
        send_resolved: true
"""
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port on 0.0.0.0
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "stderr.log").open("wb"),
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                pytest.fail(f"alertmanager exited: {(workdir / 'stderr.log').read_text()}")
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("alertmanager did not become ready in 15 s")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def mi250x(gpu: int, junction: float) -> DeviceState:
    """One GCD of an MI250X package (two GCDs per package)."""
    identity = DeviceIdentity(
        pci_bus_id=f"0000:{0x29 + gpu:02x}:00.0",
        card=f"card{gpu}",
        device_dir=f"/sys/devices/pci0000:00/0000:{0x29 + gpu:02x}:00.0",
        unique_id=f"{0x6A0F3D2B00000000 + gpu // 2:016x}",
        product="AMD Instinct MI250X",
        serial=f"PCB04{gpu // 2}",
        package=str(gpu // 2),
        die=gpu % 2,
    )
    sample = Sample(
        timestamp=time.time(),
        temperatures=frozen_map({"junction": junction, "edge": junction - 20}),
        clocks_max_hertz=frozen_map({"gfx": 1700e6}),
    )
    return DeviceState(identity=identity, gpu=gpu, sample=sample, up=True)


class Node:
    """Drives the real rules over a two-GCD node, the way the poll loop does."""

    def __init__(self) -> None:
        self.rules = default_rule_file().rules
        self.states: tuple[AlertState, ...] = ()

    def cycle(self, at: float, junctions: tuple[float, float]) -> tuple[Snapshot, tuple[AlertState, ...]]:
        """One cycle as the pipeline hands it to the pusher: the snapshot and the alerts evaluated on it."""
        snapshot = Snapshot(taken_at=at, monotonic_at=at, devices=(mi250x(0, junctions[0]), mi250x(1, junctions[1])))
        self.states, _ = evaluate(self.rules, self.states, snapshot)
        return snapshot, self.states


async def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_firing_alert_reaches_the_receiver_then_resolves(alertmanager: str, webhook: Webhook) -> None:
    instance = "gpu-node-17:9442"

    async def scenario() -> None:
        node = Node()
        now = time.time()
        node.cycle(now - 61, (70.0, 90.0))  # GCD 1 goes hot: pending
        firing = node.cycle(now - 1, (70.0, 91.0))  # 60 s later: firing, first clock-down step
        (state,) = [s for s in firing[1] if s.firing]
        pusher = AlertmanagerPusher(
            [alertmanager], node="gpu-node-17", instance=instance, resend_interval=0.5, rules=node.rules
        )
        stop = asyncio.Event()
        sender = asyncio.create_task(pusher.run(stop))
        try:
            pusher.update(*firing)
            (alert,) = await wait_for(lambda: webhook.received(instance, "firing"), 10, "the firing notification")
            assert alert["labels"] == {
                "alertname": "GpuJunctionTemperatureHigh",
                "alert": "GpuJunctionTemperatureHigh",
                "severity": "warning",
                "node": "gpu-node-17",
                "instance": instance,
                "sensor": "junction",
                "gpu": "1",
                "pci_bus_id": "0000:2a:00.0",
                "serial": "PCB040",
                "product": "AMD Instinct MI250X",
                "package": "0",
                "die": "1",
            }
            annotations = alert["annotations"]
            assert annotations["summary"] == (
                "GPU 1 (0000:2a:00.0) on gpu-node-17: junction temperature 91.0 °C is above 85 °C"
            )
            assert "0000:2a:00.0" in annotations["description"] and "gpu-node-17" in annotations["description"]
            assert annotations["suggestion"] == state.suggestion
            assert annotations["suggested_command"] == "rocm-smi -d 1 --autorespond yes --setsrange 500 1615"
            assert annotations["undo_command"] == "rocm-smi -d 1 --resetclocks"
            assert annotations["runbook_url"] == "docs/runbooks.md#amdgpudaemonalert"
            assert parse_time(alert["startsAt"]) == pytest.approx(state.since, abs=0.001)

            # Re-posted on the resend cadence with endsAt a few intervals ahead, so it stays firing.
            def am_alert() -> dict[str, Any] | None:
                listed = httpx.get(f"{alertmanager}/api/v2/alerts", params={"filter": f'instance="{instance}"'}).json()
                return listed[0] if listed else None

            first_end = parse_time((await wait_for(am_alert, 5, "the alert in Alertmanager"))["endsAt"])
            assert time.time() < first_end <= time.time() + 4 * 0.5 + 1
            current = await wait_for(
                lambda: (found := am_alert()) and parse_time(found["endsAt"]) > first_end and found, 5, "a re-post"
            )
            assert current["status"]["state"] == "active"

            # Cooling below 80 °C resolves it; Alertmanager tells the receiver.
            resolved_snapshot = node.cycle(time.time(), (70.0, 79.0))
            pusher.update(*resolved_snapshot)
            (resolved,) = await wait_for(lambda: webhook.received(instance, "resolved"), 10, "the resolution")
            assert resolved["status"] == "resolved"
            assert resolved["labels"] == alert["labels"]
            assert parse_time(resolved["endsAt"]) == pytest.approx(resolved_snapshot[0].taken_at, abs=0.001)
            # The resolved page carries the restore advice: the one undo command.
            assert resolved["annotations"]["suggested_command"] == "rocm-smi -d 1 --resetclocks"
            assert "restore" in resolved["annotations"]["suggestion"]
            assert pusher.stats.failed == 0 and pusher.stats.sent >= 3
        finally:
            stop.set()
            await asyncio.wait_for(sender, 5)

    asyncio.run(scenario())


def test_a_dead_alertmanager_costs_log_lines_and_a_counter_only(alertmanager: str, webhook: Webhook) -> None:
    instance = "gpu-node-18:9442"
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    async def scenario() -> None:
        node = Node()
        now = time.time()
        node.cycle(now - 61, (95.0, 60.0))
        firing = node.cycle(now - 1, (95.0, 60.0))
        pusher = AlertmanagerPusher(
            [dead, alertmanager],
            node="gpu-node-18",
            instance=instance,
            resend_interval=0.4,
            timeout=1.0,
            retry_initial=0.05,
        )
        stop = asyncio.Event()
        sender = asyncio.create_task(pusher.run(stop))
        try:
            started = time.perf_counter()
            pusher.update(*firing)
            assert time.perf_counter() - started < 0.5, "update() must not wait for the network (1 s timeout)"
            # The live Alertmanager gets the alert although the first one refuses every post.
            (alert,) = await wait_for(lambda: webhook.received(instance, "firing"), 10, "the firing notification")
            assert alert["labels"]["gpu"] == "0" and alert["labels"]["die"] == "0"
            await wait_for(lambda: pusher.stats.failed >= 3, 5, "retries against the dead Alertmanager")
            # Backoff 0.05, 0.1, 0.2, then every 0.4 s: a handful of attempts, not a busy loop.
            await asyncio.sleep(0.5)
            assert pusher.stats.failed <= 8
            assert pusher.last_error[alerts_endpoint(dead)].startswith("ConnectError")
            assert pusher.last_error[alerts_endpoint(alertmanager)] == ""
            assert pusher.stats.sent >= 1
        finally:
            stop.set()
            started = time.perf_counter()
            await asyncio.wait_for(sender, 5)
            assert time.perf_counter() - started < 1.0, "stopping must not wait for retries"

    asyncio.run(scenario())


def test_alertmanager_rejects_nothing_we_send(alertmanager: str) -> None:
    """A post with a firing and a resolved alert is accepted as-is by the v2 API (HTTP 200)."""
    node = Node()
    now = time.time()
    node.cycle(now - 130, (90.0, 90.0))
    node.cycle(now - 70, (90.0, 90.0))
    pusher = AlertmanagerPusher([alertmanager], node="gpu-node-19", instance="gpu-node-19:9442")
    pusher.update(*node.cycle(now - 69, (90.0, 90.0)))
    pusher.update(*node.cycle(now - 10, (70.0, 90.0)))  # GCD 0 resolved, GCD 1 still firing
    body = pusher.pending_payload()
    assert [a["labels"]["gpu"] for a in body] == ["1", "0"]  # firing first
    assert parse_time(body[1]["endsAt"]) == pytest.approx(now - 10, abs=0.001)
    response = httpx.post(alerts_endpoint(alertmanager + "/"), json=body, timeout=5)
    assert response.status_code == 200, response.text
    listed = httpx.get(f"{alertmanager}/api/v2/alerts", params={"filter": 'instance="gpu-node-19:9442"'}).json()
    assert {a["labels"]["gpu"] for a in listed} == {"1"}  # the resolved one is not active
