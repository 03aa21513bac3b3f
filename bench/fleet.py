"""Fleet benchmark: what one Prometheus pays for N nodes of amdgpu-exporter.

    python -m bench.fleet [--nodes 100,300,600,1000] [--fleets 'MIXED'] [--warmup 240] [--label before]
                          [--rules-dir DIR] [--rule-files a.rules.yml,b.rules.yml]
                          [--go-gc GOGC] [--go-memory-limit GOMEMLIMIT]
                          [--output bench/RESULTS-fleet.md] [--json FILE] [--before FILE]
    python -m bench.fleet sizes 'FLEET;FLEET...' [DAEMON FLAG ...]   (one node's series and bytes)

A real Prometheus (Debian's /usr/bin/prometheus) scrapes N virtual nodes every 15 s and evaluates
the shipped rule files (amdgpu-exporter and amdgpu-health by default; --rule-files adds
dme-compat; --rules-dir measures another revision's) at their groups' intervals. The nodes are served by one
child process (`python -m bench.fleet serve`) from /metrics bodies captured from the real daemon
on demo fleets (`amdgpu-exporter --demo --demo.fleet=...`), their values moved on every scrape:
counters advance at the rate seen between two captures, timestamps follow the clock, gauges are
jittered by up to 2 % (integers stay integers, ratios stay in 0..1, 0/1 states and _info stay).

Per N, after the warm-up: head series (/api/v1/status/tsdb), Prometheus RSS and CPU, each rule
group's evaluation time (prometheus_rule_group_last_duration_seconds, mean and max over the last
warm-up minutes, Prometheus scraping itself), missed iterations
(prometheus_rule_group_iterations_missed_total). Then scraping and rules are stopped by a reload
(the head keeps its data), Prometheus is left to write the staleness markers of every series until
its CPU is idle, and, on that otherwise idle ("quiet") Prometheus, every rule's
expression is run once as an instant query with `stats=all`: its wall and CPU time and the
samples it reads (totalQueryableSamples), a count that does not depend on the machine's load;
a group's quiet cost is the sum over its rules. Last, every query of grafana/dashboards/*.json
over the dashboard's default range the way Grafana sends it (range queries at the step Grafana
picks for ~1,000 points, instant queries for instant targets; variables substituted: All where a
variable allows it, else its first value), with the same stats. Costs are fitted on a log-log
line and extrapolated to 1,000 and 10,000 nodes. The warm-up is shorter than most windows and
ranges (--warmup): they see that much data, which the report states. --go-gc and --go-memory-limit
run Prometheus (Go) with GOGC and GOMEMLIMIT set: the collector's trade of CPU for resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import report as fmt
from bench.procstat import cpu_seconds, file_rss_bytes, peak_rss_bytes, rss_bytes

ROOT = Path(__file__).resolve().parents[1]
RESULTS_FILE = Path(__file__).with_name("RESULTS-fleet.md")
EXPORTER = ROOT / ".venv" / "bin" / "amdgpu-exporter"
RULES_DIR = ROOT / "deploy" / "prometheus"
DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
SCRAPE_INTERVAL = 15  # seconds, scrape and evaluation, and the dashboards' datasource timeInterval
QUERY_RANGE = 300  # seconds: a dashboard's range when it names none
MIXED_FLEET = "8xMI300X;4xMI250X;8xMI300X;8xMI300X:CPX"  # half 8 x MI300X, a quarter each 4 x MI250X, CPX
DEFAULT_RULE_FILES = "amdgpu-exporter.rules.yml,amdgpu-health.rules.yml"
CAPTURE_GAP = 5.0  # seconds between the two captured bodies that give the counters' rates
JITTER = 0.02
JOB = "amdgpu-exporter"  # the job name the shipped rules expect
EXTRAPOLATE_TO = (1_000, 10_000)
# The goals, at the fitted 1,000 nodes.
GOAL_GROUP_SHARE = 0.10  # of the evaluation interval, per rule group
GOAL_FLEET_PANEL = 0.5  # seconds, the slowest fleet-dashboard query
GOAL_RSS = 4 * 2**30  # bytes, Prometheus at 1,000 nodes
GOAL_EXPONENT = 1.1  # quiet rule cost against N


# ---------------------------------------------------------------------------------------------
# Virtual nodes: captured bodies, values moved per scrape
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    """One sample line of a captured body: the text before the value, and how the value moves."""

    prefix: str  # 'name{labels} '
    value: float
    rate: float  # per second, counters only
    kind: str  # counter | timestamp | fixed | integer | ratio | float


def _sample_kinds(body: str) -> dict[str, str]:
    types: dict[str, str] = {}
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
    return types


def _family(name: str, types: dict[str, str]) -> tuple[str, str]:
    if name in types:
        return name, types[name]
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)], types[name[: -len(suffix)]]
    return name, "untyped"


def _samples(body: str) -> Iterator[tuple[str, float]]:
    for line in body.splitlines():
        if line and not line.startswith("#"):
            prefix, _, value = line.rpartition(" ")
            yield prefix, float(value)


def parse_capture(first: str, second: str, gap: float) -> tuple[list[str], list[Line]]:
    """Header lines (# HELP / # TYPE, kept in place as None-valued entries) and the sample lines."""
    types = _sample_kinds(second)
    before = dict(_samples(first))
    lines: list[Line] = []
    for prefix, value in _samples(second):
        name = prefix.split("{", 1)[0]
        _, kind = _family(name, types)
        rate = 0.0
        if kind in ("counter", "histogram", "summary"):
            move = "counter"
            rate = max(0.0, (value - before.get(prefix, value)) / gap)
        elif name.endswith("_timestamp_seconds") or (name.endswith("_seconds") and value > 1e9):
            move = "timestamp"
        elif name.endswith("_info") or value in (0.0, 1.0) or not math.isfinite(value):
            move = "fixed"
        elif name.endswith("_ratio"):
            move = "ratio"
        elif value.is_integer():
            move = "integer"
        else:
            move = "float"
        lines.append(Line(prefix + " ", value, rate, move))
    headers = [line for line in second.splitlines() if line.startswith("#")]
    return headers, lines


def render(headers: Sequence[str], lines: Sequence[Line], elapsed: float, rng: random.Random) -> bytes:
    """One scrape's body: every value moved to `elapsed` seconds after the capture."""
    out = list(headers)
    uniform = rng.uniform
    for line in lines:
        kind, value = line.kind, line.value
        if kind == "counter":
            value += line.rate * elapsed
        elif kind == "timestamp":
            value += elapsed
        elif kind == "ratio":
            value = min(1.0, max(0.0, value + uniform(-JITTER, JITTER)))
        elif kind == "integer":
            value = float(round(value * (1 + uniform(-JITTER, JITTER))))
        elif kind == "float":
            value *= 1 + uniform(-JITTER, JITTER)
        out.append(f"{line.prefix}{value!r}")
    out.append("")
    return "\n".join(out).encode()


def capture(fleet: str, work: Path, extra: Sequence[str] = ()) -> dict[str, Any]:
    """Two /metrics bodies of the real demo daemon, CAPTURE_GAP apart, and when they were taken."""
    port = _free_port()
    log = work / f"capture-{_slug(fleet)}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(EXPORTER), "--demo", f"--demo.fleet={fleet}", f"--web.listen-address=127.0.0.1:{port}", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 60, f"demo daemon {fleet}")
        time.sleep(3 * SCRAPE_INTERVAL / 15)  # a few poll cycles: the windows filled, counters moving
        headers = {"Accept": "text/plain; version=0.0.4"}
        first = httpx.get(f"{base}/metrics", headers=headers, timeout=10).text
        started = time.time()
        time.sleep(CAPTURE_GAP)
        second = httpx.get(f"{base}/metrics", headers=headers, timeout=10).text
        return {"fleet": fleet, "first": first, "second": second, "gap": time.time() - started, "at": time.time()}
    finally:
        _stop(process)


async def serve(captures: list[dict[str, Any]], nodes: int, port: int) -> None:
    """Node i at /node/<i>/metrics, from captures[i % len(captures)], until killed."""
    parsed = [parse_capture(c["first"], c["second"], c["gap"]) for c in captures]
    stamps = [c["at"] for c in captures]
    rngs = [random.Random(i) for i in range(nodes)]
    path = re.compile(rb"GET /node/(\d+)/metrics")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = path.match(head)
                node = int(match.group(1)) if match else -1
                if 0 <= node < nodes:
                    k = node % len(parsed)
                    headers, lines = parsed[k]
                    body = render(headers, lines, time.time() - stamps[k], rngs[node])
                    status = b"200 OK"
                else:
                    body, status = b"no such node\n", b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 %s\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n"
                    % (status, len(body))
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------------------------------------
# Dashboards: every query, as Grafana would send it for the last 5 minutes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    dashboard: str
    where: str  # panel title and refId
    expr: str  # with variables
    instant: bool
    step: int
    range: int  # seconds: the dashboard's default time range


_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")
_DURATION = re.compile(r"((?:\d+[smhd])+)")
_DURATION_PART = re.compile(r"(\d+)([smhd])")


def _seconds(text: str) -> int:
    """A Prometheus duration ('15s', '1m', '2m30s', '1h'; '>15s' as Grafana writes a minimum) in seconds."""
    match = _DURATION.fullmatch(text.strip().lstrip(">"))
    if not match:
        return SCRAPE_INTERVAL
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in _DURATION_PART.findall(match.group(1)))


def dashboard_range(dashboard: dict[str, Any]) -> int:
    """The dashboard's default range in seconds (time.from 'now-6h' -> 21600)."""
    start = str(dashboard.get("time", {}).get("from", ""))
    return _seconds(start.removeprefix("now-")) if start.startswith("now-") else QUERY_RANGE


def dashboard_queries(dashboard_dir: Path) -> list[Query]:
    found: list[Query] = []
    for path in sorted(dashboard_dir.glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        span = dashboard_range(dashboard)
        stack = list(dashboard["panels"])
        while stack:
            panel = stack.pop(0)
            stack[0:0] = panel.get("panels", [])
            # Grafana's step: the panel's min interval, else the datasource's (the scrape interval),
            # unless the range over the panel's width (~1,000 points) is longer.
            step = max(_seconds(panel.get("interval") or f"{SCRAPE_INTERVAL}s"), math.ceil(span / 1000), 1)
            for target in panel.get("targets", []):
                if target.get("expr"):
                    instant = bool(target.get("instant")) and not target.get("range")
                    where = f"{panel['title']} {target['refId']}"
                    found.append(Query(path.stem, where, target["expr"], instant, step, span))
        for annotation in dashboard.get("annotations", {}).get("list", []):
            if annotation.get("expr"):
                found.append(Query(path.stem, f"annotation {annotation['name']}", annotation["expr"], False, 60, span))
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(replace, expr)


def dashboard_values(dashboard_dir: Path, client: httpx.Client) -> dict[str, dict[str, str]]:
    """Per dashboard: its variables' values (All where allowed, else the first option)."""
    result: dict[str, dict[str, str]] = {}
    for path in sorted(dashboard_dir.glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        span = dashboard_range(dashboard)
        values = {"__range": f"{span}s", "__range_s": str(span), "__range_ms": str(span * 1000)}
        for variable in dashboard["templating"]["list"]:
            kind, name = variable["type"], variable["name"]
            if kind in ("textbox", "constant", "custom"):
                values[name] = str(variable.get("query", ""))
            elif kind == "interval":
                values[name] = str(variable.get("query", "")).split(",")[0]
            elif kind == "query":
                if variable.get("includeAll"):
                    values[name] = variable.get("allValue") or ".*"
                    continue
                query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
                values[name] = _first_label_value(client, substitute(query, values))
        result[path.stem] = values
    return result


def _first_label_value(client: httpx.Client, query: str) -> str:
    match = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", query.strip())
    if not match:
        return ""
    selector, label = match.group(1), match.group(2)
    if selector:
        body = client.get("/api/v1/series", params={"match[]": selector}).json()
        options = sorted({s[label] for s in body.get("data", []) if label in s})
    else:
        options = sorted(client.get(f"/api/v1/label/{label}/values").json().get("data", []))
    return options[0] if options else ""


def time_query(
    client: httpx.Client, query: Query, values: dict[str, str], now: float, repeats: int, pid: int
) -> dict[str, Any]:
    step_values = dict(values)
    step_values |= {
        "__interval": f"{query.step}s",
        "__interval_ms": str(query.step * 1000),
        "__rate_interval": f"{max(query.step + SCRAPE_INTERVAL, 4 * SCRAPE_INTERVAL)}s",
    }
    promql = substitute(query.expr, step_values)
    if query.instant:
        params = {"query": promql, "time": f"{now:.3f}"}
    else:
        params = {"query": promql, "start": f"{now - query.range:.3f}", "end": f"{now:.3f}", "step": str(query.step)}
    measured = measure_query(client, params, repeats, pid)
    return {
        "dashboard": query.dashboard,
        "where": query.where,
        **measured,
        "promql": promql,
        "instant": query.instant,
        "range": query.range,
    }


def measure_query(client: httpx.Client, params: dict[str, str], repeats: int, pid: int) -> dict[str, Any]:
    """Best wall and CPU time of `repeats` runs, and the samples the query read (its stats)."""
    url = "/api/v1/query_range" if "step" in params else "/api/v1/query"
    best, best_cpu, error, series, samples, peak = math.inf, math.inf, "", 0, 0, 0
    for _ in range(repeats):
        cpu_started = cpu_seconds(pid)
        started = time.perf_counter()
        response = client.post(url, data={**params, "stats": "all"})
        elapsed = time.perf_counter() - started
        body = response.json()
        if body.get("status") != "success":
            error = f"{body.get('errorType')}: {body.get('error')}"[:160]
        else:
            result = body["data"]["result"]
            series = len(result) if isinstance(result, list) else 1
            stats = body["data"].get("stats", {}).get("samples", {})
            samples = int(stats.get("totalQueryableSamples", 0))
            peak = int(stats.get("peakSamples", 0))
        best = min(best, elapsed)
        best_cpu = min(best_cpu, cpu_seconds(pid) - cpu_started)
    return {"seconds": best, "cpu": best_cpu, "series": series, "samples": samples, "peak": peak, "error": error}


def rule_costs(
    client: httpx.Client, rule_files: Sequence[Path], now: float, pid: int, repeats: int = 1
) -> dict[str, dict[str, Any]]:
    """Per rule group: each rule's expression run once as an instant query at `now` (quiet cost)."""
    groups: dict[str, dict[str, Any]] = {}
    for path in rule_files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            rules = []
            for rule in group["rules"]:
                measured = measure_query(client, {"query": rule["expr"], "time": f"{now:.3f}"}, repeats, pid)
                rules.append({"name": rule.get("record") or rule.get("alert"), **measured})
            groups[group["name"]] = {
                "file": path.name,
                "interval": _seconds(group.get("interval", f"{SCRAPE_INTERVAL}s")),
                "rules": rules,
                "seconds": sum(r["seconds"] for r in rules),
                "cpu": sum(r["cpu"] for r in rules),
                "samples": sum(r["samples"] for r in rules),
            }
    return groups


# ---------------------------------------------------------------------------------------------
# One run: N nodes
# ---------------------------------------------------------------------------------------------


def prometheus_config(nodes: int, server_port: int, rule_files: list[str], self_port: int) -> dict[str, Any]:
    targets = [
        {
            "targets": [f"127.0.0.1:{server_port}"],
            "labels": {
                "instance": f"node-{i:05d}:9442",
                "node": f"node-{i:05d}",
                "__metrics_path__": f"/node/{i}/metrics",
            },
        }
        for i in range(nodes)
    ]
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL}s", "evaluation_interval": f"{SCRAPE_INTERVAL}s"},
        "rule_files": rule_files,
        "scrape_configs": [
            {"job_name": JOB, "scrape_timeout": "10s", "static_configs": targets},
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self_port}"]}]},
        ],
    }


def run_nodes(
    nodes: int,
    captures_file: Path,
    work: Path,
    warmup: float,
    repeats: int,
    rule_paths: Sequence[Path],
    dashboard_dir: Path = DASHBOARD_DIR,
    go_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    run_dir = work / f"n{nodes}"
    run_dir.mkdir()
    server_port, prom_port = _free_port(), _free_port()
    rule_files = [str(p) for p in rule_paths]
    (run_dir / "prometheus.yml").write_text(
        yaml.safe_dump(prometheus_config(nodes, server_port, rule_files, prom_port))
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.fleet", "serve", str(captures_file), str(nodes), str(server_port)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    log = (run_dir / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={run_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={run_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(go_env or {})},
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{prom_port}", timeout=300)
    try:
        started = time.time()
        _wait(lambda: client.get("/-/ready").status_code == 200, 60, "prometheus /-/ready")

        def all_up() -> bool:
            # 99 %: on a loaded machine a scrape of the last few may time out once
            result = _instant(client, f'count(up{{job="{JOB}"}} == 1)')
            return bool(result) and int(float(result[0]["value"][1])) >= 0.99 * nodes

        _wait(all_up, 3 * SCRAPE_INTERVAL + 60 + 0.3 * nodes, f"{nodes} targets up")
        cpu_from, cpu_at = cpu_seconds(prometheus.pid), time.time()
        loads = [fmt.load_average()]
        while time.time() - started < warmup:
            time.sleep(min(30.0, warmup - (time.time() - started)) + 0.01)
            loads.append(fmt.load_average())
            print(f"  {nodes} nodes: {time.time() - started:.0f}/{warmup:.0f} s, load {loads[-1]}", flush=True)
        cpu = (cpu_seconds(prometheus.pid) - cpu_from) / (time.time() - cpu_at)
        server_cpu = cpu_seconds(server.pid)
        rss = rss_bytes(prometheus.pid)
        rss_peak = peak_rss_bytes(prometheus.pid)
        rss_file = file_rss_bytes(prometheus.pid)
        heap = {
            series["metric"]["__name__"]: float(series["value"][1])
            for series in _instant(client, '{__name__=~"go_memstats_(heap_inuse|next_gc)_bytes", job="prometheus"}')
        }
        tsdb = client.get("/api/v1/status/tsdb").json()["data"]["headStats"]
        window = f"{int(min(warmup - 2 * SCRAPE_INTERVAL, 180))}s"
        groups: dict[str, dict[str, float]] = {}
        for series in _instant(client, f"avg_over_time(prometheus_rule_group_last_duration_seconds[{window}])"):
            groups.setdefault(_group(series["metric"]), {})["mean"] = float(series["value"][1])
        for series in _instant(client, f"max_over_time(prometheus_rule_group_last_duration_seconds[{window}])"):
            groups.setdefault(_group(series["metric"]), {})["max"] = float(series["value"][1])
        for series in _instant(client, "prometheus_rule_group_iterations_missed_total"):
            groups.setdefault(_group(series["metric"]), {})["missed"] = float(series["value"][1])
        for series in _instant(client, "prometheus_rule_group_iterations_total"):
            groups.setdefault(_group(series["metric"]), {})["iterations"] = float(series["value"][1])
        for series in _instant(client, "prometheus_rule_group_interval_seconds"):
            groups.setdefault(_group(series["metric"]), {})["interval"] = float(series["value"][1])
        values = dashboard_values(dashboard_dir, client)
        # The queries run on a Prometheus that does nothing else: scraping and rules stopped by a
        # reload (the head keeps the data), so a query's CPU is its own and the wall time carries
        # only the machine's other load. The range ends before the reload's staleness markers.
        now = time.time() - 1
        quiet = prometheus_config(0, server_port, [], prom_port)
        quiet["scrape_configs"] = []
        (run_dir / "prometheus.yml").write_text(yaml.safe_dump(quiet))
        client.post("/-/reload").raise_for_status()
        settle_seconds = wait_idle(prometheus.pid)
        quiet_groups = rule_costs(client, rule_paths, now, prometheus.pid, repeats)
        rss_quiet = rss_bytes(prometheus.pid)
        timings = [
            time_query(client, q, values[q.dashboard], now, repeats, prometheus.pid)
            for q in dashboard_queries(dashboard_dir)
        ]
        loads.append(fmt.load_average())
        return {
            "nodes": nodes,
            "head_series": int(tsdb["numSeries"]),
            "chunks": int(tsdb.get("chunkCount", 0)),
            "rss": rss,
            "rss_peak": rss_peak,  # VmHWM over the warm-up: what a memory limit must allow
            "rss_file": rss_file,  # mmapped files in the RSS, outside Go's heap and GOMEMLIMIT
            "go_heap_inuse": heap.get("go_memstats_heap_inuse_bytes"),
            "go_next_gc": heap.get("go_memstats_next_gc_bytes"),
            "gc_seconds": _gc_seconds(client),
            "cpu_cores": cpu,
            "server_cpu_seconds": server_cpu,
            "groups": groups,
            "quiet_groups": quiet_groups,
            "rss_after_queries": max(rss_quiet, rss_bytes(prometheus.pid)),
            "queries": timings,
            "loads": loads,
            "go_env": go_env or {},
            "settle_seconds": settle_seconds,  # after the reload, until Prometheus's CPU went quiet
            "data_seconds": now - started,  # scraped data before the reload stopped scraping
            "data_until_reload": True,
            "variables": {k: {n: v for n, v in d.items() if not n.startswith("__")} for k, d in values.items()},
        }
    finally:
        client.close()
        _stop(prometheus)
        _stop(server)
        log.close()
        shutil.rmtree(run_dir / "data", ignore_errors=True)


IDLE_CPU = 0.05  # of a core: Prometheus counts as idle below this
IDLE_FOR = 3  # seconds in a row
IDLE_TIMEOUT = 180.0


def wait_idle(pid: int) -> float:
    """Seconds until Prometheus, its scraping and rules stopped by the reload, goes idle: stopping a
    target writes a staleness marker to each of its series (1.2 M at 1,000 nodes), seconds of CPU
    that the first quiet queries would otherwise be charged with."""
    started = time.monotonic()
    quiet = 0
    while quiet < IDLE_FOR and time.monotonic() - started < IDLE_TIMEOUT:
        before = cpu_seconds(pid)
        time.sleep(1.0)
        quiet = quiet + 1 if cpu_seconds(pid) - before < IDLE_CPU else 0
    return time.monotonic() - started


def _gc_seconds(client: httpx.Client) -> float | None:
    """Prometheus's own time in GC stop-the-world pauses so far (go_gc_duration_seconds_sum)."""
    result = _instant(client, 'go_gc_duration_seconds_sum{job="prometheus"}')
    return float(result[0]["value"][1]) if result else None


def _group(labels: dict[str, str]) -> str:
    return labels.get("rule_group", "?").rsplit(";", 1)[-1]


def _instant(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    body = client.post("/api/v1/query", data={"query": expr}).json()
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body.get('error')}")
    return list(body["data"]["result"])


# ---------------------------------------------------------------------------------------------
# Fit and report
# ---------------------------------------------------------------------------------------------


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """log y = a + b log x by least squares: (a, b); None with fewer than two positive points."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(points) < 2:
        return None
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return None
    b = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return my - b * mx, b


def at(line: tuple[float, float] | None, x: float) -> float | None:
    return None if line is None else math.exp(line[0] + line[1] * math.log(x))


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


def _count(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    groups = run["groups"]
    mean = {name: g.get("mean", 0.0) for name, g in groups.items()}
    slowest = max(mean, key=lambda k: mean[k]) if mean else "n/a"
    by_dashboard: dict[str, list[dict[str, Any]]] = {}
    for q in run["queries"]:
        by_dashboard.setdefault(q["dashboard"], []).append(q)
    worst = {d: max(qs, key=lambda q: q["seconds"]) for d, qs in by_dashboard.items()}
    worst_cpu = {d: max(qs, key=lambda q: q.get("cpu", 0.0)) for d, qs in by_dashboard.items()}
    return {
        "slowest_group": slowest,
        "slowest_group_seconds": mean.get(slowest, 0.0),
        "all_groups_seconds": sum(mean.values()),
        "missed": sum(g.get("missed", 0.0) for g in groups.values()),
        "worst": worst,
        "worst_cpu": worst_cpu,
        "total": {d: sum(q["seconds"] for q in qs) for d, qs in by_dashboard.items()},
        "errors": sum(1 for q in run["queries"] if q["error"]),
        "quiet_seconds": sum(g["seconds"] for g in run.get("quiet_groups", {}).values()),
        "quiet_samples": sum(g["samples"] for g in run.get("quiet_groups", {}).values()),
        # samples read per second of evaluation: each group's samples times its evaluations a second
        "quiet_samples_per_second": sum(
            g["samples"] / g["interval"] for g in run.get("quiet_groups", {}).values() if g["interval"]
        ),
        "quiet_cpu_share": {
            name: g["cpu"] / g["interval"] for name, g in run.get("quiet_groups", {}).items() if g["interval"]
        },
        "quiet_cpu_per_second": sum(
            g["cpu"] / g["interval"] for g in run.get("quiet_groups", {}).values() if g["interval"]
        ),
        "quiet_share": {
            name: g["seconds"] / g["interval"] for name, g in run.get("quiet_groups", {}).items() if g["interval"]
        },
    }


def build_report(result: dict[str, Any], before: dict[str, Any] | None) -> str:
    runs = result["runs"]
    sums = [summarise(r) for r in runs]
    ns = [r["nodes"] for r in runs]
    dashboards = sorted({q["dashboard"] for r in runs for q in r["queries"]})
    out = [
        f"## {result['label']}",
        "",
        f"`{result['command']}`; {result['when']} UTC; Prometheus {result['prometheus']}; "
        f"{result['machine']}; load average (1, 5, 15 min) at start {result['load_start']}, at end "
        f"{result['load_end']} (2 shared vCPUs, other helpers running: CPU-bound figures are inflated by "
        "their load).",
        "",
        f"Virtual nodes: {', '.join(result['fleets'])} (the daemon's demo), "
        + "; ".join(f"{c['fleet']}: {c['series']} series, {c['bytes'] / 1e3:.1f} kB a body" for c in result["captures"])
        + f". Scrape and evaluation every {SCRAPE_INTERVAL} s; rule files: {', '.join(result['rule_files'])}; "
        f"{result['warmup']:.0f} s of data before measuring (queries over the last {QUERY_RANGE} s see that much); "
        f"Prometheus's Go collector: {go_settings(result.get('go_env') or {})}; "
        f"query latency = best of {result['repeats']} (wall, over HTTP, and Prometheus's CPU time "
        "during it), run after a reload that stops scraping and rules.",
        "",
    ]
    headers = ["N nodes", "head series", "a node", "Prometheus RSS", "a node", "CPU (cores)", "slowest rule group"]
    headers += ["all groups per cycle", "missed iterations", "quiet cost, all groups (samples)"]
    for d in dashboards:
        headers += [f"slowest {d} query (wall)", f"most CPU {d} query", f"{d} all queries (wall)"]
    headers += ["load (1 min) during"]
    rows = []
    for r, s in zip(runs, sums, strict=True):
        row = [
            str(r["nodes"]),
            _count(r["head_series"]),
            f"{r['head_series'] / r['nodes']:.0f}",
            _gib(r["rss"]) + (f" (peak {_gib(r['rss_peak'])})" if r.get("rss_peak") else ""),
            f"{r['rss'] / r['nodes'] / 2**20:.1f} MiB",
            f"{r['cpu_cores']:.2f}",
            f"{fmt.seconds(s['slowest_group_seconds'])} ({s['slowest_group']})",
            fmt.seconds(s["all_groups_seconds"]),
            f"{s['missed']:.0f}",
            f"{fmt.seconds(s['quiet_seconds'])} ({_count(s['quiet_samples'])})",
        ]
        for d in dashboards:
            worst = s["worst"].get(d)
            row += [f"{fmt.seconds(worst['seconds'])} ({worst['where']})" if worst else "n/a"]
            most = s["worst_cpu"].get(d)
            row += [f"{fmt.seconds(most.get('cpu'))} ({most['where']})" if most else "n/a"]
            row += [fmt.seconds(s["total"].get(d))]
        loads = [float(x.split(",")[0]) for x in r["loads"]]
        row.append(f"{min(loads):.1f}-{max(loads):.1f}")
        rows.append(row)
    out += [fmt.markdown_table(headers, rows), ""]
    errors = [q for r in runs for q in r["queries"] if q["error"]]
    if errors:
        out += [
            f"Queries that failed: {len(errors)}: "
            + "; ".join(f"{q['where']} at {q['dashboard']}: {q['error']}" for q in errors[:5]),
            "",
        ]

    # fits
    series: dict[str, list[float]] = {
        "head series": [r["head_series"] for r in runs],
        "Prometheus RSS (bytes)": [r["rss"] for r in runs],
        "Prometheus CPU (cores)": [r["cpu_cores"] for r in runs],
        "all rule groups per cycle (s)": [s["all_groups_seconds"] for s in sums],
    }
    group_names = sorted({g for r in runs for g in r["groups"]})
    for g in group_names:
        series[f"rule group {g} (s)"] = [r["groups"].get(g, {}).get("mean", 0.0) for r in runs]
    for d in dashboards:
        series[f"slowest {d} query (s)"] = [s["worst"][d]["seconds"] if d in s["worst"] else 0.0 for s in sums]
        series[f"most CPU {d} query (CPU s)"] = [
            s["worst_cpu"][d].get("cpu", 0.0) if d in s["worst_cpu"] else 0.0 for s in sums
        ]
        series[f"{d}: all queries (s)"] = [s["total"].get(d, 0.0) for s in sums]
    fits = {name: fit(ns, ys) for name, ys in series.items()}
    rows = []
    for name, line in fits.items():
        cells = [name, "n/a" if line is None else f"{line[1]:.2f}"]
        for x in EXTRAPOLATE_TO:
            value = at(line, x)
            if "bytes" in name:
                cells.append(_gib(value))
            elif name == "head series":
                cells.append(_count(value))
            elif "cores" in name:
                cells.append("n/a" if value is None else f"{value:.2f}")
            else:
                cells.append(fmt.seconds(value))
        rows.append(cells)
    out += [
        f"Fit: log-log least squares over N = {', '.join(map(str, ns))}; exponent 1 = linear.",
        "",
        fmt.markdown_table(["figure", "exponent", "at 1,000 nodes", "at 10,000 nodes"], rows),
        "",
    ]
    out += quiet_report(runs, sums)
    # goals (issue 34), at the largest N measured
    largest, largest_sum = runs[-1], sums[-1]
    over = {g: v for g, v in largest_sum["quiet_cpu_share"].items() if v > GOAL_GROUP_SHARE}
    fleet_name = next((d for d in dashboards if "fleet" in d), None)
    fleet_worst = largest_sum["worst"].get(fleet_name) if fleet_name else None
    quiet_fit = fit(ns, [s["quiet_cpu_per_second"] for s in sums])
    samples_fit = fit(ns, [s["quiet_samples_per_second"] for s in sums])
    mid = next((r for r in runs if r["nodes"] == 600), None)
    goals = [
        f"Goals (issue 34), at N = {largest['nodes']}:",
        "",
        f"- every rule group's quiet cost within {GOAL_GROUP_SHARE:.0%} of its interval: "
        + ("met" if not over else "NOT met: " + ", ".join(f"{g} {v:.0%}" for g, v in sorted(over.items())))
        + f" (largest share of CPU {max(largest_sum['quiet_cpu_share'].values(), default=0):.1%}; of wall "
        f"{max(largest_sum['quiet_share'].values(), default=0):.1%});",
        "- no missed iteration under live load at 600 nodes: "
        + ("not measured" if mid is None else f"{summarise(mid)['missed']:.0f} missed")
        + ";",
        f"- every fleet-dashboard query under {GOAL_FLEET_PANEL * 1000:.0f} ms at its default range: slowest "
        + (f"{fmt.seconds(fleet_worst['seconds'])} ({fleet_worst['where']})" if fleet_worst else "n/a")
        + " wall on the loaded machine;",
        f"- Prometheus RSS at most {GOAL_RSS / 2**30:.0f} GiB: {_gib(largest['rss'])};",
        f"- quiet rule cost exponent at most {GOAL_EXPONENT}: CPU a second "
        + ("n/a" if quiet_fit is None else f"{quiet_fit[1]:.2f}")
        + ", samples read a second "
        + ("n/a" if samples_fit is None else f"{samples_fit[1]:.2f}")
        + ".",
    ]
    out += [*goals, ""]

    # rule groups per N
    headers = ["rule group", *[f"N={n} mean (max)" for n in ns], "missed (largest N)"]
    rows = []
    for g in group_names:
        cells = [g]
        for r in runs:
            stats = r["groups"].get(g, {})
            cells.append(f"{fmt.seconds(stats.get('mean'))} ({fmt.seconds(stats.get('max'))})")
        cells.append(f"{runs[-1]['groups'].get(g, {}).get('missed', 0):.0f}")
        rows.append(cells)
    out += ["Rule groups: evaluation time per cycle.", "", fmt.markdown_table(headers, rows), ""]

    # every query (queries come in the same order in every run: keyed by position)
    for d in dashboards:
        per_run = [[q for q in r["queries"] if q["dashboard"] == d] for r in runs]
        order = sorted(range(len(per_run[-1])), key=lambda i: -per_run[-1][i]["seconds"])
        rows = []
        for i in order:
            cells = [per_run[-1][i]["where"].replace("|", "/")]
            for pr in per_run:
                q = pr[i] if i < len(pr) else None
                if q is None:
                    cells.append("n/a")
                else:
                    cells.append(
                        "error"
                        if q["error"]
                        else f"{fmt.seconds(q['seconds'])} / {fmt.seconds(q.get('cpu'))} / "
                        f"{_count(q.get('samples', 0))}"
                    )
            cells.append(_count(full_range_samples(per_run[-1][i], data_span(runs[-1]))))
            rows.append(cells)
        variables = ", ".join(f"{k}={v!r}" for k, v in runs[-1]["variables"].get(d, {}).items() if k != "datasource")
        out += [
            f"Every {d} query, wall / Prometheus CPU / samples read (slowest first at the largest N; variables: "
            f"{variables or 'none'}). The last column scales the samples of a query over the range (a range "
            f"query, or a window of $__range) from the {data_span(runs[-1]):.0f} s of data to the "
            "dashboard's whole default range: an estimate of what it reads with its range full of data.",
            "",
            fmt.markdown_table(["panel query", *[f"N={n}" for n in ns], f"N={ns[-1]}, full range (est.)"], rows),
            "",
        ]
    return "\n".join(out)


def go_settings(env: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "Go's defaults (GOGC=100, no GOMEMLIMIT)"


def data_span(run: dict[str, Any]) -> float:
    """Seconds of scraped data. Runs saved before the field meant that measured to the end of the
    queries: their quiet queries' time is taken off."""
    if run.get("data_until_reload"):
        return float(run["data_seconds"])
    quiet = sum(r["seconds"] for g in run.get("quiet_groups", {}).values() for r in g["rules"])
    return float(run["data_seconds"]) - quiet - sum(q["seconds"] for q in run["queries"]) - 2


def full_range_samples(query: dict[str, Any], data_seconds: float) -> float | None:
    """The samples a query over the dashboard's range would read with the range full of data."""
    if "range" not in query:
        return None
    over_range = not query.get("instant") or f"[{query['range']}s" in query.get("promql", "")
    return float(query.get("samples", 0)) * (max(1.0, query["range"] / data_seconds) if over_range else 1.0)


def quiet_report(runs: Sequence[dict[str, Any]], sums: Sequence[dict[str, Any]]) -> list[str]:
    """Each group's quiet cost per N, and every rule's samples at the largest N."""
    if not any(r.get("quiet_groups") for r in runs):
        return []
    ns = [r["nodes"] for r in runs]
    names = list(dict.fromkeys(g for r in runs for g in r.get("quiet_groups", {})))
    headers = ["rule group", "interval", *[f"N={n}: samples / a node / wall / CPU (CPU share)" for n in ns]]
    headers.append("exponent (CPU)")
    rows = []
    for name in names:
        cells = [name, f"{runs[-1]['quiet_groups'].get(name, {}).get('interval', SCRAPE_INTERVAL)} s"]
        cpus = []
        for r in runs:
            g = r.get("quiet_groups", {}).get(name)
            if g is None:
                cells.append("n/a")
                cpus.append(0.0)
                continue
            cpus.append(g["cpu"])
            cells.append(
                f"{_count(g['samples'])} / {g['samples'] / r['nodes']:.0f} / {fmt.seconds(g['seconds'])} / "
                f"{fmt.seconds(g['cpu'])} ({g['cpu'] / g['interval']:.1%})"
            )
        line = fit(ns, [max(c, 1e-3) for c in cpus])
        cells.append("n/a" if line is None else f"{line[1]:.2f}")
        rows.append(cells)
    cpu_rate = [
        sum(g["cpu"] / g["interval"] for g in r.get("quiet_groups", {}).values() if g["interval"]) for r in runs
    ]
    cpu_line = fit(ns, cpu_rate)
    cpu_cells = [f"{c:.3f} / {c / r['nodes'] * 1000:.2f} per 1,000 nodes" for c, r in zip(cpu_rate, runs, strict=True)]
    rows.append(
        ["all groups, CPU a second (cores)", "", *cpu_cells, "n/a" if cpu_line is None else f"{cpu_line[1]:.2f}"]
    )
    totals = ["all groups, samples read a second", ""]
    totals += [
        f"{_count(s['quiet_samples_per_second'])} / {s['quiet_samples_per_second'] / r['nodes']:.0f}"
        for r, s in zip(runs, sums, strict=True)
    ]
    line = fit(ns, [s["quiet_samples_per_second"] for s in sums])
    totals.append("n/a" if line is None else f"{line[1]:.2f}")
    rows.append(totals)
    out = [
        "Quiet cost: every rule's expression run once as an instant query on the idle Prometheus "
        "(scraping and rules stopped), with `stats=all`. Samples = totalQueryableSamples (independent of "
        "the machine's load); a node = samples / N; wall = the sum of the rules' query times on the loaded "
        "machine; CPU = Prometheus's CPU time during them (10 ms ticks; inflated by the other load's cache "
        f"and scheduling); share = CPU / interval. Windows longer than the {data_span(runs[-1]):.0f} s of "
        "data are partly filled: their samples are lower bounds.",
        "",
        fmt.markdown_table(headers, rows),
        "",
    ]
    rules = [(g, rule) for g, group in runs[-1]["quiet_groups"].items() for rule in group["rules"]]
    rules.sort(key=lambda item: -item[1]["samples"])
    rows = [
        [
            g,
            rule["name"],
            _count(rule["samples"]),
            f"{rule['samples'] / runs[-1]['nodes']:.1f}",
            fmt.seconds(rule["seconds"]),
            fmt.seconds(rule["cpu"]),
        ]
        for g, rule in rules
    ]
    out += [
        f"Every rule at N = {runs[-1]['nodes']}, most samples first (one evaluation).",
        "",
        fmt.markdown_table(["group", "rule", "samples", "a node", "wall", "Prometheus CPU"], rows),
        "",
    ]
    return out


def write_section(path: Path, label: str, text: str) -> None:
    begin, end = f"<!-- fleet:{label} -->", f"<!-- /fleet:{label} -->"
    current = path.read_text(encoding="utf-8") if path.exists() else "# Fleet benchmark (`python -m bench.fleet`)\n\n"
    block = f"{begin}\n{text}\n{end}\n"
    if begin in current and end in current:
        head, _, rest = current.partition(begin)
        _, _, tail = rest.partition(end + "\n")
        current = head + block + tail
    else:
        current = current.rstrip("\n") + "\n\n" + block
    path.write_text(current, encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Plumbing
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text)


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (httpx.HTTPError, RuntimeError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def report_from_json(argv: list[str]) -> int:
    """`report LABEL OUTPUT FILE.json...`: one section from the runs of several --json files (by N)."""
    if len(argv) < 3:
        print("usage: python -m bench.fleet report LABEL OUTPUT FILE.json...", file=sys.stderr)
        return 2
    label, output, files = argv[0], argv[1], argv[2:]
    results = [json.loads(Path(f).read_text(encoding="utf-8")) for f in files]
    merged = dict(results[0])
    merged["label"] = label
    merged["runs"] = sorted((r for result in results for r in result["runs"]), key=lambda r: r["nodes"])
    merged["command"] = "; ".join(r["command"] for r in results)
    merged["load_end"] = results[-1].get("load_end", "n/a")
    text = build_report(merged, None)
    print(text)
    if output:
        write_section(Path(output), label, text)
    return 0


_GOGC = re.compile(r"\d+|off")
_GOMEMLIMIT = re.compile(r"\d+(B|KiB|MiB|GiB|TiB)?")


def go_environment(gogc: str, memory_limit: str) -> dict[str, str] | str:
    """GOGC / GOMEMLIMIT for Prometheus, checked the way Go reads them (a bad value Go would ignore
    silently, measuring the default), or the message saying what is wrong."""
    env: dict[str, str] = {}
    if gogc:
        if not _GOGC.fullmatch(gogc):
            return f"--go-gc {gogc!r}: a percentage (100 is Go's default) or 'off'"
        env["GOGC"] = gogc
    if memory_limit:
        if not _GOMEMLIMIT.fullmatch(memory_limit):
            return f"--go-memory-limit {memory_limit!r}: bytes with an optional B, KiB, MiB, GiB or TiB suffix (3GiB)"
        env["GOMEMLIMIT"] = memory_limit
    return env


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,300,600,1000", help="node counts, one Prometheus each")
    parser.add_argument("--fleets", default=MIXED_FLEET, help="demo fleets the nodes take in turn, ';'-separated")
    parser.add_argument("--rules-dir", default=str(RULES_DIR), help="where the rule files are (another revision's)")
    parser.add_argument("--rule-files", default=DEFAULT_RULE_FILES, help="rule files to load, ','-separated")
    parser.add_argument("--dashboards-dir", default=str(DASHBOARD_DIR), help="dashboard JSON (another revision's)")
    parser.add_argument("--warmup", type=float, default=240.0, help="seconds of scraping before measuring")
    parser.add_argument("--repeats", type=int, default=2, help="runs per dashboard query (best kept)")
    parser.add_argument("--label", default="run", help="section title in the results file")
    parser.add_argument("--output", default=str(RESULTS_FILE), help="results file ('' = print only)")
    parser.add_argument("--json", default="", help="also write the raw figures here")
    parser.add_argument("--before", default="", help="raw figures of an earlier run, for the memory goal")
    parser.add_argument("--go-gc", default="", help="GOGC for Prometheus, percent ('' = Go's 100)")
    parser.add_argument("--go-memory-limit", default="", help="GOMEMLIMIT for Prometheus, e.g. 3GiB ('' = none)")
    return parser.parse_args(argv)


def sizes(fleets: list[str], extra: list[str]) -> str:
    """Series and bytes of one node's /metrics per demo fleet, at the daemon's defaults (or `extra`)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-sizes-") as tmp:
        for fleet in fleets:
            body = capture(fleet, Path(tmp), extra)["second"]
            series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
            devices = sum(1 for line in body.splitlines() if line.startswith("amdgpu_up{"))
            raw = body.encode()
            rows.append(
                [
                    fleet,
                    str(devices),
                    str(series),
                    f"{series / max(devices, 1):.0f}",
                    f"{len(raw) / 1e3:.1f} kB",
                    f"{len(gzip.compress(raw, compresslevel=5, mtime=0)) / 1e3:.1f} kB",
                ]
            )
    headers = ["demo fleet", "devices", "series", "a device", "text", "gzip"]
    return fmt.markdown_table(headers, rows, right=[False, True, True, True, True, True])


def main(argv: list[str]) -> int:
    if argv[:1] == ["sizes"]:
        print(f"daemon flags: {' '.join(argv[2:]) or '(defaults)'}")
        print(sizes([f for f in argv[1].split(";") if f], argv[2:]))
        return 0
    if argv[:1] == ["serve"]:
        captures = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        asyncio.run(serve(captures, int(argv[2]), int(argv[3])))
        return 0
    if argv[:1] == ["report"]:
        return report_from_json(argv[1:])
    args = parse_args(argv)
    go_env = go_environment(args.go_gc, args.go_memory_limit)
    if isinstance(go_env, str):
        print(go_env, file=sys.stderr)
        return 2
    if shutil.which("prometheus") is None:
        print("prometheus is missing: ./.ci/install-debian-packages prometheus", file=sys.stderr)
        return 2
    if not EXPORTER.exists():
        print(f"{EXPORTER} is missing: make .venv/bin/.runtime-installed", file=sys.stderr)
        return 2
    nodes = [int(n) for n in args.nodes.split(",")]
    fleets = [f for f in args.fleets.split(";") if f]
    rule_paths = [Path(args.rules_dir) / name for name in args.rule_files.split(",") if name]
    missing = [str(p) for p in rule_paths if not p.is_file()]
    if missing:
        print(f"rule files not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    version = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, check=False)
    result: dict[str, Any] = {
        "label": args.label,
        "command": "python -m bench.fleet " + " ".join(argv),
        "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "prometheus": (version.stdout or version.stderr).split("\n", 1)[0].split("version ")[-1].split(" ")[0],
        "machine": ", ".join(f"{k} {v}" for k, v in fmt.machine_description()[1:3]),
        "load_start": fmt.load_average(),
        "fleets": fleets,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "rule_files": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in rule_paths],
        "go_env": go_env,
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        captures = [capture(f, work) for f in fleets]
        result["captures"] = [
            {
                "fleet": c["fleet"],
                "series": sum(1 for line in c["second"].splitlines() if line and not line.startswith("#")),
                "bytes": len(c["second"].encode()),
            }
            for c in captures
        ]
        captures_file = work / "captures.json"
        captures_file.write_text(json.dumps(captures), encoding="utf-8")
        for n in nodes:
            print(f"{n} nodes ...", flush=True)
            run = run_nodes(
                n, captures_file, work, args.warmup, args.repeats, rule_paths, Path(args.dashboards_dir), go_env
            )
            result["runs"].append(run)
            s = summarise(run)
            print(
                f"  head series {run['head_series']}, RSS {_gib(run['rss'])}, "
                f"groups {fmt.seconds(s['all_groups_seconds'])}, quiet {fmt.seconds(s['quiet_seconds'])} "
                f"({_count(s['quiet_samples'])} samples)"
                f" (slowest {s['slowest_group']} {fmt.seconds(s['slowest_group_seconds'])}), missed {s['missed']:.0f}, "
                + ", ".join(f"slowest {d} {fmt.seconds(q['seconds'])} ({q['where']})" for d, q in s["worst"].items()),
                flush=True,
            )
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    result["load_end"] = fmt.load_average()
    before = json.loads(Path(args.before).read_text(encoding="utf-8")) if args.before else None
    text = build_report(result, before)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.output:
        write_section(Path(args.output), args.label, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
