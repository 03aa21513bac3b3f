"""bench.fleet reads the rule groups' intervals as Prometheus does, compound durations included."""

from __future__ import annotations

import pytest

from bench import fleet


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("1m", 60), ("2m30s", 150), ("1h", 3600), (">30s", 30)])
def test_durations(text: str, seconds: int) -> None:
    assert fleet._seconds(text) == seconds


def test_an_unreadable_duration_is_the_scrape_interval() -> None:
    assert fleet._seconds("soon") == fleet.SCRAPE_INTERVAL
