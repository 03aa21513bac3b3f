"""Hypothesis fuzz targets for the record-by-record health signal parsers (issue 31): whatever bytes a
file holds, each returns a value (counting what it skipped) and never raises anything else."""

from __future__ import annotations

import math
import struct

from hypothesis import given
from hypothesis import strategies as st

from exporter.simulator import cper_writer
from exporter.sources import textfiles as tf
from exporter.sources.cper import SEVERITIES, scan_cper_ring

_RECORD = st.tuples(
    st.integers(946684800, 4102444799),
    st.sampled_from(sorted(cper_writer.SEVERITY_CODES)),
    st.from_regex(r"[0-9]:[0-9A-F]{1,6}", fullmatch=True),
)


@given(st.binary(max_size=2000))
def test_any_ring_bytes_give_records_and_errors_never_an_exception(data: bytes) -> None:
    scan = scan_cper_ring(struct.pack("<III", 0, 0, 0) + data)
    assert all(r.severity in SEVERITIES.values() and math.isfinite(r.timestamp) for r in scan.records)
    assert all(c.isprintable() for r in scan.records for c in r.record_id)


@given(st.lists(_RECORD, min_size=1, max_size=6), st.data())
def test_a_corrupted_record_costs_only_itself(records: list[tuple[int, str, str]], data: st.DataObject) -> None:
    """Any one record's first 16 bytes overwritten: every other record is still read."""
    blobs = [cper_writer.record(t, sev, rid, 0x74A1, 0) for t, sev, rid in records]
    bad = data.draw(st.integers(0, len(blobs) - 1))
    junk = data.draw(st.binary(min_size=16, max_size=16).filter(lambda b: not b.startswith(b"CPER")))
    blobs[bad] = junk + blobs[bad][16:]
    scan = scan_cper_ring(cper_writer.ring(blobs))
    expected = [rid for i, (_t, _sev, rid) in enumerate(records) if i != bad]
    assert [r.record_id for r in scan.records] == expected
    assert len(scan.errors) == 1


@given(st.binary(max_size=3000), st.lists(st.integers(1, 200), max_size=30))
def test_bad_pages_any_bytes_any_chunks(data: bytes, cuts: list[int]) -> None:
    """Counting a stream gives the same counts however it is cut into reads."""
    whole = tf.BadPageCount()
    whole.feed(data)
    expected = (whole.finish(), whole.bad_lines, whole.records)
    count, position = tf.BadPageCount(), 0
    for size in cuts:
        count.feed(data[position : position + size])
        position += size
    count.feed(data[position:])
    assert (count.finish(), count.bad_lines, count.records) == expected


@given(st.binary(max_size=400))
def test_a_coredump_head_with_any_process_name_gives_its_time(comm: bytes) -> None:
    head = b"**** AMDGPU Device Coredump ****\nversion: 1\ntime: 12.500000000\nprocess_name: " + comm + b"\n"
    assert tf.parse_devcoredump_time(head) == 12.5
