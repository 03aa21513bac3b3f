"""End to end: the daemon's --demo with injected faults, scraped over HTTP: each raw health signal moves
while its fault lasts and stops (or clears) once it is over."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.test_demo_e2e import Series, parse, value
from tests.realtools import start_exporter, wait_ready

pytestmark = pytest.mark.integration

FAULT_AT, FAULT_FOR = 4.0, 8.0
# gpu 0 is the MI300X (GCD 0), gpus 1 and 2 the MI250X's dies (GCDs 1 and 2)
FAULTS = "ecc_ue.0+ecc_ce.1+aer_fatal.0+aer_correctable.2+bad_pages.1+cper_fatal.0+reset.1+pcie_downtrain.2+throttle.0"
THRESHOLD_MI250X_DIE = 64 * 1024 // 100  # retired pages: one per 100 MiB of the die's 64 GiB


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    truth = tmp_path_factory.mktemp("demo-faults") / "truth.json"
    proc, port = start_exporter(
        "--demo",
        "--demo.fleet=1xMI300X,1xMI250X",
        f"--demo.scenario=idle:faults={FAULTS},fault_at={FAULT_AT:g},fault_for={FAULT_FOR:g}",
        f"--demo.truth-file={truth}",
        "--interval=250ms",
        "--slow-interval=250ms",
    )
    try:
        wait_ready(port, proc, timeout=30)
        yield f"http://127.0.0.1:{port}", truth
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _elapsed(truth: Path) -> float:
    try:
        return float(json.loads(truth.read_text())["elapsed"])
    except (OSError, ValueError, KeyError):
        return 0.0


def _scrape_when(url: str, truth: Path, condition: Callable[[Series, float], bool], what: str) -> Series:
    """Scrape until `condition(series, simulated seconds)` holds (a generous deadline against a hang)."""
    deadline = time.monotonic() + 90
    while True:
        series = parse(httpx.get(url + "/metrics", timeout=5).text)
        if condition(series, _elapsed(truth)):
            return series
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def test_the_raw_signals_move_while_the_faults_last_and_stop_after(demo: tuple[str, Path]) -> None:
    url, truth = demo
    before = _scrape_when(url, truth, lambda s, t: value(s, "amdgpu_up", gpu="2") == 1.0, "all up")
    assert value(before, "amdgpu_ecc_errors_total", gpu="0", block="umc", type="uncorrectable") == 0
    assert value(before, "amdgpu_pcie_aer_errors_total", gpu="0", port="device", severity="fatal") == 0
    assert value(before, "amdgpu_last_reset_timestamp_seconds", gpu="1") is None
    assert value(before, "amdgpu_ras_bad_page_threshold_pages", gpu="1") == THRESHOLD_MI250X_DIE

    def during(s: Series, t: float) -> bool:
        return (
            FAULT_AT + 2 < t < FAULT_AT + FAULT_FOR - 1
            and (value(s, "amdgpu_ras_pending_pages", gpu="1") or 0) > 0
            and value(s, "amdgpu_last_reset_timestamp_seconds", gpu="1") is not None
        )

    mid = _scrape_when(url, truth, during, "the faults under way")
    assert value(mid, "amdgpu_ecc_errors_total", gpu="0", block="umc", type="uncorrectable") >= 1
    assert value(mid, "amdgpu_ecc_errors_total", gpu="1", block="umc", type="correctable") > 0
    assert value(mid, "amdgpu_pcie_aer_errors_total", gpu="0", port="device", severity="fatal") >= 1
    assert value(mid, "amdgpu_pcie_aer_errors_total", gpu="0", port="upstream", severity="fatal") >= 1
    assert value(mid, "amdgpu_pcie_aer_errors_total", gpu="2", port="device", severity="correctable") > 0
    assert value(mid, "amdgpu_cper_records", gpu="0", severity="fatal") >= 1
    newest = value(mid, "amdgpu_cper_newest_record_timestamp_seconds", gpu="0", severity="fatal")
    assert newest is not None and abs(newest - time.time()) < 60
    reset = value(mid, "amdgpu_last_reset_timestamp_seconds", gpu="1")
    assert reset is not None and reset <= time.time()
    assert value(mid, "amdgpu_pcie_current_link_width", gpu="2") == 8
    assert value(mid, "amdgpu_pcie_max_link_width", gpu="2") == 16

    over = FAULT_AT + FAULT_FOR + 1.5  # past the end, and past a slow-schedule refresh after it
    after = _scrape_when(url, truth, lambda s, t: t > over, "the faults over")
    later = _scrape_when(url, truth, lambda s, t: t > over + 2, "two seconds on")
    for name, labels in (
        ("amdgpu_ecc_errors_total", {"gpu": "0", "block": "umc", "type": "uncorrectable"}),
        ("amdgpu_ecc_errors_total", {"gpu": "1", "block": "umc", "type": "correctable"}),
        ("amdgpu_pcie_aer_errors_total", {"gpu": "0", "port": "device", "severity": "fatal"}),
        ("amdgpu_pcie_aer_errors_total", {"gpu": "2", "port": "device", "severity": "correctable"}),
    ):
        stopped = value(after, name, **labels)
        assert stopped is not None and stopped > (value(mid, name, **labels) or 0) - 1
        assert value(later, name, **labels) == stopped, (name, labels)  # stopped growing
    assert value(later, "amdgpu_ras_pending_pages", gpu="1") == 0
    assert value(later, "amdgpu_ras_retired_pages", gpu="1") == THRESHOLD_MI250X_DIE  # retired pages stay
    assert value(later, "amdgpu_last_reset_timestamp_seconds", gpu="1") is None  # the coredump is gone
    assert value(later, "amdgpu_pcie_current_link_width", gpu="2") == 16  # retrained
    assert value(later, "amdgpu_cper_records", gpu="0", severity="fatal") == value(
        after, "amdgpu_cper_records", gpu="0", severity="fatal"
    )  # no new records; the old ones stay in the ring, ageing
