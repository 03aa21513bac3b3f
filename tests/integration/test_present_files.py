"""Discovery decides what each device has (issue 30): the real daemon, traced by strace on a
simulator's tree, opens no file that does not exist while it polls, slow layer included, and an
MI250X GCD's hot cycle reads at most 4 files besides gpu_metrics.

The window measured is between two published cycle counts (after start-up and the first
discovery), told apart in the trace by strace's own timestamps.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from exporter.simulator import Simulator
from tests.realtools import EXPORTER, free_port, poll_cycles, require_tool, stop, wait_for_cycles

_CALL = re.compile(r"^(?P<pid>\d+)\s+(?P<time>\d+\.\d+)\s+(?P<call>openat|pread64)\((?P<args>.*)$")
_RESUMED = re.compile(r"^(?P<pid>\d+)\s+\d+\.\d+\s+<\.\.\. (?:openat|pread64) resumed>(?P<rest>.*)$")


@dataclass(frozen=True)
class Traced:
    lines: list[tuple[float, str, str]]  # (unix time, call, the rest of the line)
    window: tuple[float, float]  # unix times of the two cycle counts
    cycles: int  # cycles published within the window


def _trace(tmp_path: Path, fleet: str, *flags: str, cycles: int = 10) -> tuple[Traced, Path]:
    """The daemon on a static tree of `fleet` under strace; the openat/pread64 calls of `cycles` cycles."""
    strace = require_tool("strace")
    root = tmp_path / "sys"
    Simulator(root, fleet=fleet, scenario="idle", seed=1).write_tree()
    trace = tmp_path / "strace.txt"
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="amdgpu-exporter-present-", suffix=".log")[1])
    argv = [
        strace, "-f", "-qq", "-ttt", "-y", "-e", "trace=openat,pread64", "-e", "signal=none", "-o", str(trace), "--",
        EXPORTER, f"--path.sysfs={root}", "--source=sysfs", "--interval=100ms", "--fast.interval=0",
        f"--web.listen-address=127.0.0.1:{port}", "--log.format=json", *flags,
    ]  # fmt: skip
    # Its own session: SIGTERM to strace only detaches it, so the whole group is stopped.
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _listening(port):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        wait_for_cycles(port, 3, timeout=60)
        first, started = poll_cycles(port), time.time()
        wait_for_cycles(port, first + cycles, timeout=60)
        last, ended = poll_cycles(port), time.time()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        stop(process)  # type: ignore[arg-type]
        with contextlib.suppress(ProcessLookupError):
            time.sleep(0.5)
            os.killpg(process.pid, signal.SIGKILL)
    assert "Traceback" not in log.read_text()
    log.unlink()
    lines = []
    unfinished: dict[str, int] = {}  # pid -> index in lines of its call that another thread's interrupted
    for line in trace.read_text(errors="replace").splitlines():
        if (resumed := _RESUMED.match(line)) is not None:  # the result of a call strace printed in two parts
            index = unfinished.pop(resumed["pid"], None)
            if index is not None:
                when, call, args = lines[index]
                lines[index] = (when, call, args + resumed["rest"])
            continue
        match = _CALL.match(line)
        if match is not None and str(root) in line:
            if line.endswith("<unfinished ...>"):
                unfinished[match["pid"]] = len(lines)
            lines.append((float(match["time"]), match["call"], match["args"]))
    return Traced(lines, (started, ended), last - first), root


def _listening(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _within(traced: Traced) -> list[tuple[str, str]]:
    """The calls from the first counted cycle on (to the daemon's stop: it opens nothing to stop)."""
    start, _end = traced.window
    return [(call, args) for when, call, args in traced.lines if start <= when]


def test_polling_opens_no_file_that_does_not_exist(tmp_path: Path) -> None:
    # the slow layer every 200 ms: AER, board/, debugfs, the bad-page threshold, xcp/xcp_metrics asked for many times
    traced, _ = _trace(tmp_path, "2xMI250X,1xMI300X,1xMI355X", "--slow-interval=200ms", "--collectors.include=*")
    assert traced.cycles >= 10
    calls = _within(traced)
    assert len(calls) > 100, "strace saw no sysfs reads: the test is not looking where the daemon reads"
    absent = [args for call, args in calls if call == "openat" and "ENOENT" in args]
    assert not absent, absent[:10]


def test_an_mi250x_gcd_reads_at_most_four_files_a_cycle_besides_gpu_metrics(tmp_path: Path) -> None:
    traced, root = _trace(tmp_path, "4xMI250X", "--slow-interval=1h")
    calls = _within(traced)
    # every file asked for: pread of a kept descriptor, or an open (one that fails with ENOENT too)
    asked = [args for call, args in calls if "O_DIRECTORY" not in args]
    files = [re.search(rf"{re.escape(str(root))}[^>\"]*", args) for args in asked]
    names = [match.group(0) for match in files if match is not None]
    # one gpu_metrics read per GCD per cycle (the fast sampler is off): each GCD's reads counted from
    # its first gpu_metrics read on, so a cycle under way when the window opened is not half counted
    devices = sorted({os.path.dirname(name) for name in names if name.endswith("/gpu_metrics")})
    started: set[str] = set()
    counted: list[str] = []
    for name in names:
        device = next((d for d in devices if name.startswith(d + "/")), "")
        if name.endswith("/gpu_metrics"):
            started.add(device)
        if device in started:
            counted.append(name)
    gcd_cycles = sum(name.endswith("/gpu_metrics") for name in counted)
    assert len(devices) == 8 and gcd_cycles >= 8 * 5, f"{gcd_cycles} gpu_metrics reads of {len(traced.lines)} calls"
    # pcie_bw is read by its own background thread every 30 s, off the poll path
    others = [name for name in counted if not name.endswith(("/gpu_metrics", "/pcie_bw"))]
    per_gcd_cycle = len(others) / gcd_cycles
    assert per_gcd_cycle <= 4, (per_gcd_cycle, sorted({os.path.basename(name) for name in others}))
    print(f"files read per MI250X GCD per hot cycle besides gpu_metrics: {per_gcd_cycle:.2f}")
