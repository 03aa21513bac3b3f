"""No command leaves its --demo tree behind, whatever ends it: SIGTERM, SIGINT or SIGHUP unwind and
remove it; after a SIGKILL, which nothing can handle, the next demo removes the orphan."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.realtools import EXPORTER, start_exporter, wait_ready, wait_until

pytestmark = pytest.mark.integration

SHM = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())


def _trees(pid: int) -> list[Path]:
    return sorted(SHM.glob(f"amdgpu-exporter-demo-{pid}-*"))


def _started_as_a_background_job() -> None:
    # SIGINT as a background job of a script starts it: ignored, as a shell leaves it there; SIGHUP at
    # its default even when the suite runs under nohup (which ignores it for every child: the demo would
    # rightly keep it ignored, and the SIGHUP case could never end it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _watch() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [EXPORTER, "snapshot", "--demo", "--watch", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_started_as_a_background_job,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_snapshot_watch_removes_its_tree_on_signal(sig: signal.Signals) -> None:
    proc = _watch()
    try:
        wait_until(lambda: bool(_trees(proc.pid)) or proc.poll() is not None)
        assert _trees(proc.pid), "the demo never wrote its tree"
        proc.send_signal(sig)
        assert proc.wait(30) == 128 + sig
        assert _trees(proc.pid) == []
    finally:
        proc.kill()


def test_serve_removes_its_tree_on_sigterm() -> None:
    proc, port = start_exporter("--demo")
    try:
        wait_ready(port, proc)
        assert _trees(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert _trees(proc.pid) == []
    finally:
        proc.kill()


def test_the_next_demo_removes_an_orphan_of_sigkill() -> None:
    proc = _watch()
    wait_until(lambda: bool(_trees(proc.pid)) or proc.poll() is not None)
    proc.kill()
    proc.wait(30)
    assert _trees(proc.pid), "the demo never wrote its tree"
    subprocess.run([EXPORTER, "snapshot", "--demo"], check=True, stdout=subprocess.DEVNULL, timeout=120)
    assert _trees(proc.pid) == []
