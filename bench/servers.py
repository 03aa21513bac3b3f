"""Start and stop the HTTP servers under test, each a real process bound to loopback.

- this exporter: the `amdgpu-exporter` daemon on the simulated tree (sysfs source);
- the peer: Debian's prometheus-node-exporter with only its drm and hwmon collectors;
- the ceiling: bench.ceiling, a bare ASGI app on the same uvicorn serving the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODE_EXPORTER = "prometheus-node-exporter"


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


@dataclass
class ServerProcess:
    name: str
    process: subprocess.Popen[bytes]
    url: str  # the /metrics URL
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 30.0) -> bytes:
        """Block until the metrics URL answers 200; returns that first body."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"{self.name} exited {self.process.returncode} at start:\n{self.log_tail()}")
            try:
                status, body = http_get(self.url, timeout=2.0)
                if status == 200:
                    return body
                last = f"HTTP {status}"
            except OSError as error:
                last = str(error)
            time.sleep(0.1)
        raise ServerError(f"{self.name} not ready after {timeout:.0f} s ({last}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # A thread stuck in a hung read can hold the process up: SIGKILL is what a
                # supervisor would do next.
                self.process.kill()
                self.process.wait(timeout=10)


def _start(name: str, argv: Sequence[str], url: str, log_dir: Path) -> ServerProcess:
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child for its lifetime
    try:
        process = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=child_env()
        )
    finally:
        log.close()
    return ServerProcess(name, process, url, log_path)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.pop("PYTHONTRACEMALLOC", None)
    return env


def exporter_command() -> list[str]:
    script = Path(sys.executable).with_name("amdgpu-exporter")
    return [str(script)] if script.exists() else [sys.executable, "-m", "exporter.cli"]


def start_exporter(sysfs: Path, log_dir: Path, *, interval: str = "1s", read_timeout: str = "2s") -> ServerProcess:
    port = free_port()
    argv = [
        *exporter_command(),
        f"--path.sysfs={sysfs}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--interval={interval}",
        f"--read-timeout={read_timeout}",
        "--source=sysfs",
        "--log.format=json",
    ]
    return _start("amdgpu-exporter", argv, f"http://127.0.0.1:{port}/metrics", log_dir)


def start_node_exporter(sysfs: Path, log_dir: Path) -> ServerProcess:
    binary = shutil.which(NODE_EXPORTER)
    if binary is None:
        raise ServerError(f"{NODE_EXPORTER} is not installed (Debian package prometheus-node-exporter)")
    port = free_port()
    argv = [
        binary,
        f"--path.sysfs={sysfs}",
        "--collector.disable-defaults",
        "--collector.drm",
        "--collector.hwmon",
        # No cap on parallel scrapes (default 40, then 503s): its capacity, not its admission control.
        "--web.max-requests=0",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return _start("node-exporter", argv, f"http://127.0.0.1:{port}/metrics", log_dir)


def start_ceiling(body: Path, log_dir: Path, content_type: str = "", gzipped: bool = False) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "bench.ceiling", f"--body={body}", f"--listen=127.0.0.1:{port}"]
    if content_type:
        argv.append(f"--content-type={content_type}")
    if gzipped:
        argv.append("--gzip")
    return _start("bare-asgi", argv, f"http://127.0.0.1:{port}/metrics", log_dir)


def node_exporter_version() -> str:
    binary = shutil.which(NODE_EXPORTER)
    if binary is None:
        return "absent"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    first = (out.stdout or out.stderr).splitlines()
    return first[0] if first else "unknown"
