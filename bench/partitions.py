"""Scale of a partitioned node: 8 x MI300X in CPX (64 devices) against 16 GCDs (8 x MI250X).

    python -m bench.partitions [--cycles N] [--renders N] [--output FILE]

For each node, on a frozen simulated tree: CPU of one poll cycle (hot = between slow refreshes,
full = slow fields re-read too; bench.pollcost in a child process, so nothing else shares its CPU
clock), CPU of rendering one fresh snapshot as Prometheus asks for it (OpenMetrics + gzip) and as
text, and the size of /metrics. Per-device figures show whether the cost is linear in devices.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.poll_bench import run_child
from exporter.alerting.rulefile import default_rule_file
from exporter.cycle import Pipeline
from exporter.log import configure_logging
from exporter.pipeline.poller import Poller
from exporter.simulator import Simulator
from exporter.sources.sysfs import SysfsSource

NODES = {
    "16 GCDs (8xMI250X)": "8xMI250X",
    "64 partitions (8xMI300X CPX, gpu_metrics v1_5)": "8xMI300X:CPX:gpu_metrics=1.5",
    "64 partitions (8xMI300X CPX, gpu_metrics v1_7)": "8xMI300X:CPX:gpu_metrics=1.7",
    "8 sockets (8xMI300X SPX, v1_7)": "8xMI300X:gpu_metrics=1.7",
}


def build_tree(fleet: str, work: Path) -> Path:
    root = work / fleet.replace(":", "_").replace("=", "") / "sys"
    simulator = Simulator(root, fleet=fleet, scenario="training", seed=1)
    simulator.write_tree()
    simulator.tick(30.0)
    return root


def render_cost(sysfs: Path, renders: int) -> dict[str, Any]:
    """CPU of rendering fresh snapshots (each a new poll, so no cached bytes), and their sizes."""

    async def run() -> dict[str, Any]:
        poller = Poller(SysfsSource(sysfs, slow_interval=1e9), interval=1.0, read_timeout=5.0, source_name="sysfs")
        pipeline = Pipeline(source_name="sysfs", source_reason="bench", rules=default_rule_file().rules)
        poller.discover()
        try:
            om_gzip = text = 0.0
            sizes: dict[str, int] = {}
            for _ in range(renders + 2):
                pipeline.on_snapshot(await poller.poll_once())
                metrics = pipeline.state.metrics
                assert metrics is not None
                cpu0 = time.process_time()
                body = metrics.body(openmetrics=True, gzipped=True)
                cpu1 = time.process_time()
                plain = metrics.body(openmetrics=False, gzipped=False)
                cpu2 = time.process_time()
                om_gzip += cpu1 - cpu0
                text += cpu2 - cpu1
                sizes = {
                    "text": len(plain),
                    "text_gzip": len(gzip.compress(plain, compresslevel=5, mtime=0)),
                    "openmetrics_gzip": len(body),
                    "series": sum(1 for line in plain.splitlines() if line and not line.startswith(b"#")),
                }
            return {
                "devices": poller.device_count,
                "render_openmetrics_gzip": om_gzip / (renders + 2),
                "render_text": text / (renders + 2),
                **sizes,
            }
        finally:
            poller.close()

    return asyncio.run(run())


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--renders", type=int, default=30)
    parser.add_argument("--output", default="", help="also write the table to this file")
    args = parser.parse_args(argv)
    configure_logging("warn", "json")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-partitions-", dir="/dev/shm") as work:
        for label, fleet in NODES.items():
            sysfs = build_tree(fleet, Path(work))
            hot = run_child(["measure", "--sysfs", str(sysfs), "--mode", "hot", "--cycles", str(args.cycles)])
            full = run_child(["measure", "--sysfs", str(sysfs), "--mode", "full", "--cycles", str(args.cycles // 3)])
            render = render_cost(sysfs, args.renders)
            rows.append((label, hot, full, render))
            print(f"{label}: done", file=sys.stderr)
    base_devices = rows[0][3]["devices"]
    base = rows[0]
    lines = [
        "| node | devices | series | poll CPU hot | per device | full | render OM+gzip | per device "
        "| render text | /metrics text | gzip | vs 16 GCDs per device (poll, render, bytes) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, hot, full, render in rows:
        n = render["devices"]
        per = (
            (hot["cpu_per_cycle"] / n) / (base[1]["cpu_per_cycle"] / base_devices),
            (render["render_openmetrics_gzip"] / n) / (base[3]["render_openmetrics_gzip"] / base_devices),
            (render["text"] / n) / (base[3]["text"] / base_devices),
        )
        lines.append(
            f"| {label} | {n} | {render['series']} | {fmt_time(hot['cpu_per_cycle'])} "
            f"| {fmt_time(hot['cpu_per_cycle'] / n)} | {fmt_time(full['cpu_per_cycle'])} "
            f"| {fmt_time(render['render_openmetrics_gzip'])} | {fmt_time(render['render_openmetrics_gzip'] / n)} "
            f"| {fmt_time(render['render_text'])} | {render['text'] / 1000:.1f} kB "
            f"| {render['text_gzip'] / 1000:.1f} kB "
            f"| {per[0]:.2f}x, {per[1]:.2f}x, {per[2]:.2f}x |"
        )
    table = "\n".join(lines)
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
