"""The enrich stage and the render of attribution, pure: label sets per snapshot, nothing carried over."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution.sources import AttributionInputs
from exporter.exposition.render import render
from exporter.exposition.selection import DEFAULTS, ExpositionOptions
from exporter.model import (
    AttributionReport,
    ByBdf,
    ByGpuIndex,
    Claim,
    DeviceIdentity,
    DeviceState,
    Published,
    Sample,
    Snapshot,
)
from exporter.pipeline.enrich import enrich

LABELS = ("pod", "namespace", "container", "job_id", "job_user", "job_partition")
DEVICES = tuple(
    DeviceState(DeviceIdentity(bdf, f"card{i}", f"/sys/devices/{bdf}"), i, Sample(1.0, power_watts=100.0), True)
    for i, bdf in enumerate(("0000:19:00.0", "0000:3b:00.0"))
)


def _pod(bdf: str, pod: str) -> Claim:
    return Claim(ByBdf(bdf), bdf, (("pod", pod), ("namespace", "ml"), ("container", "c")), "amd.com/gpu")


def _job(gpu: int, job: str) -> Claim:
    return Claim(ByGpuIndex(gpu), str(gpu), (("job_id", job), ("job_user", "u"), ("job_partition", "p")), "slurm")


# --attribution.series-labels: the holders' labels on every per-GPU series, not only on the _info series.
ON_EVERY_SERIES = replace(DEFAULTS, attribution_labels=True)


def _series(snapshot: Snapshot, options: ExpositionOptions = ON_EVERY_SERIES) -> dict[str, list[dict[str, str]]]:
    text = render(Published(snapshot), options).text.decode()
    result: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if family.name == "amdgpu_exporter_attribution_up":
                labels["__value__"] = str(sample.value)
            result.setdefault(sample.name, []).append(labels)
    return result


def _values(series: dict[str, list[dict[str, str]]], name: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, float(labels.pop("__value__"))) for labels in (dict(x) for x in series[name])]


def _enriched(*claims: Claim, kubelet_up: bool = True) -> Snapshot:
    pods = AttributionReport("kubernetes", kubelet_up, tuple(c for c in claims if c.resource != "slurm"))
    jobs = AttributionReport("slurm", True, tuple(c for c in claims if c.resource == "slurm"))
    return enrich(Snapshot(taken_at=2.0, devices=DEVICES), AttributionInputs(LABELS, (pods, jobs)))


def test_by_default_only_the_info_series_name_the_holders() -> None:
    series = _series(_enriched(_pod("0000:19:00.0", "a"), _job(1, "7")), DEFAULTS)
    assert series["amdgpu_power_watts"] == [{"gpu": "0"}, {"gpu": "1"}]
    labelled = {name for name, found in series.items() if any(set(LABELS) & set(labels) for labels in found)}
    assert labelled == {"amdgpu_allocation_info", "amdgpu_job_info"}


def test_as_an_option_every_per_gpu_series_carries_the_holder_and_a_gone_pod_leaves_nothing() -> None:
    first = _series(_enriched(_pod("0000:19:00.0", "a"), _job(1, "7")))
    assert first["amdgpu_power_watts"] == [
        {"gpu": "0", **dict(zip(LABELS, ("a", "ml", "c", "", "", ""), strict=True))},
        {"gpu": "1", **dict(zip(LABELS, ("", "", "", "7", "u", "p"), strict=True))},
    ]
    assert first["amdgpu_allocation_info"] == [
        {"gpu": "0", "pod": "a", "namespace": "ml", "container": "c", "resource": "amd.com/gpu"}
    ]
    assert first["amdgpu_job_info"] == [{"gpu": "1", "job_id": "7", "job_user": "u", "job_partition": "p"}]
    for name, series in first.items():
        if series and "gpu" in series[0] and name not in ("amdgpu_allocation_info", "amdgpu_job_info"):
            assert all(set(LABELS) <= set(labels) for labels in series), name

    # The next snapshot: pod a and job 7 are gone, b holds GPU 1. Nothing of a or 7 remains.
    second = _series(_enriched(_pod("0000:3b:00.0", "b")))
    text = repr(second)
    assert "'a'" not in text and "'7'" not in text
    assert [labels["pod"] for labels in second["amdgpu_power_watts"]] == ["", "b"]
    assert "amdgpu_job_info" not in second


def test_kubelet_down_is_up_0_and_its_kept_claims_still_label() -> None:
    # Within keep_for the source's report is down but still holds its last good claims.
    series = _series(_enriched(_pod("0000:19:00.0", "a"), kubelet_up=False))
    up = {labels["source"]: value for labels, value in _values(series, "amdgpu_exporter_attribution_up")}
    assert up == {"kubernetes": 0.0, "slurm": 1.0}
    assert [labels["pod"] for labels in series["amdgpu_power_watts"]] == ["a", ""]
    # After keep_for the source drops them: the labels empty.
    series = _series(_enriched(kubelet_up=False))
    assert all(labels["pod"] == "" for labels in series["amdgpu_power_watts"])


def test_enrich_without_inputs_changes_nothing() -> None:
    snapshot = Snapshot(taken_at=2.0, devices=DEVICES)
    assert enrich(snapshot) is snapshot
    assert set(_series(snapshot)["amdgpu_power_watts"][0]) == {"gpu"}


def test_identity_labels_go_with_the_attribution_labels() -> None:
    snapshot = _enriched(_pod("0000:19:00.0", "a"))
    options = replace(ON_EVERY_SERIES, identity_labels=("pci_bus_id", "card"))
    text = render(Published(snapshot), options).text.decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    (first, _) = families["amdgpu_power_watts"].samples
    assert set(first.labels) == {"gpu", "pci_bus_id", "card", *LABELS}
    assert (first.labels["pci_bus_id"], first.labels["card"], first.labels["pod"]) == ("0000:19:00.0", "card0", "a")
    (holder,) = families["amdgpu_allocation_info"].samples  # not attributed, but per GPU: identity too
    assert set(holder.labels) == {"gpu", "pod", "namespace", "container", "resource", "pci_bus_id", "card"}
    info = families["amdgpu_device_info"].samples[0].labels  # has them already: unchanged
    assert info["card"] == "card0" and info["pci_bus_id"] == "0000:19:00.0"
