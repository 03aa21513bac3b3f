"""In-process cost of poll cycles, run as a child process so nothing else shares its CPU clock.

    python -m bench.pollcost measure --sysfs DIR [--mode hot|full] [--cycles N] [--limit N] [--floor FILE]
    python -m bench.pollcost trace   --sysfs DIR [--mode hot|full] [--cycles N]      (run under strace)
    python -m bench.pollcost soak    --sysfs DIR [--warmup N] [--cycles N]

Modes: `hot` is a cycle between slow-schedule refreshes (the common case: gpu_metrics plus the
text files it cannot replace); `full` refreshes the slow fields on every cycle (caps, thresholds,
DPM tables, RAS counts), which the daemon does once per --slow-interval (default 10 s = every
10th cycle at the default 1 s interval). Each prints one JSON object on stdout.

CPU is time.process_time(): every thread of this process, so the poller's read threads count.
The raw-read floor replays, in one thread and with no parsing, exactly the opens and reads a
traced cycle made (the --floor file, written by the parent from the strace log).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.procstat import rss_bytes
from bench.syscalls import MARKER_PREFIX
from exporter.log import configure_logging
from exporter.model import DeviceIdentity, Sample, SourceStats
from exporter.pipeline.poller import Poller
from exporter.sources.base import Source
from exporter.sources.sysfs import SysfsSource

HOT_SLOW_INTERVAL = 1e9  # slow fields read once at the first cycle, never again
WARMUP_CYCLES = 3


class FirstDevices(Source):
    """A source limited to the first N devices in PCI order: one big tree gives every fleet size."""

    def __init__(self, source: SysfsSource, limit: int) -> None:
        self.source = source
        self.limit = limit
        self.name = source.name
        self.values_checked = source.values_checked  # as the daemon's poller sees the sysfs source

    def discover(self) -> Sequence[DeviceIdentity]:
        found = sorted(self.source.discover(), key=lambda d: d.pci_bus_id)
        return found[: self.limit] if self.limit > 0 else found

    def read(self, device: DeviceIdentity) -> Sample:
        return self.source.read(device)

    def stats(self) -> SourceStats:
        return self.source.stats()

    def close(self) -> None:
        self.source.close()


def make_poller(sysfs: str, mode: str, limit: int = 0) -> Poller:
    slow_interval = 0.0 if mode == "full" else HOT_SLOW_INTERVAL
    source = FirstDevices(SysfsSource(sysfs, slow_interval=slow_interval), limit)
    poller = Poller(source, interval=1.0, read_timeout=5.0, source_name="sysfs")
    if not poller.discover():
        raise SystemExit(f"no device found under {sysfs}")
    return poller


def read_floor(paths: Sequence[str]) -> None:
    """The raw-read floor: open, read to EOF, close, exactly like read_file_bytes, but no parsing."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            while os.read(fd, 65536):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)


def _check_up(poller: Poller, snapshot: Any) -> None:
    down = [d.identity.card for d in snapshot.devices if not d.up]
    if down:
        raise SystemExit(f"devices down during the measurement: {down}")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    poller = make_poller(args.sysfs, args.mode, args.limit)
    try:
        for _ in range(WARMUP_CYCLES):
            _check_up(poller, await poller.poll_once())
        gc.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.cycles):
            snapshot = await poller.poll_once()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        _check_up(poller, snapshot)
        result: dict[str, Any] = {
            "mode": args.mode,
            "gcds": poller.device_count,
            "cycles": args.cycles,
            "cpu_per_cycle": cpu / args.cycles,
            "wall_per_cycle": wall / args.cycles,
        }
    finally:
        poller.close()
    if args.floor:
        with open(args.floor, encoding="utf-8") as handle:
            paths = json.load(handle)
        read_floor(paths)
        cpu0 = time.process_time()
        for _ in range(args.cycles):
            read_floor(paths)
        result["floor_cpu_per_cycle"] = (time.process_time() - cpu0) / args.cycles
        result["floor_files"] = len(paths)
    return result


def _marker(name: str) -> None:
    with contextlib.suppress(OSError):
        os.close(os.open(MARKER_PREFIX + name, os.O_RDONLY))


async def trace(args: argparse.Namespace) -> dict[str, Any]:
    poller = make_poller(args.sysfs, args.mode, args.limit)
    try:
        for _ in range(WARMUP_CYCLES):
            await poller.poll_once()
        for cycle in range(args.cycles):
            _marker(str(cycle))
            await poller.poll_once()
        _marker("end")
        return {"mode": args.mode, "gcds": poller.device_count, "cycles": args.cycles}
    finally:
        poller.close()


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Poll, evaluate the rules and render (OpenMetrics, gzip), back to back: a daemon scraped every cycle."""
    from exporter.alerting.rulefile import default_rule_file
    from exporter.config import add_arguments, resolve
    from exporter.cycle import Pipeline

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = resolve(parser.parse_args([f"--path.sysfs={args.sysfs}", "--source=sysfs"]), environ={})
    source = SysfsSource(args.sysfs, slow_interval=settings.slow_interval)
    poller = Poller(source, interval=settings.interval, read_timeout=settings.read_timeout, source_name="sysfs")
    pipeline = Pipeline(source_name="sysfs", source_reason="bench", rules=default_rule_file().rules)
    poller.discover()
    pid = os.getpid()
    checkpoints: list[tuple[int, int]] = []
    started = time.perf_counter()
    cpu0 = time.process_time()
    try:
        total = args.warmup + args.cycles
        for cycle in range(1, total + 1):
            pipeline.on_snapshot(await poller.poll_once())
            pipeline.flush()  # render each snapshot as a scrape would: memory must not grow with renders
            if cycle == args.warmup or (cycle > args.warmup and (cycle - args.warmup) % args.every == 0):
                checkpoints.append((cycle - args.warmup, rss_bytes(pid)))
    finally:
        poller.close()
    return {
        "gcds": poller.device_count,
        "warmup": args.warmup,
        "cycles": args.cycles,
        "rss": checkpoints,
        "cpu_per_cycle": (time.process_time() - cpu0) / total,
        "wall_seconds": time.perf_counter() - started,
        "metrics_bytes": len(pipeline.state.metrics.text) if pipeline.state.metrics else 0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pollcost", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("measure", "trace", "soak"):
        command = sub.add_parser(name)
        command.add_argument("--sysfs", required=True)
        command.add_argument("--cycles", type=int, default=200)
        command.add_argument("--mode", choices=("hot", "full"), default="hot")
        command.add_argument("--limit", type=int, default=0, help="poll only the first N devices")
        command.add_argument("--floor", default="", help="JSON list of paths for the raw-read floor")
        command.add_argument("--warmup", type=int, default=200)
        command.add_argument("--every", type=int, default=1000)
    args = parser.parse_args(argv)
    configure_logging("warn", "json")  # warnings only; stdout is kept for the one result line
    runner = {"measure": measure, "trace": trace, "soak": soak}[args.command]
    result = asyncio.run(runner(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
