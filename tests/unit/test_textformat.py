"""Our text formatter must produce exactly prometheus-client's bytes, in both formats."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import exposition as text_exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics_exposition

from exporter.exposition.render import families as render_families
from exporter.exposition.textformat import format_families
from exporter.model import DeviceState, Histogram, Published, Snapshot
from tests.unit.test_exposition import _identity, _snapshot


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return list(self.families)


def _library(families: list, openmetrics: bool) -> bytes:
    generate = openmetrics_exposition.generate_latest if openmetrics else text_exposition.generate_latest
    return generate(_Families(families))


def test_a_whole_snapshot_renders_exactly_as_the_library_would() -> None:
    published = _snapshot()
    snapshot = published.snapshot
    weird = DeviceState(
        _identity("0000:e1:00.0", 'card"9\\\nx'), 3, snapshot.devices[0].sample, True, read_errors={'é"': 2}
    )
    stats = dataclasses.replace(published.stats, poll_durations=Histogram().observe(0.004))
    snapshot = Snapshot(taken_at=5.0, devices=(*snapshot.devices, weird))
    for openmetrics in (False, True):
        families = list(render_families(Published(snapshot, alerts=published.alerts, stats=stats)))
        assert format_families(families, openmetrics) == _library(families, openmetrics)


label_values = st.text(st.characters(codec="utf-8"), max_size=12)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(label_values, label_values, values), max_size=6),
    st.text(max_size=30),
    st.booleans(),
)
def test_any_values_and_labels_match_the_library(rows, doc, openmetrics) -> None:
    gauge = GaugeMetricFamily("amdgpu_test_ratio", doc, labels=("gpu", "zone"))
    counter = CounterMetricFamily("amdgpu_test_events", doc, labels=("gpu", "zone"))
    for gpu, zone, value in rows:
        gauge.add_metric([gpu, zone], value)
        counter.add_metric([gpu, zone], abs(value) if value == value else 0.0)
    histogram = HistogramMetricFamily("amdgpu_test_seconds", doc, buckets=[("1.0", 1), ("+Inf", 2)], sum_value=3)
    families = [gauge, counter, histogram, GaugeMetricFamily("amdgpu_empty", doc)]
    assert format_families(families, openmetrics) == _library(families, openmetrics)
