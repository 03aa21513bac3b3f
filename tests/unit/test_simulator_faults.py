"""The simulator's faults: each writes what the kernel would while it lasts, then recovers."""

from __future__ import annotations

import itertools
import os
import struct
from pathlib import Path

import pytest

from exporter.simulator import Simulator, parse_scenario
from exporter.simulator.asics import MI300X
from exporter.simulator.physics import bad_page_threshold
from exporter.simulator.workload import FAULT_KINDS


def _sim(tmp_path: Path, fleet: str, faults: str, at: float = 2, lasting: float = 10) -> Simulator:
    sim = Simulator(tmp_path / "sys", fleet, f"training:faults={faults},fault_at={at:g},fault_for={lasting:g}", seed=3)
    sim.write_tree()
    return sim


def _device(sim: Simulator, gcd: int = 0) -> Path:
    return sim.root / sim.gcds[gcd].device_relpath


def test_the_fault_option_parses_on_every_scenario_and_prints_back() -> None:
    for name in ("idle", "training", "thermal-excursion", "alternating"):
        scenario = parse_scenario(f"{name}:faults=ecc_ue.0+aer_fatal.1,fault_at=5,fault_for=20")
        assert scenario.faults == (("ecc_ue", 0), ("aer_fatal", 1))
        assert (scenario.fault_at, scenario.fault_for) == (5, 20)
        assert parse_scenario(str(scenario)) == scenario
    assert len(FAULT_KINDS) == 14


@pytest.mark.parametrize(
    "spec", ["training:faults=melt.0", "training:faults=ecc_ue", "training:faults=ecc_ue.x", "idle:fault_for=0"]
)
def test_a_bad_fault_option_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_scenario(spec)


def test_a_fault_is_active_from_fault_at_for_fault_for() -> None:
    scenario = parse_scenario("idle:faults=reset.2,fault_at=5,fault_for=20")
    assert not scenario.fault_active("reset", 2, 4.9)
    assert scenario.fault_active("reset", 2, 5) and scenario.fault_active("reset", 2, 24.9)
    assert not scenario.fault_active("reset", 2, 25) and not scenario.fault_active("reset", 1, 10)
    assert scenario.fault_seconds("reset", 2, 3) is None
    assert scenario.fault_seconds("reset", 2, 100) == 20


def _ras(path: Path) -> dict[str, int]:
    return {key: int(value) for key, value in (line.split(": ") for line in path.read_text().splitlines())}


def test_ecc_counts_grow_while_the_fault_lasts_then_stop(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "1xMI300X", "ecc_ue.0+ecc_ce.0+ecc_de.0")
    umc = _device(sim) / "ras/umc_err_count"
    sim.tick(1)
    before = _ras(umc)
    assert before["ue"] == 0 and before["de"] == 0
    sim.tick(5)
    during = _ras(umc)
    assert during["ue"] > 0 and during["de"] > 0 and during["ce"] > before["ce"]
    sim.tick(12)
    ended = _ras(umc)
    sim.tick(30)
    assert _ras(umc) == ended and ended["ue"] > during["ue"]
    # only the block given the deferred fault prints a "de:" line (Debian's rocm-smi refuses one)
    assert "de:" not in (_device(sim) / "ras/gfx_err_count").read_text()
    truth = sim.truth()[0].sample.ecc_errors
    assert truth[("umc", "uncorrectable")] == ended["ue"] and truth[("umc", "deferred")] == ended["de"]


def test_bad_pages_are_pending_first_then_retired_up_to_the_threshold(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "1xMI300X", "bad_pages.0", at=2, lasting=10)
    pages = _device(sim) / "ras/gpu_vram_bad_pages"
    threshold = bad_page_threshold(MI300X)
    assert threshold == 192 * 1024 // 100  # one page per 100 MiB of VRAM

    def statuses() -> tuple[int, int]:
        lines = [line.rsplit(": ", 1)[1] for line in pages.read_text().splitlines()]
        return lines.count("R"), lines.count("P")

    sim.tick(2)
    assert statuses()[1] >= 1  # found, not retired yet
    sim.tick(7)
    retired, pending = statuses()
    assert 0 < retired < threshold and pending > 0
    sim.tick(13)
    assert statuses() == (threshold, 0)
    sample = sim.truth()[0].sample
    assert (sample.ras_retired_pages, sample.ras_pending_pages) == (threshold, 0)
    assert sample.ras_bad_page_threshold == threshold
    assert (sim.root / "kernel/debug/dri/0/ras/bad_page_cnt_threshold").read_text() == f"{threshold}\n"
    assert (sim.root / "module/amdgpu/parameters/bad_page_threshold").read_text() == "-1\n"


def _records(ring: bytes) -> list[tuple[int, int, bytes, str]]:
    """(severity, length, timestamp bytes, record id) of each record, read by the CPER header layout."""
    rptr, wptr, _ = struct.unpack_from("<III", ring)
    body = ring[12 + 4 * rptr : 12 + 4 * wptr]
    found = []
    while body:
        assert body[:4] == b"CPER" and struct.unpack_from("<I", body, 6)[0] == 0xFFFFFFFF
        severity, _valid, length = struct.unpack_from("<III", body, 12)
        found.append((severity, length, body[24:32], body[96:104].rstrip(b"\0").decode()))
        body = body[length:]
    return found


def test_cper_records_are_written_while_the_fault_lasts_and_stay_in_the_ring(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "1xMI300X", "cper_fatal.0+cper_corrected.0", at=2, lasting=10)
    ring = sim.root / "kernel/debug/dri/0/amdgpu_ring_cper"
    sim.tick(1)
    assert _records(ring.read_bytes()) == []
    sim.tick(8)
    records = _records(ring.read_bytes())
    assert sorted(r[0] for r in records) == [1, 1, 2, 2]  # fatal, corrected at 2 s and 7 s
    assert [r[3] for r in records] == ["0:1", "0:2", "0:3", "0:4"]
    sim.tick(40)
    assert len(_records(ring.read_bytes())) == 6  # no more after the fault; the old ones age in the ring
    truth = sim.truth()[0].sample.cper_records
    assert sorted(r.severity for r in truth) == ["corrected"] * 3 + ["fatal"] * 3
    assert all(t.timestamp <= u.timestamp for t, u in itertools.pairwise(truth))


def test_mi200_has_no_cper_ring(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "1xMI250X", "cper_fatal.0")
    sim.tick(5)
    assert not (sim.root / "kernel/debug/dri/0/amdgpu_ring_cper").exists()
    assert sim.truth()[0].sample.cper_records == ()


def test_a_reset_leaves_a_device_coredump_until_the_fault_ends(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "2xMI250X", "reset.1", at=2, lasting=10)
    dumps = sim.root / "class/devcoredump"
    sim.tick(1)
    assert not dumps.exists() or not os.listdir(dumps)
    sim.tick(3)
    assert os.listdir(dumps) == ["devcd0"]
    assert os.path.realpath(dumps / "devcd0/failing_device") == os.path.realpath(_device(sim, 1))
    text = (_device(sim, 1) / "devcoredump/data").read_text()
    assert text.startswith("**** AMDGPU Device Coredump ****\n") and "\ntime: " in text
    truth = sim.truth()
    assert truth[1].sample.last_reset_at is not None and truth[0].sample.last_reset_at is None
    sim.tick(12)
    assert os.listdir(dumps) == [] and not (_device(sim, 1) / "devcoredump").exists()
    assert sim.truth()[1].sample.last_reset_at is None


def _total(path: Path) -> int:
    return int(path.read_text().splitlines()[-1].split()[1])


def test_aer_counts_grow_on_the_device_and_its_port_then_stop(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "1xMI210", "aer_fatal.0+aer_correctable.0+aer_nonfatal.0")
    dev = _device(sim)
    port = dev.parent
    sim.tick(1)
    assert [_total(dev / f"aer_dev_{k}") for k in ("correctable", "nonfatal", "fatal")] == [0, 0, 0]
    sim.tick(6)
    assert all(_total(dev / f"aer_dev_{k}") > 0 for k in ("correctable", "nonfatal", "fatal"))
    assert _total(port / "aer_dev_fatal") > 0 and _total(port / "aer_dev_correctable") == 0
    sim.tick(12)
    ended = [_total(dev / f"aer_dev_{k}") for k in ("correctable", "nonfatal", "fatal")]
    sim.tick(50)
    assert [_total(dev / f"aer_dev_{k}") for k in ("correctable", "nonfatal", "fatal")] == ended
    assert (dev / "aer_dev_fatal").read_text().splitlines()[-1].startswith("TOTAL_ERR_FATAL ")
    assert sim.truth()[0].sample.pcie_aer_errors[("device", "fatal")] == ended[2]


def test_an_xgmi_link_goes_down_and_comes_back(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "4xMI300X", "xgmi_down.1")
    sim.tick(1)
    assert sim.truth()[1].sample.xgmi_link_up[0] is True
    sim.tick(5)
    assert sim.truth()[1].sample.xgmi_link_up[0] is False and sim.truth()[0].sample.xgmi_link_up[0] is True
    sim.tick(13)
    assert sim.truth()[1].sample.xgmi_link_up[0] is True


def test_the_pcie_link_trains_below_its_maximum_then_retrains(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "1xMI300X", "pcie_downtrain.0")
    dev = _device(sim)
    sim.tick(5)
    assert (dev / "current_link_width").read_text() == "8\n"
    assert (dev / "current_link_speed").read_text() == "16.0 GT/s PCIe\n"
    assert (dev / "max_link_width").read_text() == "16\n"
    sim.tick(13)
    assert (dev / "current_link_width").read_text() == "16\n"


def test_a_throttle_reason_is_held_while_the_fault_lasts(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "1xMI250X", "throttle.0", at=2, lasting=10)
    sim.tick(5)
    assert sim.truth()[0].sample.throttle["ppt0"] is True
    sim.tick(13)
    assert sim.truth()[0].sample.throttle["ppt0"] is False
    mi300 = _sim(tmp_path / "b", "1xMI300X", "throttle.0", at=2, lasting=10)
    mi300.tick(12)
    held = mi300.truth()[0].sample.throttle_residency_seconds["ppt"]
    assert held == pytest.approx(10, abs=0.3)
