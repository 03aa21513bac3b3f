"""The one test harness for tests that run the daemon (or any server) as a real process.

- `free_port()` and `start_listening()`: a loopback port, and a server started on it that is known
  to listen there itself (a lost race for the port starts it again on another one).
- `start_daemon()` / the `daemon` fixture (tests/conftest.py): `amdgpu-exporter` on a simulated
  tree, JSON logs in a file, stopped by the fixture.
- `Daemon.scrape()`, `Daemon.wait_cycles(n)`, `Daemon.wait_for(check)`: scrape /metrics; wait on
  the daemon's own poll-cycle counter (`amdgpu_exporter_poll_duration_seconds_count`), not on
  seconds. The timeouts here only end a broken run; no test passes or fails on how long a cycle
  takes on a busy machine.
- `scrape()`, `parse()` and `value()` for a URL or a port; `wait_until()` for anything else.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

EXPORTER = str(Path(sys.executable).parent / "amdgpu-exporter")
CYCLES = "amdgpu_exporter_poll_duration_seconds_count"  # the poll cycles the daemon has published

# (family sample name, sorted labels) -> value
Labels = tuple[tuple[str, str], ...]
Series = dict[tuple[str, Labels], float]

# A bound that only ends a broken run: a wait that needs it has failed, however loaded the machine.
BROKEN_RUN = 60.0


# --- ports ---------------------------------------------------------------------------------------


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


def _early_exit_words(process: subprocess.Popen[Any], log: Path | None) -> str:
    if log is not None:
        return log.read_text(errors="replace")
    err = process.stderr.read() if process.stderr is not None else ""
    return err.decode(errors="replace") if isinstance(err, bytes) else err


def start_listening(
    argv_for: Callable[[int], Sequence[str]],
    *,
    timeout: float = BROKEN_RUN,
    attempts: int = 5,
    log_for: Callable[[int], Path] | None = None,
    **popen_kwargs: Any,
) -> tuple[subprocess.Popen[Any], int]:
    """Start the server argv_for(port) on a free port; return once that very process listens there.

    free_port's port can be taken by another process before the server binds it. A server that
    exits saying so (BIND_FAILURES, on its stderr: a pipe, or the file log_for(port) names) is
    started again on another port; any other early exit fails with the server's own words.
    """
    for attempt in range(1, attempts + 1):
        port = free_port()
        log = log_for(port) if log_for is not None else None
        kwargs = dict(popen_kwargs)
        if log is not None:
            kwargs["stderr"] = log.open("wb")
        else:
            kwargs.setdefault("stderr", subprocess.PIPE)
        process: subprocess.Popen[Any] = subprocess.Popen(list(argv_for(port)), **kwargs)
        if log is not None:
            kwargs["stderr"].close()  # the child holds its own copy
        deadline = time.monotonic() + timeout
        while not listens_on(process.pid, port):
            if process.poll() is not None:
                err = _early_exit_words(process, log)
                if attempt < attempts and any(words in err.lower() for words in BIND_FAILURES):
                    stop(process)  # closes its pipes
                    break  # lost the race for the port: another port
                stop(process)
                raise AssertionError(f"{argv_for(port)[0]} exited with {process.returncode} before listening: {err}")
            if time.monotonic() > deadline:
                stop(process)
                raise AssertionError(f"{argv_for(port)[0]} did not listen on 127.0.0.1:{port} within {timeout} s")
            time.sleep(0.02)
        else:
            return process, port
    raise AssertionError(f"no free port held for {attempts} attempts")


def wait_for_port(port: int, process: subprocess.Popen[str], timeout: float = BROKEN_RUN) -> None:
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


def stop(process: subprocess.Popen[Any], timeout: float = 5.0) -> int:
    """Terminate a process we started (by its own pid), killing it if it will not go; its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    return int(process.returncode)


# --- scraping ------------------------------------------------------------------------------------


def _url(where: int | str, path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{where}{path}" if isinstance(where, int) else where


def parse(text: str) -> Series:
    """Every sample of a text exposition, by (sample name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_text(where: int | str, client: httpx.Client | None = None, timeout: float = 10.0) -> str:
    """The text format body of /metrics on 127.0.0.1:`where` (a port) or at `where` (a URL)."""
    get = client.get if client is not None else httpx.get
    response = get(_url(where), headers={"Accept": "text/plain"}, timeout=timeout)
    response.raise_for_status()
    return response.text


def scrape(where: int | str, client: httpx.Client | None = None) -> Series:
    """One scrape of /metrics (a port on 127.0.0.1, or a URL), parsed."""
    return parse(scrape_text(where, client))


def value(series: Series, name: str, **labels: str) -> float | None:
    """The sample `name` with exactly these labels, or None."""
    return series.get((name, tuple(sorted(labels.items()))))


def poll_cycles(where: int | str, client: httpx.Client | None = None) -> int:
    """Poll cycles the daemon has published: the count of its poll-duration histogram (0 before the first)."""
    prefix = CYCLES + " "
    text = scrape_text(where, client)
    return next((int(float(line[len(prefix) :])) for line in text.splitlines() if line.startswith(prefix)), 0)


def wait_for_cycles(where: int | str, cycles: int, timeout: float = BROKEN_RUN) -> None:
    """Wait until the daemon has published `cycles` poll cycles: a condition, not a guess at how long
    cycles take on a busy machine."""
    deadline = time.monotonic() + timeout
    while (done := poll_cycles(where)) < cycles:
        assert time.monotonic() < deadline, f"{done} of {cycles} poll cycles within {timeout} s"
        time.sleep(0.05)


_NOT_YET = (httpx.HTTPError, OSError, ValueError, KeyError)


def wait_until(
    check: Callable[[], Any],
    what: str = "the condition",
    timeout: float = BROKEN_RUN,
    process: subprocess.Popen[Any] | None = None,
    step: float = 0.05,
) -> Any:
    """Call `check` until it returns something true, and return that. A check that raises an HTTP,
    OS, value or key error is 'not yet'; a `process` that exits meanwhile fails the wait at once.
    The timeout only ends a broken run."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process exited with {process.returncode} while waiting for {what}")
        try:
            found = check()
        except _NOT_YET:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g} s")
        time.sleep(step)


def wait_for_series(
    where: int | str,
    check: Callable[[Series], bool],
    what: str = "",
    timeout: float = BROKEN_RUN,
    process: subprocess.Popen[Any] | None = None,
    step: float = 0.1,
) -> Series:
    """Scrape /metrics (a port on 127.0.0.1, or a URL) every `step` s until `check(series)` holds; that scrape."""
    last: list[Series] = [{}]

    def scraped() -> Series | None:
        last[0] = scrape(where)
        return last[0] if check(last[0]) else None

    try:
        return wait_until(scraped, what or "the condition", timeout, process, step)
    except AssertionError as error:
        ups = [(k, v) for k, v in last[0].items() if k[0] == "amdgpu_up"]
        raise AssertionError(f"{error}; last amdgpu_up: {ups}") from None


# --- the daemon ----------------------------------------------------------------------------------


class Daemon:
    """`amdgpu-exporter` as a real process on 127.0.0.1:port, its stderr (JSON logs) in a file."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path, scheme: str = "http") -> None:
        self.process = process
        self.port = port
        self.log = log
        self.base = f"{scheme}://127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, path: str) -> str:
        return self.base + path

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 10)
        return httpx.get(self.url(path), **kwargs)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log events so far (those named `name`)."""
        found = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if name is None or event.get("event") == name:
                    found.append(event)
        return found

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"the exporter exited with {self.process.returncode}: {self.stderr()}")

    def scrape_text(self, client: httpx.Client | None = None) -> str:
        return scrape_text(self.url("/metrics"), client)

    def scrape(self, client: httpx.Client | None = None) -> Series:
        return parse(self.scrape_text(client))

    def cycles(self) -> int:
        return poll_cycles(self.url("/metrics"))

    def wait_ready(self, client: httpx.Client | None = None, timeout: float = BROKEN_RUN) -> None:
        """Until /readyz says 200 (the first cycle is published)."""
        get = client.get if client is not None else httpx.get
        wait_until(
            lambda: get(self.url("/readyz"), timeout=5).status_code == 200,
            f"/readyz on {self.base}: {self.stderr()[-2000:]}",
            timeout,
            self.process,
        )

    def wait_cycles(self, more: int = 1, timeout: float = BROKEN_RUN) -> int:
        """Until `more` poll cycles after the ones published now; the new count."""
        target = self.cycles() + more
        return wait_until(
            lambda: (n := self.cycles()) >= target and n, f"{more} more poll cycles", timeout, self.process
        )

    def wait_for(
        self, check: Callable[[Series], bool], what: str = "", timeout: float = BROKEN_RUN, step: float = 0.1
    ) -> Series:
        """Scrape every `step` s until `check(series)` holds; that scrape."""
        return wait_for_series(self.url("/metrics"), check, what, timeout, self.process, step)

    def stop(self, timeout: float = BROKEN_RUN) -> int:
        """SIGTERM, and its exit code (killed after `timeout`, which fails)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                stop(self.process)
                raise AssertionError(f"still running {timeout} s after SIGTERM") from None
        return stop(self.process)


def start_daemon(
    folder: Path,
    *args: str,
    ready: bool = True,
    wrapper: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    scheme: str = "http",
    port: int | None = None,
    **popen_kwargs: Any,
) -> Daemon:
    """`amdgpu-exporter *args` (after `wrapper`, a command that execs it) on a free loopback port,
    JSON logs in folder/exporter-PORT.log; by default waits for /readyz (plain HTTP only).

    A --web.listen-address or --web.systemd-socket among args is used as is: `port` (or the first
    such address's) is then the one the Daemon speaks to, and nothing retries a port taken meanwhile.
    """
    folder.mkdir(parents=True, exist_ok=True)
    argv = [*wrapper, EXPORTER, "--log.format=json", *args]
    if env is not None:
        popen_kwargs["env"] = dict(env)
    popen_kwargs.setdefault("stdout", subprocess.DEVNULL)
    own_address = any(a.startswith("--web.listen-address") or a == "--web.systemd-socket" for a in args)
    if own_address or port is not None:
        if port is None:
            port = next((int(a.rsplit(":", 1)[1]) for a in args if a.startswith("--web.listen-address=")), 0)
        if not own_address:
            argv.append(f"--web.listen-address=127.0.0.1:{port}")
        log = folder / f"exporter-{port}.log"
        with log.open("wb") as err:
            process = subprocess.Popen(argv, stderr=err, **popen_kwargs)
    else:
        process, port = start_listening(
            lambda p: [*argv, f"--web.listen-address=127.0.0.1:{p}"],
            log_for=lambda p: folder / f"exporter-{p}.log",
            **popen_kwargs,
        )
        log = folder / f"exporter-{port}.log"
    daemon = Daemon(process, port, log, scheme)
    if ready:
        if scheme != "http":
            raise ValueError("wait for readiness over TLS with daemon.wait_ready(client)")
        try:
            daemon.wait_ready()
        except BaseException:
            stop(process)
            raise
    return daemon


# --- the daemon started the older way: a stderr pipe ---------------------------------------------


def start_exporter(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon as a real process listening on a free loopback port, JSON logs on its stderr pipe."""
    return start_listening(
        lambda port: [EXPORTER, *args, f"--web.listen-address=127.0.0.1:{port}", "--log.format=json"],
        stdout=subprocess.DEVNULL,
    )


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = BROKEN_RUN) -> None:
    """Wait for /readyz (first poll cycle done); fail with the daemon's stderr if it exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            raise AssertionError(f"exporter exited with {process.returncode}: {err}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"exporter on 127.0.0.1:{port} not ready within {timeout} s")
