"""The generated plausibility checks agree with the exact, value-by-value judgement they stand in for."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.model import Sample, frozen_map
from exporter.sources.plausible import (
    _BOUNDS,
    _MAPPING_FIELDS,
    RANGES,
    _within,
    all_plausible,
    items_check,
    plausible,
    plausible_items,
    remove_implausible,
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
def test_the_generated_sample_check_equals_the_exact_one(sample: Sample) -> None:
    exact, rejected = remove_implausible(sample)
    assert all_plausible(sample) == (not rejected)
    assert without_implausible(sample) == (exact, rejected)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(_MAPPING_FIELDS)), st.lists(numbers, max_size=6))
def test_the_generated_items_check_equals_the_exact_one(name: str, values: list[Any]) -> None:
    mapping = {i: v for i, v in enumerate(values)}
    assert plausible_items(name, mapping) == all(_within(_BOUNDS[name], v) for v in values)
    assert items_check(name)(mapping) == plausible_items(name, mapping)


def test_a_value_that_does_not_compare_goes_to_the_exact_path() -> None:
    # not a number: _within lets it through (it is no range's business), and so must the fast path
    sample = Sample(timestamp=1.0, power_watts="12", busy=frozen_map({"gfx": 0.5}))  # type: ignore[arg-type]
    assert not all_plausible(sample)
    assert without_implausible(sample) == (sample, {})


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(RANGES)), st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=2)))
def test_the_generated_value_check_equals_the_exact_one(name: str, value: Any) -> None:
    assert plausible(name, value) == _within(_BOUNDS[name], value)
