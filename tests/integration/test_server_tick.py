"""The HTTP server wakes once a second (GuardedServer.main_loop), not ten times: what uvicorn's
0.1 s tick did must still happen. The Date header follows the clock, and SIGTERM stops the daemon
at once (the server is woken, not left to notice on its next tick)."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable

from tests.harness import Daemon, wait_until


def date_of(daemon: Daemon) -> float:
    response = daemon.get("/healthz")
    assert response.status_code == 200
    return email.utils.parsedate_to_datetime(response.headers["date"]).timestamp()


def test_the_date_header_follows_the_clock(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon("--demo", "--demo.fleet=1xMI210", "--fast.interval=0")
    first = date_of(daemon)
    assert abs(first - time.time()) <= 3.0
    # Refreshed once a second, as uvicorn's own loop does: a later answer carries a later date.
    later = wait_until(lambda: (d := date_of(daemon)) >= first + 2 and d, "a Date header 2 s later", 15.0)
    assert abs(later - time.time()) <= 3.0


def test_sigterm_stops_the_server_at_once_and_cleanly(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon("--demo", "--demo.fleet=1xMI210", "--fast.interval=0")
    daemon.wait_cycles(1)
    assert daemon.stop() == 0
    stopped = [e for e in daemon.events() if e.get("event") == "stopped"]
    assert stopped and stopped[-1]["abandoned_tasks"] == 0  # the HTTP task ended by itself, within the grace
