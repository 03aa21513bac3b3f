"""The /metrics bytes are prometheus-client's own, in both formats: the library is the reference.

render.py writes the metric table straight to text; here the same families are built as the
library's objects (bench/render_cost.py, which also measures the two) and formatted by its
generate_latest, and the bytes must be equal: whole snapshots
(odd label values, a histogram) and, with hypothesis, any label value, help text and number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import exposition as text_exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics_exposition
from prometheus_client.utils import floatToGoString

from bench.render_cost import Families, library_families, library_histogram
from exporter.exposition.metrics import METRICS, MetricSpec
from exporter.exposition.render import (
    exposition,
    family_lines,
    go_float,
    header,
    histogram_lines,
)
from exporter.exposition.selection import DEFAULTS, EVERYTHING
from exporter.model import DeviceState, Histogram, Published, Snapshot
from tests.unit.test_exposition import _identity, _snapshot


def _library(families: Iterable[Metric], openmetrics: bool) -> bytes:
    generate = openmetrics_exposition.generate_latest if openmetrics else text_exposition.generate_latest
    return generate(Families(families))


def test_a_whole_snapshot_renders_exactly_as_the_library_would() -> None:
    published = _snapshot()
    snapshot = published.snapshot
    weird = DeviceState(
        _identity("0000:e1:00.0", 'card"9\\\nx'), 3, snapshot.devices[0].sample, True, read_errors={'é"': 2}
    )
    stats = dataclasses.replace(published.stats, poll_durations=Histogram().observe(0.004))
    snapshot = Snapshot(taken_at=5.0, devices=(*snapshot.devices, weird))
    odd = Published(snapshot, alerts=published.alerts, stats=stats)
    # The collectors' outcome families are made from the render itself (their durations differ from
    # render to render): what they hold is test_collectors'; here every family made from the data.
    from_data = frozenset(spec.name for spec in METRICS if spec.outcome is None)
    for options in (DEFAULTS, EVERYTHING):
        options = dataclasses.replace(options, families=options.families & from_data)
        for openmetrics in (False, True):
            assert exposition(odd, options, openmetrics) == _library(library_families(odd, options), openmetrics)


label_values = st.text(st.characters(codec="utf-8"), max_size=12)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70).map(float),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(label_values, label_values, values), max_size=6),
    st.text(max_size=30),
    st.booleans(),
)
def test_any_values_and_labels_match_the_library(rows, doc, openmetrics) -> None:
    ours, theirs = [], []
    for kind, name in (("gauge", "amdgpu_test_ratio"), ("counter", "amdgpu_test_events")):
        spec = MetricSpec(name, doc, lambda _: (), ("zone", "gpu"), kind)  # type: ignore[arg-type]
        counted = kind == "counter"
        series = [((zone, gpu), abs(value) if counted and value == value else value) for gpu, zone, value in rows]
        ours.append(header(name, doc, kind, openmetrics) + family_lines(spec, ("zone", "gpu"), series))
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=("zone", "gpu"))
        for labels, value in series:
            family.add_metric(labels, value)
        theirs.append(family)
    histogram = Histogram(bounds=(0.5, 1.0), counts=(1, 0, 1), total=3.0)
    ours.append(histogram_lines("amdgpu_test_seconds", doc, histogram, openmetrics))
    theirs.append(library_histogram("amdgpu_test_seconds", doc, histogram))
    empty = MetricSpec("amdgpu_empty", doc, lambda _: ())
    ours.append(header("amdgpu_empty", doc, "gauge", openmetrics) + family_lines(empty, (), []))
    theirs.append(GaugeMetricFamily("amdgpu_empty", doc))
    assert ("".join(ours) + ("# EOF\n" if openmetrics else "")).encode() == _library(theirs, openmetrics)


@given(values)
def test_numbers_are_written_as_go_writes_them(value: float) -> None:
    assert go_float(value) == floatToGoString(value)


def test_equal_numbers_that_print_differently_keep_their_own_text() -> None:
    spec = MetricSpec("amdgpu_test_ratio", "h", lambda _: (), ("gpu",))
    rows = [(("0",), 0.0), (("1",), -0.0), (("2",), 0.0), (("3",), float("nan")), (("4",), float("nan"))]
    family = GaugeMetricFamily("amdgpu_test_ratio", "h", labels=("gpu",))
    for labels, value in rows:
        family.add_metric(labels, value)
    assert (header("amdgpu_test_ratio", "h", "gauge", False) + family_lines(spec, ("gpu",), rows)).encode() == _library(
        [family], False
    )
