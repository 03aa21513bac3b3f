"""bench.fleet_fullrange: the history it backfills holds what the fleet dashboard's graphs read."""

from __future__ import annotations

import io
import itertools
import re

from bench import fleet, fleet_fullrange


def test_the_history_holds_every_series_the_fleet_graphs_read() -> None:
    assert fleet_fullrange.missing_families(fleet.dashboard_queries(fleet.DASHBOARD_DIR)) == []


def test_the_history_is_openmetrics_at_each_familys_interval() -> None:
    out = io.StringIO()
    end = 1_800_000_000
    fleet_fullrange.write_history(out, nodes=2, end=end)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "# EOF"
    samples = [line for line in lines if not line.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9_:]+\{[^}]*\} [-+.e\d]+ \d+", line) for line in samples)
    power = [line for line in samples if line.startswith('instance:amdgpu_power_watts:sum{instance="node-00001')]
    times = [int(line.rsplit(" ", 1)[1]) for line in power]
    assert times[-1] == end and {b - a for a, b in itertools.pairwise(times)} == {30}
    assert times[-1] - times[0] >= fleet_fullrange.HISTORY - 30
