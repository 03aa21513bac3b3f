"""Wires the pipeline: source -> poller -> rules -> exposition -> HTTP, plus the demo simulator."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from exporter import rules as alert_rules
from exporter.api import PublishedState, create_app
from exporter.config import ConfigError, Settings
from exporter.exposition import ExporterInfo, Exposition
from exporter.logging import get_logger
from exporter.model import AlertState, Snapshot
from exporter.poller import Poller
from exporter.sources.base import Source
from exporter.sources.sysfs import SysfsSource

log = get_logger("exporter.daemon")


class StartupError(RuntimeError):
    """The daemon cannot start; the message is one sentence for the operator."""


@contextlib.contextmanager
def demo_tree(settings: Settings) -> Iterator[str]:
    """Run the simulator in-process on a temporary folder; yields the folder standing for /sys."""
    from exporter.simulator import Simulator

    # tmpfs where there is one: the simulator rewrites a few files per GCD every tick.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="amdgpu-exporter-demo-", dir=shm) as tmp:
        root = Path(tmp) / "sys"
        try:
            simulator = Simulator(root, fleet=settings.demo_fleet, scenario=settings.demo_scenario)
        except ValueError as error:
            raise ConfigError(f"--demo.fleet/--demo.scenario: {error}") from error
        stop = threading.Event()
        truth = Path(settings.demo_truth_file) if settings.demo_truth_file else None
        thread = threading.Thread(
            target=simulator.run, args=(min(settings.interval, 1.0), stop, truth), name="simulator", daemon=True
        )
        # Written here first so discovery never races the thread (run() writes the same t=0 tree again).
        simulator.write_tree()
        if truth is not None:
            simulator.write_truth_json(truth)
        thread.start()
        log.info("demo_started", sysfs=str(root), fleet=settings.demo_fleet, scenario=settings.demo_scenario)
        try:
            yield str(root)
        finally:
            stop.set()
            thread.join(timeout=5)


def select_source(settings: Settings, sysfs_root: str) -> tuple[Source, str, str]:
    """Returns (source, name, why). rocm-smi only where the library can read this root."""
    sysfs = SysfsSource(sysfs_root, slow_interval=settings.slow_interval)
    if settings.source == "sysfs":
        return sysfs, "sysfs", "chosen by --source"
    if settings.source == "auto" and Path(sysfs_root).resolve() != Path("/sys"):
        return sysfs, "sysfs", "auto: librocm_smi64 only reads /sys, and --path.sysfs points elsewhere"
    from exporter.sources import rocm_smi

    if settings.source == "rocm-smi":
        ok, reason = rocm_smi.probe_rocm_smi(sysfs_root)
        if not ok:
            raise StartupError(f"--source=rocm-smi was asked for but the ROCm SMI library cannot be used: {reason}")
        return _rocm_smi_source(settings, sysfs), "rocm-smi", "chosen by --source"
    ok, reason = rocm_smi.probe_rocm_smi(sysfs_root)
    if ok:
        return _rocm_smi_source(settings, sysfs), "rocm-smi", f"auto: {reason}"
    return sysfs, "sysfs", f"auto: ROCm SMI library unusable ({reason})"


def _rocm_smi_source(settings: Settings, sysfs: SysfsSource) -> Source:
    from exporter.sources import rocm_smi

    # The worker's own call deadline fires before the poller's, so a hung library call is
    # attributed (and the worker restarted) by the supervisor rather than merely timed out.
    return rocm_smi.RocmSmiSource(fallback=sysfs, call_timeout=settings.read_timeout * 0.75)


def open_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, reuse_port=False)
    except OSError as error:
        raise StartupError(f"cannot listen on {host}:{port}: {error.strerror or error}") from error
    # Accepted connections inherit TCP_NODELAY from the listener (Linux). asyncio only sets it when
    # the socket's proto is IPPROTO_TCP, which create_server's sockets are not; without it a small
    # (gzip) answer waits ~40 ms for the scraper's delayed ACK (Nagle) after the header segment.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Pipeline:
    """Everything that happens after a poll cycle: rules, rendering, publishing, paging."""

    def __init__(self, settings: Settings, source_name: str, reason: str, rules: Any, pusher: Any) -> None:
        self.info = ExporterInfo(source=source_name, source_reason=reason)
        self.exposition = Exposition(self.info)
        self.rules = rules
        self.pusher = pusher
        self.source: Any = None
        self.state = PublishedState(source=source_name, source_reason=reason)
        self._alerts: tuple[AlertState, ...] = ()

    def on_snapshot(self, snapshot: Snapshot) -> None:
        alerts, transitions = alert_rules.evaluate(self.rules, self._alerts, snapshot)
        self._alerts = alerts
        log.debug(
            "cycle",
            cycle=snapshot.cycle,
            poll_seconds=round(snapshot.poll_duration_seconds, 6),
            up=sum(1 for d in snapshot.devices if d.up),
            down={d.gpu: d.down_reason for d in snapshot.devices if not d.up},
            alerts_firing=sum(1 for a in alerts if a.firing),
            alerts_pending=sum(1 for a in alerts if not a.firing and a.pending_since is not None),
            transitions=len(transitions),
        )
        for transition in transitions:
            log.warning("alert_transition", **transition.log_fields())
        snapshot = dataclasses.replace(snapshot, alerts=alerts)
        self.exposition.poll_duration.observe(snapshot.poll_duration_seconds)
        restarts = getattr(self.source, "worker_restarts", None)
        self.info.worker_restarts = restarts if isinstance(restarts, int) else None
        if self.pusher is not None:
            self.pusher.update(snapshot)
            self.info.alertmanager_results = {
                "sent": self.pusher.sent_total,
                "failed": self.pusher.failed_total,
            }
        commands = {(a.gpu, a.alert): alert_rules.suggested_command(a.suggestion) for a in alerts if a.suggestion}
        # Publishing is cheap: the bytes are rendered by the first scrape that asks (exposition.py).
        rendered = self.exposition.render(snapshot)
        self.state = dataclasses.replace(self.state, snapshot=snapshot, metrics=rendered, alert_commands=commands)

    def flush(self) -> None:
        """Render the current snapshot as a Prometheus scrape would ask for it (benchmarks)."""
        if self.state.metrics is not None:
            self.state.metrics.body(openmetrics=True, gzipped=True)


async def serve(settings: Settings) -> None:
    rules = alert_rules.load_rules(Path(settings.rules_file)) if settings.rules_file else alert_rules.default_rules()
    host, port = settings.web_listen_address
    listener = open_listener(host, port)
    port = listener.getsockname()[1]  # the real port when asked for port 0
    with contextlib.ExitStack() as stack:
        sysfs_root = stack.enter_context(demo_tree(settings)) if settings.demo else settings.path_sysfs
        source, source_name, reason = select_source(settings, sysfs_root)
        log.info("source_selected", source=source_name, reason=reason)
        log.debug("settings", **{name: origin for name, origin in settings.origins.items() if origin != "default"})
        poller = Poller(
            source,
            interval=settings.interval,
            read_timeout=settings.read_timeout,
            discovery_interval=settings.discovery_interval,
            source_name=source_name,
        )
        stack.callback(poller.close)
        # A hung GPU can block a discovery read as it can any read: bound it, and say so.
        discovery_deadline = max(10.0, settings.read_timeout * 5)
        try:
            devices = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(None, poller.discover), discovery_deadline
            )
        except TimeoutError as error:
            raise StartupError(
                f"device discovery under {sysfs_root} did not finish within {discovery_deadline:g} s: "
                "a GPU or its driver may be hung (see dmesg)"
            ) from error
        log.debug("discovered", devices=[d.pci_bus_id for d in devices], sysfs=sysfs_root)
        if not devices:
            raise StartupError(
                f"no AMD GPU found: no card under {sysfs_root}/class/drm is a PCI device driven by amdgpu "
                "(vendor 0x1002); to try the exporter without a GPU run: amdgpu-exporter --demo"
            )
        pusher = None
        if settings.alertmanager_url:
            from exporter.alertmanager import AlertmanagerPusher

            try:
                pusher = AlertmanagerPusher(
                    list(settings.alertmanager_url), instance=f"{socket.gethostname()}:{port}", rules=rules
                )
            except ValueError as error:
                raise ConfigError(f"--alertmanager.url: {error}") from error
        pipeline = Pipeline(settings, source_name, reason, rules, pusher)
        pipeline.source = source
        poller.on_snapshot = pipeline.on_snapshot
        app = create_app(
            lambda: pipeline.state, settings.web_telemetry_path, refresh_seconds=max(settings.interval, 0.5)
        )
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False)
        server = uvicorn.Server(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        shown_host = f"[{host}]" if ":" in host else host
        shown_host = "localhost" if host in ("0.0.0.0", "::") else shown_host
        log.info(
            "listening",
            url=f"http://{shown_host}:{port}{settings.web_telemetry_path}",
            devices=len(devices),
            interval=settings.interval,
        )
        tasks = [
            asyncio.create_task(poller.run(stop), name="poller"),
            asyncio.create_task(server.serve(sockets=[listener]), name="http"),
        ]
        if pusher is not None:
            tasks.append(asyncio.create_task(pusher.run(stop), name="alertmanager"))
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        server.should_exit = True
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        await asyncio.wait(tasks, timeout=5)
        log.info("stopped")
