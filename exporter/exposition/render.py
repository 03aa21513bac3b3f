"""Published -> /metrics bytes: every family of the metric table, rendered lazily, at most once per format.

A scrape then only sends bytes: its cost does not depend on how many GPUs there are or whether
one of them is hung (see docs/architecture.md). Text, OpenMetrics and their gzip forms are made
here, by the first scrape that asks for one after a cycle, so the HTTP layer never formats anything.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from exporter.exposition.metrics import METRICS, MetricSpec
from exporter.exposition.selection import DEFAULT_WINDOW_SERIES, DEFAULTS, ExpositionOptions
from exporter.exposition.textformat import format_families
from exporter.log import get_logger
from exporter.model import IDENTITY_FIELDS, DeviceIdentity, Histogram, Published

log = get_logger("exporter.exposition")


class RenderedMetrics:
    """The /metrics bytes of one snapshot, rendered at most once per format, on first request.

    Prometheus scrapes every 15-60 s while the poller produces a snapshot every second:
    rendering every cycle eagerly (text and OpenMetrics, ~2,000 series) would spend most of the
    exporter's CPU on bytes nobody reads. A snapshot is rendered when the first scrape after it
    asks for a format, and every later scrape of that snapshot gets the same bytes.
    """

    def __init__(self, published: Published, options: ExpositionOptions = DEFAULTS) -> None:
        self._published = published  # immutable, so two cycles can be rendered on different threads
        self._options = options
        self._lock = threading.Lock()
        self._cache: dict[tuple[bool, bool], bytes] = {}

    def cached(self, openmetrics: bool, gzipped: bool) -> bytes | None:
        return self._cache.get((openmetrics, gzipped))

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        """The bytes for a format; renders them (blocking, tens of ms) if nobody has yet."""
        key = (openmetrics, gzipped)
        found = self._cache.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                return found
            plain = self._cache.get((openmetrics, False))
            if plain is None:
                plain = format_families(families(self._published, self._options), openmetrics)
                self._cache[(openmetrics, False)] = plain
            if gzipped:
                # Level 5: most of the size win at a fraction of level 9's CPU.
                self._cache[key] = gzip.compress(plain, compresslevel=5, mtime=0)
            return self._cache[key]

    @property
    def text(self) -> bytes:
        return self.body(False, False)

    @property
    def openmetrics(self) -> bytes:
        return self.body(True, False)


def _histogram_family(spec: MetricSpec, histogram: Histogram) -> Metric:
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
        cumulative += count
        buckets.append((floatToGoString(bound), float(cumulative)))
    # No _created sample: the family is built from data, and its creation time would only be noise.
    return HistogramMetricFamily(spec.name, spec.help, buckets=buckets, sum_value=histogram.total)


def families(published: Published, options: ExpositionOptions = DEFAULTS) -> Iterator[Metric]:
    """The chosen families of the metric table for one Published, in table order.

    A window family renders the series of DEFAULT_WINDOW_SERIES only, unless all are asked for. Every
    per-GPU family (first label `gpu`) also carries the chosen identity labels it does not have
    itself (--metrics.identity-labels), then, with attribution on and asked for on every series
    (--attribution.series-labels), the attribution labels: with the values of the snapshot they are
    rendered from ("" for a device nobody holds or not known). A family whose making fails is left
    out and its collector's amdgpu_exporter_collector_success is 0 (the others are still rendered).
    """
    identities = {str(state.gpu): state.identity for state in published.snapshot.devices}
    by_gpu: dict[tuple[str, tuple[str, ...], bool], tuple[str, ...]] = {}
    outcomes: dict[str, tuple[bool, float]] = {}  # collector -> (no family failed, seconds)
    for spec in METRICS:
        if spec.name not in options.families:
            continue
        if spec.outcome is not None:
            family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            for labels, value in spec.outcome(dict(sorted(outcomes.items()))):
                family.add_metric(labels, value)
            yield family
            continue
        started = time.perf_counter()
        made: Metric | None = None
        try:
            made = _family(spec, published, options, identities, by_gpu)
        except Exception as error:  # one broken family must not take /metrics down with it
            log.warning("family_failed", family=spec.name, collector=spec.collector, error=repr(error))
        ok, seconds = outcomes.get(spec.collector, (True, 0.0))
        outcomes[spec.collector] = (ok and made is not None, seconds + time.perf_counter() - started)
        if made is not None and (made.samples or not spec.omit_when_empty or spec.kind == "histogram"):
            yield made


def _family(
    spec: MetricSpec,
    published: Published,
    options: ExpositionOptions,
    identities: Mapping[str, DeviceIdentity],
    by_gpu: dict[tuple[str, tuple[str, ...], bool], tuple[str, ...]],
) -> Metric:
    """One family with its series (`by_gpu`: the extra labels of each GPU, filled as met)."""
    if spec.kind == "histogram":
        assert spec.histogram is not None
        return _histogram_family(spec, spec.histogram(published))
    identity_labels = options.identity_labels
    attribution = published.snapshot.attribution
    family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    per_gpu = spec.labels[:1] == ("gpu",)
    identity = tuple(name for name in identity_labels if name not in spec.labels) if per_gpu else ()
    attributed = options.attribution_labels and bool(attribution.label_names) and spec.attributed and per_gpu
    window_series = None if options.all_window_series else DEFAULT_WINDOW_SERIES.get(spec.name)
    extra = (*identity, *(attribution.label_names if attributed else ()))
    family = family_type(spec.name, spec.help, labels=(*spec.labels, *extra))
    for labels, value in spec.values(published):
        if window_series is not None and labels[1:] not in window_series:
            continue
        if extra:
            key = (labels[0], identity, attributed)
            if key not in by_gpu:
                found = identities.get(labels[0])
                shown = tuple(str(getattr(found, IDENTITY_FIELDS[name])) if found else "" for name in identity)
                by_gpu[key] = (*shown, *(attribution.values_for(int(labels[0])) if attributed else ()))
            labels = (*labels, *by_gpu[key])
        family.add_metric(labels, value)
    return family


def render(published: Published, options: ExpositionOptions = DEFAULTS) -> RenderedMetrics:
    """Cheap: the bytes are made on first request (RenderedMetrics)."""
    return RenderedMetrics(published, options)
