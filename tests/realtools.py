"""Helpers for tests that run real tools (rocm-smi, librocm_smi64, node_exporter, prometheus ...).

A missing tool skips the test on a developer machine but FAILS it in CI (CI=true), so CI can
never pass by quietly testing nothing.

librocm_smi64 hard-codes /sys, so tools that use it run in a private mount namespace with the
simulated tree bind-mounted over /sys and a private tmpfs on /dev/shm (the library keeps
process-shared mutexes there; a private one means no stale lock from another test can block it).
Needs root (CAP_SYS_ADMIN) for unshare/mount.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

ROCM_SMI_LIBRARY = "/usr/lib/librocm_smi64.so.1"
NODE_EXPORTER = "prometheus-node-exporter"

# $0 is the tree, "$@" the command: bind the tree over /sys, give the library its own /dev/shm
_NAMESPACE_SCRIPT = 'mount --bind "$0" /sys && mount -t tmpfs tmpfs /dev/shm && exec "$@"'


def _missing(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (required in CI)")
    pytest.skip(message)


def require_tool(name: str, path: str | None = None) -> str:
    """Path of an executable; skip when missing, fail under CI=true.

    An absolute path is taken as is; otherwise the project's venv (PyPI-installed tools) is
    searched first, then PATH; `path` pins the search to one folder.
    """
    if os.path.isabs(name):
        found = name if os.access(name, os.X_OK) else None
    elif path:
        found = shutil.which(name, path=path)
    else:
        found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not found:
        _missing(f"{name} is not installed (see DEBIAN_TEST_PACKAGES in the Makefile and the test extras)")
    assert found is not None
    return found


def require_file(path: str, what: str) -> str:
    if not os.path.exists(path):
        _missing(f"{what} ({path}) is not installed")
    return path


def require_root() -> None:
    if os.geteuid() != 0:
        _missing("running tools in a private mount namespace needs root")


def namespace_argv(sys_dir: Path, argv: Sequence[str]) -> list[str]:
    """The command line that runs argv with sys_dir mounted over /sys in a private namespace."""
    require_root()
    unshare = require_tool("unshare")
    return [unshare, "-m", "--propagation", "private", "sh", "-c", _NAMESPACE_SCRIPT, str(sys_dir), *argv]


def run_in_sysfs_namespace(
    sys_dir: Path, argv: list[str], timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run argv to completion with sys_dir as /sys; text output captured."""
    return subprocess.run(
        namespace_argv(sys_dir, argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        check=False,
    )


def start_in_sysfs_namespace(
    sys_dir: Path, argv: list[str], env: Mapping[str, str] | None = None, **popen_kwargs: object
) -> subprocess.Popen[str]:
    """Start a long-running argv (a server) with sys_dir as /sys. The caller stops it."""
    kwargs: dict[str, object] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    kwargs.update(popen_kwargs)
    return subprocess.Popen(  # type: ignore[call-overload]
        namespace_argv(sys_dir, argv), env=dict(env) if env is not None else None, **kwargs
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: another process can take it before the
    caller binds it, so a server started on it should go through start_listening, which retries.
    Under pytest-xdist each worker hands out its own share of the ports: two workers never race for one."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port // 2 % workers == worker:  # by port // 2: bind() hands out even ports first
            return port


_TCP_LISTEN = "0A"
# What a server prints when its port was taken: the exporter's own sentence, and Go's / the kernel's.
BIND_FAILURES = ("cannot listen on", "address already in use")


def _listening_socket_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == _TCP_LISTEN:
                inodes.add(fields[9])
    return inodes


def listens_on(pid: int, port: int) -> bool:
    """True when process `pid` itself holds a socket listening on TCP `port` (not merely someone)."""
    inodes = _listening_socket_inodes(port)
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def start_listening(
    argv_for: Callable[[int], Sequence[str]], *, timeout: float = 20.0, attempts: int = 5, **popen_kwargs: Any
) -> tuple[subprocess.Popen[Any], int]:
    """Start the server argv_for(port) on a free port; return once that very process listens there.

    free_port's port can be taken by another process before the server binds it. A server that
    exits saying so (BIND_FAILURES, on its stderr, which must be a pipe) is started again on another
    port; any other early exit fails with the server's own words.
    """
    popen_kwargs.setdefault("stderr", subprocess.PIPE)
    for attempt in range(1, attempts + 1):
        port = free_port()
        process: subprocess.Popen[Any] = subprocess.Popen(list(argv_for(port)), **popen_kwargs)
        deadline = time.monotonic() + timeout
        while not listens_on(process.pid, port):
            if process.poll() is not None:
                err = process.stderr.read() if process.stderr is not None else ""
                err = err.decode(errors="replace") if isinstance(err, bytes) else err
                if attempt < attempts and any(words in err.lower() for words in BIND_FAILURES):
                    stop(process)  # closes its pipes
                    break  # lost the race for the port: another port
                raise AssertionError(f"{argv_for(port)[0]} exited with {process.returncode} before listening: {err}")
            if time.monotonic() > deadline:
                stop(process)
                raise AssertionError(f"{argv_for(port)[0]} did not listen on 127.0.0.1:{port} within {timeout} s")
            time.sleep(0.02)
        else:
            return process, port
    raise AssertionError(f"no free port held for {attempts} attempts")


def wait_for_port(port: int, process: subprocess.Popen[str], timeout: float = 10.0) -> None:
    """Wait until something listens on 127.0.0.1:port; fail early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"process exited with {process.returncode} before listening: {err or out}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listened on 127.0.0.1:{port} within {timeout} s")


def stop(process: subprocess.Popen[str], timeout: float = 5.0) -> None:
    """Terminate a process we started (by its own pid), killing it if it will not go."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


EXPORTER = str(Path(sys.executable).parent / "amdgpu-exporter")


def start_exporter(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon as a real process listening on a free loopback port, JSON logs on its stderr pipe."""
    return start_listening(
        lambda port: [EXPORTER, *args, f"--web.listen-address=127.0.0.1:{port}", "--log.format=json"],
        stdout=subprocess.DEVNULL,
    )


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Wait for /readyz (first poll cycle done); fail with the daemon's stderr if it exited."""
    import httpx  # here, not at the top: the helpers above serve tests that never speak HTTP

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            raise AssertionError(f"exporter exited with {process.returncode}: {err}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"exporter on 127.0.0.1:{port} not ready within {timeout} s")


def poll_cycles(port: int) -> int:
    """Poll cycles the daemon on 127.0.0.1:port has published: the count of its poll-duration histogram."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": "text/plain"}, timeout=5).text
    prefix = "amdgpu_exporter_poll_duration_seconds_count "
    return next((int(float(line[len(prefix) :])) for line in text.splitlines() if line.startswith(prefix)), 0)


def wait_for_cycles(port: int, cycles: int, timeout: float = 30.0) -> None:
    """Wait until the daemon has published `cycles` poll cycles: a condition, not a guess at how long
    cycles take on a busy machine."""
    deadline = time.monotonic() + timeout
    while (done := poll_cycles(port)) < cycles:
        assert time.monotonic() < deadline, f"{done} of {cycles} poll cycles within {timeout} s"
        time.sleep(0.1)


def wait_until(condition: Callable[[], bool]) -> None:
    """Wait for a condition other threads bring about (the limit, 15 s, only ends a broken run)."""
    for _ in range(3000):
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError("condition never met")
