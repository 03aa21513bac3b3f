"""AlertmanagerPusher's pure parts: URLs, labels, what update() queues and when it sends at once."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime

import pytest

from exporter.alerting.alertmanager import (
    AlertmanagerPusher,
    OutgoingAlert,
    _needs_prompt_send,
    alert_labels,
    alerts_endpoint,
    rfc3339,
)
from exporter.alerting.rulefile import default_rule_file
from exporter.model import AlertmanagerStats, AlertState, DeviceIdentity, DeviceState, Snapshot, frozen_map


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def gcd(gpu: int, serial: str = "PCB040") -> DeviceState:
    identity = DeviceIdentity(
        pci_bus_id=f"0000:{0x29 + gpu:02x}:00.0",
        card=f"card{gpu}",
        device_dir="/sys/devices/x",
        product="AMD Instinct MI250X",
        serial=serial,
        package="0",
        die=gpu,
    )
    return DeviceState(identity=identity, gpu=gpu, sample=None, up=True)


def alert(gpu: int, firing: bool, since: float, suggestion: str = "lower it", value: float = 90.0) -> AlertState:
    return AlertState(
        gpu=gpu,
        alert="GpuJunctionTemperatureHigh",
        severity="warning",
        firing=firing,
        since=since,
        value=value,
        suggestion=suggestion if firing else "",
        device_key=gcd(gpu).identity.key,  # alerts follow the device, not the gpu index
    )


def snapshot(at: float, *alerts: AlertState) -> tuple[Snapshot, tuple[AlertState, ...]]:
    """One cycle as the pipeline hands it to the pusher: the snapshot and the alerts evaluated on it."""
    return Snapshot(taken_at=at, monotonic_at=at, devices=(gcd(0), gcd(1))), alerts


def test_urls_are_checked_and_normalised() -> None:
    assert alerts_endpoint("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert alerts_endpoint(" https://host/alertmanager/ ") == "https://host/alertmanager/api/v2/alerts"
    assert alerts_endpoint("http://am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"
    for bad in ("am:9093", "ftp://am", "http://", ""):
        with pytest.raises(ValueError, match=r"alertmanager\.url"):
            alerts_endpoint(bad)
    with pytest.raises(ValueError, match="at least one"):
        AlertmanagerPusher([], node="x")
    pusher = AlertmanagerPusher(["http://a:9093", "http://a:9093/"], node="x")
    assert pusher.endpoints == ("http://a:9093/api/v2/alerts",)


def test_labels_carry_identity_and_drop_empty_values() -> None:
    (rule,) = default_rule_file().rules
    workload = {"pod": "train-0", "namespace": "ml", "container": "", "gpu": "7"}
    labels = alert_labels(
        alert(1, True, 0.0), gcd(1, serial=""), node="gpu-node-1", instance="pod:9442", rule=rule, workload=workload
    )
    assert labels == {
        "alertname": "GpuJunctionTemperatureHigh",
        "alert": "GpuJunctionTemperatureHigh",
        "severity": "warning",
        "node": "gpu-node-1",
        "instance": "pod:9442",
        "sensor": "junction",
        "pod": "train-0",  # workload labels when attribution gives them; never over an identifying one
        "namespace": "ml",
        "gpu": "1",
        "pci_bus_id": "0000:2a:00.0",
        "product": "AMD Instinct MI250X",
        "package": "0",
        "die": "1",
    }
    assert alert_labels(alert(0, True, 0.0), None, node="n")["gpu"] == "0"


def test_rfc3339_is_utc() -> None:
    assert rfc3339(0.5) == "1970-01-01T00:00:00.500000Z"
    assert parse_time(rfc3339(1700000000.25)) == 1700000000.25


def test_firing_then_resolved_then_expired() -> None:
    pusher = AlertmanagerPusher(["http://am:9093"], node="n", resend_interval=10, resolved_retention=100)
    pusher.update(*snapshot(1000, alert(0, True, since=990), alert(1, False, since=500)))
    (firing,) = pusher.pending_payload(now=1001)
    assert firing["labels"]["gpu"] == "0"
    assert parse_time(firing["startsAt"]) == 990
    assert parse_time(firing["endsAt"]) == 1001 + 4 * 10  # stays active across three lost resends
    assert firing["annotations"]["suggestion"] == "lower it"
    assert firing["annotations"]["summary"] == "GpuJunctionTemperatureHigh on GPU 0 on n"
    assert firing["annotations"]["runbook_url"] == "docs/runbooks.md#amdgpudaemonalert"
    assert firing["labels"]["node"] == "n" and firing["labels"]["alert"] == "GpuJunctionTemperatureHigh"

    # Still firing: the start time is kept. Then it resolves at 1050 (the state's since).
    pusher.update(*snapshot(1010, alert(0, True, since=990, value=91.0)))
    assert parse_time(pusher.pending_payload(now=1011)[0]["startsAt"]) == 990
    pusher.update(*snapshot(1050, alert(0, False, since=1050)))
    (resolved,) = pusher.pending_payload(now=1060)
    assert parse_time(resolved["endsAt"]) == 1050 and parse_time(resolved["startsAt"]) == 990
    assert "suggestion" not in resolved["annotations"]  # "lower it" is no advice for a resolved alert

    # An alert that vanishes without a resolved state (its rule was removed) resolves "now".
    pusher.update(*snapshot(1100, alert(1, True, since=1100)))
    pusher.update(*snapshot(1120))
    ends = {p["labels"]["gpu"]: parse_time(p["endsAt"]) for p in pusher.pending_payload(now=1121)}
    assert ends == {"0": 1050, "1": 1120}

    # Resolved alerts are re-sent for the retention period, then dropped.
    pusher.update(*snapshot(1149))
    assert len(pusher.pending_payload(now=1150)) == 2
    pusher.update(*snapshot(1151))
    assert [p["labels"]["gpu"] for p in pusher.pending_payload(now=1152)] == ["1"]
    pusher.update(*snapshot(1300))
    assert pusher.pending_payload(now=1300) == []


def test_refiring_after_resolution_is_a_new_alert() -> None:
    pusher = AlertmanagerPusher(["http://am:9093"], node="n")
    pusher.update(*snapshot(10, alert(0, True, since=10)))
    pusher.update(*snapshot(20, alert(0, False, since=20)))
    pusher.update(*snapshot(30, alert(0, True, since=30)))
    (again,) = pusher.pending_payload(now=31)
    assert parse_time(again["startsAt"]) == 30 and parse_time(again["endsAt"]) > 31


def test_only_meaningful_changes_are_sent_at_once() -> None:
    labels = {"alertname": "A", "gpu": "0"}
    base = OutgoingAlert(labels, {"summary": "s", "description": "86 °C", "suggestion": "5 %"}, 10.0)
    same = {(0, "A"): base}
    assert _needs_prompt_send({}, same)
    assert not _needs_prompt_send(same, same)
    new_value = dataclasses.replace(base, annotations={**base.annotations, "description": "87 °C"})
    assert not _needs_prompt_send(same, {(0, "A"): new_value})
    next_step = dataclasses.replace(base, annotations={**base.annotations, "suggestion": "10 %"})
    assert _needs_prompt_send(same, {(0, "A"): next_step})
    assert _needs_prompt_send(same, {(0, "A"): dataclasses.replace(base, resolved_at=20.0)})
    assert _needs_prompt_send(same, {(0, "A"): dataclasses.replace(base, labels={**labels, "severity": "x"})})
    resolved = {(0, "A"): dataclasses.replace(base, resolved_at=20.0)}
    assert not _needs_prompt_send(resolved, resolved)
    assert not _needs_prompt_send({}, resolved)


def test_nothing_to_send_means_no_post_and_a_prompt_stop() -> None:
    # Port 9 (discard) on localhost is never contacted: with no alerts there is nothing to post.
    pusher = AlertmanagerPusher(["http://127.0.0.1:9"], node="n", resend_interval=0.05)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(pusher.run(stop))
        pusher.update(*snapshot(1.0, alert(0, False, since=1.0)))
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(task, 1)

    asyncio.run(scenario())
    assert pusher.stats == AlertmanagerStats(sent=0, failed=0)


def test_resolved_clock_down_alert_carries_the_restore_advice_until_it_expires() -> None:
    pusher = AlertmanagerPusher(["http://am:9093"], node="gpu-node-1", runbook_base="https://git.example.org/x/")
    lower = dataclasses.replace(
        alert(0, True, since=10),
        suggestion="lower to 1548 MHz",
        suggested_command="rocm-smi -d 0 --autorespond yes --setsrange 500 1548",
        undo_command="rocm-smi -d 0 --resetclocks",
    )
    pusher.update(*snapshot(20, lower))
    (firing,) = pusher.pending_payload(now=21)
    assert firing["annotations"]["undo_command"] == "rocm-smi -d 0 --resetclocks"
    assert firing["annotations"]["runbook_url"] == "https://git.example.org/x/docs/runbooks.md#amdgpudaemonalert"
    restore = dataclasses.replace(
        alert(0, False, since=30),
        suggestion="restore the default clocks",
        suggested_command="rocm-smi -d 0 --resetclocks",
        undo_command="rocm-smi -d 0 --resetclocks",
        cool_since=30,
    )
    pusher.update(*snapshot(30, restore))
    (resolved,) = pusher.pending_payload(now=31)
    assert parse_time(resolved["endsAt"]) == 30
    assert resolved["annotations"]["suggestion"] == "restore the default clocks"
    assert resolved["annotations"]["suggested_command"] == "rocm-smi -d 0 --resetclocks"
    pusher.update(*snapshot(40, restore))
    assert pusher.pending_payload(now=41)[0]["annotations"]["suggestion"] == "restore the default clocks"
    # Cool for long enough: the advice expires, the resolved alert stays without it.
    pusher.update(*snapshot(100, alert(0, False, since=30)))
    (after,) = pusher.pending_payload(now=101)
    assert parse_time(after["endsAt"]) == 30
    assert not {"suggestion", "suggested_command", "undo_command"} & set(after["annotations"])


def test_pushed_alerts_carry_the_workload_labels_of_the_enriched_snapshot() -> None:
    from exporter.model import Attribution

    attribution = Attribution(
        label_names=("pod", "namespace", "container"), labels=frozen_map({1: ("train-0", "ml", "worker")})
    )
    pusher = AlertmanagerPusher(["http://am:9093"], node="gpu-node-1")
    cycle, alerts = snapshot(10, alert(1, True, since=10), alert(0, True, since=10))
    pusher.update(dataclasses.replace(cycle, attribution=attribution), alerts)
    labels = {p["labels"]["gpu"]: p["labels"] for p in pusher.pending_payload(now=11)}
    assert (labels["1"]["pod"], labels["1"]["namespace"], labels["1"]["container"]) == ("train-0", "ml", "worker")
    assert not {"pod", "namespace", "container"} & set(labels["0"])  # not allocated: no empty labels
