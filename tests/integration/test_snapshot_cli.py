"""`amdgpu-exporter snapshot` as a real process: the table on a mixed simulated fleet and on trees
with faults (a hung device, missing files, a degraded PCIe link), --demo, --json (the
/api/v1/devices document, compared with a running daemon's), and --watch."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.faulty_tree import degrade_pcie, hang_device, release, remove, write_tree
from tests.realtools import EXPORTER, start_exporter, wait_ready

pytestmark = pytest.mark.integration


def snapshot(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXPORTER, "snapshot", *args], capture_output=True, text=True, timeout=timeout, env=_env())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AMDGPU_EXPORTER_LOG_FORMAT", None)
    return env


def rows(table: str) -> dict[int, str]:
    """gpu index -> its table row."""
    out = {}
    for line in table.splitlines():
        head = line[:3].strip()
        if head.isdigit():
            out[int(head)] = line
    return out


def test_table_groups_dies_under_their_package_on_80_columns(tmp_path: Path) -> None:
    write_tree(tmp_path / "sys")
    result = snapshot(f"--path.sysfs={tmp_path / 'sys'}")
    assert result.returncode == 0, result.stderr
    table = result.stdout
    lines = table.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "\x1b" not in table + result.stderr  # piped: no colour, no cursor moves
    assert lines[0].startswith("amdgpu-exporter snapshot · 7 devices · sysfs")
    by_gpu = rows(table)
    assert sorted(by_gpu) == list(range(7))
    headers = [i for i, line in enumerate(lines) if line.startswith("── ")]
    assert len(headers) == 5  # 2 MI210, 2 MI250X packages, 1 MI300X
    mi250x = [i for i in headers if "MI250X" in lines[i]]
    assert len(mi250x) == 2 and all("2 dies" in lines[i] for i in mi250x)
    for header in mi250x:  # the two dies follow their package's header
        assert lines[header + 1][4:6] == "d0" and lines[header + 2][4:6] == "d1"
    assert "MI300X" in lines[headers[-1]] and lines[headers[-1] + 1].startswith("  6")
    # every up device shows a junction temperature, VRAM and a 16 GT/s x16 (or 32 GT/s) link
    for line in by_gpu.values():
        assert "DOWN" not in line
        assert "GT x16" in line, line
    assert "/560" in by_gpu[2] and "/300" in by_gpu[0] and "/750" in by_gpu[6]  # power caps
    assert result.stderr == ""  # info logs stay quiet for a person's command


def test_demo_flag_is_honoured() -> None:
    result = snapshot("--demo", "--demo.fleet=MI300X,2xMI210")
    assert result.returncode == 0, result.stderr
    assert sorted(rows(result.stdout)) == [0, 1, 2]
    assert "MI300X" in result.stdout and "MI210" in result.stdout


def test_hung_device_is_shown_down_and_the_command_exits_promptly(tmp_path: Path) -> None:
    simulator = write_tree(tmp_path / "sys")
    hung = hang_device(simulator, 3)
    try:
        # The hung read never ends while the pipe is held: a command that joined the stuck thread
        # would not exit at all (the 20 s limit only ends such a run).
        result = snapshot(f"--path.sysfs={tmp_path / 'sys'}", "--read-timeout=500ms", timeout=20)
    finally:
        release(hung)
    assert result.returncode == 0, result.stderr
    by_gpu = rows(result.stdout)
    assert "DOWN (timeout)" in by_gpu[3]
    assert all("DOWN" not in line for gpu, line in by_gpu.items() if gpu != 3)
    assert "(1 down)" in result.stdout.splitlines()[0]


def test_missing_files_and_a_degraded_link(tmp_path: Path) -> None:
    simulator = write_tree(tmp_path / "sys")
    # GPU 1 lost its gpu_metrics table (values come from hwmon) and trained at x8 on a x16 slot.
    remove(simulator, 1, "gpu_metrics")
    degrade_pcie(simulator, 1, width=8, speed_gts=8.0)
    # GPU 0: nothing readable at all (no gpu_metrics, no hwmon, no busy/VRAM files) -> down.
    hwmon = next((tmp_path / "sys").glob("devices/**/0000:01:00.0/hwmon/hwmon*"))
    for name in (
        "gpu_metrics",
        "gpu_busy_percent",
        "mem_busy_percent",
        "mem_info_vram_used",
        "mem_info_vis_vram_used",
        "mem_info_gtt_used",
    ):
        remove(simulator, 0, name)
    for child in hwmon.iterdir():
        if child.name.startswith(("temp", "power")) and not child.is_symlink():
            child.unlink()
    result = snapshot(f"--path.sysfs={tmp_path / 'sys'}")
    assert result.returncode == 0, result.stderr
    by_gpu = rows(result.stdout)
    assert "DOWN (read_error)" in by_gpu[0]
    assert "8/16GT x8/16" in by_gpu[1], by_gpu[1]
    assert "DOWN" not in by_gpu[1]


def test_json_is_the_api_devices_document(tmp_path: Path) -> None:
    write_tree(tmp_path / "sys")
    result = snapshot(f"--path.sysfs={tmp_path / 'sys'}", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    proc, port = start_exporter(f"--path.sysfs={tmp_path / 'sys'}", "--interval=200ms")
    try:
        wait_ready(port, proc)
        api = httpx.get(f"http://127.0.0.1:{port}/api/v1/devices", timeout=5).json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)

    def shape(value: object) -> object:
        if isinstance(value, dict):
            return {key: shape(item) for key, item in value.items()}
        if isinstance(value, list):
            return [shape(item) for item in value[:1]]
        return type(value).__name__ if value is not None else None

    assert set(document) == set(api)
    assert len(document["devices"]) == len(api["devices"]) == 7
    for mine, theirs in zip(document["devices"], api["devices"], strict=True):
        assert mine["identity"] == theirs["identity"]
        assert set(mine["sample"]) == set(theirs["sample"])
        assert shape(mine["sample"]["temperatures"]) == shape(theirs["sample"]["temperatures"])
    schema = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    for key in (
        *document,
        *document["devices"][0],
        *document["devices"][0]["identity"],
        *document["devices"][0]["sample"],
    ):
        assert f"`{key}`" in schema, f"{key} is not documented in docs/api.md"
    for key in document["devices"][0]["identity"]["topology"][0]:
        assert key in schema.split("| `topology` |", 1)[1].splitlines()[0], f"topology's {key} is not documented"


def test_watch_redraws_in_place_on_a_terminal(tmp_path: Path) -> None:
    write_tree(tmp_path / "sys", fleet="MI210")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [EXPORTER, "snapshot", f"--path.sysfs={tmp_path / 'sys'}", "--watch=200ms"],
        stdout=follower,
        stderr=subprocess.DEVNULL,  # never read: an unread pipe could fill and block logging
        env=_env(),
    )
    os.close(follower)
    output = b""
    deadline = time.monotonic() + 10
    while output.count(b"\x1b[H\x1b[2J") < 3 and time.monotonic() < deadline:
        output += os.read(leader, 65536)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=5) == 130
    os.close(leader)
    assert output.count(b"\x1b[H\x1b[2J") >= 3
    assert output.count(b"amdgpu-exporter snapshot") >= 3


def test_watch_json_is_one_document_per_line_when_piped(tmp_path: Path) -> None:
    write_tree(tmp_path / "sys", fleet="MI210")
    proc = subprocess.Popen(
        [EXPORTER, "snapshot", f"--path.sysfs={tmp_path / 'sys'}", "--watch=200ms", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # never read: an unread pipe could fill and block logging
        env=_env(),
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=5)
    cycles = [json.loads(line)["cycle"] for line in lines]
    assert cycles == sorted(cycles) and len(set(cycles)) == 3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--watch=1ms"], "--watch: '1ms' is outside 100ms..24h"),
        (["--watch=soon"], "--watch"),
        (["--path.sysfs=/nonexistent"], "--path.sysfs: /nonexistent is missing"),
    ],
)
def test_bad_snapshot_flags(args: list[str], needle: str) -> None:
    result = snapshot(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"amdgpu-exporter: error: {result.stderr.split('error: ', 1)[1].strip()}"
    ]
    assert needle in result.stderr


def test_logs_are_plain_json_when_piped(tmp_path: Path) -> None:
    write_tree(tmp_path / "sys", fleet="MI210")
    result = snapshot(f"--path.sysfs={tmp_path / 'sys'}", "--log.level=debug")
    assert result.returncode == 0
    assert "\x1b" not in result.stderr
    events = [json.loads(line)["event"] for line in result.stderr.splitlines()]
    assert {"device_found", "discovered", "polled"} <= set(events)


def test_watch_shows_a_device_that_hangs_mid_watch_and_still_stops_at_once(tmp_path: Path) -> None:
    simulator = write_tree(tmp_path / "sys", fleet="2xMI210")
    log_path = tmp_path / "stderr.log"
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        [
            EXPORTER,
            "snapshot",
            f"--path.sysfs={tmp_path / 'sys'}",
            "--watch=200ms",
            "--json",
            "--read-timeout=300ms",
            "--slow-interval=100ms",
        ],
        stdout=subprocess.PIPE,
        stderr=log_file,  # a file, not an unread pipe that could fill and block logging
        env=_env(),
    )
    assert proc.stdout is not None
    hung = None
    try:
        first = json.loads(proc.stdout.readline())
        assert [d["up"] for d in first["devices"]] == [True, True]
        hung = hang_device(simulator, 1)  # its DPM table is re-read on the slow schedule: that read blocks
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            frame = json.loads(proc.stdout.readline())
            if not frame["devices"][1]["up"]:
                break
        assert frame["devices"][1]["down_reason"] in ("timeout", "stuck") and frame["devices"][0]["up"]
        proc.send_signal(signal.SIGINT)
        # The stuck read never ends while the pipe is held: exiting at all shows its thread is not joined.
        try:
            assert proc.wait(timeout=10) == 130
        except subprocess.TimeoutExpired as error:
            raise AssertionError(f"still running 10 s after SIGINT; its log:\n{log_path.read_text()}") from error
    finally:
        log_file.close()
        if hung is not None:
            release(hung)
        if proc.poll() is None:
            proc.kill()


def test_partitions_sit_under_their_socket() -> None:
    result = snapshot("--demo", "--demo.fleet=MI300X:CPX:NPS4,MI210")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "MI300X" in line)
    assert "socket" in lines[header] and "CPX/NPS4 · 8 partitions" in lines[header]
    assert [line[4:6] for line in lines[header + 1 : header + 9]] == [f"p{i}" for i in range(8)]
    assert "/192" in lines[header + 1] and "/48" in lines[header + 2]  # the socket's VRAM; a partition's share
    assert "MI210" in lines[header + 9] and lines[header + 10].startswith("  8")
