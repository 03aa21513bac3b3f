"""Settings for every test session."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness
from tests.harness import Daemon

# A suite started as a background job of a shell without job control inherits SIGINT ignored, and
# every process a test starts would inherit that too: Ctrl-C tests of `snapshot --watch` and the demo
# stack would then wait in vain. Handled here, children start with SIGINT at its default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Starts `amdgpu-exporter` (tests.harness.start_daemon: args, ready=True, ...) as often as the
    test asks, each with its log in its own folder under tmp_path; stops every one at the end."""
    started: list[Daemon] = []

    def start(*args: str, **kwargs: Any) -> Daemon:
        daemon = harness.start_daemon(tmp_path / f"daemon-{len(started)}", *args, **kwargs)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        harness.stop(daemon.process)
