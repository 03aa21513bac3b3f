"""HTTP load with Debian's `wrk`: requests per second and latency percentiles at N connections.

wrk reports through a small Lua `done` hook (wrk_report.lua) that prints one JSON line, so the
figures are wrk's own numbers rather than a re-parse of its human-readable summary.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPORT_SCRIPT = Path(__file__).with_name("wrk_report.lua")
MARKER = "BENCH_WRK "


class LoadGenError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class WrkResult:
    connections: int
    requests: int  # responses received, whatever their status
    status_errors: int  # responses that were not 2xx/3xx (e.g. node_exporter's 503 when over its limit)
    duration_seconds: float
    bytes_read: int
    errors: int  # connect + read + write + non-2xx/3xx + timeouts
    timeouts: int
    p50_seconds: float
    p90_seconds: float
    p99_seconds: float
    max_seconds: float

    @property
    def answered(self) -> int:
        """Requests answered with a 2xx/3xx status: the ones that count as scrapes."""
        return self.requests - self.status_errors

    @property
    def requests_per_second(self) -> float:
        return self.answered / self.duration_seconds if self.duration_seconds > 0 else 0.0


def parse_wrk_report(output: str, connections: int) -> WrkResult:
    """The WrkResult in wrk's stdout (the line wrk_report.lua writes); LoadGenError if absent."""
    for line in output.splitlines():
        if line.startswith(MARKER):
            data = json.loads(line[len(MARKER) :])
            break
    else:
        raise LoadGenError(f"wrk printed no report line; its output was:\n{output.strip()[-2000:]}")
    errors = sum(data[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts"))
    return WrkResult(
        connections=connections,
        requests=int(data["requests"]),
        status_errors=int(data["status_errors"]),
        duration_seconds=data["duration_us"] / 1e6,
        bytes_read=int(data["bytes"]),
        errors=int(errors),
        timeouts=int(data["timeouts"]),
        p50_seconds=data["p50_us"] / 1e6,
        p90_seconds=data["p90_us"] / 1e6,
        p99_seconds=data["p99_us"] / 1e6,
        max_seconds=data["max_us"] / 1e6,
    )


def wrk_binary() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise LoadGenError("wrk is not installed (Debian package `wrk`; `make bench` installs it)")
    return path


def run_wrk(
    url: str,
    *,
    connections: int,
    duration: float,
    threads: int = 2,
    timeout: float = 10.0,
    headers: tuple[str, ...] = (),
) -> WrkResult:
    """One wrk run against url. wrk needs at least one connection per thread."""
    threads = max(1, min(threads, connections))
    argv = [
        wrk_binary(),
        f"--threads={threads}",
        f"--connections={connections}",
        f"--duration={max(1, round(duration))}s",
        f"--timeout={max(1, round(timeout))}s",
        f"--script={REPORT_SCRIPT}",
    ]
    for header in headers:
        argv += ["--header", header]
    argv.append(url)
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=duration + timeout + 30, check=False)
    if completed.returncode != 0:
        raise LoadGenError(f"wrk exited {completed.returncode}: {completed.stderr.strip() or completed.stdout.strip()}")
    return parse_wrk_report(completed.stdout, connections)
