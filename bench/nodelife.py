"""`python -m bench.nodelife`: a node's worst day, as figures (issue 10).

- soak: 100,000 poll cycles of the real Poller and Pipeline (rules, publish; /metrics rendered
  every 100th cycle) on a simulated 8-GCD node with one GCD hung (a named pipe) and a rediscovery
  every 1,000 cycles: RSS growth, thread count and fd count at the start and the end;
- load: the real daemon on a simulated 16-GCD node with one GCD hung, under 1,000 wrk connections,
  then with 200 slow clients (100 that send their request a byte a second, 100 that never read the
  answer) while a well-behaved scraper measures its latency; threads, fds and RSS of the daemon,
  /readyz throughout, and the time SIGTERM takes with all of that going on.

Results go to stdout and bench/NODELIFE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import servers
from bench.procstat import rss_bytes, thread_count

RESULTS_FILE = Path(__file__).with_name("NODELIFE.md")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_names() -> str:
    """Live threads by pool (the part of the name before the last '-' or ':')."""
    counts: dict[str, int] = {}
    for thread in threading.enumerate():
        pool = re.split(r"[-:_]", thread.name, maxsplit=1)[0]
        counts[pool] = counts.get(pool, 0) + 1
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))


def hang(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o444)


# --- soak ---------------------------------------------------------------------------------------


def soak(cycles: int, work: Path, warm: int = 1000) -> list[str]:
    from exporter.alerting.rulefile import default_rule_file
    from exporter.cycle import Pipeline
    from exporter.pipeline.poller import Poller
    from exporter.simulator import Simulator
    from exporter.sources.sysfs import SysfsSource

    root = work / "soak" / "sys"
    simulator = Simulator(root, fleet="4xMI250X", scenario="training", seed=7)
    simulator.write_tree()
    simulator.tick(10.0)
    hung = simulator.truth()[3].identity
    source = SysfsSource(root, slow_interval=0.05, read_timeout=0.05)
    poller = Poller(source, interval=0.001, read_timeout=0.05, discovery_interval=1e9)
    pipeline = Pipeline(source_name="sysfs", source_reason="soak", rules=default_rule_file().rules)
    poller.on_snapshot = pipeline.on_snapshot
    pid = os.getpid()

    async def run() -> list[str]:
        assert await poller.discover_within(10.0) is not None
        hang(Path(hung.device_dir) / "gpu_metrics")  # after discovery: the poll path gets stuck in it too
        marks: dict[str, tuple[int, int, int, float]] = {}
        names: dict[str, str] = {}
        most = 0
        started = time.monotonic()
        for cycle in range(cycles + warm):
            if cycle % 1000 == 999:
                poller._start_discovery()  # a rediscovery every 1,000 cycles, merged between cycles
            poller._finish_discovery()
            snapshot = await poller.poll_once()
            pipeline.on_snapshot(snapshot)
            if cycle % 100 == 0 and pipeline.state.metrics is not None:
                pipeline.state.metrics.body(openmetrics=True, gzipped=True)
            if cycle == warm:
                marks["start"] = (rss_bytes(pid), thread_count(pid), fd_count(pid), time.monotonic())
                names["start"] = thread_names()
            if cycle > warm:
                most = max(most, thread_count(pid)) if cycle % 97 == 0 else most
        marks["end"] = (rss_bytes(pid), thread_count(pid), fd_count(pid), time.monotonic())
        names["end"] = thread_names()
        up = sum(d.up for d in snapshot.devices)
        (rss0, threads0, fds0, t0), (rss1, threads1, fds1, t1) = marks["start"], marks["end"]
        took = time.monotonic() - started
        return [
            f"- soak: {cycles:,} poll cycles (after {warm:,} warm-up) of 8 GCDs, one hung (gpu_metrics a named pipe),"
            f" rediscovery every 1,000 cycles ({snapshot.discoveries} merged), rules and publish every cycle,"
            f" /metrics rendered every 100th: {took:.0f} s, {1e3 * (t1 - t0) / cycles:.2f} ms per cycle",
            f"- RSS {rss0 / 2**20:.1f} MiB -> {rss1 / 2**20:.1f} MiB ({(rss1 - rss0) / 2**10:+.0f} KiB,"
            f" {(rss1 - rss0) / cycles:+.2f} B per cycle)",
            f"- threads {threads0} -> {threads1} (most seen {most}; bound: 8 + 2 readers, 8 + 2 identify, 1 discovery,"
            f" 8 pcie_bw, main); open fds {fds0} -> {fds1}",
            f"- threads at the start: {names['start']}; at the end: {names['end']}",
            f"- devices up at the end: {up} of {len(snapshot.devices)} (the hung one down: "
            f"{next(d.down_reason for d in snapshot.devices if d.identity.pci_bus_id == hung.pci_bus_id)})",
        ]

    try:
        return asyncio.run(run())
    finally:
        poller.close()


# --- load ---------------------------------------------------------------------------------------


def wrk(url: str, connections: int, seconds: float) -> dict[str, float]:
    threads = 2
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency", "--timeout", "10s", url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    ).stdout
    result: dict[str, float] = {}
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        result["rps"] = float(m.group(1))
    if m := re.search(r"(\d+) requests in", out):
        result["requests"] = float(m.group(1))
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        result["non2xx"] = float(m.group(1))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["socket_errors"] = float(sum(int(g) for g in errors.groups())) if errors else 0.0
    for pct in ("50", "99"):
        if m := re.search(rf"\s{pct}%\s+([\d.]+)(us|ms|s)\b", out):
            scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
            result[f"p{pct}_ms"] = float(m.group(1)) * scale
    return result


def slow_senders(host: str, port: int, count: int, stop: threading.Event) -> list[socket.socket]:
    """Clients that send their request one byte a second (slowloris)."""
    request = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    socks = []
    for _ in range(count):
        s = socket.create_connection((host, port))
        socks.append(s)

    def drip() -> None:
        for i in range(len(request)):
            if stop.wait(1.0):
                return
            for s in socks:
                with contextlib.suppress(OSError):
                    s.send(request[i : i + 1])

    threading.Thread(target=drip, daemon=True).start()
    return socks


def non_readers(host: str, port: int, count: int) -> list[socket.socket]:
    """Clients that ask for /metrics again and again and never read an answer."""
    socks = []
    request = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() * 50
    for _ in range(count):
        s = socket.create_connection((host, port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        with contextlib.suppress(OSError):
            s.send(request)
        socks.append(s)
    return socks


def load(work: Path, connections: int, seconds: float) -> list[str]:
    from exporter.simulator import Simulator

    root = work / "load" / "sys"
    simulator = Simulator(root, fleet="8xMI250X", scenario="training", seed=7)
    simulator.write_tree()
    simulator.tick(10.0)
    exporter = servers.start_exporter(root, work, interval="1s", read_timeout="2s")
    lines = []
    try:
        exporter.wait_ready()
        time.sleep(2)
        hung = simulator.truth()[1].identity
        hang(Path(hung.device_dir) / "gpu_metrics")
        time.sleep(3.5)
        pid = exporter.pid
        base = exporter.url.removesuffix("/metrics")
        host, port = "127.0.0.1", int(base.rsplit(":", 1)[1])
        _, body = servers.http_get(exporter.url)
        ups = re.findall(rb'^amdgpu_up\{gpu="\d+"\} ([01])', body, re.M)
        lines.append(
            f"- node: 16 GCDs (8xMI250X), one hung (gpu_metrics a named pipe): {ups.count(b'1')} of {len(ups)} up,"
            f" /metrics {len(body) / 1024:.0f} KiB"
        )
        before = (thread_count(pid), fd_count(pid), rss_bytes(pid))
        result = wrk(exporter.url, connections, seconds)
        after = (thread_count(pid), fd_count(pid), rss_bytes(pid))
        lines.append(
            f"- wrk {connections} connections, {seconds:g} s: {result.get('rps', 0):.0f} requests/s,"
            f" p50 {result.get('p50_ms', 0):.1f} ms, p99 {result.get('p99_ms', 0):.1f} ms,"
            f" non-2xx {result.get('non2xx', 0):.0f}, socket errors {result.get('socket_errors', 0):.0f}"
        )
        lines.append(
            f"- daemon during it: threads {before[0]} -> {after[0]}, fds {before[1]} -> {after[1]},"
            f" RSS {before[2] / 2**20:.1f} -> {after[2] / 2**20:.1f} MiB"
        )
        stop = threading.Event()
        slow = slow_senders(host, port, 100, stop)
        stuck = non_readers(host, port, 100)
        time.sleep(1.0)
        latencies = []
        ready_ok = 0
        probes = 40
        for _ in range(probes):
            started = time.monotonic()
            code, _ = servers.http_get(exporter.url, timeout=10)
            latencies.append((time.monotonic() - started) * 1e3 if code == 200 else float("inf"))
            code, _ = servers.http_get(base + "/readyz", timeout=10)
            ready_ok += code == 200
            time.sleep(0.1)
        finite = sorted(x for x in latencies if x != float("inf"))
        lines.append(
            f"- with 100 slow senders and 100 clients that never read: {len(finite)} of {probes} scrapes answered,"
            f" median {statistics.median(finite):.1f} ms, worst {finite[-1]:.1f} ms; /readyz 200 in {ready_ok} of"
            f" {probes}; daemon threads {thread_count(pid)}, fds {fd_count(pid)}, RSS {rss_bytes(pid) / 2**20:.1f} MiB"
        )
        started = time.monotonic()
        exporter.process.terminate()
        try:
            exporter.process.wait(10)
            how = f"exit {exporter.process.returncode}"
        except subprocess.TimeoutExpired:
            how = "still running after 10 s"
        lines.append(
            f"- SIGTERM with the GCD hung and the slow clients connected: {how} after"
            f" {time.monotonic() - started:.2f} s"
        )
        stop.set()
        for s in slow + stuck:
            s.close()
    finally:
        exporter.stop()
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nodelife", description=__doc__)
    parser.add_argument("--cycles", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--only", choices=("soak", "load"), default=None)
    parser.add_argument("--output", default=str(RESULTS_FILE))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-nodelife-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    lines = [
        "# A node's worst day, measured (`python -m bench.nodelife`)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs (shared),"
        f" Python {sys.version.split()[0]}.",
        "",
    ]
    try:
        if args.only in (None, "soak"):
            lines += ["## Soak", "", *soak(args.cycles, work), ""]
        if args.only in (None, "load"):
            lines += ["## Load with one GCD hung", "", *load(work, args.connections, args.seconds), ""]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
