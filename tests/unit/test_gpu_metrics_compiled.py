"""The compiled decoder gives exactly what decode_gpu_metrics gives, on every layout."""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.simulator import Simulator
from exporter.sources.gpu_metrics import GpuMetricsError, decode_gpu_metrics, layouts
from exporter.sources.gpu_metrics.compiled import decode_gpu_metrics_compiled
from tests.unit.test_gpu_metrics import V1_9_RECORDS, v1_9
from tests.unit.test_gpu_metrics_fast import random_table


def assert_same(blob: bytes) -> None:
    try:
        expected = decode_gpu_metrics(blob)
    except GpuMetricsError as error:
        with pytest.raises(GpuMetricsError, match=re.escape(str(error))):
            decode_gpu_metrics_compiled(blob)
        return
    assert decode_gpu_metrics_compiled(blob) == expected


@pytest.mark.parametrize("layout", layouts.FIXED_LAYOUTS, ids=lambda layout: layout.name)
@given(seed=st.integers(0, 2**32 - 1), supplied=st.sampled_from([0.0, 0.3, 0.9, 1.0]))
@settings(max_examples=80, deadline=None)
def test_random_tables_decode_exactly_as_the_reference_decoder(
    layout: layouts.Layout, seed: int, supplied: float
) -> None:
    assert_same(random_table(layout, random.Random(seed), supplied))


@pytest.mark.parametrize("layout", [lay for lay in layouts.FIXED_LAYOUTS if lay.partition_block is not None])
@pytest.mark.parametrize("partitions", [0, 1, 2, 4, 8, 9, 0xFFFF])
def test_partition_counts_including_an_absent_one(layout: layouts.Layout, partitions: int) -> None:
    blob = bytearray(random_table(layout, random.Random(partitions), 0.9))
    (offset,) = [f.offset for f in layout.fields if f.name == "num_partition"]
    struct.pack_into("<H", blob, offset, partitions)
    assert_same(bytes(blob))


@pytest.mark.parametrize(
    "fleet", ["MI210", "MI250X", "MI300X", "MI300X:gpu_metrics=1.4", "MI300X:gpu_metrics=1.6", "MI355X"]
)
def test_the_simulated_drivers_tables(fleet: str, tmp_path: Path) -> None:
    simulator = Simulator(tmp_path / "sys", fleet=fleet, scenario="training")
    simulator.write_tree()
    simulator.tick(42.0)
    tables = sorted((tmp_path / "sys").glob("class/drm/card*/device/gpu_metrics"))
    assert tables
    for path in tables:
        assert_same(path.read_bytes())


def test_v1_9_and_malformed_tables_go_to_the_reference_decoder() -> None:
    assert_same(v1_9(V1_9_RECORDS))
    assert_same(struct.pack("<HBB", 120, 1, 3) + b"\x00" * 10)  # truncated: the reference's message
    assert_same(b"\x01")
    assert decode_gpu_metrics_compiled(bytearray(random_table(layouts.V1_3, random.Random(3), 1.0))) is not None


@given(st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_any_bytes_give_the_reference_answer(blob: bytes) -> None:
    assert_same(blob)
