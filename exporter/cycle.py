"""After each poll cycle: enrich, evaluate the alert rules and the health verdict, hand the alerts to
the pusher, publish.

The one place that runs the stages after the poller, in order. Each cycle ends in one immutable
Published (snapshot + alerts + health verdict + the exporter's stats) and the lazily rendered
/metrics of it, which
the web layer reads; nothing downstream writes back into anything upstream.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.accounting.ledger import Ledger
from exporter.accounting.stage import Accounting
from exporter.alerting.rulefile import default_health
from exporter.alerting.rules import Rule
from exporter.alerting.state import evaluate
from exporter.alerting.verdict import HealthThresholds, evaluate_health
from exporter.attribution.sources import AttributionInputs
from exporter.exposition.render import RenderedMetrics, render
from exporter.exposition.selection import DEFAULTS, ExpositionOptions
from exporter.log import get_logger
from exporter.model import (
    AlertState,
    DevicePluginStats,
    ExporterStats,
    HealthVerdict,
    Histogram,
    HostInfo,
    Published,
    Snapshot,
    WebStats,
    frozen_map,
)
from exporter.pipeline.enrich import enrich
from exporter.pipeline.process import read_process_stats
from exporter.pipeline.readiness import Readiness
from exporter.pipeline.sampler import Sampler

if TYPE_CHECKING:  # imported only when used: httpx with an Alertmanager, the actions with --action.slurm
    from exporter.actions.slurm import SlurmActions
    from exporter.alerting.alertmanager import AlertmanagerPusher

log = get_logger("exporter.pipeline")


@dataclass(frozen=True, slots=True)
class PublishedState:
    """What the web layer serves: the last Published and its /metrics; replaced whole, never mutated."""

    source: str = ""
    source_reason: str = ""
    started_at: float = field(default_factory=time.time)
    published: Published | None = None  # None until the first cycle has finished
    metrics: RenderedMetrics | None = None
    rules: tuple[Rule, ...] = ()  # the alert rules evaluated from this cycle on (the status page colours by them)
    health_thresholds: HealthThresholds | None = None  # the health verdict's, from the same rule file
    jobs: Ledger | None = None  # per-job accounting (running and ended jobs), None when off


class Pipeline:
    """Runs the stages after the poller for every snapshot (Poller.on_snapshot)."""

    def __init__(
        self,
        *,
        source_name: str,
        source_reason: str,
        rules: Sequence[Rule],
        pusher: AlertmanagerPusher | None = None,
        host: HostInfo | None = None,
        attribution: Callable[[], AttributionInputs] | None = None,
        sampler: Sampler | None = None,
        web_stats: Callable[[], WebStats | None] | None = None,
        device_plugin_stats: Callable[[], DevicePluginStats] | None = None,
        readiness: Readiness | None = None,
        clock_tool: str = "rocm-smi",
        exposition: ExpositionOptions = DEFAULTS,
        reloads: Callable[[], Mapping[tuple[str, str], int]] | None = None,
        health_thresholds: HealthThresholds | None = None,
        node: str = "",
        accounting: Accounting | None = None,
        actions: SlurmActions | None = None,
    ) -> None:
        self.exposition = exposition  # what is rendered: families, window detail, extra labels (SIGHUP replaces it)
        self.reloads = reloads  # the SIGHUP reloads' counts, copied into each cycle's stats
        self.host = host
        self.rules = tuple(rules)
        self.health_thresholds = health_thresholds if health_thresholds is not None else default_health()
        self.node = node  # the node the verdict's drain and taint commands name (--node-name)
        self.clock_tool = clock_tool  # what clock-down commands are written for (alerting/clockdown.py)
        self.pusher = pusher  # where evaluated alerts go after each cycle; never blocks
        self.attribution = attribution  # the attribution sources' latest reports; must never block
        self.sampler = sampler  # the sub-second gpu_metrics sampler (--fast.interval); None: off
        self.web_stats = web_stats  # the HTTP layer's counters, copied into each cycle's stats
        self.device_plugin_stats = device_plugin_stats  # the device-plugin health service's, likewise
        self.readiness = readiness if readiness is not None else Readiness()
        self.accounting = accounting  # per-job accounting (exporter/accounting/), after the verdict
        self.actions = actions  # the Slurm action mode (--action.slurm): handed each verdict; never blocks
        self.state = PublishedState(
            source=source_name, source_reason=source_reason, rules=self.rules, health_thresholds=self.health_thresholds
        )
        self._alerts: tuple[AlertState, ...] = ()
        self._verdict: HealthVerdict | None = None
        self._poll_durations = Histogram()

    def on_snapshot(self, snapshot: Snapshot) -> None:
        self.readiness.progress()
        if self.sampler is not None:
            # The join of the poller and the sampler: the sampler follows the devices the poller knows (same
            # gpu numbers), and its windows as of this cycle travel on with the cycle's snapshot.
            self.sampler.track((d.gpu, d.identity) for d in snapshot.devices if d.down_reason != "gone")
            snapshot = dataclasses.replace(snapshot, windows=self.sampler.windows(now=snapshot.monotonic_at))
        snapshot = enrich(snapshot, self.attribution() if self.attribution is not None else None)
        try:
            alerts, transitions = evaluate(self.rules, self._alerts, snapshot, self.clock_tool)
        except Exception as error:  # a bug in a rule: keep the last alerts, count it, fail readiness
            if self.readiness.failed("rules", f"{type(error).__name__}: {error}"):
                log.exception("stage_failed", stage="rules")
            alerts, transitions = self._alerts, ()
        else:
            if self.readiness.ok("rules"):
                log.info("stage_recovered", stage="rules")
        self._alerts = alerts
        verdict = self._evaluate_health(snapshot)
        if self.actions is not None:
            self.actions.update(verdict)
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
        self._poll_durations = self._poll_durations.observe(snapshot.poll_duration_seconds)
        pusher_stats = None
        if self.pusher is not None:
            self.pusher.update(snapshot, alerts)
            pusher_stats = self.pusher.stats
            if pusher_stats.sender_failing:
                self.readiness.failed("alertmanager", "an Alertmanager sender died (restarted)")
            elif self.readiness.ok("alertmanager"):
                log.info("stage_recovered", stage="alertmanager")
        failures = self.readiness.failures
        if pusher_stats is not None and pusher_stats.sender_failures:
            failures["alertmanager"] = pusher_stats.sender_failures  # the pusher counts its own deaths
        stats = ExporterStats(
            source=self.state.source,
            source_reason=self.state.source_reason,
            poll_durations=self._poll_durations,
            alertmanager=pusher_stats,
            process=read_process_stats(),
            host=self.host,
            stage_failures=frozen_map(failures),
            failing_stages=tuple(sorted(self.readiness.failing)),
            web=self.web_stats() if self.web_stats is not None else None,
            reloads=frozen_map(self.reloads()) if self.reloads is not None else frozen_map(),
            actions=self.actions.stats if self.actions is not None else None,
            device_plugin=self.device_plugin_stats() if self.device_plugin_stats is not None else None,
        )
        jobs = self._account(snapshot, verdict)
        published = Published(
            snapshot=snapshot, alerts=alerts, stats=stats, health=verdict, jobs=jobs.running if jobs else ()
        )
        # Publishing is cheap: the bytes are rendered by the first scrape that asks (exposition/render.py).
        self.state = dataclasses.replace(
            self.state,
            published=published,
            metrics=render(published, self.exposition),
            rules=self.rules,
            health_thresholds=self.health_thresholds,
            jobs=jobs,
        )

    def _account(self, snapshot: Snapshot, verdict: HealthVerdict) -> Ledger | None:
        """The accounting stage; a bug in it keeps the last ledger and fails readiness."""
        if self.accounting is None:
            return None
        try:
            ledger = self.accounting.on_cycle(snapshot, verdict)
        except Exception as error:
            if self.readiness.failed("accounting", f"{type(error).__name__}: {error}"):
                log.exception("stage_failed", stage="accounting")
            return self.accounting.ledger
        if self.readiness.ok("accounting"):
            log.info("stage_recovered", stage="accounting")
        return ledger

    def _evaluate_health(self, snapshot: Snapshot) -> HealthVerdict:
        """The verdict on this snapshot; a bug in the stage keeps the last verdict and fails readiness."""
        previous = self._verdict
        try:
            verdict = evaluate_health(previous, snapshot, self.health_thresholds, self.node)
        except Exception as error:
            if self.readiness.failed("health", f"{type(error).__name__}: {error}"):
                log.exception("stage_failed", stage="health")
            return previous if previous is not None else HealthVerdict(taken_at=snapshot.taken_at, node=self.node)
        if self.readiness.ok("health"):
            log.info("stage_recovered", stage="health")
        _log_changes(previous, verdict)
        self._verdict = verdict
        return verdict

    def replace_exposition(self, exposition: ExpositionOptions) -> None:
        """What is rendered from the next cycle on (SIGHUP)."""
        self.exposition = exposition

    def replace_rules(self, rules: Sequence[Rule], health_thresholds: HealthThresholds | None = None) -> None:
        """New rules (and health thresholds) from the next cycle on (SIGHUP): alerts of rules that are
        gone go with them; the checks' histories stay, judged by the new thresholds."""
        if health_thresholds is not None:
            self.health_thresholds = health_thresholds
        self.rules = tuple(rules)
        if self.pusher is not None:
            self.pusher.set_rules(self.rules)

    def flush(self) -> None:
        """Render the current cycle as a Prometheus scrape would ask for it (benchmarks)."""
        if self.state.metrics is not None:
            self.state.metrics.body(openmetrics=True, gzipped=True)


def _log_changes(previous: HealthVerdict | None, verdict: HealthVerdict) -> None:
    """One log event per check that starts or stops failing, never one per cycle."""
    before = {(gpu.gpu, c.check): c for gpu in previous.gpus for c in gpu.checks} if previous is not None else {}
    now = {(gpu.gpu, c.check): c for gpu in verdict.gpus for c in gpu.checks}
    for (gpu, name), check in now.items():
        if (gpu, name) not in before:
            log.warning("health_check_failing", gpu=gpu, check=name, severity=check.severity, reason=check.reason)
    for gpu, name in before.keys() - now.keys():
        log.info("health_check_cleared", gpu=gpu, check=name)
    if verdict.drain_command and (previous is None or previous.drain_command != verdict.drain_command):
        log.warning(
            "health_suggestion",
            suggestion=verdict.suggestion,
            slurm=verdict.drain_command,
            kubernetes=verdict.taint_command,
        )
