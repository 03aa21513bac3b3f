"""Two builds of the daemon, alternated on one tree: the whole daemon's CPU and RSS, before / after.

    python -m bench.ab --seconds 30 --rounds 3 [--fleet 8xMI250X] BEFORE_DIR AFTER_DIR

Each DIR is a copy of the repository (`git archive COMMIT | tar -x -C DIR`); the daemon runs from it
(PYTHONPATH at it) at its defaults on one static tree on tmpfs, scraped every 15 s as Prometheus
asks (OpenMetrics, gzip), measured from /proc (utime + stime) over `--seconds` after a settle, its
RSS taken at the end. The builds take turns, round after round, so a change in the machine's other
work falls on both: on a shared machine, compare the runs of one round and the spread of each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.procstat import cpu_seconds, rss_bytes
from bench.sampler_cost import SCRAPE_EVERY
from bench.servers import exporter_command, free_port, http_get
from bench.trees import write_tree

PROMETHEUS_ASKS = {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"}


def run_once(build: Path, sysfs: Path, seconds: float, settle: float, log: Path) -> tuple[float, float]:
    """(CPU ms per second, RSS MB at the end) of the daemon of `build` on `sysfs`."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(build))
    argv = [*exporter_command(), f"--path.sysfs={sysfs}", f"--web.listen-address=127.0.0.1:{port}"]
    argv += ["--source=sysfs", "--log.format=json", "--log.level=warn"]
    url = f"http://127.0.0.1:{port}/metrics"
    with open(log, "ab") as err:
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http_get(url, headers=PROMETHEUS_ASKS)[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon of {build} did not answer (see {log})")
            time.sleep(0.1)
        time.sleep(settle)
        started, cpu0 = time.monotonic(), cpu_seconds(process.pid)
        next_scrape = started + SCRAPE_EVERY / 2
        while (now := time.monotonic()) < started + seconds:
            if now >= next_scrape:
                http_get(url, headers=PROMETHEUS_ASKS)
                next_scrape += SCRAPE_EVERY
            time.sleep(0.25)
        rate = (cpu_seconds(process.pid) - cpu0) / (time.monotonic() - started)
        return rate * 1e3, rss_bytes(process.pid) / 2**20
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    parser.add_argument("builds", nargs=2, type=Path, help="two copies of the repository (before, after)")
    parser.add_argument("--fleet", default="8xMI250X", help="the simulated node (default: 16 GCDs)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per run")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the first answer before measuring")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for build in args.builds:
        if not (build / "exporter" / "__init__.py").is_file():
            parser.error(f"{build} is not a copy of the repository (no exporter/__init__.py)")
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="bench-ab-", dir=shm) as tmp:
        sysfs = write_tree(Path(tmp), args.fleet)
        runs: dict[Path, list[tuple[float, float]]] = {build: [] for build in args.builds}
        for round_ in range(args.rounds):
            for build in args.builds:
                cpu, rss = run_once(build.resolve(), sysfs, args.seconds, args.settle, Path(tmp) / "daemon.log")
                runs[build].append((cpu, rss))
                load = os.getloadavg()[0]
                print(f"round {round_}  {build}  {cpu:6.2f} ms/s  RSS {rss:5.1f} MB  load {load:.2f}", flush=True)
        for build, results in runs.items():
            cpus = ", ".join(f"{cpu:.2f}" for cpu, _ in results)
            rsss = ", ".join(f"{rss:.1f}" for _, rss in results)
            print(f"{build}: CPU ms/s {cpus}; RSS MB {rsss}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
