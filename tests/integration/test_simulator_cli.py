"""`python -m exporter.simulator` as a real process: one-line errors, --once, ticking, clean stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.simulator import load_truth_json

pytestmark = pytest.mark.integration

MODULE = [sys.executable, "-m", "exporter.simulator"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fleet", "3xMI999"], "unknown GPU model 'MI999'"),
        (["--fleet", "0xMI210"], "the count must be at least 1"),
        (["--scenario", "gaming"], "unknown scenario 'gaming'"),
        (["--scenario", "thermal-excursion:hot=-1"], "bad hot=-1"),
        (["--interval", "0"], "--interval must be a positive number"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run(
        [*MODULE, "--path.sysfs", str(tmp_path / "sys"), *args], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "sys").exists()


def test_once_writes_the_tree_and_the_truth(tmp_path: Path) -> None:
    args = ["--fleet", "2xMI210", "--once", "--truth-file", str(tmp_path / "truth.json")]
    result = subprocess.run(
        [*MODULE, "--path.sysfs", str(tmp_path / "sys"), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    truth = load_truth_json(tmp_path / "truth.json")
    assert [d.identity.card for d in truth] == ["card0", "card1"]
    for device in truth:
        busy = (Path(device.identity.device_dir) / "gpu_busy_percent").read_text()
        assert int(busy) == round(device.sample.busy["gfx"] * 100)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_runs_until_signalled_and_stops_cleanly(tmp_path: Path, signum: int) -> None:
    truth_file = tmp_path / "truth.json"
    args = ["--fleet", "MI250X", "--scenario", "training", "--interval", "0.1", "--truth-file", str(truth_file)]
    process = subprocess.Popen(
        [*MODULE, "--path.sysfs", str(tmp_path / "sys"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        elapsed = 0.0
        while time.monotonic() < deadline and elapsed < 0.5:
            if truth_file.exists():
                elapsed = json.loads(truth_file.read_text())["elapsed"]
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        assert elapsed >= 0.5  # it ticks and keeps the truth current
        process.send_signal(signum)
        _out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0
    assert "Traceback" not in err
