"""Series per device of a demo fleet, counted on /metrics rendered through the real pipeline.

The simulator writes a sysfs tree, the daemon's own source selection picks the sysfs source, the
poller reads it, the fast sampler fills its windows from the tree's gpu_metrics, the Pipeline
enriches (a pod and a Slurm job on every device), evaluates the shipped rules and renders: what
/metrics would send for that node. `python -m tests.series_budget [FLEET ...]` prints the table
docs/design.md quotes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter import config
from exporter.alerting.rulefile import rules_of
from exporter.attribution.sources import AttributionInputs
from exporter.cycle import Pipeline
from exporter.exposition.render import render
from exporter.exposition.selection import DEFAULTS, ExpositionOptions, Selection
from exporter.model import AttributionReport, ByGpuIndex, Claim, Published
from exporter.pipeline.enrich import enrich
from exporter.pipeline.poller import Poller
from exporter.pipeline.sampler import Sampler
from exporter.simulator import Simulator
from exporter.simulator.asics import ASICS
from exporter.simulator.fleet import COMPUTE_PARTITION_COUNTS
from exporter.sources.select import select_source

BUDGET = 120  # series per device (GCD or compute partition) at defaults, all families together
POD_LABELS = ("pod", "namespace", "container")
JOB_LABELS = ("job_id", "job_user", "job_partition")
ATTRIBUTION_FAMILIES = ("amdgpu_allocation_info", "amdgpu_job_info", "amdgpu_exporter_attribution_up")


def demo_fleets() -> tuple[str, ...]:
    """A full node of every model the simulator offers (8 GCDs or sockets), and every compute
    partition mode of an MI300X and of the newest model."""
    fleets = [f"{8 // model.gcds_per_package}x{name}" for name, model in ASICS.items()]
    for name in ("MI300X", "MI355X"):
        offered = [mode.strip() for mode in ASICS[name].compute_partitions.split(",") if mode.strip()]
        fleets += [f"8x{name}:{mode}" for mode in offered if COMPUTE_PARTITION_COUNTS[mode] > 1]
    return tuple(fleets)


def attribution_inputs(devices: int, job: str = "1000") -> AttributionInputs:
    """A pod and a Slurm job on every device (the Slurm job `job`+gpu)."""
    pods = tuple(
        Claim(ByGpuIndex(g), str(g), (("pod", f"train-{g}"), ("namespace", "ml"), ("container", "main")), "amd.com/gpu")
        for g in range(devices)
    )
    jobs = tuple(
        Claim(ByGpuIndex(g), str(g), (("job_id", f"{job}{g}"), ("job_user", "ana"), ("job_partition", "gpu")), "slurm")
        for g in range(devices)
    )
    reports = (AttributionReport("kubernetes", True, pods), AttributionReport("slurm", True, jobs))
    return AttributionInputs((*POD_LABELS, *JOB_LABELS), reports)


def published_node(fleet: str, seed: int = 1) -> Published:
    """The second cycle's Published of a demo node running `training`, every device held."""
    with tempfile.TemporaryDirectory(prefix="amdgpu-budget-") as tmp:
        root = Path(tmp) / "sys"
        simulator = Simulator(root, fleet, "training", seed=seed)
        simulator.write_tree()
        parser = argparse.ArgumentParser()
        config.add_arguments(parser)
        settings = config.resolve(parser.parse_args([f"--path.sysfs={root}", "--slow-interval=1h"]), environ={})
        source, name, reason = select_source(settings.source_choice(), str(root))
        poller = Poller(source, interval=settings.interval, read_timeout=10.0, source_name=name)
        fast = Sampler(interval=settings.fast_interval, window=settings.window)
        devices = simulator.fleet.device_count
        pipeline = Pipeline(
            source_name=name,
            source_reason=reason,
            rules=rules_of(settings),
            sampler=fast,
            attribution=lambda: attribution_inputs(devices),
        )

        async def cycles() -> None:
            poller.discover()
            for elapsed in (30.0, 31.0):
                simulator.tick(elapsed)
                snapshot = await poller.poll_once()
                fast.track((d.gpu, d.identity) for d in snapshot.devices)
                fast.sample_once()  # the windows of what the sampler read at this tick
                fast.sample_once()
                pipeline.on_snapshot(snapshot)

        try:
            asyncio.run(cycles())
        finally:
            poller.close()
            fast.stop()
        published = pipeline.state.published
        assert published is not None
        return published


def series(published: Published, options: ExpositionOptions = DEFAULTS) -> list[tuple[str, dict[str, str]]]:
    """(sample name, labels) of every sample of the text /metrics."""
    return _samples(render(published, options).text)


def _samples(body: bytes) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, dict(s.labels)) for f in text_string_to_metric_families(body.decode()) for s in f.samples]


WITHOUT_ATTRIBUTION = replace(DEFAULTS, families=Selection(collectors_exclude=("attribution",)).families())


@dataclass(frozen=True)
class Count:
    devices: int
    total: int  # every sample of /metrics, node-level ones included
    by_gpu: Counter[str]  # per device: the samples carrying its gpu label
    body_bytes: int

    @property
    def per_device(self) -> float:
        return self.total / self.devices

    @property
    def worst_device(self) -> int:
        return max(self.by_gpu.values())


def count(published: Published, options: ExpositionOptions = DEFAULTS) -> Count:
    body = render(published, options).text  # rendered once: counted and measured
    found = _samples(body)
    by_gpu = Counter(labels["gpu"] for _name, labels in found if "gpu" in labels)
    size = len(body)
    return Count(len(published.snapshot.devices), len(found), by_gpu, size)


def new_series_for_a_new_job(published: Published, options: ExpositionOptions = DEFAULTS) -> int:
    """Series per device that a new Slurm job (and pod) on every device adds to what Prometheus holds."""
    devices = len(published.snapshot.devices)
    before = {(name, tuple(sorted(labels.items()))) for name, labels in series(published, options)}
    moved = replace(published, snapshot=enrich(published.snapshot, attribution_inputs(devices, job="2000")))
    after = {(name, tuple(sorted(labels.items()))) for name, labels in series(moved, options)}
    return len(after - before) // devices


def table(fleets: Sequence[str]) -> str:
    lines = [
        "| fleet | devices | series per device (node / devices), no attribution | worst device | with "
        "attribution | new series per device for a new job | with attribution.series-labels: new series per "
        "device for a new job | /metrics bytes (no attribution / attribution / series-labels) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    labelled = replace(DEFAULTS, attribution_labels=True)
    for fleet in fleets:
        published = published_node(fleet)
        plain, attributed, every = count(published, WITHOUT_ATTRIBUTION), count(published), count(published, labelled)
        lines.append(
            f"| {fleet} | {plain.devices} | {plain.per_device:.1f} | {plain.worst_device} | "
            f"{attributed.per_device:.1f} | {new_series_for_a_new_job(published)} | "
            f"{new_series_for_a_new_job(published, labelled)} | "
            f"{plain.body_bytes:,} / {attributed.body_bytes:,} / {every.body_bytes:,} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    from exporter.log import configure_logging

    configure_logging("error", "console")
    print(table(sys.argv[1:] or demo_fleets()))
