"""Everything one bench run measured, and the report (markdown) built from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench import report as fmt
from bench.http_bench import FreshScrapes, HttpRow
from bench.poll_bench import CycleTrace
from bench.rocmsmi import RocmSmiCost

# The targets, as numbers.
THROUGHPUT_VS_NODE_EXPORTER = 50.0
THROUGHPUT_VS_CEILING = 0.7
POLL_VS_ROCM_SMI = 1 / 20
POLL_VS_FLOOR = 2.0
LINEARITY_SLACK = 1.25  # per-GCD cost at the largest fleet <= this x per-GCD cost at the node's size
OTHER_FILES_PER_GCD = 4.0  # "the few text files gpu_metrics cannot replace", per hot cycle
RSS_STEADY = 60e6
DAEMON_CPU_PER_SECOND = 10e-3  # the whole daemon at defaults, scraped every 15 s: 1 % of a core
SAMPLER_VS_BARE = 2.0  # the sampler in place (daemon with it - without it) vs its bare reads
FRESH_SCRAPE_VS_NODE_EXPORTER = 1.0  # CPU of one scrape of a new snapshot, OpenMetrics + gzip
RSS_GROWTH = 1e6
HUNG_P99 = 0.050
TARGET_CONNECTIONS = 64


@dataclass(slots=True)
class Results:
    command: str
    fleet: str
    gcds: int
    slow_every: int  # one full (slow-refresh) cycle per this many cycles in the daemon's defaults
    versions: dict[str, str] = field(default_factory=dict)
    http: list[HttpRow] = field(default_factory=list)
    fresh: list[FreshScrapes] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)  # tool -> "16 of 16 GCDs ..."
    metrics_bytes: int = 0
    rss_daemon_idle: int | None = None
    rss_daemon_loaded: int | None = None
    daemon_idle_cpu_rate: float | None = None
    # bench.sampler_cost's figures (CPU seconds per second, the least of the rounds): daemon_default,
    # daemon_no_sampler, bare_loop, node_exporter; and every round's
    daemon_cpu: dict[str, float] = field(default_factory=dict)
    daemon_cpu_runs: dict[str, list[float]] = field(default_factory=dict)
    render: dict[str, float] = field(default_factory=dict)  # bench.render_cost: ours, library (CPU s per render)
    rocm_smi: RocmSmiCost | None = None
    traces: dict[str, CycleTrace] = field(default_factory=dict)  # mode -> trace
    cycles: dict[str, dict[str, Any]] = field(default_factory=dict)  # mode -> bench.pollcost measure
    scaling: list[dict[str, Any]] = field(default_factory=list)  # measure results, hot and full, by size
    soak: dict[str, Any] | None = None
    hung: dict[str, str] = field(default_factory=dict)  # observations from the hung-GCD run
    load_average_start: str = ""
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # phases that could not run, and why

    # -- derived figures -----------------------------------------------------------------------
    def http_row(self, server: str, connections: int, scenario: str = "healthy") -> HttpRow | None:
        for row in self.http:
            if row.server == server and row.wrk.connections == connections and row.scenario == scenario:
                return row
        return None

    def rps_ratio(self, server: str, other: str) -> float | None:
        mine = self.http_row(server, TARGET_CONNECTIONS)
        theirs = self.http_row(other, TARGET_CONNECTIONS)
        if mine is None or theirs is None or theirs.wrk.requests_per_second <= 0:
            return None
        return mine.wrk.requests_per_second / theirs.wrk.requests_per_second

    def averaged(self, key: str) -> float | None:
        """A per-cycle figure at the daemon's schedule: hot cycles plus one full cycle per slow_every."""
        hot, full = self.cycles.get("hot"), self.cycles.get("full")
        if hot is None or full is None or key not in hot or key not in full:
            return None
        return float(hot[key] + (full[key] - hot[key]) / self.slow_every)

    def scaled_average(self, gcds: int) -> float | None:
        """Daemon-average poll CPU per cycle for the scaling run of `gcds` GCDs."""
        found = {r["mode"]: r["cpu_per_cycle"] for r in self.scaling if r["gcds"] == gcds}
        if "hot" not in found or "full" not in found:
            return None
        return float(found["hot"] + (found["full"] - found["hot"]) / self.slow_every)

    def linearity(self) -> float | None:
        """Per-GCD daemon-average poll CPU at the largest size over that at the node's size."""
        sizes = sorted({r["gcds"] for r in self.scaling})
        if self.gcds not in sizes or len(sizes) < 2:
            return None
        largest, node = self.scaled_average(sizes[-1]), self.scaled_average(self.gcds)
        if largest is None or not node:
            return None
        return (largest / sizes[-1]) / (node / self.gcds)

    # -- the report ----------------------------------------------------------------------------
    def markdown(self, machine: list[tuple[str, str]]) -> str:
        parts = [
            "# amdgpu-exporter: benchmark against the peers",
            "",
            f"Written by `{self.command}` (`make bench` runs it); do not edit by hand. One run, one simulated node: "
            f"{self.fleet} = {self.gcds} GCDs, every tool on the same tree.",
            "",
            fmt.markdown_table(
                ["machine", ""],
                [
                    *([k, v] for k, v in machine),
                    ["load average (1, 5, 15 min) at start", self.load_average_start],
                    ["load average at end", fmt.load_average()],
                ],
            ),
            "",
            fmt.markdown_table(["tool", "version"], [[k, v] for k, v in self.versions.items()]),
            "",
            "## Targets",
            "",
            self._targets(),
            "",
            "## The whole daemon at defaults, idle between scrapes",
            "",
            self._daemon_table(),
            "",
            "## /metrics under load (wrk, loopback)",
            "",
            self._http_table(),
            "",
            "One scrape per snapshot, as Prometheus scrapes (OpenMetrics, gzip; one poll interval apart):",
            "",
            self._fresh_table(),
            "",
            fmt.markdown_table(["tool", "GCDs it reports"], [[k, v] for k, v in self.seen.items()]),
            "",
            "## One poll of every GCD, against rocm-smi and the raw-read floor",
            "",
            self._poll_table(),
            "",
            "## Kernel calls per cycle (strace -f)",
            "",
            self._files_table(),
            "",
            "## Scaling with the number of GCDs",
            "",
            self._scaling_table(),
            "",
            "## Memory",
            "",
            self._memory_table(),
            "",
        ]
        if self.hung:
            parts += [
                "## One hung GCD",
                "",
                fmt.markdown_table(["observation", ""], [[k, v] for k, v in self.hung.items()]),
                "",
            ]
        if self.failures:
            parts += ["## Phases that did not run", "", *[f"- {f}" for f in self.failures], ""]
        parts += ["## Notes", "", *[f"- {n}" for n in self.notes], ""]
        return "\n".join(parts)

    def _targets(self) -> str:
        rows: list[list[str]] = []

        def add(what: str, value: str, goal: str, met: bool | None) -> None:
            rows.append([what, value, goal, fmt.verdict(met)])

        vs_node = self.rps_ratio("amdgpu-exporter", "node-exporter")
        add(
            f"/metrics req/s at {TARGET_CONNECTIONS} conns vs node_exporter",
            fmt.ratio(vs_node),
            f">= {THROUGHPUT_VS_NODE_EXPORTER:.0f}x",
            None if vs_node is None else vs_node >= THROUGHPUT_VS_NODE_EXPORTER,
        )
        vs_ceiling = self.rps_ratio("amdgpu-exporter", "bare-asgi")
        add(
            f"/metrics req/s at {TARGET_CONNECTIONS} conns vs bare ASGI ceiling",
            fmt.ratio(vs_ceiling),
            f">= {THROUGHPUT_VS_CEILING}x",
            None if vs_ceiling is None else vs_ceiling >= THROUGHPUT_VS_CEILING,
        )
        poll = self.averaged("cpu_per_cycle")
        rocm = self.rocm_smi.cpu_seconds_median if self.rocm_smi else None
        vs_rocm = poll / rocm if poll is not None and rocm else None
        add(
            f"CPU of one poll of {self.gcds} GCDs vs one rocm-smi sample",
            f"{fmt.seconds(poll)} vs {fmt.seconds(rocm)} = {fmt.ratio(vs_rocm)}",
            "<= 1/20",
            None if vs_rocm is None else vs_rocm <= POLL_VS_ROCM_SMI,
        )
        floor = self.averaged("floor_cpu_per_cycle")
        vs_floor = poll / floor if poll is not None and floor else None
        add(
            "poll-cycle CPU vs raw-read floor",
            f"{fmt.seconds(poll)} vs {fmt.seconds(floor)} = {fmt.ratio(vs_floor)}",
            f"<= {POLL_VS_FLOOR:.0f}x",
            None if vs_floor is None else vs_floor <= POLL_VS_FLOOR,
        )
        linear = self.linearity()
        largest = max((r["gcds"] for r in self.scaling), default=0)
        add(
            f"per-GCD poll CPU (daemon average) at {largest} GCDs / at {self.gcds}",
            fmt.ratio(linear),
            f"<= {LINEARITY_SLACK} (linear)",
            None if linear is None else linear <= LINEARITY_SLACK,
        )
        hot, full = self.traces.get("hot"), self.traces.get("full")
        if hot is not None:
            worst_metrics = max(hot.gpu_metrics_per_gcd, full.gpu_metrics_per_gcd if full else 0.0)
            add(
                "gpu_metrics reads per GCD per cycle",
                fmt.number(worst_metrics),
                "<= 1",
                worst_metrics <= 1.0,
            )
            others = ", ".join(k for k in hot.opens_by_kind if k != "gpu_metrics")
            add(
                "other files per GCD per cycle (between slow refreshes)",
                f"{fmt.number(hot.other_files_per_gcd)} ({others})",
                f"<= {OTHER_FILES_PER_GCD:.0f}",
                hot.other_files_per_gcd <= OTHER_FILES_PER_GCD,
            )
        cpu = self.daemon_cpu
        default = cpu.get("daemon_default")
        add(
            f"whole daemon CPU at defaults, {self.gcds} GCDs, scraped every 15 s",
            "n/a" if default is None else f"{default * 1e3:.2f} ms/s",
            f"<= {DAEMON_CPU_PER_SECOND * 1e3:.0f} ms/s",
            None if default is None else default <= DAEMON_CPU_PER_SECOND,
        )
        sampler = self.sampler_in_place()
        bare = cpu.get("bare_loop")
        add(
            "the sampler in place (daemon with it - without it) vs its bare reads",
            "n/a"
            if sampler is None or not bare
            else f"{sampler * 1e3:.2f} vs {bare * 1e3:.2f} ms/s = {fmt.ratio(sampler / bare)}",
            f"<= {SAMPLER_VS_BARE:.0f}x",
            None if sampler is None or not bare else sampler / bare <= SAMPLER_VS_BARE,
        )
        ours, theirs = self.fresh_row("amdgpu-exporter", "healthy"), self.fresh_row("node-exporter", "healthy")
        fresh_ratio = ours.cpu_per_scrape / theirs.cpu_per_scrape if ours and theirs and theirs.cpu_per_scrape else None
        add(
            "CPU of one fresh scrape (OpenMetrics, gzip) vs node_exporter's",
            "n/a"
            if fresh_ratio is None or ours is None or theirs is None
            else " ".join(
                (
                    fmt.seconds(ours.cpu_per_scrape),
                    "vs",
                    fmt.seconds(theirs.cpu_per_scrape),
                    "=",
                    fmt.ratio(fresh_ratio),
                )
            ),
            f"<= {FRESH_SCRAPE_VS_NODE_EXPORTER:.0f}x",
            None if fresh_ratio is None else fresh_ratio <= FRESH_SCRAPE_VS_NODE_EXPORTER,
        )
        theirs_cpu = theirs.cpu_per_scrape if theirs else None
        for what, key in (("render.py", "ours"), ("prometheus-client's formatter", "library")):
            render = self.render.get(key)
            add(
                f"one render of a snapshot (OpenMetrics, gzip), {what}, vs node_exporter's whole scrape",
                "n/a"
                if render is None or not theirs_cpu
                else f"{fmt.seconds(render)} vs {fmt.seconds(theirs_cpu)} = {fmt.ratio(render / theirs_cpu)}",
                f"<= {FRESH_SCRAPE_VS_NODE_EXPORTER:.0f}x",
                None if render is None or not theirs_cpu else render <= theirs_cpu * FRESH_SCRAPE_VS_NODE_EXPORTER,
            )
        add(
            "daemon RSS, steady under load",
            fmt.megabytes(self.rss_daemon_loaded),
            f"<= {RSS_STEADY / 1e6:.0f} MB",
            None if self.rss_daemon_loaded is None else self.rss_daemon_loaded <= RSS_STEADY,
        )
        growth = self._soak_growth()
        add(
            f"RSS growth over {self.soak['cycles'] if self.soak else 0:,} cycles",
            fmt.megabytes(growth),
            f"< {RSS_GROWTH / 1e6:.0f} MB",
            None if growth is None else growth < RSS_GROWTH,
        )
        fresh = self.fresh_row("amdgpu-exporter", "one GCD hung")
        add(
            "slowest single scrape of a new snapshot, one GCD hung",
            fmt.seconds(fresh.slowest if fresh else None),
            f"< {HUNG_P99 * 1e3:.0f} ms",
            None if fresh is None else fresh.slowest < HUNG_P99,
        )
        for connections in (1, TARGET_CONNECTIONS):
            hung = self.http_row("amdgpu-exporter", connections, "one GCD hung")
            add(
                f"p99 scrape latency, one GCD hung, {connections} conn{'s' if connections > 1 else ''}",
                fmt.seconds(hung.wrk.p99_seconds if hung else None),
                f"< {HUNG_P99 * 1e3:.0f} ms",
                None if hung is None else hung.wrk.p99_seconds < HUNG_P99 and hung.wrk.errors == 0,
            )
        return fmt.markdown_table(["target", "measured", "goal", "met"], rows)

    def sampler_in_place(self) -> float | None:
        """CPU seconds per second the sampler adds to the daemon: with it at its default minus without it."""
        cpu = self.daemon_cpu
        if "daemon_default" not in cpu or "daemon_no_sampler" not in cpu:
            return None
        return cpu["daemon_default"] - cpu["daemon_no_sampler"]

    def _daemon_table(self) -> str:
        cpu = self.daemon_cpu
        if not cpu:
            return "not measured"
        labels = {
            "daemon_default": "daemon at defaults (--fast.interval 100ms), scraped every 15 s",
            "daemon_no_sampler": "daemon with --fast.interval 0, scraped every 15 s",
            "bare_loop": "bare loop: the sampler's reads (kept open, pread) and unpacks every 100 ms, nothing else",
            "node_exporter": "prometheus-node-exporter (drm, hwmon), scraped every 15 s",
        }
        rows = [
            [label, f"{cpu[key] * 1e3:.2f}", ", ".join(f"{v * 1e3:.2f}" for v in self.daemon_cpu_runs.get(key, []))]
            for key, label in labels.items()
            if key in cpu
        ]
        sampler = self.sampler_in_place()
        if sampler is not None:
            rows.append(["the sampler in place (the difference)", f"{sampler * 1e3:.2f}", ""])
        return fmt.markdown_table(["CPU ms per second (/proc)", "least", "every run"], rows, right=[False, True, True])

    def _soak_growth(self) -> float | None:
        if not self.soak or len(self.soak["rss"]) < 2:
            return None
        return float(self.soak["rss"][-1][1] - self.soak["rss"][0][1])

    def _http_table(self) -> str:
        rows = []
        for row in self.http:
            w = row.wrk
            ours = self.http_row("amdgpu-exporter", w.connections, row.scenario)
            vs = ours.wrk.requests_per_second / w.requests_per_second if ours and w.requests_per_second else None
            rows.append(
                [
                    row.server,
                    row.scenario,
                    str(w.connections),
                    fmt.number(w.requests_per_second),
                    fmt.ratio(vs) if row.server != "amdgpu-exporter" else "",
                    fmt.seconds(w.p50_seconds),
                    fmt.seconds(w.p99_seconds),
                    fmt.seconds(row.cpu_per_scrape),
                    f"{w.bytes_read / w.requests / 1e3:.1f} kB" if w.requests else "n/a",
                    str(w.errors),
                ]
            )
        headers = [
            "server",
            "scenario",
            "conns",
            "req/s",
            "ours / this",
            "p50",
            "p99",
            "CPU/scrape",
            "answer",
            "errors",
        ]
        return fmt.markdown_table(headers, rows, right=[False, False] + [True] * 8)

    def _fresh_table(self) -> str:
        rows = [
            [
                f.server,
                f.scenario,
                str(len(f.latencies)),
                fmt.seconds(f.median),
                fmt.seconds(f.slowest),
                fmt.seconds(f.cpu_per_scrape),
            ]
            for f in self.fresh
        ]
        headers = ["server", "scenario", "scrapes", "median latency", "slowest", "CPU/scrape"]
        return fmt.markdown_table(headers, rows, right=[False, False, True, True, True, True])

    def fresh_row(self, server: str, scenario: str) -> FreshScrapes | None:
        return next((f for f in self.fresh if f.server == server and f.scenario == scenario), None)

    def _poll_table(self) -> str:
        rows = []
        labels = {"hot": "between slow refreshes", "full": "slow refresh (caps, DPM, RAS ...)"}
        for mode in ("hot", "full"):
            m = self.cycles.get(mode)
            if m is None:
                continue
            floor = m.get("floor_cpu_per_cycle")
            rows.append(
                [
                    f"{mode}: {labels[mode]}",
                    fmt.seconds(m["cpu_per_cycle"]),
                    fmt.seconds(m["wall_per_cycle"]),
                    fmt.seconds(floor),
                    fmt.ratio(m["cpu_per_cycle"] / floor) if floor else "n/a",
                ]
            )
        poll, floor = self.averaged("cpu_per_cycle"), self.averaged("floor_cpu_per_cycle")
        if poll is not None:
            rows.append(
                [
                    f"daemon average (1 refresh per {self.slow_every} cycles)",
                    fmt.seconds(poll),
                    fmt.seconds(self.averaged("wall_per_cycle")),
                    fmt.seconds(floor),
                    fmt.ratio(poll / floor) if floor else "n/a",
                ]
            )
        if self.daemon_idle_cpu_rate is not None:
            rows.append(
                [
                    "daemon process, no scrapes, per 1 s cycle (poll + rules + loop)",
                    fmt.seconds(self.daemon_idle_cpu_rate),
                    "",
                    "",
                    "",
                ]
            )
        if self.soak:
            rows.append(
                [
                    "poll + rules + render (OpenMetrics gzip), back to back (soak)",
                    fmt.seconds(self.soak["cpu_per_cycle"]),
                    "",
                    "",
                    "",
                ]
            )
        if self.rocm_smi is not None:
            r = self.rocm_smi
            rows.append(
                [
                    f"`rocm-smi {' '.join(('--showpower', '--showtemp', '--showuse'))}`, one sample",
                    fmt.seconds(r.cpu_seconds_median),
                    fmt.seconds(r.wall_seconds_median),
                    "",
                    "",
                ]
            )
        headers = [f"{self.gcds} GCDs", "CPU/cycle", "wall/cycle", "raw-read floor CPU", "CPU / floor"]
        return fmt.markdown_table(headers, rows, right=[False, True, True, True, True])

    def _files_table(self) -> str:
        hot, full = self.traces.get("hot"), self.traces.get("full")
        if hot is None:
            return "not measured"
        kinds = sorted(set(hot.opens_by_kind) | set(full.opens_by_kind if full else {}))
        kinds.sort(key=lambda k: (k != "gpu_metrics", k))
        rows = []
        for kind in kinds:
            rows.append(
                [
                    f"open {kind}",
                    fmt.number(hot.opens_by_kind.get(kind, 0.0)),
                    fmt.number(full.opens_by_kind.get(kind, 0.0)) if full else "",
                ]
            )
        rows.append(
            ["read() on device files", fmt.number(hot.reads_per_gcd), fmt.number(full.reads_per_gcd) if full else ""]
        )
        for kind, value in sorted(hot.background_opens.items()):
            rows.append([f"open {kind} (background thread)", fmt.number(value), ""])
        per_gcd = fmt.markdown_table(["per GCD per cycle", "hot", "full"], rows, right=[False, True, True])
        names = sorted(set(hot.syscalls_per_cycle) | set(full.syscalls_per_cycle if full else {}))
        names.sort(key=lambda n: -hot.syscalls_per_cycle.get(n, 0.0))
        sys_rows = [
            [
                n,
                fmt.number(hot.syscalls_per_cycle.get(n, 0.0)),
                fmt.number(full.syscalls_per_cycle.get(n, 0.0)) if full else "",
            ]
            for n in names[:12]
        ]
        sys_rows.append(
            [
                "all syscalls",
                fmt.number(hot.syscalls_total_per_cycle),
                fmt.number(full.syscalls_total_per_cycle) if full else "",
            ]
        )
        per_cycle = fmt.markdown_table(
            [f"syscalls per cycle, {hot.gcds} GCDs", "hot", "full"], sys_rows, right=[False, True, True]
        )
        return per_gcd + "\n\n" + per_cycle

    def _scaling_table(self) -> str:
        sizes = sorted({r["gcds"] for r in self.scaling})
        rows = []
        for size in sizes:
            cells = [str(size)]
            for mode in ("hot", "full"):
                found = [r for r in self.scaling if r["gcds"] == size and r["mode"] == mode]
                if found:
                    r = found[0]
                    cells += [fmt.seconds(r["cpu_per_cycle"]), fmt.seconds(r["cpu_per_cycle"] / size)]
                    if mode == "hot":
                        cells.append(fmt.seconds(r["wall_per_cycle"]))
                else:
                    cells += ["", ""] + ([""] if mode == "hot" else [])
            average = self.scaled_average(size)
            cells += [fmt.seconds(average), fmt.seconds(average / size if average is not None else None)]
            rows.append(cells)
        headers = [
            "GCDs",
            "hot CPU/cycle",
            "per GCD",
            "hot wall/cycle",
            "full CPU/cycle",
            "per GCD",
            "daemon average",
            "per GCD",
        ]
        return fmt.markdown_table(headers, rows, right=[True] * len(headers))

    def _memory_table(self) -> str:
        rows = [
            ["daemon RSS after start-up (idle, polling)", fmt.megabytes(self.rss_daemon_idle)],
            ["daemon RSS after the load runs", fmt.megabytes(self.rss_daemon_loaded)],
        ]
        if self.soak:
            first, last = self.soak["rss"][0], self.soak["rss"][-1]
            peak = max(rss for _, rss in self.soak["rss"])
            rows += [
                [f"soak: RSS after {self.soak['warmup']} warm-up cycles", fmt.megabytes(first[1])],
                [f"soak: RSS after {last[0]:,} more cycles", fmt.megabytes(last[1])],
                ["soak: highest checkpoint", fmt.megabytes(peak)],
                ["soak: growth", fmt.megabytes(last[1] - first[1])],
                ["soak: wall time", fmt.seconds(self.soak["wall_seconds"])],
            ]
        return fmt.markdown_table(["", ""], rows, right=[False, True])
