"""The harness survives losing a port: free_port's port taken before the daemon binds it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator

import pytest

from tests import harness
from tests.harness import Daemon, listens_on, start_exporter, stop, wait_ready

pytestmark = pytest.mark.integration


@pytest.fixture
def racy_ports(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[int]]]:
    """free_port hands out a port another socket already listens on first, then free ones."""
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", 0))
        thief.listen()
        taken = thief.getsockname()[1]
        real_free_port = harness.free_port
        ports: Iterator[int] = iter([taken])
        handed_out: list[int] = []

        def racy_free_port() -> int:
            port = next(ports, None) or real_free_port()
            handed_out.append(port)
            return port

        monkeypatch.setattr(harness, "free_port", racy_free_port)
        yield taken, handed_out


def test_a_port_taken_before_the_daemon_binds_it_is_retried(racy_ports: tuple[int, list[int]]) -> None:
    taken, handed_out = racy_ports
    proc, port = start_exporter("--demo", "--demo.fleet=1xMI210")
    try:
        assert handed_out[0] == taken and port == handed_out[-1] != taken and len(handed_out) == 2
        assert listens_on(proc.pid, port) and not listens_on(proc.pid, taken)
        wait_ready(port, proc)
        assert ("amdgpu_up", (("gpu", "0"),)) in harness.scrape(port)
    finally:
        stop(proc)


def test_the_daemon_fixture_retries_a_taken_port_too(
    racy_ports: tuple[int, list[int]], start_daemon: Callable[..., Daemon]
) -> None:
    taken, handed_out = racy_ports
    daemon = start_daemon("--demo", "--demo.fleet=1xMI210", "--interval=100ms")
    assert handed_out[0] == taken and daemon.port == handed_out[-1] != taken and len(handed_out) == 2
    assert listens_on(daemon.pid, daemon.port) and not listens_on(daemon.pid, taken)
    first = daemon.cycles()
    assert first >= 1, "ready means a published cycle"
    assert daemon.wait_cycles(2) >= first + 2
    assert harness.value(daemon.scrape(), "amdgpu_up", gpu="0") == 1
    assert daemon.stop() == 0


def test_listens_on_tells_the_holder_from_others() -> None:
    with socket.socket() as ours:
        ours.bind(("127.0.0.1", 0))
        port = ours.getsockname()[1]
        assert not listens_on(os.getpid(), port)  # bound, not listening
        ours.listen()
        assert listens_on(os.getpid(), port)
        assert not listens_on(1, port)
