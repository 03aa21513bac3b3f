"""Wiring only: source -> poller -> pipeline (enrich, alerting, exposition) -> HTTP, plus the demo simulator.

Nothing here computes anything a cycle publishes; see docs/architecture.md for the stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import functools
import os
import re
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from exporter.accounting.stage import Accounting
from exporter.accounting.store import LedgerStore
from exporter.alerting.clockdown import find_tool
from exporter.alerting.rulefile import RuleFile, rule_file_of
from exporter.alerting.rules import Rule
from exporter.attribution.sources import AttributionSources
from exporter.config import ConfigError, Settings, node_name
from exporter.configcheck import RELOADABLE, changed_options, exposition_of, reload_settings
from exporter.cycle import Pipeline
from exporter.demo import sysfs_tree
from exporter.exposition.selection import ExpositionOptions, read_fields
from exporter.log import configure_logging, get_logger
from exporter.model import DeviceIdentity, HostInfo
from exporter.pipeline.poller import Poller
from exporter.pipeline.readiness import Readiness
from exporter.pipeline.sampler import Sampler
from exporter.sources.base import Source, StartupError
from exporter.sources.select import select_source
from exporter.threads import run_once
from exporter.web import http_server, webconfig_reload
from exporter.web.device_plugin import DevicePluginService
from exporter.web.http_guard import WebGuard
from exporter.web.http_log import HttpStats, route_library_logs
from exporter.web.http_server import shown_address, systemd_sockets
from exporter.web.routes import create_app
from exporter.web.waveform import WaveformSource

if TYPE_CHECKING:
    from exporter.actions.slurm import SlurmActions
    from exporter.alerting.alertmanager import AlertmanagerPusher

log = get_logger("exporter.daemon")

SHUTDOWN_GRACE_SECONDS = 0.5


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


async def discover_at_start(poller: Poller, sysfs_root: str, read_timeout: float) -> Sequence[DeviceIdentity]:
    """The first discovery, bounded; the devices found.

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
    log.debug("discovered", devices=[d.pci_bus_id for d in devices], sysfs=sysfs_root)
    return devices


def alertmanager_pusher(settings: Settings, port: int, rules: Sequence[Rule]) -> AlertmanagerPusher | None:
    """The pusher for --alertmanager.url, None without one (httpx is imported only then)."""
    if not settings.alertmanager_url:
        return None
    from exporter.alerting.alertmanager import AlertmanagerPusher

    try:
        return AlertmanagerPusher(
            list(settings.alertmanager_url),
            node=node_name(settings),
            instance=f"{socket.gethostname()}:{port}",
            rules=rules,
            runbook_base=settings.alerting_runbook_base,
        )
    except ValueError as error:
        raise ConfigError(f"--alertmanager.url: {error}") from error


# Slurm's node names: what scontrol and sinfo are handed as one argument (never a shell word)
_SLURM_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def slurm_actions(settings: Settings) -> SlurmActions | None:
    """The Slurm action mode for --action.slurm=dry-run|on, None when off; ConfigError when the node name
    is not a Slurm node name or scontrol / sinfo are not on PATH (found once, at start)."""
    if settings.action_slurm == "off":
        return None
    from exporter.actions.slurm import ActionPolicy, SlurmActions

    node = node_name(settings)
    if not _SLURM_NODE_NAME.match(node):
        raise ConfigError(f"--action.slurm: the node name {node!r} is not a Slurm node name (set --node-name)")
    tools = {name: shutil.which(name) for name in ("scontrol", "sinfo")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise ConfigError(f"--action.slurm: {' and '.join(missing)} not found on PATH ({os.environ.get('PATH', '')})")
    policy = ActionPolicy(
        mode=settings.action_slurm,
        max_drained_share=settings.action_slurm_max_drained_share,
        max_actions=settings.action_slurm_max_actions,
        actions_interval=settings.action_slurm_actions_interval,
        retry_interval=settings.action_slurm_retry_interval,
        timeout=settings.action_slurm_timeout,
        scontrol=tools["scontrol"] or "scontrol",
        sinfo=tools["sinfo"] or "sinfo",
    )
    log.info(
        "slurm_actions",
        mode=policy.mode,
        node=node,
        max_drained_share=policy.max_drained_share,
        max_actions=policy.max_actions,
        actions_interval=policy.actions_interval,
    )
    return SlurmActions(node, policy)


async def read_host_info(sysfs_root: str, deadline: float = 15.0) -> HostInfo | None:
    """Kernel, driver, ROCm and SMI library versions for the _info series; None when they take too long
    (the SMI libraries are loaded in child processes, which a broken install can hang)."""
    from exporter.sources.host import collect, host_info

    started = time.monotonic()
    read = run_once(lambda: host_info(collect(sysfs_root, "/proc", "/opt", os.environ, packages=False)), "host-info")
    try:
        info = await asyncio.wait_for(asyncio.wrap_future(read), deadline)
    except TimeoutError:
        log.warning("host_info_timeout", deadline=deadline)
        return None
    log.debug("host_info", seconds=round(time.monotonic() - started, 3), **dataclasses.asdict(info))
    return info


def sampler_of(settings: Settings) -> Sampler | None:
    """The sub-second gpu_metrics sampler behind the windows and the waveform API; None when turned off."""
    if not settings.fast_interval:
        return None
    return Sampler(interval=settings.fast_interval, window=settings.window, read_timeout=settings.read_timeout)


class _ReloadFailed(Exception):
    def __init__(self, what: str, detail: str, config_read: bool = False) -> None:
        super().__init__(detail)
        self.what = what  # config | rules: the file that was being read
        self.detail = detail
        self.config_read = config_read  # a config file was read fine before the rule file failed


@dataclasses.dataclass(frozen=True)
class _Reread:
    settings: Settings
    exposition: ExpositionOptions
    rule_file: RuleFile


def reread(current: Settings) -> _Reread:
    """The config file and the rule file read again and checked (blocking: a file of thousands of
    globs takes seconds); _ReloadFailed naming the file and why."""
    # counted by the file that was read: a bad rule file after a good config is a rules failure
    what, config_read = "config", False
    try:
        settings = reload_settings(current)
        exposition = exposition_of(settings)  # a collector or family that matches nothing: a config failure
        what, config_read = "rules", bool(settings.config_file)
        return _Reread(settings, exposition, rule_file_of(settings))
    except Exception as error:  # nothing a file holds may end the daemon: keep what runs
        detail = str(error) if isinstance(error, ConfigError) else f"{type(error).__name__}: {error}"
        raise _ReloadFailed(what, detail, config_read) from None


def accounting_state_file(settings: Settings) -> str:
    """The accounting state file: the setting, except that by default a demo or a simulated tree
    (--path.sysfs elsewhere than /sys) keeps its jobs in memory: a test's or a demo's jobs are not
    the host's, and must never be charged across into the next run."""
    simulated = settings.demo or os.path.realpath(settings.path_sysfs) != "/sys"
    if settings.origins.get("accounting.state-file", "default") == "default" and simulated:
        return ""
    return settings.accounting_state_file


class Reloader:
    """SIGHUP: read the config file and the rule file again. New rules and what /metrics renders
    (collectors, families, window detail, extra labels) apply from the next cycle; an invalid file
    keeps what runs and says why; an option that needs a restart is named in the log.

    The files are read and checked on a thread of their own, one reload at a time (a SIGHUP during
    one runs one more after it): on the event loop a file of 30,000 globs held every scrape for
    seconds. Only applying the result happens on the loop."""

    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        counts: Counter[tuple[str, str]],
        source: Source | None = None,
    ) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.source = source  # told which fields the families now shown are made of
        self.counts = counts  # (config | rules, success | failure) -> reloads: amdgpu_exporter_reloads_total
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def reload(self) -> None:
        """The signal handler: start a reload, or ask for one more after the one running. Without a
        running event loop (a tool, a test) the reload is done here and now."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._settle(lambda: reread(self.settings))
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = loop.create_task(self._reloads(), name="reload")

    async def _reloads(self) -> None:
        while True:
            self._again = False
            current = self.settings
            try:
                future = run_once(functools.partial(reread, current), "reload")
            except RuntimeError:  # no thread can be started: read here, holding the loop
                self._settle(functools.partial(reread, current))
            else:
                with contextlib.suppress(_ReloadFailed):
                    await asyncio.wrap_future(future)
                self._settle(future.result)
            if not self._again:
                return

    def _settle(self, result: Callable[[], _Reread]) -> None:
        """Apply what a reread gave, or log and count why it failed."""
        try:
            self.apply(result())
        except _ReloadFailed as failure:
            log.error("reload_failed", error=failure.detail, kept="the running config and rules")
            self.counts["config", "success"] += failure.config_read
            self.counts[failure.what, "failure"] += 1

    def apply(self, result: _Reread) -> None:
        settings = result.settings
        self.counts["config", "success"] += bool(settings.config_file)  # without one nothing was read
        self.counts["rules", "success"] += 1
        changed = changed_options(self.settings, settings)
        rules = result.rule_file.rules
        self.pipeline.replace_rules(rules, result.rule_file.health)
        self.pipeline.replace_exposition(result.exposition)
        if self.source is not None:
            self.source.want(read_fields(result.exposition.families))
        if settings.log_level != self.settings.log_level:
            configure_logging(settings.log_level, settings.log_format)
        self.settings = settings
        log.info(
            "reloaded",
            config_file=settings.config_file or None,
            rules_file=settings.rules_file or "(shipped rules)",
            rules=len(rules),
            changed=changed,
            restart_needed=[name for name in changed if name not in RELOADABLE],
        )


def spare_address_space() -> None:
    """Keep the daemon's address space near its resident size, so that RLIMIT_AS (`ulimit -v`, some
    batch systems' memory limits) does not stop it starting threads. By default glibc gives each
    thread that allocates an arena of 64 MiB of address space (15 of them here: ~1 GB for a daemon of
    60 MB resident) and each thread a stack of RLIMIT_STACK (8 MiB); two arenas and 2 MiB stacks are
    plenty for reads, rendering and YAML bounded in depth."""
    threading.stack_size(2 << 20)
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to tune
        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX


async def serve(settings: Settings) -> None:
    spare_address_space()
    # A SIGHUP while starting (before the reloader exists) must not end the process, as its default does.
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGHUP, lambda: log.warning("reload_ignored", reason="the daemon is still starting")
    )
    rule_file = rule_file_of(settings)
    rules = rule_file.rules
    actions = slurm_actions(settings)  # before anything starts: a missing scontrol is a start-up error
    exposition = exposition_of(settings)
    # The web config first, so a bad file fails before anything else starts.
    route_library_logs()
    reloader = webconfig_reload.WebConfigReloader(settings.web_config_file) if settings.web_config_file else None
    active_web = reloader.load() if reloader is not None else webconfig_reload.PLAIN  # a bad file: ConfigError
    nofile_soft, _ = http_server.raise_nofile_limit()
    if settings.web_systemd_socket:
        listeners = systemd_sockets()
    else:
        listeners = [open_listener(host, port) for host, port in settings.web_listen_address]
    port = listeners[0].getsockname()[1] if listeners[0].family in (socket.AF_INET, socket.AF_INET6) else 0
    with contextlib.ExitStack() as stack:
        # First: a socket another server (DME) owns, or a folder that cannot hold one, stops the start here.
        # It answers for no GPU until the first cycle; then for each GPU while /readyz would call the verdict fresh.
        device_plugin = None
        if settings.device_plugin_socket:
            fresh_for = Readiness(interval=settings.interval, read_timeout=settings.read_timeout).stale_after
            device_plugin = DevicePluginService(settings.device_plugin_socket, max_age=fresh_for)
            device_plugin.start()
            stack.callback(device_plugin.stop)
        sysfs_root = stack.enter_context(sysfs_tree(settings))
        details: dict[str, str] = {}
        wanted = read_fields(exposition.families)  # a family nobody shows is not read
        source, source_name, reason = select_source(settings.source_choice(wanted), sysfs_root, details)
        poller = Poller(
            source,
            interval=settings.interval,
            read_timeout=settings.read_timeout,
            discovery_interval=settings.discovery_interval,
            source_name=source_name,
        )
        stack.callback(poller.close)
        devices = await discover_at_start(poller, sysfs_root, settings.read_timeout)
        device_count = len(devices)
        host_info = await read_host_info(sysfs_root)
        # logged once devices are found: on a host without a GPU the one-sentence error is all there is
        log.info("source_selected", source=source_name, reason=reason, devices=device_count, **details)
        log.debug("settings", **{name: origin for name, origin in settings.origins.items() if origin != "default"})
        pusher = alertmanager_pusher(settings, port, rules)
        sampler = sampler_of(settings)
        if sampler is not None:
            stack.callback(sampler.stop)
            sampler.start()
        clock_tool = find_tool(
            settings.alerting_clock_tool,
            asics=[identity.asic for identity in devices],
            rocm_versions=[version for _, version in host_info.rocm] if host_info is not None else (),
        )
        attribution = AttributionSources(settings, sysfs_root)
        if attribution.enabled:
            attribution.start()
            stack.callback(attribution.close)
        accounting = None
        if settings.kubernetes or settings.slurm_state_dir:  # jobs and pods are known: account for them
            accounting = Accounting(LedgerStore(accounting_state_file(settings)), node=node_name(settings))
            stack.callback(accounting.close)
        http_stats = HttpStats()
        reload_counts: Counter[tuple[str, str]] = Counter()
        readiness = Readiness(interval=settings.interval, read_timeout=settings.read_timeout)
        pipeline = Pipeline(
            source_name=source_name,
            source_reason=reason,
            rules=rules,
            pusher=pusher,
            host=host_info,
            web_stats=(lambda: webconfig_reload.web_stats(http_stats, reloader)) if reloader is not None else None,
            attribution=attribution.inputs if attribution.enabled else None,
            readiness=readiness,
            sampler=sampler,
            clock_tool=clock_tool,
            exposition=exposition,
            reloads=lambda: reload_counts,
            health_thresholds=rule_file.health,
            node=node_name(settings),
            accounting=accounting,
            actions=actions,
        )
        poller.on_snapshot = pipeline.on_snapshot
        if device_plugin is not None:
            device_plugin.follow(lambda: pipeline.state.published)
            pipeline.device_plugin_stats = device_plugin.stats
        waveform = (
            WaveformSource(gpus=sampler.gpus_sampled, max_seconds=sampler.window, read=sampler.waveform)
            if sampler
            else None
        )
        app = create_app(
            lambda: pipeline.state,
            settings.web_telemetry_path,
            readiness,
            waveform=waveform,
            refresh_seconds=max(settings.interval, 0.5),
            node=node_name(settings),
        )
        current_web = reloader.current if reloader is not None else (lambda: webconfig_reload.PLAIN)
        app = WebGuard(app, current_web, http_stats)
        budget = http_server.connection_budget(
            settings.web_max_connections, nofile_soft, http_server.open_descriptors(), device_count
        )
        limits = http_server.HttpLimits(max_connections=budget)
        server = http_server.GuardedServer(
            http_server.uvicorn_config(app, limits), limits, http_stats, current_web, active_web.ssl_context is not None
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, Reloader(settings, pipeline, reload_counts, source).reload)
        scheme = "https" if active_web.ssl_context is not None else "http"
        log.info(
            "listening",
            urls=[f"{scheme}://{shown_address(sock)}{settings.web_telemetry_path}" for sock in listeners],
            devices=device_count,
            interval=settings.interval,
            max_connections=budget,
            open_files_limit=nofile_soft,
            basic_auth=active_web.verifier.enabled,
            node=node_name(settings),
            clock_tool=clock_tool,
            rules=len(rules),
        )
        tasks = [
            asyncio.create_task(poller.run(stop), name="poller"),
            asyncio.create_task(server.serve(sockets=listeners), name="http"),
        ]
        if pusher is not None:
            tasks.append(asyncio.create_task(pusher.run(stop), name="alertmanager"))
        if actions is not None:
            tasks.append(asyncio.create_task(actions.run(stop), name="slurm-actions"))
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        server.exit()
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        # Whatever is stuck (a read in a hung driver, a slow client), leave within the grace period:
        # reader threads are daemon threads, and cli.main exits without joining anything.
        _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
        for task in pending:
            task.cancel()
        log.info("stopped", abandoned_tasks=len(pending))
