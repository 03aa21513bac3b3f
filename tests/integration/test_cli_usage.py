"""The command line as a person meets it, through real processes: --help lists the commands and
each flag's choices once, a typo names the flag and its nearest neighbour, every value is checked
(bounds for durations) before any device is touched, duplicate config keys and missing folders are
named, port 0 is logged as the port really bound, and --log.level=debug says what each stage did."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.faulty_tree import hang, release, write_tree
from tests.realtools import EXPORTER, wait_for_cycles

pytestmark = pytest.mark.integration


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXPORTER, *args], capture_output=True, text=True, timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("amdgpu-exporter: error: ")
    return lines[0].removeprefix("amdgpu-exporter: error: ")


def test_help_lists_commands_and_each_choice_once() -> None:
    result = run("--help")
    assert result.returncode == 0
    text = result.stdout
    assert text.startswith(
        "usage: amdgpu-exporter [serve|snapshot|doctor|simulate|check-config|check-rules|job-report] [FLAG ...]"
    )
    for command in ("serve", "snapshot", "doctor", "simulate", "check-config", "check-rules", "job-report"):
        assert f"\n  {command}  " in text
    assert text.count("{auto,sysfs,rocm-smi,amd-smi}") == 1
    assert text.count("{debug,info,warn,error}") == 1
    flat = " ".join(text.split())
    assert "(default )" not in flat and "(default: )" not in flat
    for block in re.split(r"\n  (?=--)", text):  # one block per flag: its default said once
        assert block.count("(default:") <= 1, block
    assert "(default: the shipped rules)" in flat and "(default: 1s; 10ms..1h)" in flat
    snapshot = run("snapshot", "--help").stdout
    assert "--watch DURATION" in snapshot and "--json" in snapshot
    doctor = run("doctor", "--help").stdout
    assert "--path.procfs PATH" in doctor and "--path.dev PATH" in doctor


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--intervl=5s"], "unknown flag --intervl; did you mean --interval?"),
        (["--web.listen-adress", ":1"], "unknown flag --web.listen-adress; did you mean --web.listen-address?"),
        (["snapshot", "--jsn"], "unknown flag --jsn; did you mean --json?"),
        (["--interval=0.001ms"], "--interval: '0.001ms' is outside 10ms..1h"),
        (["--interval=99999999999999h"], "--interval: '99999999999999h' is outside 10ms..1h"),
        (["--read-timeout=0s"], "--read-timeout: '0s' must be longer than zero"),
        (["--slow-interval=2d"], "--slow-interval: '2d' is not a duration (examples: 1s, 500ms, 2m)"),
        (["--interval"], "--interval: expected one argument"),
        (["--path.sysfs=/nonexistent"], "--path.sysfs: /nonexistent is missing (no such folder)"),
        (
            ["--alertmanager.url=ftp://am:9093"],
            "--alertmanager.url: 'ftp://am:9093' is not an http:// or https:// URL with a host "
            "(example: http://alertmanager:9093)",
        ),
        (["--source=cuda"], "--source: 'cuda' is not one of auto, sysfs, rocm-smi, amd-smi"),
        (
            ["bogus"],
            "unexpected argument 'bogus' (commands: serve, snapshot, doctor, simulate, check-config, check-rules, "
            "job-report)",
        ),
    ],
)
def test_bad_command_lines_are_one_line_naming_the_flag(args: list[str], message: str) -> None:
    assert one_error_line(run(*args)) == message


def test_flags_are_checked_before_any_device_is_touched(tmp_path: Path) -> None:
    """A hung device would block discovery for its deadline; a bad flag must be reported at once."""
    simulator = write_tree(tmp_path / "sys", fleet="MI210")
    gpu_metrics = tmp_path / "sys" / simulator.gcds[0].device_relpath / "gpu_metrics"
    hang(gpu_metrics)
    # A writer's open() of the pipe returns once a reader opens it: whoever touches the device.
    touched = threading.Event()
    writer = threading.Thread(target=lambda: (os.close(os.open(gpu_metrics, os.O_WRONLY)), touched.set()))
    writer.start()
    try:
        result = run(f"--path.sysfs={tmp_path / 'sys'}", "--web.listen-address=127.0.0.1:0", "--interval=1us")
        read_by_it = touched.is_set()
    finally:
        os.close(os.open(gpu_metrics, os.O_RDONLY | os.O_NONBLOCK))  # lets the writer go
        writer.join()
        release(gpu_metrics)
    assert one_error_line(result).startswith("--interval: '1us' is not a duration")
    assert not read_by_it, "a device was read before the flags were checked"


def test_duplicate_config_keys_are_rejected(tmp_path: Path) -> None:
    config = tmp_path / "exporter.yaml"
    config.write_text("interval: 1s\nsource: sysfs\ninterval: 5s\n")
    message = one_error_line(run(f"--config.file={config}", "--demo"))
    assert message == f"config file {config} line 3: option 'interval' is given twice (lines 1 and 3)"


def test_port_zero_logs_the_port_really_bound_and_debug_says_what_each_stage_did() -> None:
    proc = subprocess.Popen(
        [
            EXPORTER,
            "--demo",
            "--demo.fleet=MI210",
            "--web.listen-address=127.0.0.1:0",
            "--interval=200ms",
            "--log.format=json",
            "--log.level=debug",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    events: list[dict] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(e["event"] == "cycle" for e in events) < 3:
            line = proc.stderr.readline()
            if line.startswith("{"):
                events.append(json.loads(line))
        listening = next(e for e in events if e["event"] == "listening")
        (url,) = listening["urls"]
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert port != 0
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    names = {e["event"] for e in events if e["level"] == "debug"}
    assert {"settings", "discovered", "slow_fields_read", "cycle"} <= names, names
    cycle = next(e for e in events if e["event"] == "cycle")
    assert cycle["up"] == 1 and cycle["poll_seconds"] > 0 and "alerts_pending" in cycle


def test_info_level_has_no_debug_events() -> None:
    proc = subprocess.Popen(
        [
            EXPORTER,
            "--demo",
            "--demo.fleet=MI210",
            "--web.listen-address=127.0.0.1:0",
            "--interval=200ms",
            "--log.format=json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    events: list[dict] = []
    try:
        # Until it listens (info), then three poll cycles: what debug would have logged, each time.
        while not any(e["event"] == "listening" for e in events):
            line = proc.stderr.readline()
            assert line, "exited before listening"
            if line.startswith("{"):
                events.append(json.loads(line))
        (url,) = next(e for e in events if e["event"] == "listening")["urls"]
        wait_for_cycles(int(url.rsplit(":", 1)[1].split("/")[0]), 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=10)
    events += [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    levels = {e["level"] for e in events}
    assert "debug" not in levels and "info" in levels
