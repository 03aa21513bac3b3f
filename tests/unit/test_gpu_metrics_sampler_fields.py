"""The sampler's fields (the decoder over a field subset) agree with the full decode, value by value."""

from __future__ import annotations

import math
import random
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.abi import gpu_metrics as layouts
from exporter.simulator import Simulator
from exporter.sources.gpu_metrics.decoder import ENERGY_JOULES_PER_TICK, GpuMetricsError, decode_gpu_metrics
from exporter.sources.gpu_metrics.sampler_fields import SAMPLER_FIELD_INDEX, SAMPLER_FIELDS, sampler_values
from tests.unit.test_gpu_metrics import PERCENT, TEMP_C, U16, V1_9_RECORDS, record, v1_9


def expected_channels(blob: bytes) -> dict[tuple[str, str], float]:
    """What the full decoder says about each fast channel (absent = not supplied)."""
    m = decode_gpu_metrics(blob)
    out: dict[tuple[str, str], float] = {}
    for sensor, value in m.temperatures.items():
        out[("temperature", sensor)] = value
    if m.power_watts is not None:
        out[("power", "socket")] = m.power_watts
    for engine in ("gfx", "memory"):
        if engine in m.busy:
            out[("busy", engine)] = m.busy[engine]
    for domain in ("gfx", "memory", "soc"):
        if domain in m.clocks_hertz:
            out[("clock", domain)] = m.clocks_hertz[domain]
    if m.energy_joules is not None:
        out[("acc", "energy_joules")] = m.energy_joules
    if m.system_clock_counter_seconds is not None:
        out[("acc", "clock_seconds")] = m.system_clock_counter_seconds
    if (m.format_revision, m.content_revision) >= (1, 4):
        if m.gfx_activity_acc is not None:
            out[("acc", "gfx_activity")] = float(m.gfx_activity_acc)
        if m.mem_activity_acc is not None:
            out[("acc", "mem_activity")] = float(m.mem_activity_acc)
    return out


def actual_channels(blob: bytes) -> dict[tuple[str, str], float]:
    values = sampler_values(blob)
    assert len(values) == len(SAMPLER_FIELDS)
    return {channel: value for channel, value in zip(SAMPLER_FIELDS, values, strict=True) if not math.isnan(value)}


def assert_agrees(blob: bytes) -> None:
    expected = expected_channels(blob)
    actual = actual_channels(blob)
    assert actual.keys() == expected.keys()
    for channel, value in expected.items():
        assert actual[channel] == pytest.approx(value, rel=1e-12), channel


def random_table(layout: layouts.Layout, rng: random.Random, supplied: float) -> bytes:
    """Every field random, all-ones (not supplied) with probability 1 - supplied; small values often."""
    blob = bytearray(b"\xff" * layout.size)
    fields = list(layout.fields)
    if layout.partition_block is not None:
        for index in range(layout.partition_count):
            base = layout.partitions_offset + index * layout.partition_block.size
            fields += [layouts.Field(f.name, f.ctype, base + f.offset, f.count) for f in layout.partition_block.fields]
    for fld in fields:
        code, width = layouts.C_TYPES[fld.ctype]
        for i in range(fld.count):
            if rng.random() < supplied:
                top = (1 << (8 * width)) - 1
                value = rng.choice([rng.randrange(0, 120), rng.randrange(0, 3000), rng.randrange(0, top)])
                struct.pack_into("<" + code, blob, fld.offset + i * width, value & top)
    struct.pack_into("<HBB", blob, 0, layout.size, layout.format_revision, layout.content_revision)
    return bytes(blob)


@pytest.mark.parametrize("layout", layouts.FIXED_LAYOUTS, ids=lambda layout: layout.name)
@given(seed=st.integers(0, 2**32 - 1), supplied=st.sampled_from([0.0, 0.3, 0.9, 1.0]))
@settings(max_examples=60, deadline=None)
def test_fixed_layouts_agree_with_the_full_decoder(layout: layouts.Layout, seed: int, supplied: float) -> None:
    assert_agrees(random_table(layout, random.Random(seed), supplied))


def test_the_v1_9_reference_records_agree_with_the_full_decoder() -> None:
    blob = v1_9(V1_9_RECORDS)
    assert_agrees(blob)
    values = actual_channels(blob)
    assert values[("temperature", "junction")] == 72  # the first of two records for the id wins
    assert ("temperature", "vr_soc") not in values  # declared in MHz: not a temperature
    assert values[("clock", "gfx")] == 2000e6  # highest supplied XCC
    assert values[("acc", "gfx_activity")] == 777
    assert values[("acc", "energy_joules")] == 5.0


# v1.9 records of the fields the extractor reads, in any order, any type, any declared unit.
_V1_9_IDS = [0, 1, 2, 3, 4, 5, 7, 8, 20, 21, 33, 34, 37, 16, 500]
_WIDTH_BITS = {0: 8, 1: 8, 2: 16, 3: 16, 4: 32, 5: 32, 6: 64, 7: 64}


def _typed_record(attr_id: int, unit: int, value_type: int, values: list[int]) -> bytes:
    # A negative value is "not supplied" (all-ones) in an unsigned type, a real negative in a signed one.
    signed = value_type % 2 == 1
    stored = [v if v >= 0 or signed else (1 << _WIDTH_BITS[value_type]) - 1 for v in values]
    return record(attr_id, unit, value_type, stored)


_record = st.builds(
    _typed_record,
    st.sampled_from(_V1_9_IDS),
    st.sampled_from([0, 1, 2, 3, 4, 5, 10, 42]),
    st.sampled_from(range(8)),
    st.lists(st.integers(-3, 127), min_size=0, max_size=9),
)


@given(st.lists(_record, max_size=20))
@settings(max_examples=300, deadline=None)
def test_random_v1_9_tables_agree_with_the_full_decoder(records: list[bytes]) -> None:
    blob = v1_9(records)
    try:
        decode_gpu_metrics(blob)
    except GpuMetricsError as error:
        with pytest.raises(GpuMetricsError, match=re.escape(str(error))):
            sampler_values(blob)
        return
    assert_agrees(blob)


def test_two_v1_9_tables_of_one_size_with_their_records_swapped() -> None:
    first = v1_9([record(0, TEMP_C, U16, [70]), record(4, PERCENT, U16, [50])])
    second = v1_9([record(4, PERCENT, U16, [50]), record(0, TEMP_C, U16, [70])])
    assert len(first) == len(second)
    for blob in (first, second, first):
        assert actual_channels(blob) == {("temperature", "junction"): 70, ("busy", "gfx"): 0.5}


def test_only_the_channels_fields_are_unpacked() -> None:
    from exporter.sources.gpu_metrics.sampler_fields import _PLANS

    layout = layouts.V1_8
    plan = _PLANS.fixed[(layout.size, layout.format_revision, layout.content_revision)]
    # One tuple element per wanted element: 3 temperatures, 2 powers... never the 3.8 kB of xcp_stats.
    assert len(plan.codec.unpack_from(random_table(layout, random.Random(1), 1.0))) < 40


def test_die_values_with_the_kernel_energy_tick() -> None:
    blob = bytearray(random_table(layouts.V1_3, random.Random(2), 0.0))
    struct.pack_into("<Q", blob, 24, 3 * 65536 + 1)
    values = sampler_values(bytes(blob))
    assert values[SAMPLER_FIELD_INDEX[("acc", "energy_joules")]] == 3 + ENERGY_JOULES_PER_TICK


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x78\x00", "shorter than the 4-byte header"),
        (struct.pack("<HBB", 120, 1, 3) + b"\x00" * 10, "shorter than structure_size 120"),
        (struct.pack("<HBB", 100, 1, 3) + b"\x00" * 96, "v1.3 with structure_size 100; known layouts are 120 bytes"),
        (struct.pack("<HBB", 8, 2, 1) + b"\x00" * 4, "unknown gpu_metrics revision 2.1"),
        (v1_9([record(0, TEMP_C, U16, [1])], count=2), "attr_count 2 does not fit"),
    ],
)
def test_unreadable_tables_raise_one_clear_error(blob: bytes, message: str) -> None:
    with pytest.raises(GpuMetricsError, match=message):
        sampler_values(blob)


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_any_bytes_give_floats_or_gpu_metrics_error(blob: bytes) -> None:
    try:
        values = sampler_values(blob)
    except GpuMetricsError:
        return
    assert len(values) == len(SAMPLER_FIELDS)


@pytest.mark.parametrize(
    "fleet",
    [
        "MI210",
        "MI250X",
        "MI300X",
        "MI300X:gpu_metrics=1.4",
        "MI300X:gpu_metrics=1.6",
        "MI300X:gpu_metrics=1.7",
        "MI325X",
        "MI355X",
        "MI300X:gpu_metrics=1.9",
    ],
)
def test_the_simulated_drivers_tables_agree_with_the_full_decoder(fleet: str, tmp_path: Path) -> None:
    simulator = Simulator(tmp_path / "sys", fleet=fleet, scenario="alternating")
    simulator.write_tree()
    for elapsed in (0.0, 7.3, 31.0):
        simulator.tick(elapsed)
        tables = sorted((tmp_path / "sys").glob("class/drm/card*/device/gpu_metrics"))
        assert tables
        for path in tables:
            blob = path.read_bytes()
            assert_agrees(blob)
            assert not math.isnan(sampler_values(blob)[SAMPLER_FIELD_INDEX[("temperature", "junction")]])
