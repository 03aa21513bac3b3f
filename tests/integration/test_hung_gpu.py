"""A hung GPU (a named pipe in place of its gpu_metrics: every read blocks, as on a hung SMU)
through the real daemon: the others keep updating, the hung one goes down within two cycles,
threads stay bounded, it comes back without a restart, and SIGTERM still stops the daemon."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.simulator import Simulator
from tests.harness import CYCLES, Daemon, Series, value

pytestmark = pytest.mark.integration


def up(series: Series, gpu: int | str) -> float | None:
    return value(series, "amdgpu_up", gpu=str(gpu))


def sampled(series: Series, gpu: str) -> float | None:
    return value(series, "amdgpu_sample_timestamp_seconds", gpu=gpu)


def cycles(series: Series) -> float:
    return value(series, CYCLES) or 0


def hang(path: Path) -> bytes:
    """Swap a named pipe in for `path` (atomically); returns the file's content for later.

    The pipe keeps a second name (`.held`) so unhang can release a reader blocked on it after the
    real file is back in place.
    """
    content = path.read_bytes()
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo)
    os.link(fifo, path.with_name(path.name + ".held"))
    os.replace(fifo, path)
    return content


def unhang(path: Path, content: bytes) -> None:
    """Restore the file, then release the blocked reader (a writer opens and closes the pipe).

    In this order: released first, a reader's next open in the gap before the file is back would
    block on the pipe again, with no writer ever coming (a race a loaded machine does hit).
    """
    temp = path.with_name(path.name + ".tmp")
    temp.write_bytes(content)
    os.replace(temp, path)
    held = path.with_name(path.name + ".held")
    fd = os.open(held, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)
    held.unlink()


def test_hung_gpu_goes_down_alone_and_comes_back(tmp_path: Path, start_daemon: Callable[..., Daemon]) -> None:
    simulator = Simulator(tmp_path / "sys", fleet="2xMI250X", scenario="training", seed=2)
    simulator.write_tree()
    gcds = simulator.truth()
    daemon = start_daemon(f"--path.sysfs={tmp_path / 'sys'}", "--interval=100ms", "--read-timeout=300ms")
    daemon.wait_for(lambda s: all(up(s, g.gpu) == 1 for g in gcds), "every GCD up")
    threads_before = len(os.listdir(f"/proc/{daemon.pid}/task"))
    hung = Path(gcds[1].identity.device_dir) / "gpu_metrics"
    content = hang(hung)
    # Down within two cycles, counted in cycles the daemon published, not in seconds: a scrape
    # begun after the hang counts no more cycles than were done at the hang, so once two more
    # are published the hung one is down (a scrape that lags behind only makes this weaker).
    hung_at = cycles(daemon.scrape())
    series = daemon.wait_for(lambda s: cycles(s) >= hung_at + 2, "two cycles after the hang")
    assert up(series, 1) == 0, "down within two cycles"
    assert all(up(series, g) == 1 for g in (0, 2, 3))
    # The others keep updating while it hangs; the hung one's sample stops aging forward.
    before = daemon.scrape()
    after = daemon.wait_for(lambda s: cycles(s) >= cycles(before) + 5, "five more cycles")
    for gpu in ("0", "2", "3"):
        assert (sampled(after, gpu) or 0) > (sampled(before, gpu) or 0)
    assert sampled(after, "1") == sampled(before, "1")
    # Cycles with the read stuck: a thread left behind by each would be 20 more threads.
    daemon.wait_for(lambda s: cycles(s) >= cycles(after) + 20, "twenty more cycles")
    assert len(os.listdir(f"/proc/{daemon.pid}/task")) <= threads_before + 2
    unhang(hung, content)
    daemon.wait_for(lambda s: up(s, 1) == 1, "the GCD back")  # no restart
    daemon.alive()
    # Hang it again and stop the daemon while the read is stuck: it must still exit (a daemon that
    # waited for the read would never exit: the wait's bound only ends such a broken run).
    hang(hung)
    daemon.wait_for(lambda s: up(s, 1) == 0, "the GCD hung again")
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.stderr()
