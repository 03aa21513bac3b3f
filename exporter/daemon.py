"""Wiring only: source -> poller -> pipeline (enrich, alerting, exposition) -> HTTP, plus the demo simulator.

Nothing here computes anything a cycle publishes; see docs/architecture.md for the stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from exporter.alerting.rulefile import default_rules, load_rules
from exporter.alerting.rules import Rule
from exporter.config import ConfigError, Settings
from exporter.log import get_logger
from exporter.pipeline.health import Health
from exporter.pipeline.poller import Poller
from exporter.pipeline.publish import Pipeline
from exporter.sources.base import Source
from exporter.sources.sysfs import SysfsSource
from exporter.web.routes import create_app

if TYPE_CHECKING:
    from exporter.alerting.alertmanager import AlertmanagerPusher

log = get_logger("exporter.daemon")

SHUTDOWN_GRACE_SECONDS = 0.5


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
            thread.join(timeout=SHUTDOWN_GRACE_SECONDS)


def select_source(settings: Settings, sysfs_root: str) -> tuple[Source, str, str]:
    """Returns (source, name, why). rocm-smi only where the library can read this root."""
    sysfs = SysfsSource(sysfs_root, slow_interval=settings.slow_interval, read_timeout=settings.read_timeout)
    if settings.source == "sysfs":
        return sysfs, "sysfs", "chosen by --source"
    if settings.source == "auto" and Path(sysfs_root).resolve() != Path("/sys"):
        return sysfs, "sysfs", "auto: librocm_smi64 only reads /sys, and --path.sysfs points elsewhere"
    from exporter.sources.rocm_smi import source as rocm_smi

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
    from exporter.sources.rocm_smi import source as rocm_smi

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


async def discover_at_start(poller: Poller, sysfs_root: str, read_timeout: float) -> int:
    """The first discovery, bounded; the device count.

    With a hung GPU: each card's identity is read against the read deadline, so a card that hangs
    is served as down (amdgpu_up 0, reason identify_timeout) with the others up, and identified by
    a later discovery. Serving is the better choice: exiting would have systemd restart us into the
    same hang in a loop, leaving the node's healthy GPUs unmonitored exactly when something is
    wrong. Only a discovery that cannot even list the cards by the deadline (nothing to serve) ends
    start-up, in one line and non-zero.
    """
    devices = await poller.discover_within(poller.discovery_deadline)
    if devices is None:
        raise StartupError(
            f"device discovery under {sysfs_root} did not finish within {poller.discovery_deadline:g} s: "
            "a GPU or its driver may be hung (see dmesg)"
        )
    if not devices:
        raise StartupError(
            f"no AMD GPU found: no card under {sysfs_root}/class/drm is a PCI device driven by amdgpu "
            "(vendor 0x1002); to try the exporter without a GPU run: amdgpu-exporter --demo"
        )
    return len(devices)


def alertmanager_pusher(settings: Settings, port: int, rules: Sequence[Rule]) -> AlertmanagerPusher | None:
    """The pusher for --alertmanager.url, None without one (httpx is imported only then)."""
    if not settings.alertmanager_url:
        return None
    from exporter.alerting.alertmanager import AlertmanagerPusher

    try:
        return AlertmanagerPusher(
            list(settings.alertmanager_url), instance=f"{socket.gethostname()}:{port}", rules=rules
        )
    except ValueError as error:
        raise ConfigError(f"--alertmanager.url: {error}") from error


def _shown_url(host: str, port: int, path: str) -> str:
    shown_host = f"[{host}]" if ":" in host else host
    shown_host = "localhost" if host in ("0.0.0.0", "::") else shown_host
    return f"http://{shown_host}:{port}{path}"


async def serve(settings: Settings) -> None:
    rules = load_rules(Path(settings.rules_file)) if settings.rules_file else default_rules()
    host, port = settings.web_listen_address
    listener = open_listener(host, port)
    with contextlib.ExitStack() as stack:
        sysfs_root = stack.enter_context(demo_tree(settings)) if settings.demo else settings.path_sysfs
        source, source_name, reason = select_source(settings, sysfs_root)
        log.info("source_selected", source=source_name, reason=reason)
        poller = Poller(
            source,
            interval=settings.interval,
            read_timeout=settings.read_timeout,
            discovery_interval=settings.discovery_interval,
            source_name=source_name,
        )
        stack.callback(poller.close)
        device_count = await discover_at_start(poller, sysfs_root, settings.read_timeout)
        pusher = alertmanager_pusher(settings, port, rules)
        health = Health(interval=settings.interval, read_timeout=settings.read_timeout)
        pipeline = Pipeline(source_name=source_name, source_reason=reason, rules=rules, pusher=pusher, health=health)
        poller.on_snapshot = pipeline.on_snapshot
        app = create_app(lambda: pipeline.state, settings.web_telemetry_path, health)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            # SIGTERM must end the process within a second, slow clients or not: connections are
            # dropped, not drained (uvicorn takes whole seconds here).
            timeout_graceful_shutdown=0,
        )
        server = uvicorn.Server(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        url = _shown_url(host, port, settings.web_telemetry_path)
        log.info("listening", url=url, devices=device_count, interval=settings.interval)
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
        # Whatever is stuck (a read in a hung driver, a slow client), leave within the grace period:
        # reader threads are daemon threads, and cli.main exits without joining anything.
        _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
        for task in pending:
            task.cancel()
        log.info("stopped", abandoned_tasks=len(pending))
