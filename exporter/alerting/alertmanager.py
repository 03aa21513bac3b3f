"""Direct paging without Prometheus: push in-daemon alerts to Alertmanager's v2 API.

    pusher = AlertmanagerPusher(["http://127.0.0.1:9093"], node="node1", instance="node1:9442", rules=rules)
    task = asyncio.create_task(pusher.run(stop))      # the background sender
    pusher.update(snapshot, alerts)                   # after each poll cycle: never blocks
    pusher.stats                                      # AlertmanagerStats, copied into what a cycle publishes

Alertmanager expects what Prometheus does: every firing alert re-posted on a fixed cadence with an
endsAt a few intervals ahead (so a daemon that dies lets its alerts expire instead of firing
forever), and a resolved alert posted with endsAt = the time it resolved. Resolved alerts are
re-posted for `resolved_retention` seconds, as Prometheus does, in case a post was lost.

update() only swaps in the new set of alerts and drops a wake-up token into each endpoint's
one-slot queue; one sender task per Alertmanager posts the newest set, so a slow or dead
Alertmanager delays only itself and never the poll loop, and a retry never sends stale alerts.
Failures back off exponentially up to the resend interval and end up as log lines and counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from exporter.alerting.rules import Rule
from exporter.alerting.texts import ADVICE, advice_fields, alert_annotations
from exporter.alerting.watch import WATCHABLE
from exporter.log import get_logger
from exporter.model import AlertmanagerStats, AlertState, DeviceState, Snapshot

log = get_logger("exporter.alerting.alertmanager")

API_PATH = "/api/v2/alerts"
AlertKey = tuple[tuple[str, str, int], str]  # (device key, alert): an alert follows its device, whatever its gpu
# Prometheus sets endsAt to 4 resend intervals ahead: three lost posts in a row do not resolve it.
ENDS_AT_INTERVALS = 4


def alerts_endpoint(url: str) -> str:
    """'http://am:9093' or 'http://host/prefix/' -> the v2 alerts URL; ValueError when not http(s)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--alertmanager.url must be an http:// or https:// URL, not {url!r}")
    base = url.strip().rstrip("/")
    return base if base.endswith(API_PATH) else base + API_PATH


def rfc3339(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


REPLY_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class OutgoingAlert:
    """One alert as Alertmanager sees it; `resolved_at` is None while it fires."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    resolved_at: float | None = None

    def payload(self, now: float, valid_for: float) -> dict[str, Any]:
        ends_at = self.resolved_at if self.resolved_at is not None else now + valid_for
        return {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(self.starts_at),
            "endsAt": rfc3339(max(ends_at, self.starts_at)),
        }


RUNBOOK_PATH = "docs/runbooks.md#amdgpudaemonalert"


def alert_labels(
    state: AlertState,
    device: DeviceState | None,
    *,
    node: str,
    instance: str = "",
    rule: Rule | None = None,
    workload: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The labels of docs/alert-labels.md: alertname and alert (both the rule's name), severity, node,
    gpu, pci_bus_id, the rule's sensor / engine / pool / domain, the workload labels when attribution
    is on, and the device identity. Empty values are left out (Alertmanager, like Prometheus, treats
    an empty label as an absent one). `instance` is sent for people only: routing never uses it."""
    labels = {
        "alertname": state.alert,
        "alert": state.alert,
        "severity": state.severity,
        "node": node,
        "instance": instance,
        "gpu": str(state.gpu),
        "pci_bus_id": state.device_key[0],
    }
    if rule is not None and rule.key:
        key_label = WATCHABLE[rule.metric].key_label
        if key_label is not None:
            labels[key_label] = rule.key
    if device is not None:
        identity = device.identity
        labels.update(
            pci_bus_id=identity.pci_bus_id,
            serial=identity.serial,
            product=identity.product,
            package=identity.package,
            die=str(identity.die),
        )
    for name, value in (workload or {}).items():
        # Workload labels never replace an identifying one.
        labels.setdefault(name, value)
    return {name: value for name, value in labels.items() if value}


class AlertmanagerPusher:
    """Sends firing and resolved in-daemon alerts to one or more Alertmanagers."""

    def __init__(
        self,
        urls: Sequence[str],
        node: str,
        instance: str = "",
        resend_interval: float = 60.0,
        timeout: float = 5.0,
        *,
        rules: Sequence[Rule] = (),
        resolved_retention: float = 900.0,
        retry_initial: float = 1.0,
        runbook_base: str = "",
    ) -> None:
        if not urls:
            raise ValueError("AlertmanagerPusher needs at least one Alertmanager URL")
        if resend_interval <= 0 or timeout <= 0 or retry_initial <= 0:
            raise ValueError("resend_interval, timeout and retry_initial must be more than 0")
        self.endpoints = tuple(dict.fromkeys(alerts_endpoint(url) for url in urls))
        self.node = node
        self.instance = instance
        self.runbook_url = runbook_base + RUNBOOK_PATH
        self.resend_interval = resend_interval
        self.timeout = timeout
        self.resolved_retention = resolved_retention
        self.retry_initial = retry_initial
        self.set_rules(rules)
        # Replaced whole by update() so a sender always reads one consistent set.
        self._outbox: Mapping[AlertKey, OutgoingAlert] = {}
        # One-slot wake-up queues per endpoint, made in run() so they belong to its event loop.
        self._wake: dict[str, asyncio.Queue[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = AlertmanagerStats()  # replaced whole: a reader never sees half an update
        self.last_error: dict[str, str] = {}  # endpoint -> last failure, "" once it works again

    # -- called by the poll loop --

    def set_rules(self, rules: Sequence[Rule]) -> None:
        """The rules whose texts the next update() uses (after a reload)."""
        self._rules = {rule.alert: rule for rule in rules}

    @property
    def stats(self) -> AlertmanagerStats:
        """Alerts accepted by an Alertmanager and alerts in failed posts (one per alert per post), so far."""
        return self._stats

    def update(self, snapshot: Snapshot, alerts: Sequence[AlertState]) -> None:
        """Record what should be sent after this cycle. Never blocks, never does I/O."""
        now, attribution = snapshot.taken_at, snapshot.attribution
        devices = {device.identity.key: device for device in snapshot.devices}
        previous = self._outbox
        outbox: dict[AlertKey, OutgoingAlert] = {}
        for state in alerts:
            key = (state.device_key, state.alert)
            old = previous.get(key)
            if not state.firing:
                if old is not None and state.suggestion:
                    # The restore advice after a clock-down rides on the resolved alert until it expires.
                    advice = advice_fields(state.suggestion, state.suggested_command, state.undo_command)
                    annotations = {**old.annotations, **advice}
                    resolved_at = old.resolved_at if old.resolved_at is not None else max(state.since, old.starts_at)
                    outbox[key] = OutgoingAlert(old.labels, annotations, old.starts_at, resolved_at=resolved_at)
                continue
            device = devices.get(state.device_key)
            rule = self._rules.get(state.alert)
            starts_at = old.starts_at if old is not None and old.resolved_at is None else state.since
            annotations = alert_annotations(rule, state, device, node=self.node)
            annotations["runbook_url"] = self.runbook_url
            # Who is on the device (pod, namespace, container / job_id, ...), as its series say; none
            # when attribution is off.
            workload = dict(zip(attribution.label_names, attribution.values_for(state.gpu), strict=True))
            labels = alert_labels(state, device, node=self.node, instance=self.instance, rule=rule, workload=workload)
            outbox[key] = OutgoingAlert(labels, annotations, starts_at)
        resolved_since = {(s.device_key, s.alert): s.since for s in alerts if not s.firing}
        for key, old in previous.items():
            if key in outbox:
                continue
            # Resolved now (posted at once), or earlier and still re-posted for resolved_retention.
            if old.resolved_at is None:
                resolved_at = max(resolved_since.get(key, now), old.starts_at)
            elif now - old.resolved_at < self.resolved_retention:
                resolved_at = old.resolved_at
            else:
                continue
            outbox[key] = OutgoingAlert(old.labels, _without_advice(old.annotations), old.starts_at, resolved_at)
        self._outbox = outbox
        if _needs_prompt_send(previous, outbox):
            self._wake_senders()

    def pending_payload(self, now: float | None = None) -> list[dict[str, Any]]:
        """The body the next post will carry (firing alerts first), as of `now`."""
        at = time.time() if now is None else now
        valid_for = ENDS_AT_INTERVALS * self.resend_interval
        alerts = sorted(self._outbox.values(), key=lambda a: (a.resolved_at is not None, sorted(a.labels.items())))
        return [alert.payload(at, valid_for) for alert in alerts]

    # -- the background sender --

    async def run(self, stop: asyncio.Event) -> None:
        """Post to every Alertmanager until `stop` is set: at once on a change, else every resend_interval."""
        self._wake = {url: asyncio.Queue(maxsize=1) for url in self.endpoints}
        self._loop = asyncio.get_running_loop()
        # Redirects are not followed and nothing is decompressed: only a few KiB of any reply are read.
        async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as client:
            senders = [
                asyncio.create_task(self._supervised(client, url), name=f"alertmanager {url}") for url in self.endpoints
            ]
            try:
                await stop.wait()
            finally:
                for task in senders:
                    task.cancel()
                for task in senders:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                self._loop = None

    async def _supervised(self, client: httpx.AsyncClient, url: str) -> None:
        """One endpoint's sender, restarted (and counted, and readiness failed) if it ever dies."""
        while True:
            try:
                await self._sender(client, url)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a bug in building a payload: count it, say so, start again
                stats = self._stats
                self._stats = dataclasses.replace(stats, sender_failures=stats.sender_failures + 1, sender_failing=True)
                log.error("alertmanager_sender_failed", url=url, error=f"{type(error).__name__}: {error}")
                await asyncio.sleep(self.retry_initial)

    async def _sender(self, client: httpx.AsyncClient, url: str) -> None:
        backoff = self.retry_initial
        while True:
            body = self.pending_payload()
            delay = self.resend_interval
            if body:
                if await self._post(client, url, body):
                    backoff = self.retry_initial
                else:
                    delay = backoff
                    backoff = min(backoff * 2, self.resend_interval)
            if self._stats.sender_failing:
                self._stats = dataclasses.replace(self._stats, sender_failing=False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake[url].get(), timeout=delay)

    async def _post(self, client: httpx.AsyncClient, url: str, body: list[dict[str, Any]]) -> bool:
        try:
            # One deadline for the whole post: httpx's timeout is per read, and an endpoint that
            # trickles a byte every few seconds would otherwise hold its sender forever.
            async with asyncio.timeout(self.timeout):
                status, reply = await _post_json(client, url, body)
        except TimeoutError:
            error = f"no complete answer within {self.timeout:g} s"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            if 200 <= status < 300:
                self._stats = dataclasses.replace(self._stats, sent=self._stats.sent + len(body))
                if self.last_error.get(url):
                    log.info("alertmanager_reachable_again", url=url, alerts=len(body))
                self.last_error[url] = ""
                return True
            error = f"HTTP {status}: {reply.decode('utf-8', 'replace').strip()[:200]}"
        self._stats = dataclasses.replace(self._stats, failed=self._stats.failed + len(body))
        self.last_error[url] = error
        log.warning("alertmanager_post_failed", url=url, alerts=len(body), error=error)
        return False

    def _wake_senders(self) -> None:
        loop = self._loop
        if loop is None:
            return  # run() has not started: its first pass sends everything anyway
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._signal()
        else:
            loop.call_soon_threadsafe(self._signal)

    def _signal(self) -> None:
        for queue in self._wake.values():
            # A token already waiting means a send is already due: one is enough.
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)


async def _post_json(client: httpx.AsyncClient, url: str, body: list[dict[str, Any]]) -> tuple[int, bytes]:
    """(status, at most REPLY_LIMIT bytes of the raw reply): a 400 MB error page or a gzip bomb
    from a broken Alertmanager costs the daemon a few KiB."""
    headers = {"accept-encoding": "identity"}
    async with client.stream("POST", url, json=body, headers=headers) as response:
        reply = bytearray()
        async for chunk in response.aiter_raw():
            reply += chunk[: REPLY_LIMIT - len(reply)]
            if len(reply) >= REPLY_LIMIT:
                break
        return response.status_code, bytes(reply)


def _without_advice(annotations: Mapping[str, str]) -> Mapping[str, str]:
    """A resolved alert whose restore advice has expired: the advice goes, the rest stays."""
    if not any(name in annotations for name in ADVICE):
        return annotations
    return {name: value for name, value in annotations.items() if name not in ADVICE}


def _needs_prompt_send(previous: Mapping[AlertKey, OutgoingAlert], current: Mapping[AlertKey, OutgoingAlert]) -> bool:
    """A new, resolved or re-labelled alert, or a changed suggestion, is sent at once; a changed
    value in the description alone waits for the next regular resend."""
    for key, alert in current.items():
        old = previous.get(key)
        if old is None:
            if alert.resolved_at is None:
                return True
            continue
        if (old.resolved_at is None) != (alert.resolved_at is None) or old.labels != alert.labels:
            return True
        if old.annotations.get("suggestion") != alert.annotations.get("suggestion"):
            return True
    return False
