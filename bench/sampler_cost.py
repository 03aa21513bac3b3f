"""What the sampler costs in place: the real daemon's CPU with and without it, against its bare reads.

    python -m bench.sampler_cost [--fleet 8xMI250X] [--seconds 45] [--output bench/RESULTS-sampler.md]

On one simulated tree (written once, left still, on tmpfs), one after the other, each measured from
/proc (utime + stime, every thread) over the same window while scraped every 15 s:
  1. the daemon at its defaults (--fast.interval 100ms);
  2. the daemon with the sampler off (--fast.interval 0);
  3. a bare loop in its own process: every 100 ms, every GCD's gpu_metrics read as the sampler reads
     it (kept open, fstat, pread at offset 0) and unpacked (the sampler's extractor), nothing else;
  4. prometheus-node-exporter (drm and hwmon collectors, --path.sysfs at the same tree).
1 to 3 run --rounds times, interleaved, each figure the least of its runs. Prints the sampler's cost
in place (1 - 2) against the bare loop (3), and 1 beside 4.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.procstat import cpu_seconds
from bench.servers import (
    ServerProcess,
    child_env,
    exporter_command,
    free_port,
    http_get,
    node_exporter_version,
    start_node_exporter,
)
from bench.trees import write_tree

SCRAPE_EVERY = 15.0
RESULTS_FILE = Path(__file__).resolve().parent / "RESULTS-sampler.md"


def bare_loop(sysfs: str, interval: float) -> None:
    """The floor: the sampler's reads and nothing else, on its schedule, until killed."""
    from exporter.sources.gpu_metrics.sampler_fields import sampler_values

    drm = Path(sysfs) / "class" / "drm"
    cards = [p for p in drm.iterdir() if p.name.startswith("card") and p.name[4:].isdigit()]
    paths = [os.path.realpath(p / "device" / "gpu_metrics") for p in cards]
    # As the sampler reads (pipeline/sampler.py _read_kept): each table kept open, checked still
    # linked (fstat), re-read from offset 0.
    fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in paths]
    next_tick = time.monotonic()
    while True:
        for fd in fds:
            os.fstat(fd)
            sampler_values(os.pread(fd, 65536, 0))
        next_tick += interval
        time.sleep(max(0.0, next_tick - time.monotonic()))


def start_daemon(sysfs: Path, log_dir: Path, fast_interval: str) -> ServerProcess:
    port = free_port()
    argv = [
        *exporter_command(),
        f"--path.sysfs={sysfs}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--fast.interval={fast_interval}",
        "--source=sysfs",
        "--log.format=json",
        "--log.level=warn",
    ]
    log_path = log_dir / f"daemon-{fast_interval}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env()
        )
    url = f"http://127.0.0.1:{port}/metrics"
    return ServerProcess(f"amdgpu-exporter --fast.interval={fast_interval}", process, url, log_path)


def cpu_per_second(pid: int, seconds: float, scrape: Callable[[], object] | None) -> float:
    """CPU seconds per second of `pid` over `seconds`, scraped every SCRAPE_EVERY (mid-slot) if asked."""
    started, cpu0 = time.monotonic(), cpu_seconds(pid)
    next_scrape = started + SCRAPE_EVERY / 2
    while (now := time.monotonic()) < started + seconds:
        if scrape is not None and now >= next_scrape:
            scrape()
            next_scrape += SCRAPE_EVERY
        time.sleep(min(0.5, max(0.0, started + seconds - now)))
    return (cpu_seconds(pid) - cpu0) / (time.monotonic() - started)


def measure_server(server: ServerProcess, seconds: float, settle: float) -> float:
    try:
        server.wait_ready()
        time.sleep(settle)  # discovery, the first cycles and the sampler's start are not the steady state
        return cpu_per_second(server.pid, seconds, lambda: http_get(server.url))
    finally:
        server.stop()


def measure_bare(sysfs: Path, seconds: float, settle: float) -> float:
    code = f"from bench.sampler_cost import bare_loop; bare_loop({str(sysfs)!r}, 0.1)"
    process = subprocess.Popen([sys.executable, "-c", code], env=child_env(), stdin=subprocess.DEVNULL)
    try:
        time.sleep(settle)
        if process.poll() is not None:
            raise SystemExit(f"the bare loop exited with status {process.returncode} (see its traceback above)")
        return cpu_per_second(process.pid, seconds, None)
    finally:
        process.kill()
        process.wait()


def measure(fleet: str, seconds: float, settle: float, rounds: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """measure_on a tree of `fleet` written for the run (on tmpfs where there is one)."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="sampler-cost-", dir=shm) as tmp:
        return measure_on(write_tree(Path(tmp), fleet), seconds, settle, rounds, Path(tmp))


def measure_on(
    sysfs: Path, seconds: float, settle: float, rounds: int, logs: Path
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each figure the least of `rounds` runs (interleaved): the run least disturbed by the machine's other work."""
    gcds = sum(1 for p in (sysfs / "class" / "drm").iterdir() if p.name[4:].isdigit() and p.name.startswith("card"))
    runs: dict[str, list[float]] = {"daemon_default": [], "daemon_no_sampler": [], "bare_loop": [], "node_exporter": []}
    for _ in range(rounds):
        runs["daemon_default"].append(measure_server(start_daemon(sysfs, logs, "100ms"), seconds, settle))
        runs["daemon_no_sampler"].append(measure_server(start_daemon(sysfs, logs, "0"), seconds, settle))
        runs["bare_loop"].append(measure_bare(sysfs, seconds, settle))
        runs["node_exporter"].append(measure_server(start_node_exporter(sysfs, logs), seconds, settle))
    figures: dict[str, float] = {name: min(values) for name, values in runs.items()}
    figures["gcds"] = gcds
    return figures, runs


def report(fleet: str, seconds: float, r: dict[str, float], runs: dict[str, list[float]]) -> list[str]:
    rise = r["daemon_default"] - r["daemon_no_sampler"]
    versus_node_exporter = r["daemon_default"] / r["node_exporter"]
    ms = 1e3
    return [
        f"### {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, {fleet} ({r['gcds']:.0f} GCDs),"
        f" {seconds:g} s per run, load average at end {', '.join(f'{v:.2f}' for v in os.getloadavg())}",
        "",
        "| figure (CPU ms per second, from /proc)                         | measured |",
        "|----------------------------------------------------------------|----------|",
        f"| daemon at defaults (--fast.interval 100ms), scraped every 15 s | {r['daemon_default'] * ms:8.2f} |",
        f"| daemon with --fast.interval 0, scraped every 15 s              | {r['daemon_no_sampler'] * ms:8.2f} |",
        f"| the sampler in place (the difference)                          | {rise * ms:8.2f} |",
        f"| bare loop: the same reads and unpacks every 100 ms             | {r['bare_loop'] * ms:8.2f} |",
        f"| **sampler in place / bare loop**                               | {rise / r['bare_loop']:7.2f}x |",
        f"| prometheus-node-exporter (drm, hwmon), scraped every 15 s      | {r['node_exporter'] * ms:8.2f} |",
        f"| daemon at defaults / node-exporter                             | {versus_node_exporter:7.2f}x |",
        "",
        "Every run (ms/s), the least of each kept above: "
        + "; ".join(f"{name} {', '.join(f'{v * ms:.2f}' for v in values)}" for name, values in runs.items()),
        "",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sampler_cost", description=__doc__)
    parser.add_argument("--fleet", default="8xMI250X", help="the simulated node (default: 16 GCDs)")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured window per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per figure of the daemon and the bare loop")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after start before measuring")
    parser.add_argument("--output", default=str(RESULTS_FILE), help="markdown file the run is appended to ('' = none)")
    args = parser.parse_args(argv)
    figures, runs = measure(args.fleet, args.seconds, args.settle, args.rounds)
    lines = report(args.fleet, args.seconds, figures, runs)
    print("\n".join(lines))
    if args.output:
        path = Path(args.output)
        if not path.exists():
            path.write_text(
                "# amdgpu-exporter: what the sampler costs in place\n\n"
                "Runs of `python -m bench.sampler_cost`, appended as measured (the machine is shared:"
                f" expect noise). node-exporter: {node_exporter_version()}.\n\n",
                encoding="utf-8",
            )
        with path.open("a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
