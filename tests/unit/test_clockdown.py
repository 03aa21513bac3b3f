"""The clock-down ceiling against DPM tables, and the commands that set and undo it."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from exporter.alerting.clockdown import (
    RANGE_TABLE_MAX_LEVELS,
    find_tool,
    next_ceiling,
    set_ceiling_command,
    undo_command,
)

MHZ = 1e6
# pp_dpm_sclk as the kernel prints them: Aldebaran (MI210 / MI250X) and MI300X are fine-grained
# (min, max; the current clock in between when it is neither), older SMUs list discrete levels.
MI250X_RANGE = (500 * MHZ, 1700 * MHZ)
MI300X_RANGE = (500 * MHZ, 2100 * MHZ)
DISCRETE = tuple(mhz * MHZ for mhz in (300, 500, 800, 1000, 1200, 1400, 1500, 1600, 1700))


def ceiling(
    current: float | None, previous: float | None = None, levels: tuple[float, ...] = MI250X_RANGE, **kw: float
):
    return next_ceiling(
        current_hertz=current,
        previous_ceiling_hertz=previous,
        max_hertz=kw.get("max_hertz", max(levels) if levels else 1700 * MHZ),
        levels_hertz=levels,
        step_ratio=kw.get("step", 0.05),
        floor_ratio=kw.get("floor", 0.75),
    )


def test_five_percent_below_what_the_hot_gpu_holds_not_below_its_maximum() -> None:
    # The demo: at 85 °C the MI250X already held ~1630 MHz; 5 % of 1700 would be 1615, above it.
    found = ceiling(1630 * MHZ)
    assert found is not None and found.mhz == 1548 and not found.at_floor
    # Three-line fine-grained table with the current clock in the middle: the same range.
    assert ceiling(1630 * MHZ, levels=(500 * MHZ, 1630 * MHZ, 1700 * MHZ)) == found


def test_steps_go_down_from_the_last_ceiling_or_the_clock_whichever_is_lower() -> None:
    assert ceiling(1650 * MHZ, previous=1548 * MHZ).mhz == 1470  # type: ignore[union-attr]
    assert ceiling(1400 * MHZ, previous=1548 * MHZ).mhz == 1330  # type: ignore[union-attr]


def test_the_floor_and_a_gpu_already_below_it() -> None:
    at_floor = ceiling(1300 * MHZ)
    assert at_floor is not None and at_floor.mhz == 1275 and at_floor.at_floor
    assert ceiling(1200 * MHZ) is None  # below 75 % of 1700 already: nothing lower to advise


def test_discrete_tables_snap_to_a_real_level() -> None:
    assert ceiling(1700 * MHZ, levels=DISCRETE).mhz == 1600  # type: ignore[union-attr]  # 1615 is no level
    assert ceiling(1600 * MHZ, levels=DISCRETE).mhz == 1500  # type: ignore[union-attr]  # 1520
    # From 1400 the target is 1330; the level below it (1200) is under the 1275 floor, so the lowest
    # real level at or above the floor is the last ceiling there is.
    found = ceiling(1400 * MHZ, levels=DISCRETE)
    assert found is not None and found.mhz == 1400 and found.at_floor


def test_unknown_clock_starts_from_the_maximum_and_nothing_known_gives_nothing() -> None:
    assert ceiling(None).mhz == 1615  # type: ignore[union-attr]
    assert (
        next_ceiling(current_hertz=None, previous_ceiling_hertz=None, max_hertz=None, step_ratio=0.05, floor_ratio=0.75)
        is None
    )


fine_tables = st.sampled_from([MI250X_RANGE, MI300X_RANGE, (800 * MHZ, 1700 * MHZ)])
discrete_tables = st.lists(st.integers(100, 2500), min_size=RANGE_TABLE_MAX_LEVELS + 1, max_size=16, unique=True).map(
    lambda mhz: tuple(sorted(m * MHZ for m in mhz))
)


@settings(max_examples=400, deadline=None)
@given(
    levels=st.one_of(fine_tables, discrete_tables),
    current_fraction=st.floats(0.0, 1.2),
    previous_fraction=st.one_of(st.none(), st.floats(0.3, 1.0)),
    step=st.floats(0.001, 0.5),
    floor=st.floats(0.05, 0.95),
)
def test_a_ceiling_is_never_above_the_clock_nor_below_the_floor_and_is_settable(
    levels: tuple[float, ...],
    current_fraction: float,
    previous_fraction: float | None,
    step: float,
    floor: float,
) -> None:
    top = max(levels)
    current = current_fraction * top if current_fraction > 0 else None
    previous = previous_fraction * top if previous_fraction is not None else None
    found = ceiling(current, previous, levels, step=step, floor=floor)
    running = min(h for h in (current, previous, top) if h is not None)
    lowest_allowed = max(floor * top, min(levels))
    if found is None:
        # Nothing is advised only when there is no whole MHz between the floor and what it runs at.
        assert math.ceil(lowest_allowed / MHZ - 1e-6) > math.floor(running / MHZ + 1e-6)
        return
    assert found.mhz * MHZ <= running + 1e-3, "never above what it is doing (or was advised)"
    assert found.mhz * MHZ >= lowest_allowed - 1e-3, "never below the floor nor the table's lowest level"
    assert min(levels) <= found.mhz * MHZ <= top
    if len(levels) > RANGE_TABLE_MAX_LEVELS:
        real = [h for h in levels if lowest_allowed - 1e-3 <= h <= running + 1e-3]
        if real:
            assert found.mhz * MHZ in levels, "a discrete table gives a real level where one is in range"
    else:
        assert found.mhz == max(math.ceil(lowest_allowed / MHZ - 1e-6), math.floor(running * (1 - step) / MHZ + 1e-6))


@settings(max_examples=200, deadline=None)
@given(levels=st.one_of(fine_tables, discrete_tables), start=st.floats(0.5, 1.0), step=st.floats(0.01, 0.3))
def test_repeated_steps_only_go_down_and_end_at_the_floor(levels: tuple[float, ...], start: float, step: float) -> None:
    top = max(levels)
    current = start * top
    previous: float | None = None
    seen: list[int] = []
    for _ in range(200):
        found = ceiling(current, previous, levels, step=step)
        if found is None or (previous is not None and found.mhz * MHZ >= previous):
            break
        seen.append(found.mhz)
        previous = found.mhz * MHZ
    assume(seen)
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == len(seen)
    assert seen[-1] * MHZ >= 0.75 * top - MHZ


def test_commands_run_without_a_prompt_and_have_one_undo() -> None:
    assert set_ceiling_command("rocm-smi", 2, "0000:c1:00.0", 500, 1548) == (
        "rocm-smi -d 2 --autorespond yes --setsrange 500 1548"
    )
    assert undo_command("rocm-smi", 2, "0000:c1:00.0") == "rocm-smi -d 2 --resetclocks"
    assert set_ceiling_command("amd-smi", 2, "0000:c1:00.0", 500, 1548) == (
        "amd-smi set --gpu 0000:c1:00.0 --clk-limit sclk max 1548"
    )
    assert undo_command("amd-smi", 2, "0000:c1:00.0") == "amd-smi reset --gpu 0000:c1:00.0 --clocks"
    # SCLKMIN never above SCLKMAX
    assert set_ceiling_command("rocm-smi", 0, "", 900, 800).endswith("--setsrange 800 800")


def test_the_tool_is_the_one_on_path(tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"  # type: ignore[operator]
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert find_tool("auto") == "rocm-smi"  # neither: the field notes' tool
    assert find_tool("auto", asics=["aqua_vanjaram"], rocm_versions=["6.4.1"]) == "rocm-smi"
    for name in ("amd-smi", "rocm-smi"):
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
        if name == "amd-smi":
            assert find_tool("auto") == "amd-smi"  # the only one there
    # Both on PATH: amd-smi where it drives the device (ROCm 6 or later, or an MI300-class part).
    assert find_tool("auto", asics=["aldebaran"], rocm_versions=["6.2.0"]) == "amd-smi"
    assert find_tool("auto", asics=["aldebaran", "aqua_vanjaram"]) == "amd-smi"
    assert find_tool("auto", asics=["gfx950"]) == "amd-smi"
    # An MI250X host with ROCm 5 (or no /opt/rocm version to tell): rocm-smi.
    assert find_tool("auto", asics=["aldebaran"], rocm_versions=["5.7.1"]) == "rocm-smi"
    assert find_tool("auto", asics=["aldebaran"], rocm_versions=["unknown"]) == "rocm-smi"
    assert find_tool("auto") == "rocm-smi"
    assert find_tool("rocm-smi", asics=["aqua_vanjaram"]) == "rocm-smi"
    assert find_tool("amd-smi") == "amd-smi"


def test_the_runbook_gives_the_same_undo_as_the_daemon() -> None:
    from pathlib import Path

    runbook = (Path(__file__).resolve().parents[2] / "docs" / "runbooks.md").read_text(encoding="utf-8")
    section = runbook[runbook.index("## AMDGPUDaemonAlert") :]
    assert undo_command("rocm-smi", 7, "BDF").replace("7", "N") in section
    assert undo_command("amd-smi", 7, "BDF") in section
    assert set_ceiling_command("rocm-smi", 7, "BDF", 500, 1548).replace("-d 7", "-d N") in section
