"""What one render of a snapshot costs: the exporter's one path against prometheus-client's formatter.

    python -m bench (phase "render"), or python -m bench.render_cost SYSFS

The same Published (a 16-GCD tree polled, the sampler's windows in it), rendered as Prometheus asks
(OpenMetrics, gzip level 5) by render.py and by building the same families as prometheus-client's
objects and formatting them with its generate_latest. CPU is time.process_time(), the least of the
rounds. Which one /metrics uses is decided by this figure against node_exporter's CPU for one
scrape (bench/RESULTS.md); tests/unit/test_render_format.py holds both to the same bytes.
"""

from __future__ import annotations

import asyncio
import gzip
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics_exposition
from prometheus_client.utils import floatToGoString

from exporter.exposition.render import chosen_families, exposition
from exporter.exposition.selection import DEFAULTS, ExpositionOptions
from exporter.model import Histogram, Published


class Families:
    """A prometheus-client collector over a fixed list of families."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> list[Metric]:
        return self.families


def library_histogram(name: str, doc: str, histogram: Histogram) -> Metric:
    cumulative, buckets = 0, []
    for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
        cumulative += count
        buckets.append((floatToGoString(bound), float(cumulative)))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=histogram.total)


def library_families(published: Published, options: ExpositionOptions = DEFAULTS) -> list[Metric]:
    """The families render.py chooses, as prometheus-client's objects."""
    out: list[Metric] = []
    for spec, label_names, rows in chosen_families(published, options):
        if isinstance(rows, Histogram):
            out.append(library_histogram(spec.name, spec.help, rows))
            continue
        family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
        family = family_type(spec.name, spec.help, labels=label_names)
        for labels, value in rows:
            family.add_metric(labels, value)
        if family.samples or not spec.omit_when_empty:
            out.append(family)
    return out


def ours(published: Published) -> bytes:
    return gzip.compress(exposition(published, DEFAULTS, True), compresslevel=5, mtime=0)


def library(published: Published) -> bytes:
    body = openmetrics_exposition.generate_latest(Families(library_families(published)))
    return gzip.compress(body, compresslevel=5, mtime=0)


def published_of(sysfs: Path) -> Published:
    """A daemon's cycle at defaults: polled a few times, the sampler's windows joined."""
    from exporter.alerting.rulefile import default_rule_file
    from exporter.cycle import Pipeline
    from exporter.pipeline.poller import Poller
    from exporter.pipeline.sampler import Sampler
    from exporter.sources.sysfs import SysfsSource

    async def cycles() -> Published:
        poller = Poller(SysfsSource(str(sysfs)), source_name="sysfs")
        sampler = Sampler()
        rules = default_rule_file()
        pipeline = Pipeline(
            source_name="sysfs",
            source_reason="bench",
            rules=rules.rules,
            health_thresholds=rules.health,
            sampler=sampler,
        )
        poller.discover()
        try:
            for _ in range(12):
                pipeline.on_snapshot(await poller.poll_once())
                for _ in range(10):
                    sampler.sample_once()
        finally:
            poller.close()
        assert pipeline.state.published is not None
        return pipeline.state.published

    return asyncio.run(cycles())


def cpu_per_call(call: Callable[[Published], bytes], published: Published, calls: int = 20, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            call(published)
        best = min(best, (time.process_time() - started) / calls)
    return best


def measure(sysfs: Path) -> dict[str, float]:
    from exporter.log import configure_logging

    configure_logging("warn", "json")
    published = published_of(sysfs)
    if ours(published) != library(published):
        raise RuntimeError("render.py's bytes differ from prometheus-client's for this snapshot")
    return {"ours": cpu_per_call(ours, published), "library": cpu_per_call(library, published)}


if __name__ == "__main__":
    figures = measure(Path(sys.argv[1]))
    print({name: f"{seconds * 1e3:.2f} ms" for name, seconds in figures.items()})
