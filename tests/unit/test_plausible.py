"""Plausible ranges: the edges of every range, and a Sample cleaned of exactly its implausible values."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.model import Sample, frozen_map
from exporter.sources.plausible import (
    _MAPPING_FIELDS,
    LOW_EXCLUSIVE,
    RANGES,
    all_plausible,
    plausible,
    without_implausible,
)

# Values on and around every field's edges, plus the ones hardware hands out (all-ones, NaN, inf).
_EDGES = sorted({edge for low, high in RANGES.values() for edge in (low, high) if math.isfinite(edge)})
numbers = st.one_of(
    st.sampled_from([*_EDGES, math.nan, math.inf, -math.inf, 65534.0, 2.0**64 - 1, -1.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(_EDGES).map(lambda e: math.nextafter(e, math.inf)),
    st.sampled_from(_EDGES).map(lambda e: math.nextafter(e, -math.inf)),
)


def test_every_range_edge() -> None:
    for name, (low, high) in RANGES.items():
        assert plausible(name, low) == (name not in LOW_EXCLUSIVE), name
        assert plausible(name, math.nextafter(low, math.inf)), name
        assert not plausible(name, math.nextafter(low, -math.inf)), name
        assert plausible(name, high) == math.isfinite(high), name
        assert not plausible(name, math.nextafter(high, math.inf)), name
        for value in (math.nan, math.inf, -math.inf):
            assert not plausible(name, value), (name, value)
        for value in (True, None, "12"):  # no range's business
            assert plausible(name, value), (name, value)
    assert plausible("throttle", 1e99)  # a field without a range


@given(st.sampled_from(sorted(_MAPPING_FIELDS)), st.lists(numbers, max_size=12))
@settings(max_examples=400, deadline=None)
def test_a_whole_mapping_is_judged_like_each_value(name: str, values: list[float]) -> None:
    assert all_plausible(name, values) == all(plausible(name, value) for value in values)


def test_a_nan_hidden_from_min_and_max_is_still_found() -> None:
    # max([50.0, nan]) is 50.0 and min is 50.0: the sum is what gives the NaN away.
    assert not all_plausible("temperatures", [50.0, math.nan])
    assert not all_plausible("temperatures", [50.0, math.inf])
    assert all_plausible("temperatures", [50.0, 60.0])


@st.composite
def samples(draw: Any) -> Sample:
    fields: dict[str, Any] = {}
    for name in draw(st.sets(st.sampled_from(sorted(RANGES)), max_size=8)):
        if name in _MAPPING_FIELDS:
            fields[name] = frozen_map({f"k{i}": v for i, v in enumerate(draw(st.lists(numbers, max_size=4)))})
        else:
            fields[name] = draw(numbers)
    return Sample(timestamp=1.0, **fields)


@settings(max_examples=400, deadline=None)
@given(samples())
def test_exactly_the_implausible_values_are_removed_and_counted(sample: Sample) -> None:
    cleaned, rejected = without_implausible(sample)
    for name in RANGES:
        before, after = getattr(sample, name), getattr(cleaned, name)
        if name in _MAPPING_FIELDS:
            assert dict(after) == {k: v for k, v in before.items() if plausible(name, v)}
            assert rejected.get(name, 0) == len(before) - len(after)
        else:
            kept = before is None or plausible(name, before)
            assert after is (before if kept else None)
            assert rejected.get(name, 0) == (0 if kept else 1)
    assert (cleaned is sample) == (not rejected)
    assert without_implausible(cleaned) == (cleaned, {})
