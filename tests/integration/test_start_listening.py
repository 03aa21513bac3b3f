"""start_exporter survives losing its port: free_port's port taken before the daemon binds it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests import realtools
from tests.realtools import listens_on, start_exporter, stop, wait_ready

pytestmark = pytest.mark.integration


def test_a_port_taken_before_the_daemon_binds_it_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", 0))
        thief.listen()
        taken = thief.getsockname()[1]
        real_free_port = realtools.free_port
        ports: Iterator[int] = iter([taken])
        handed_out: list[int] = []

        def racy_free_port() -> int:
            port = next(ports, None) or real_free_port()
            handed_out.append(port)
            return port

        monkeypatch.setattr(realtools, "free_port", racy_free_port)
        proc, port = start_exporter("--demo", "--demo.fleet=1xMI210")
        try:
            assert handed_out[0] == taken and port == handed_out[-1] != taken and len(handed_out) == 2
            assert listens_on(proc.pid, port) and not listens_on(proc.pid, taken)
            wait_ready(port, proc)
            assert b"amdgpu_up" in httpx.get(f"http://127.0.0.1:{port}/metrics").content
        finally:
            stop(proc)


def test_listens_on_tells_the_holder_from_others() -> None:
    with socket.socket() as ours:
        ours.bind(("127.0.0.1", 0))
        port = ours.getsockname()[1]
        assert not listens_on(os.getpid(), port)  # bound, not listening
        ours.listen()
        assert listens_on(os.getpid(), port)
        assert not listens_on(1, port)
