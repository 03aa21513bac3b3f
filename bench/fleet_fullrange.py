"""The fleet dashboard's queries at their default range with the range full, at N nodes.

    python -m bench.fleet_fullrange [--nodes 1000] [--dashboards-dir grafana/dashboards]
                                    [--blocks DIR] [--repeats 2] [--json FILE]

bench.fleet scrapes N virtual nodes for minutes: a 6 h dashboard range is mostly empty there. This
writes 6 h (and 10 minutes) of the series the fleet dashboard's graphs read for N nodes as
OpenMetrics, turns them into TSDB blocks with `promtool tsdb create-blocks-from openmetrics` (--blocks
reuses them), starts a real Prometheus on the blocks alone (no scraping, no rules: quiet) and runs
every query of amdgpu-fleet.json as Grafana sends it (bench.fleet's time_query: the range, the step,
variables), reporting wall time, Prometheus CPU and the samples each reads.

The history is synthetic: each node has the recorded per-node series of the mixed fleet (FAMILIES:
their level labels' values, at the interval of the rule group that records them) and two series the
panels read raw at the scrape interval (the exporter's resident memory and build info), values
jittered around a level. Per-GCD series exist for one node only (the per-GCD panel's): the fleet's
instant per-GCD queries find nothing here; bench.fleet times them on scraped data. A name a fleet
query reads that FAMILIES lacks is listed at the start (its query reads nothing here).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from bench import fleet
from bench import report as fmt

HISTORY = 6 * 3600 + 600  # seconds: the fleet dashboard's 6 h and the lookback before it
# name: (label sets besides the node's, seconds between samples, level, jitter)
FAMILIES: dict[str, tuple[tuple[str, ...], int, float, float]] = {
    "instance:amdgpu_power_watts:sum": (("",), 30, 4000, 200),
    "instance:amdgpu_power_cap_watts:sum": (("",), 60, 6000, 0),
    "instance_sensor:amdgpu_temperature_celsius:max": (
        tuple(f'sensor="{s}"' for s in ("edge", "junction", "memory", "hbm0", "hbm1", "hbm2", "hbm3")),
        30,
        70,
        5,
    ),
    "instance_sensor:amdgpu_temperature_celsius:min": (('sensor="junction"',), 30, 55, 5),
    "instance_sensor:amdgpu_temperature_celsius:avg": (('sensor="junction"',), 30, 62, 5),
    "instance:amdgpu_busy_ratio:avg": (('engine="gfx"', 'engine="memory"', 'engine="media"'), 30, 0.5, 0.45),
    "instance:amdgpu_vram_used:ratio": (("",), 30, 0.5, 0.05),
    "instance:amdgpu_up:sum": (("",), 30, 16, 0),
    "instance:amdgpu_up:count": (("",), 60, 16, 0),
    "instance:amdgpu_energy_joules:rate5m": (("",), 60, 4000, 200),
    "instance:amdgpu_sample_age_seconds:max": (("",), 60, 0.5, 0.3),
    "instance_type:amdgpu_ecc_errors:increase5m": (
        ('type="correctable"', 'type="uncorrectable"', 'type="deferred"'),
        150,
        0,
        0,
    ),
    "instance:amdgpu_xgmi_error_events:increase5m": (("",), 150, 0, 0),
    "instance:amdgpu_exporter_stage_failures:increase5m": (("",), 150, 0, 0),
    "process_resident_memory_bytes": (("",), fleet.SCRAPE_INTERVAL, 90e6, 1e6),
    "amdgpu_exporter_build_info": (('version="0.1.0"',), fleet.SCRAPE_INTERVAL, 1, 0),
}
# Recorded series a healthy demo fleet has none of (bench.fleet's scraped data has none either).
ABSENT_ON_A_HEALTHY_FLEET = frozenset({"instance_reason:amdgpu_exporter_file_errors:rate5m"})
PER_GCD_NODE_DEVICES = 8  # the per-GCD panel's node: 8 GCDs' gfx busy at the scrape interval


def node_labels(i: int) -> str:
    return f'instance="node-{i:05d}:9442",job="{fleet.JOB}",node="node-{i:05d}"'


def write_history(out: IO[str], nodes: int, end: int, seed: int = 1) -> None:
    """OpenMetrics text of HISTORY seconds up to `end` for `nodes` nodes, family by family."""
    rng = random.Random(seed)
    start = end - HISTORY
    for name, (extras, step, level, jitter) in FAMILIES.items():
        out.write(f"# TYPE {name} gauge\n")
        for i in range(nodes):
            for extra in extras:
                labels = node_labels(i) + ("," + extra if extra else "")
                for t in range(start - start % step, end + 1, step):
                    value = level + rng.uniform(-jitter, jitter) if jitter else level
                    out.write(f"{name}{{{labels}}} {value:.6g} {t}\n")
    out.write("# TYPE amdgpu_busy_ratio gauge\n")
    for gpu in range(PER_GCD_NODE_DEVICES):
        labels = node_labels(0) + f',gpu="{gpu}",engine="gfx"'
        for t in range(start, end + 1, fleet.SCRAPE_INTERVAL):
            out.write(f"amdgpu_busy_ratio{{{labels}}} {rng.random():.4f} {t}\n")
    out.write("# EOF\n")


def missing_families(queries: list[fleet.Query]) -> list[str]:
    """Names the fleet's graphs (range queries) read that the history does not hold."""
    graphs = [q for q in queries if q.dashboard == "amdgpu-fleet" and not q.instant]
    names = {n for q in graphs for n in re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", q.expr)}
    return sorted(names - set(FAMILIES) - ABSENT_ON_A_HEALTHY_FLEET)


def build_blocks(nodes: int, end: int, blocks: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-fullrange-") as tmp:
        text = Path(tmp) / "history.om"
        with text.open("w", encoding="utf-8") as out:
            write_history(out, nodes, end)
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(text), str(blocks)],
            check=True,
            stdin=subprocess.DEVNULL,
        )


def measure(blocks: Path, end: float, dashboard_dir: Path, repeats: int) -> list[dict[str, Any]]:
    """Every fleet query at `end` on a Prometheus that holds the blocks and does nothing else."""
    with tempfile.TemporaryDirectory(prefix="bench-fullrange-prom-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": f"{fleet.SCRAPE_INTERVAL}s"}}))
        port = fleet._free_port()
        with (Path(tmp) / "prometheus.log").open("wb") as log:
            prometheus = subprocess.Popen(
                [
                    shutil.which("prometheus") or "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={blocks}",
                    "--storage.tsdb.retention.time=3650d",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
        try:
            fleet._wait(lambda: client.get("/-/ready").status_code == 200, 300, "prometheus /-/ready")
            values = fleet.dashboard_values(dashboard_dir, client)
            return [
                fleet.time_query(client, q, values[q.dashboard], end, repeats, prometheus.pid)
                for q in fleet.dashboard_queries(dashboard_dir)
                if q.dashboard == "amdgpu-fleet"
            ]
        finally:
            client.close()
            fleet._stop(prometheus)


def table(rows: list[dict[str, Any]]) -> str:
    body = [
        [
            r["where"],
            "instant" if r["instant"] else "range",
            fmt.seconds(r["seconds"]),
            fmt.seconds(r["cpu"]),
            f"{r['samples']:,}",
            str(r["series"]),
        ]
        for r in sorted(rows, key=lambda r: -r["seconds"])
        if r["samples"] or r["series"]
    ]
    headers = ["fleet query", "kind", "wall", "Prometheus CPU", "samples", "series returned"]
    return fmt.markdown_table(headers, body, right=[False, False, True, True, True, True])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_fullrange", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--dashboards-dir", default=str(fleet.DASHBOARD_DIR))
    parser.add_argument("--blocks", default="", help="TSDB blocks of an earlier run to reuse (their end: DIR/end)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per query (best kept)")
    parser.add_argument("--json", default="", help="also write the raw figures here")
    args = parser.parse_args(argv)
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: ./.ci/install-debian-packages prometheus", file=sys.stderr)
            return 2
    dashboard_dir = Path(args.dashboards_dir)
    missing = missing_families(fleet.dashboard_queries(dashboard_dir))
    if missing:
        print(f"not in the history (their graphs read nothing here): {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="bench-fullrange-blocks-") as tmp:
        blocks = Path(args.blocks) if args.blocks else Path(tmp)
        if args.blocks and (blocks / "end").exists():
            end = int((blocks / "end").read_text())
        else:
            end = int(time.time()) // 60 * 60
            build_blocks(args.nodes, end, blocks)
            (blocks / "end").write_text(str(end))
        load = fmt.load_average()
        rows = measure(blocks, end, dashboard_dir, args.repeats)
    print(f"{args.nodes} nodes, {HISTORY / 3600:.1f} h of history; load average {load} -> {fmt.load_average()}")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"nodes": args.nodes, "load": load, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
