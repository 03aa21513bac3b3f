"""Where the verdict goes, over a constructed cycle: the metric families, /api/v1/health, /readyz,
the status page's health line and the snapshot table's column, all from the one HealthVerdict."""

from __future__ import annotations

import dataclasses

from starlette.testclient import TestClient

from exporter.alerting.rulefile import default_health
from exporter.alerting.verdict import evaluate_health
from exporter.cycle import PublishedState
from exporter.exposition.render import render
from exporter.model import HealthVerdict, Published, Sample, Snapshot
from exporter.operator.snapshot_table import WIDTH, render_table
from exporter.web.routes import create_app
from exporter.web.status_page import render_status_page
from tests.unit.test_health_verdict import T0, device, ecc

NODE = "gpu-node-1"


def published_with_a_new_error() -> Published:
    """gpu 0 read twice: its uncorrectable count grew between the reads; gpu 1 fit."""
    fit = dataclasses.replace(device(Sample(timestamp=T0)), gpu=1, identity=dataclasses.replace(
        device().identity, pci_bus_id="0000:c2:00.0", unique_id="u1"))  # fmt: skip
    verdict: HealthVerdict | None = None
    snapshot = Snapshot(taken_at=T0)
    for at, count in ((0.0, 0), (30.0, 2)):
        snapshot = Snapshot(taken_at=T0 + at, monotonic_at=at, devices=(device(ecc(uncorrectable=count)), fit))
        verdict = evaluate_health(verdict, snapshot, default_health(), NODE)
    assert verdict is not None
    later = dataclasses.replace(verdict, taken_at=T0 + 90)  # the same verdict a minute on: its age
    return Published(snapshot=snapshot, health=later)


def test_the_metric_families_show_the_verdict_and_the_commands() -> None:
    text = render(published_with_a_new_error()).body(openmetrics=False, gzipped=False).decode()
    assert 'amdgpu_health_status{gpu="0"} 0.0' in text and 'amdgpu_health_status{gpu="1"} 1.0' in text
    assert 'amdgpu_health_check{check="ecc_uncorrectable",gpu="0",severity="critical"} 1.0' in text
    assert 'amdgpu_health_check_since_seconds{check="ecc_uncorrectable",gpu="0"} 60.0' in text
    assert (
        'amdgpu_health_suggestion_info{scheduler="slurm",suggested_command="scontrol update nodename=gpu-node-1 '
        'state=drain reason=\\"amdgpu-exporter: gpu 0: ecc_uncorrectable\\"",undo_command="scontrol update '
        'nodename=gpu-node-1 state=resume"} 1.0'
    ) in text
    assert 'amdgpu_health_check{check="ecc_uncorrectable",gpu="1"' not in text


def test_the_health_document_and_readyz() -> None:
    published = published_with_a_new_error()
    state = PublishedState(source="sysfs", published=published, metrics=render(published))
    client = TestClient(create_app(lambda: state, "/metrics", node=NODE))
    document = client.get("/api/v1/health").json()
    assert document["node"] == NODE and document["fit"] is False and document["unfit_gpus"] == [0]
    (check,) = document["gpus"][0]["checks"]
    assert check["check"] == "ecc_uncorrectable" and check["age_seconds"] == 60.0
    assert check["reason"].startswith("2 uncorrectable ECC errors since the exporter started reading it")
    assert document["gpus"][1] == {"gpu": 1, "pci_bus_id": "0000:c2:00.0", "unique_id": "u1", "serial": "",
                                   "partition": 0, "fit": True, "checks": []}  # fmt: skip
    assert document["commands"]["kubernetes"] == {
        "suggested_command": f"kubectl taint node {NODE} amd.com/gpu-unhealthy=gpu0:NoSchedule --overwrite",
        "undo_command": f"kubectl taint node {NODE} amd.com/gpu-unhealthy:NoSchedule-",
    }
    # readable, if unfit: /readyz has nothing to name (it names unreadable GPUs only)
    assert client.get("/readyz").text == "ready\n"
    assert "health" in client.get("/").text and 'class="health unfit"' in client.get("/").text


def test_the_status_page_line_and_the_snapshot_column() -> None:
    published = published_with_a_new_error()
    page = render_status_page(published.snapshot, version="0", source="sysfs", health=published.health)
    assert 'class="health unfit" data-field="health"' in page and "health: UNFIT ecc_uncorrectable" in page
    assert "health: fit" in page
    table = render_table(published.snapshot.devices, taken_at=T0 + 90, health=published.health)
    lines = table.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert lines[1].endswith(" fit")
    row0 = next(line for line in lines if line.startswith("  0 "))
    row1 = next(line for line in lines if line.startswith("  1 "))
    assert row0.endswith(" NO") and row1.endswith(" yes")
    assert any(line.strip().startswith("x ecc_uncorrectable (critical, 1m00s): 2 uncorrectable") for line in lines)
    assert lines[-1].startswith("  ") and "health: GPU not fit (gpu 0: ecc_uncorrectable)" in table
