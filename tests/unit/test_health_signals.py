"""The health signals' parsers (pure, over the kernel's text and bytes) and the slow layer reading them."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.model import CperRecord
from exporter.simulator import Simulator, cper_writer
from exporter.simulator.file_contents import AER_FILES, aer_counts
from exporter.simulator.tree import devcoredump_text
from exporter.sources.cper import CperParseError, parse_cper_ring
from exporter.sources.sysfs import SysfsSource
from exporter.sources.textfiles import (
    BadPages,
    TextParseError,
    parse_aer_total,
    parse_bad_pages,
    parse_devcoredump_time,
)

U64_MAX = 2**64 - 1
SEVERITIES = ("fatal", "nonfatal", "corrected")  # a CPER record's
AER_SEVERITIES = ("correctable", "nonfatal", "fatal")

# --- ras/gpu_vram_bad_pages ---------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from("RPF")), max_size=40))
def test_bad_pages_by_status(records: list[tuple[int, str]]) -> None:
    text = "".join(f"0x{page:08x} : 0x00001000 : {status}\n" for page, status in records)
    statuses = [status for _, status in records]
    assert parse_bad_pages(text) == BadPages(retired=statuses.count("R"), pending=statuses.count("P"))


def test_no_bad_pages_is_an_empty_file() -> None:
    assert parse_bad_pages("") == BadPages(0, 0)


# --- aer_dev_* ----------------------------------------------------------------------------------


@pytest.mark.parametrize("severity", AER_SEVERITIES)
@given(total=st.integers(0, U64_MAX))
def test_aer_total_as_the_kernel_prints_it(severity: str, total: int) -> None:
    assert parse_aer_total(aer_counts(severity, total), severity) == total


def test_aer_total_needs_its_total_line() -> None:
    with pytest.raises(TextParseError, match="TOTAL_ERR_FATAL"):
        parse_aer_total("RxErr 0\nTOTAL_ERR_COR 3\n", "fatal")
    with pytest.raises(TextParseError):
        parse_aer_total("TOTAL_ERR_FATAL -1\n", "fatal")
    assert set(AER_FILES) == set(AER_SEVERITIES)


# --- devcoredump data ---------------------------------------------------------------------------


@given(seconds=st.floats(0, 1e9, allow_nan=False).map(lambda s: round(s, 9)))
def test_devcoredump_time(seconds: float) -> None:
    assert parse_devcoredump_time(devcoredump_text(seconds)) == pytest.approx(seconds, abs=1e-6)


def test_devcoredump_head_cut_mid_line_still_parses() -> None:
    text = devcoredump_text(29.725011811)
    assert parse_devcoredump_time(text[: text.index("Ring timed out") + 6]) == pytest.approx(29.725011811)


def test_another_drivers_coredump_is_not_read() -> None:
    with pytest.raises(TextParseError, match="not an amdgpu device coredump"):
        parse_devcoredump_time("**** Xe Device Coredump ****\ntime: 1.000000000\n")


# --- the CPER ring ------------------------------------------------------------------------------

record_strategy = st.tuples(
    st.integers(946684800, 4102444799),  # 2000 .. 2099, what the header's century/year bytes hold
    st.sampled_from(SEVERITIES),
    st.from_regex(r"[0-9]:[0-9A-F]{1,6}", fullmatch=True),
)


@given(st.lists(record_strategy, max_size=12))
def test_cper_ring_round_trip(records: list[tuple[int, str, str]]) -> None:
    ring = cper_writer.ring([cper_writer.record(t, sev, rid, 0x74A1, 0) for t, sev, rid in records])
    assert parse_cper_ring(ring) == tuple(CperRecord(float(t), sev, (), rid) for t, sev, rid in records)


def test_cper_header_read_by_its_own_layout() -> None:
    """A header written by hand from the UEFI layout (not by the simulator's writer)."""
    header = (
        b"CPER"
        + struct.pack("<HIHIII", 0x100, 0xFFFFFFFF, 0, 1, 0b10, 128)
        + bytes((5, 4, 3, 0, 2, 1, 25, 20))  # 2025-01-02 03:04:05 UTC
        + bytes(64)
        + b"7:1F\0\0\0\0"
        + bytes(24)
    )
    assert len(header) == 128
    ring = struct.pack("<III", 0, 32, 32) + header
    assert parse_cper_ring(ring) == (CperRecord(1735787045.0, "fatal", (), "7:1F"),)


def test_a_record_cut_short_is_left_and_an_informational_one_skipped() -> None:
    whole = cper_writer.record(1_800_000_000, "corrected", "0:1", 0x74A1, 0)
    info = bytearray(cper_writer.record(1_800_000_001, "fatal", "0:2", 0x74A1, 0))
    info[12:16] = struct.pack("<I", 3)  # informational
    ring = struct.pack("<III", 0, 0, 0) + whole + bytes(info) + whole[:200]
    assert [r.record_id for r in parse_cper_ring(ring)] == ["0:1"]


def test_garbage_in_the_ring_is_an_error() -> None:
    with pytest.raises(CperParseError):
        parse_cper_ring(struct.pack("<III", 0, 0, 0) + b"XPER" + bytes(200))
    with pytest.raises(CperParseError):
        parse_cper_ring(b"\0\0")


@given(st.binary(max_size=600))
def test_any_bytes_give_records_or_a_parse_error(data: bytes) -> None:
    try:
        records = parse_cper_ring(struct.pack("<III", 0, 0, 0) + data)
    except CperParseError:
        return
    assert all(r.severity in SEVERITIES for r in records)


# --- the slow layer -----------------------------------------------------------------------------


def _read_first(root: Path) -> object:
    source = SysfsSource(root, slow_interval=60)
    try:
        return source.read(source.discover()[0])
    finally:
        source.close()


def _tree(tmp_path: Path, fleet: str = "1xMI210", scenario: str = "idle") -> Simulator:
    sim = Simulator(tmp_path / "sys", fleet, scenario, seed=2)
    sim.write_tree()
    return sim


@pytest.mark.parametrize(("parameter", "expected"), [("-1", 655), ("-2", 655), ("0", None), ("400", 400)])
def test_the_threshold_without_debugfs_follows_the_module_parameter(
    tmp_path: Path, parameter: str, expected: int | None
) -> None:
    sim = _tree(tmp_path)
    os.remove(sim.root / "kernel/debug/dri/0/ras/bad_page_cnt_threshold")  # as a reader without root sees it
    (sim.root / "module/amdgpu/parameters/bad_page_threshold").write_text(f"{parameter}\n")
    assert _read_first(sim.root).ras_bad_page_threshold == expected  # type: ignore[attr-defined]


def test_debugfs_has_the_drivers_own_threshold(tmp_path: Path) -> None:
    sim = _tree(tmp_path)
    (sim.root / "kernel/debug/dri/0/ras/bad_page_cnt_threshold").write_text("1234\n")
    assert _read_first(sim.root).ras_bad_page_threshold == 1234  # type: ignore[attr-defined]


def test_the_reset_time_is_the_coredumps_monotonic_time_on_the_wall_clock(tmp_path: Path) -> None:
    sim = _tree(tmp_path, scenario="idle:faults=reset.0,fault_at=0,fault_for=100")
    dump = sim.root / sim.gcds[0].device_relpath / "devcoredump/data"
    ten_seconds_ago = time.monotonic() - 10
    dump.write_text(devcoredump_text(ten_seconds_ago))
    expected = time.time() - 10
    assert _read_first(sim.root).last_reset_at == pytest.approx(expected, abs=1.0)  # type: ignore[attr-defined]
