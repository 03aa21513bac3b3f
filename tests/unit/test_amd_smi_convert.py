"""The amd-smi worker's answers (amdsmi module units, "N/A" already None) -> the data model."""

from __future__ import annotations

import pytest

from exporter.sources.amd_smi import convert
from exporter.sources.amd_smi.worker import _plain


def test_module_placeholders_become_not_supplied() -> None:
    assert _plain({"clk": "N/A", "max_clk": 1600, "list": [1, "N/A"]}) == {
        "clk": None,
        "max_clk": 1600,
        "list": [1, None],
    }


def _readings() -> tuple[dict, dict]:
    readings = {
        "temperatures": {"edge": 46, "junction": 60, "memory": None},
        "power": {"socket_power": 288},
        "energy": {"energy_accumulator": 65536 * 10, "counter_resolution": 15.3},
        "activity": {"gfx_activity": 98, "umc_activity": 37, "mm_activity": None},
        "memory_used": {"vram": 1024, "gtt": None},
        "vddgfx_mv": 940,
        "gpu_metrics": {
            "temperature_vrsoc": 40,
            "temperature_hbm": [48, None, 50, 51],
            "current_gfxclk": 1700,
            "pcie_link_width": 16,
            "pcie_link_speed": 160,
            "xgmi_link_width": 16,
            "xgmi_link_speed": 32,
            "xgmi_link_status": [1, 0, None, 2],
            "xgmi_read_data_acc": [3, None],
            "ppt_residency_acc": 1500,
            "pcie_bandwidth_inst": 2,
        },
    }
    slow = {
        "thresholds": {"junction": {"critical": 105, "emergency": None}},
        "power_cap": {"power_cap": 300_000_000, "max_power_cap": 0},
        "memory_total": {"vram": 68719476736},
        "clocks": {"fabric": {"clk": None, "max_clk": 1600}, "gfx": {"clk": 1600, "max_clk": 1700}},
        "pcie": {"pcie_static": {"max_pcie_width": 16, "max_pcie_speed": 16000}, "pcie_metric": {"pcie_width": 8}},
        "pcie_replays": 5,
        "ecc": {"umc": {"correctable_count": 2, "uncorrectable_count": 0, "deferred_count": 0}, "gfx": None},
    }
    return readings, slow


def test_a_sample_in_si_units() -> None:
    readings, slow = _readings()
    sample = convert.sample_from_readings(readings, slow, 1.0)
    assert dict(sample.temperatures) == {
        "edge": 46.0,
        "junction": 60.0,
        "vr_soc": 40.0,
        "hbm0": 48.0,
        "hbm2": 50.0,
        "hbm3": 51.0,
    }
    assert dict(sample.temperature_thresholds) == {("junction", "critical"): 105.0}
    assert sample.power_watts == 288.0 and sample.power_cap_watts == 300.0 and sample.power_cap_max_watts is None
    assert sample.energy_joules == pytest.approx(10.0)  # 2^-16 J per tick, not the module's 15.3 uJ
    assert dict(sample.busy) == {"gfx": 0.98, "memory": 0.37}
    assert dict(sample.clocks_hertz) == {"gfx": 1.7e9} and dict(sample.clocks_max_hertz) == {
        "fabric": 1.6e9,
        "gfx": 1.7e9,
    }
    assert sample.pcie_link_width == 16 and sample.pcie_link_transfers_per_second == 16e9
    assert sample.pcie_max_link_transfers_per_second == 16e9 and sample.pcie_bandwidth_bytes_per_second == 2e9
    assert sample.xgmi_link_speed_bytes_per_second == 32e9 * 16 / 8
    assert dict(sample.xgmi_link_up) == {0: True, 1: False} and dict(sample.xgmi_read_bytes) == {0: 3072.0}
    assert dict(sample.throttle_residency_seconds) == {"ppt": 1.5}
    assert dict(sample.ecc_errors) == {("umc", "correctable"): 2, ("umc", "uncorrectable"): 0}
    assert dict(sample.voltages_volts) == {"gfx": 0.94} and sample.pcie_replays == 5


def test_bad_pages_by_status_and_the_threshold() -> None:
    readings, slow = _readings()
    pages = [{"page_address": a, "page_size": 4096, "status": s} for a, s in ((1, 0), (2, 0), (3, 1), (4, 2))]
    sample = convert.sample_from_readings(readings, {**slow, "bad_pages": pages, "bad_page_threshold": 655}, 1.0)
    assert (sample.ras_retired_pages, sample.ras_pending_pages, sample.ras_bad_page_threshold) == (2, 1, 655)
    # not read (the call failed) or not root ("N/A", already None): not supplied
    unread = convert.sample_from_readings(readings, {**slow, "bad_pages": None, "bad_page_threshold": None}, 1.0)
    assert (unread.ras_retired_pages, unread.ras_pending_pages, unread.ras_bad_page_threshold) == (None, None, None)
    assert convert.bad_pages([]) == (0, 0)
