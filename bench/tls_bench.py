"""`python -m bench.tls_bench`: what TLS and basic auth cost, against plain HTTP, in one run.

The same exporter on the same still tree, three ways: plain HTTP; TLS (ECDSA P-256 from a
throwaway CA); TLS with basic auth (bcrypt cost 10). For each: wrk throughput with keep-alive (as
Prometheus scrapes: it keeps the connection between scrapes), the exporter's CPU for one scrape
on a kept-alive connection, and for one scrape on a new connection (handshake included, and the
first bcrypt of a credential; later ones hit the credential cache). CPU is the exporter's own
utime+stime from /proc, minus what it spends idle (its poll loop) over the same wall time.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import yaml

from bench import trees
from bench.loadgen import run_wrk
from bench.procstat import cpu_seconds
from bench.servers import ServerProcess, _start, exporter_command, free_port

PASSWORD = "bench-password"
HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"}


def make_pki(folder: Path) -> tuple[Path, Path, Path]:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=bench CA")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (folder / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "ext")  # fmt: skip
    return folder / "ca.crt", folder / "server.crt", folder / "server.key"


@dataclass
class Row:
    name: str
    rps: dict[int, float]
    p99_ms: dict[int, float]
    cpu_keepalive_ms: float
    cpu_new_connection_ms: float


def start(sysfs: Path, work: Path, name: str, web: dict | None) -> tuple[ServerProcess, str]:
    port = free_port()
    argv = [*exporter_command(), f"--path.sysfs={sysfs}", "--source=sysfs", "--interval=1s", "--log.format=json",
            f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    scheme = "http"
    if web is not None:
        path = work / f"{name}.yml"
        path.write_text(yaml.safe_dump(web))
        argv.append(f"--web.config.file={path}")
        scheme = "https" if "tls_server_config" in web else "http"
    server = _start(name, argv, f"{scheme}://127.0.0.1:{port}/metrics", work)
    return server, scheme


def _connection(scheme: str, port: int, context: ssl.SSLContext | None) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def _get(conn: http.client.HTTPConnection, headers: dict[str, str]) -> None:
    conn.request("GET", "/metrics", headers=headers)
    response = conn.getresponse()
    body = response.read()
    if response.status != 200 or not body:
        raise RuntimeError(f"scrape answered {response.status}")


def _idle_rate(pid: int, window: float = 3.0) -> float:
    before = cpu_seconds(pid)
    time.sleep(window)
    return (cpu_seconds(pid) - before) / window


def cpu_per_scrape(server: ServerProcess, scheme: str, port: int, context: ssl.SSLContext | None,
                   headers: dict[str, str], scrapes: int, keepalive: bool) -> float:  # fmt: skip
    idle = _idle_rate(server.pid)
    conn = _connection(scheme, port, context)
    start_cpu, start_wall = cpu_seconds(server.pid), time.monotonic()
    for _ in range(scrapes):
        if not keepalive:
            conn.close()
            conn = _connection(scheme, port, context)
        _get(conn, headers)
    conn.close()
    spent = cpu_seconds(server.pid) - start_cpu - idle * (time.monotonic() - start_wall)
    return max(0.0, spent) / scrapes * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tls_bench", description=__doc__)
    parser.add_argument("--fleet", default="8xMI250X")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2, help="best of N per figure (the cores are shared)")
    parser.add_argument("--output", default=str(Path(__file__).with_name("RESULTS-tls.md")))
    args = parser.parse_args(argv)
    connections = [int(c) for c in args.connections.split(",")]
    with tempfile.TemporaryDirectory(prefix="amdgpu-exporter-tls-bench-") as tmp:
        work = Path(tmp)
        sysfs = trees.write_tree(work, args.fleet)
        ca, cert, key = make_pki(work)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        tls = {"cert_file": str(cert), "key_file": str(key)}
        auth = "Basic " + base64.b64encode(f"prom:{PASSWORD}".encode()).decode()
        variants = [
            ("plain HTTP", None, {}),
            ("TLS", {"tls_server_config": tls}, {}),
            ("TLS + basic auth", {"tls_server_config": tls, "basic_auth_users": {"prom": hashed}},
             {"Authorization": auth}),
        ]  # fmt: skip
        context = ssl.create_default_context(cafile=str(ca))
        rows = []
        for name, web, extra in variants:
            server, scheme = start(sysfs, work, name.replace(" ", "_").replace("+", ""), web)
            try:
                port = int(server.url.rsplit(":", 1)[1].split("/")[0])
                deadline = time.monotonic() + 30
                while True:
                    try:
                        _get(_connection(scheme, port, context), {**HEADERS, **extra})
                        break
                    except (OSError, RuntimeError, http.client.HTTPException):
                        if server.process.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"{name}: exporter not ready:\n{server.log_tail()}") from None
                        time.sleep(0.2)
                headers = {**HEADERS, **extra}
                wrk_headers = tuple(f"{k}: {v}" for k, v in headers.items())
                rps: dict[int, float] = {}
                p99: dict[int, float] = {}
                kept = fresh = float("inf")
                for _ in range(args.rounds):
                    for count in connections:
                        result = run_wrk(server.url, connections=count, duration=args.duration, headers=wrk_headers)
                        if result.errors:
                            raise RuntimeError(f"{name}: wrk saw {result.errors} errors")
                        if result.requests_per_second > rps.get(count, 0.0):
                            rps[count], p99[count] = result.requests_per_second, result.p99_seconds * 1000
                    kept = min(kept, cpu_per_scrape(server, scheme, port, context, headers, args.scrapes, True))
                    fresh = min(fresh, cpu_per_scrape(server, scheme, port, context, headers, args.scrapes, False))
                rows.append(Row(name, rps, p99, kept, fresh))
                print(f"{name}: {rps} req/s, {kept:.2f} ms CPU/scrape kept-alive, {fresh:.2f} ms new connection",
                      file=sys.stderr)  # fmt: skip
            finally:
                server.stop()
    lines = [
        "# TLS and basic auth cost (`python -m bench.tls_bench`)",
        "",
        f"Fleet {args.fleet}, /metrics as Prometheus asks for it (OpenMetrics, gzip); 2 shared cores; "
        f"wrk {args.duration:g} s per point; CPU per scrape over {args.scrapes} sequential scrapes; "
        f"best of {args.rounds} rounds.",
        "",
        "| server | "
        + " | ".join(f"req/s @{c} conn" for c in connections)
        + " | "
        + " | ".join(f"p99 ms @{c}" for c in connections)
        + " | CPU ms/scrape, kept-alive | CPU ms/scrape, new connection |",
        "|---|" + "---|" * (2 * len(connections) + 2),
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | "
            + " | ".join(f"{row.rps[c]:,.0f}" for c in connections)
            + " | "
            + " | ".join(f"{row.p99_ms[c]:.1f}" for c in connections)
            + f" | {row.cpu_keepalive_ms:.2f} | {row.cpu_new_connection_ms:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(10)
    sys.exit(main())
