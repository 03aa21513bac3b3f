"""A hung GPU (a named pipe in place of its gpu_metrics: every read blocks, as on a hung SMU)
through the real daemon: the others keep updating, the hung one goes down within two cycles,
threads stay bounded, it comes back without a restart, and SIGTERM still stops the daemon."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import Simulator
from tests.realtools import start_exporter

pytestmark = pytest.mark.integration


CYCLES = "amdgpu_exporter_poll_duration_seconds_count"  # poll cycles published


def scrape(port: int) -> dict[tuple[str, str], float]:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    response.raise_for_status()  # 503 until the first cycle
    text = response.text
    return {
        (s.name, s.labels.get("gpu", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ("amdgpu_up", "amdgpu_sample_timestamp_seconds", CYCLES)
    }


def wait_until(port: int, predicate, timeout: float = 10.0) -> dict[tuple[str, str], float]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            series = scrape(port)
            if predicate(series):
                return series
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.05)


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


def test_hung_gpu_goes_down_alone_and_comes_back(tmp_path: Path) -> None:
    simulator = Simulator(tmp_path / "sys", fleet="2xMI250X", scenario="training", seed=2)
    simulator.write_tree()
    gcds = simulator.truth()
    proc, port = start_exporter(f"--path.sysfs={tmp_path / 'sys'}", "--interval=100ms", "--read-timeout=300ms")
    try:
        wait_until(port, lambda s: all(s.get(("amdgpu_up", str(g.gpu))) == 1 for g in gcds))
        threads_before = len(os.listdir(f"/proc/{proc.pid}/task"))
        hung = Path(gcds[1].identity.device_dir) / "gpu_metrics"
        content = hang(hung)
        # Down within two cycles, counted in cycles the daemon published, not in seconds: a scrape
        # begun after the hang counts no more cycles than were done at the hang, so once two more
        # are published the hung one is down (a scrape that lags behind only makes this weaker).
        hung_at = scrape(port)[(CYCLES, "")]
        series = wait_until(port, lambda s: s[(CYCLES, "")] >= hung_at + 2)
        assert series[("amdgpu_up", "1")] == 0, "down within two cycles"
        assert all(series[("amdgpu_up", str(g))] == 1 for g in (0, 2, 3))
        # The others keep updating while it hangs; the hung one's sample stops aging forward.
        before = scrape(port)
        after = wait_until(port, lambda s: s[(CYCLES, "")] >= before[(CYCLES, "")] + 5)
        for gpu in ("0", "2", "3"):
            assert after[("amdgpu_sample_timestamp_seconds", gpu)] > before[("amdgpu_sample_timestamp_seconds", gpu)]
        assert after[("amdgpu_sample_timestamp_seconds", "1")] == before[("amdgpu_sample_timestamp_seconds", "1")]
        # Cycles with the read stuck: a thread left behind by each would be 20 more threads.
        wait_until(port, lambda s: s[(CYCLES, "")] >= after[(CYCLES, "")] + 20, timeout=30)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) <= threads_before + 2
        unhang(hung, content)
        wait_until(port, lambda s: s.get(("amdgpu_up", "1")) == 1)  # back, no restart
        assert proc.poll() is None
        # Hang it again and stop the daemon while the read is stuck: it must still exit promptly.
        hang(hung)
        wait_until(port, lambda s: s.get(("amdgpu_up", "1")) == 0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
        assert b"Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
