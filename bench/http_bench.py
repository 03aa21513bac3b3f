"""/metrics under load: requests per second, latency, CPU per scrape, and what each server sees."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from bench.loadgen import WrkResult, run_wrk
from bench.procstat import cpu_seconds, rss_bytes
from bench.servers import ServerProcess, http_get

IDLE_WINDOW = 3.0  # seconds of no load over which a server's background CPU rate is measured


@dataclass(frozen=True, slots=True)
class HttpRow:
    server: str
    scenario: str  # "healthy" | "one GCD hung"
    wrk: WrkResult
    cpu_per_scrape: float | None  # server CPU seconds per answered request, idle rate subtracted
    rss_after: int


def idle_cpu_rate(server: ServerProcess, window: float = IDLE_WINDOW) -> float:
    """CPU seconds per second the server burns with no requests (a poller's cycles, GC ...)."""
    before = cpu_seconds(server.pid)
    time.sleep(window)
    return (cpu_seconds(server.pid) - before) / window


# What Prometheus 2.x sends: OpenMetrics preferred, gzip accepted.
PROMETHEUS_HEADERS = (
    "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding: gzip",
)
PROMETHEUS_STYLE = "as Prometheus asks (OpenMetrics, gzip)"


def load_server(
    server: ServerProcess,
    connections: list[int],
    duration: float,
    scenario: str = "healthy",
    headers: tuple[str, ...] = (),
    idle: float | None = None,
) -> list[HttpRow]:
    """wrk runs at each connection count; `idle` is the server's idle CPU rate (measured if None)."""
    idle = idle_cpu_rate(server) if idle is None else idle
    rows = []
    for count in connections:
        before = cpu_seconds(server.pid)
        result = run_wrk(server.url, connections=count, duration=duration, headers=headers)
        used = cpu_seconds(server.pid) - before - idle * result.duration_seconds
        per_scrape = max(used, 0.0) / result.answered if result.answered else None
        rows.append(HttpRow(server.name, scenario, result, per_scrape, rss_bytes(server.pid)))
    return rows


@dataclass(frozen=True, slots=True)
class FreshScrapes:
    """Single scrapes spaced one poll interval apart: each one meets a snapshot nobody has fetched.

    That is every real Prometheus scrape (its interval is at least the poll interval), and since
    the exporter renders a snapshot on the first scrape that asks for it, each pays the render.
    """

    server: str
    scenario: str
    latencies: tuple[float, ...]
    cpu_per_scrape: float | None

    @property
    def median(self) -> float:
        return statistics.median(self.latencies)

    @property
    def slowest(self) -> float:
        return max(self.latencies)


def fresh_scrapes(
    server: ServerProcess, count: int, spacing: float, scenario: str = "healthy", headers: tuple[str, ...] = ()
) -> FreshScrapes:
    request_headers = dict(h.split(": ", 1) for h in headers)
    time.sleep(1.0)  # let requests still queued from a load run drain before measuring the idle rate
    idle = idle_cpu_rate(server)
    latencies = []
    cpu_before, started = cpu_seconds(server.pid), time.monotonic()
    for _ in range(count):
        time.sleep(spacing)
        sent = time.perf_counter()
        status, _ = http_get(server.url, timeout=30.0, headers=request_headers)
        latencies.append(time.perf_counter() - sent)
        if status != 200:
            raise RuntimeError(f"{server.name} answered HTTP {status}")
    used = cpu_seconds(server.pid) - cpu_before - idle * (time.monotonic() - started)
    return FreshScrapes(server.name, scenario, tuple(latencies), max(used, 0.0) / count)


def amdgpu_gcds(body: bytes) -> tuple[int, int]:
    """(devices up, devices known) in an amdgpu-exporter /metrics body."""
    up = known = 0
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "amdgpu_up":
            for sample in family.samples:
                known += 1
                up += sample.value == 1.0
    return up, known


def node_exporter_gcds(body: bytes) -> tuple[int, int]:
    """(cards the drm collector reports, amdgpu chips the hwmon collector reports)."""
    drm_cards: set[str] = set()
    hwmon_chips: set[str] = set()
    for family in text_string_to_metric_families(body.decode()):
        if family.name.startswith("node_drm_"):
            drm_cards.update(s.labels.get("card", "") for s in family.samples if s.labels.get("card"))
        elif family.name == "node_hwmon_chip_names":
            hwmon_chips.update(s.labels["chip"] for s in family.samples if s.labels.get("chip_name") == "amdgpu")
    return len(drm_cards), len(hwmon_chips)


def probe(url: str, timeout: float) -> tuple[str, float]:
    """One plain GET: ("HTTP 200", seconds) or ("no answer in N s", N)."""
    started = time.monotonic()
    try:
        status, _ = http_get(url, timeout=timeout)
        return f"HTTP {status}", time.monotonic() - started
    except OSError:
        return f"no answer in {timeout:.0f} s", time.monotonic() - started
