"""What sub-second sampling costs, against the raw-read floors, all ratios from one run.

    python -m bench.fastcost [--fleet 8xMI250X] [--scale-fleet 32xMI250X] [--seconds 10] [--json FILE]

Prints (and optionally writes as JSON):
  1. one fast read (open, read, close of gpu_metrics + gpu_metrics/sampler_fields.py) against the raw
     floor (the same open, read, close + one fixed-offset struct unpack): goal <= 2x;
  2. the fast sampler on the fleet's GCDs at 100 ms, as a share of one core: goal <= 2 %;
  3. the fast sampler at 64 GCDs: CPU per GCD against the fleet's (linear = 1.0);
  4. one full poll cycle against its raw-read floor (the exact files the cycle opened, read with
     no parsing): goal <= 3x.

Each measurement runs in a child process (python -m bench.fastcost child ...), so nothing else
shares its CPU clock: time.process_time() counts every thread of that process. Best of --rounds.
Trees are written once by the simulator on tmpfs and left still while measured.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.trees import write_tree

_JUNCTION_AT_6 = struct.Struct("<H")  # a fixed-offset unpack: the floor decodes one value


def _gpu_metrics_paths(sysfs: str, limit: int) -> list[str]:
    drm = Path(sysfs) / "class" / "drm"
    cards = [p for p in drm.iterdir() if p.name.startswith("card") and p.name[4:].isdigit()]
    cards.sort(key=lambda p: int(p.name[4:]))
    paths = [os.path.realpath(p / "device" / "gpu_metrics") for p in cards]
    return paths[:limit] if limit else paths


def _best_cpu(run: Callable[[], None], repeats: int, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        cpu0 = time.process_time()
        for _ in range(repeats):
            run()
        best = min(best, (time.process_time() - cpu0) / repeats)
    return best


# --- children ------------------------------------------------------------------------------------


def child_read(args: argparse.Namespace) -> dict[str, Any]:
    from exporter.pipeline.sampler import read_gpu_metrics
    from exporter.sources.gpu_metrics import decode_gpu_metrics
    from exporter.sources.gpu_metrics.sampler_fields import sampler_values

    paths = _gpu_metrics_paths(args.sysfs, args.limit)

    def floor() -> None:
        for path in paths:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                blob = os.read(fd, 65536)
            finally:
                os.close(fd)
            _JUNCTION_AT_6.unpack_from(blob, 6)

    def fast() -> None:
        for path in paths:
            sampler_values(read_gpu_metrics(path))

    def full_decode() -> None:
        for path in paths:
            decode_gpu_metrics(read_gpu_metrics(path))

    repeats = max(1, args.reads // len(paths))
    fast()
    full_decode()
    per = len(paths)
    return {
        "gcds": per,
        "floor_read": _best_cpu(floor, repeats) / per,
        "fast_read": _best_cpu(fast, repeats) / per,
        "full_decode_read": _best_cpu(full_decode, repeats) / per,
    }


def child_sampler(args: argparse.Namespace) -> dict[str, Any]:
    from exporter.model import DeviceIdentity
    from exporter.pipeline.sampler import Sampler

    paths = _gpu_metrics_paths(args.sysfs, args.limit)
    devices = [
        (gpu, DeviceIdentity(pci_bus_id=f"bench:{gpu}", card=f"card{gpu}", device_dir=os.path.dirname(path)))
        for gpu, path in enumerate(paths)
    ]
    sampler = Sampler(interval=args.interval, window=15.0)
    sampler.track(devices)
    sampler.sample_once()
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler.start()
    time.sleep(args.seconds)
    sampler.stop()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    windows = sampler.windows()
    samples = sum(windows.stats.samples.values())
    return {
        "gcds": len(paths),
        "interval": args.interval,
        "wall": wall,
        "cpu": cpu,
        "core_share": cpu / wall,
        "cycles": sampler.cycles,
        "samples": samples,
        "cpu_per_sample": cpu / max(1, samples),
        "ring_bytes_per_device": sampler.ring_bytes_per_device,
    }


def child_poll(args: argparse.Namespace) -> dict[str, Any]:
    from bench.pollcost import make_poller, read_floor
    from exporter.sources.sysfs.files import KeptFiles

    poller = make_poller(args.sysfs, args.mode, args.limit)
    opened: list[str] = []  # every file the traced cycle read: opened, or read through a kept descriptor
    real_open = os.open
    real_kept_read = KeptFiles.read
    inside_kept = threading.local()

    def recording_open(path: Any, *rest: Any, **kw: Any) -> int:
        if not getattr(inside_kept, "path", None):  # an open a kept read makes is that read's own
            opened.append(os.fsdecode(path))
        return real_open(path, *rest, **kw)

    def recording_kept_read(self: KeptFiles, path: str) -> bytes | None:
        opened.append(path)
        inside_kept.path = path
        try:
            return real_kept_read(self, path)
        finally:
            inside_kept.path = None

    async def cycles(count: int) -> None:
        for _ in range(count):
            snapshot = await poller.poll_once()
            down = [d.identity.card for d in snapshot.devices if not d.up]
            if down:
                raise SystemExit(f"devices down during the measurement: {down}")

    try:
        asyncio.run(cycles(3))
        os.open = recording_open  # one traced cycle: which files it reads
        KeptFiles.read = recording_kept_read  # type: ignore[method-assign]
        try:
            asyncio.run(cycles(1))
        finally:
            os.open = real_open
            KeptFiles.read = real_kept_read  # type: ignore[method-assign]
        gc.collect()
        cpu0 = time.process_time()
        asyncio.run(cycles(args.cycles))
        cpu = (time.process_time() - cpu0) / args.cycles
    finally:
        poller.close()
    files = [p for p in opened if p.startswith(os.path.realpath(args.sysfs)) or p.startswith(args.sysfs)]
    floor = _best_cpu(lambda: read_floor(files), args.cycles)
    return {"mode": args.mode, "gcds": poller.device_count, "cpu_per_cycle": cpu, "floor": floor, "files": len(files)}


CHILDREN = {"read": child_read, "sampler": child_sampler, "poll": child_poll}


def run_child(kind: str, sysfs: Path, **options: Any) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.fastcost", "child", kind, f"--sysfs={sysfs}"]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench child {kind} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def best(kind: str, rounds: int, key: str, sysfs: Path, **options: Any) -> dict[str, Any]:
    results = [run_child(kind, sysfs, **options) for _ in range(rounds)]
    return min(results, key=lambda r: float(r[key]))


# --- the report ------------------------------------------------------------------------------------


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="fastcost-", dir=shm) as tmp:
        base = Path(tmp)
        node = write_tree(base / "node", args.fleet)
        big = write_tree(base / "big", args.scale_fleet)
        read = best("read", args.rounds, "fast_read", node, reads=args.reads)
        read300 = None
        if args.mi300_fleet:
            mi300 = write_tree(base / "mi300", args.mi300_fleet)
            read300 = best("read", args.rounds, "fast_read", mi300, reads=args.reads)
        sampler = best("sampler", args.rounds, "cpu", node, seconds=args.seconds, interval=0.1)
        sampler64 = best("sampler", args.rounds, "cpu", big, seconds=args.seconds, interval=0.1, limit=64)
        poll = {
            mode: best("poll", args.rounds, "cpu_per_cycle", node, mode=mode, cycles=args.cycles)
            for mode in ("hot", "full")
        }
    per_gcd = sampler["cpu"] / sampler["wall"] / sampler["gcds"]
    per_gcd64 = sampler64["cpu"] / sampler64["wall"] / sampler64["gcds"]
    average = {k: (9 * poll["hot"][k] + poll["full"][k]) / 10 for k in ("cpu_per_cycle", "floor")}
    report: dict[str, Any] = {
        "fleet": args.fleet,
        "read": read,
        "read_mi300": read300,
        "sampler": sampler,
        "sampler_64": sampler64,
        "poll": poll,
        "ratios": {
            "fast_read_vs_floor": read["fast_read"] / read["floor_read"],
            "full_decode_read_vs_floor": read["full_decode_read"] / read["floor_read"],
            "fast_sampler_core_percent": 100 * sampler["core_share"],
            "fast_sampler_per_gcd_64_vs_16": per_gcd64 / per_gcd,
            "poll_hot_vs_floor": poll["hot"]["cpu_per_cycle"] / poll["hot"]["floor"],
            "poll_full_vs_floor": poll["full"]["cpu_per_cycle"] / poll["full"]["floor"],
            "poll_daemon_average_vs_floor": average["cpu_per_cycle"] / average["floor"],
        },
    }
    if read300 is not None:
        report["ratios"]["fast_read_vs_floor_mi300"] = read300["fast_read"] / read300["floor_read"]
    return report


def report_table(report: dict[str, Any]) -> list[str]:
    r, read, poll = report["ratios"], report["read"], report["poll"]
    sampler, s64 = report["sampler"], report["sampler_64"]
    rows = [
        (
            f"one fast read vs raw floor ({report['fleet']}, gpu_metrics v1_3)",
            f"{_us(read['fast_read'])} vs {_us(read['floor_read'])} = {r['fast_read_vs_floor']:.2f}x",
            "<= 2x",
            r["fast_read_vs_floor"] <= 2,
        ),
    ]
    if report["read_mi300"] is not None:
        m = report["read_mi300"]
        rows.append(
            (
                "one fast read vs raw floor (MI300X table)",
                f"{_us(m['fast_read'])} vs {_us(m['floor_read'])} = {r['fast_read_vs_floor_mi300']:.2f}x",
                "<= 2x",
                r["fast_read_vs_floor_mi300"] <= 2,
            )
        )
    rows += [
        (
            "one read + full decoder (decode_gpu_metrics, what the poll uses) vs raw floor",
            f"{_us(read['full_decode_read'])} = {r['full_decode_read_vs_floor']:.2f}x",
            "",
            None,
        ),
        (
            f"fast sampler, {sampler['gcds']} GCDs at 100 ms, share of one core",
            f"{r['fast_sampler_core_percent']:.2f} % ({_us(sampler['cpu_per_sample'])} per sample)",
            "<= 2 %",
            r["fast_sampler_core_percent"] <= 2,
        ),
        (
            f"fast sampler CPU per GCD, {s64['gcds']} GCDs / {sampler['gcds']}",
            f"{r['fast_sampler_per_gcd_64_vs_16']:.2f}x ({100 * s64['core_share']:.2f} % of a core at {s64['gcds']})",
            "<= 1.25 (linear)",
            r["fast_sampler_per_gcd_64_vs_16"] <= 1.25,
        ),
        (
            "full poll cycle vs raw-read floor, hot (between slow refreshes)",
            f"{_ms(poll['hot']['cpu_per_cycle'])} vs {_us(poll['hot']['floor'])} = {r['poll_hot_vs_floor']:.1f}x",
            "<= 3x",
            r["poll_hot_vs_floor"] <= 3,
        ),
        (
            "full poll cycle vs raw-read floor, full (slow refresh)",
            f"{_ms(poll['full']['cpu_per_cycle'])} vs {_us(poll['full']['floor'])} = {r['poll_full_vs_floor']:.1f}x",
            "<= 3x",
            r["poll_full_vs_floor"] <= 3,
        ),
        (
            "full poll vs floor, daemon average (1 slow refresh per 10)",
            f"{r['poll_daemon_average_vs_floor']:.1f}x",
            "<= 3x",
            r["poll_daemon_average_vs_floor"] <= 3,
        ),
        ("fast ring per device (window 15 s at 100 ms)", f"{sampler['ring_bytes_per_device']:,} bytes", "", None),
    ]
    width = max(len(row[0]) for row in rows)
    value_width = max(len(row[1]) for row in rows)
    lines = [
        f"| {'target'.ljust(width)} | {'measured'.ljust(value_width)} | goal             | met    |",
        f"|{'-' * (width + 2)}|{'-' * (value_width + 2)}|------------------|--------|",
    ]
    for name, value, goal, met in rows:
        shown = "" if met is None else ("yes" if met else "**NO**")
        lines.append(f"| {name.ljust(width)} | {value.ljust(value_width)} | {goal.ljust(16)} | {shown.ljust(6)} |")
    return lines


RESULTS_FILE = Path(__file__).resolve().parent / "RESULTS-fast.md"


def results_markdown(report: dict[str, Any], table: list[str]) -> str:
    import platform

    load = os.getloadavg()
    header = [
        "# amdgpu-exporter: what sub-second sampling costs",
        "",
        "Written by `python -m bench.fastcost` (do not edit by hand). All ratios from one run, on one",
        f"simulated node ({report['fleet']}, trees on tmpfs, left still while measured).",
        "",
        f"- date (UTC): {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}",
        f"- cpu: {platform.processor() or platform.machine()} x {os.cpu_count()} logical;"
        f" load average at start {report['load_at_start']}, at end {', '.join(f'{v:.2f}' for v in load)}",
        f"- python {platform.python_version()}",
        "",
    ]
    notes = [
        "",
        "How it is measured: each figure is time.process_time() of a child process (every thread), best",
        "of the rounds. One fast read: open, read, close of gpu_metrics plus the channels decoder",
        "(gpu_metrics/sampler_fields.py), against the same open, read, close plus one fixed-offset struct",
        "unpack. The fast sampler: its",
        "own threads sampling every GCD every 100 ms for the run's seconds. The poll: Poller.poll_once()",
        "back to back ('hot' between slow refreshes, 'full' re-reading the slow files too), against a",
        "replay of exactly the files one traced cycle opened (os.open recorded in the child), read with",
        "no parsing.",
    ]
    return "\n".join([*header, *table, *notes]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child"]:
        parser = argparse.ArgumentParser(prog="python -m bench.fastcost child")
        parser.add_argument("kind", choices=sorted(CHILDREN))
        parser.add_argument("--sysfs", required=True)
        parser.add_argument("--limit", type=int, default=0)
        parser.add_argument("--reads", type=int, default=20000)
        parser.add_argument("--seconds", type=float, default=10.0)
        parser.add_argument("--interval", type=float, default=0.1)
        parser.add_argument("--mode", choices=("hot", "full"), default="hot")
        parser.add_argument("--cycles", type=int, default=300)
        args = parser.parse_args(argv[1:])
        from exporter.log import configure_logging

        configure_logging("warn", "json")
        json.dump(CHILDREN[args.kind](args), sys.stdout)
        sys.stdout.write("\n")
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.fastcost", description=__doc__)
    parser.add_argument("--fleet", default="8xMI250X", help="the node under test (default: 16 GCDs)")
    parser.add_argument("--scale-fleet", default="32xMI250X", help="a 64-GCD tree for the scaling run")
    parser.add_argument("--mi300-fleet", default="8xMI300X", help="a tree with MI300 tables ('' = skip)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds the fast sampler runs per round")
    parser.add_argument("--reads", type=int, default=20000, help="reads per read-cost round")
    parser.add_argument("--cycles", type=int, default=300, help="poll cycles per round")
    parser.add_argument("--rounds", type=int, default=3, help="child runs per figure (best kept)")
    parser.add_argument("--json", default="", help="also write the measurements here")
    parser.add_argument("--output", default=str(RESULTS_FILE), help="the markdown report ('' = none)")
    args = parser.parse_args(argv)
    load_at_start = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    report = measure(args)
    report["load_at_start"] = load_at_start
    table = report_table(report)
    print("\n".join(table))
    if args.output:
        Path(args.output).write_text(results_markdown(report, table), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
