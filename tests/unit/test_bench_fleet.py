"""bench.fleet's pure helpers: a dashboard's default range, the full-range estimate of a query's
samples, the log-log fit and the quiet cost summed per rule group. The benchmark itself (a real
Prometheus, minutes per node count) is not part of the tests."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.fleet import dashboard_range, fit, full_range_samples, summarise


def test_a_dashboards_default_range_is_its_time_from() -> None:
    assert dashboard_range({"time": {"from": "now-6h", "to": "now"}}) == 6 * 3600
    assert dashboard_range({"time": {"from": "now-1h"}}) == 3600
    assert dashboard_range({}) == 300  # none named: the last 5 minutes


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # a range query over 6 h with 10 minutes of data reads 36 times as much with the range full
        ({"instant": False, "range": 21600, "samples": 1000, "promql": "x"}, 36_000),
        # an instant query with a window of the whole range likewise
        ({"instant": True, "range": 21600, "samples": 10, "promql": "increase(x[21600s])"}, 360),
        # an instant query of the latest values reads the same whatever the range
        ({"instant": True, "range": 21600, "samples": 10, "promql": "max(x)"}, 10),
    ],
)
def test_full_range_samples_scale_only_what_reads_the_range(query: dict[str, Any], expected: float) -> None:
    assert full_range_samples(query, 600) == pytest.approx(expected)


def test_full_range_samples_of_a_run_saved_without_the_range_are_unknown() -> None:
    assert full_range_samples({"samples": 10}, 600) is None


def test_fit_finds_the_exponent() -> None:
    line = fit([100, 300, 1000], [2 * n**1.1 for n in (100, 300, 1000)])
    assert line is not None
    assert line[1] == pytest.approx(1.1)
    assert math.exp(line[0]) == pytest.approx(2)


def test_quiet_cost_is_summed_per_group_and_per_second_of_evaluation() -> None:
    group = {"interval": 60, "seconds": 1.5, "cpu": 0.6, "samples": 6000, "rules": []}
    fast = {"interval": 15, "seconds": 0.3, "cpu": 0.15, "samples": 1500, "rules": []}
    run = {"groups": {}, "queries": [], "quiet_groups": {"slow": group, "fast": fast}}
    summary = summarise(run)
    assert summary["quiet_samples"] == 7500
    assert summary["quiet_samples_per_second"] == pytest.approx(6000 / 60 + 1500 / 15)
    assert summary["quiet_cpu_share"] == {"slow": pytest.approx(0.01), "fast": pytest.approx(0.01)}
    assert summary["quiet_cpu_per_second"] == pytest.approx(0.02)
