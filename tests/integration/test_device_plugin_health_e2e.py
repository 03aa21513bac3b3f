"""The device-plugin health service end to end: the real daemon on a simulated tree with
--device-plugin.socket, asked by an independent client as ROCm's k8s-device-plugin asks AMD's
device-metrics-exporter (/metricssvc.MetricsService/List on a unix socket, stubs compiled from the
test's own transcription of upstream's .proto, tests/integration/dme_health/). A degraded PCIe link
makes its GPU "unhealthy" and the others stay "healthy", each named by its PCI address; the GPU is
healthy again once the link is back; clients that connect and never read cost /metrics nothing.

Debian has no grpcurl (apt-cache policy grpcurl: no candidate), so the client is grpcio's.
"""

from __future__ import annotations

import json
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from exporter.simulator import Simulator
from tests.faulty_tree import device_dir
from tests.realtools import start_exporter, stop, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CLIENT = Path(__file__).resolve().parent / "dme_health" / "client.py"
FLEET = "MI250X,MI300X"  # gpu 0 and 1: the MI250X's two dies; gpu 2: the MI300X
RULES = "rules: []\nhealth:\n  checks:\n    pcie_link_degraded: {for: 0}\n"
# The simulator's fault: gpu 1's PCIe link trains at half its speed for a while (its files and its
# gpu_metrics table say so), then retrains at its maximum.
SCENARIO = "idle:faults=pcie_downtrain.1,fault_at=30,fault_for=20"
FAST = ("--interval=200ms", "--slow-interval=200ms")


def ask(socket_path: Path, method: str = "List", *ids: str) -> dict[str, Any]:
    """One call by the independent client, in a process of its own; its answer as JSON."""
    result = subprocess.run(
        [sys.executable, str(CLIENT), str(socket_path), method, *ids],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def health_by_device(socket_path: Path) -> dict[str, str]:
    answer = ask(socket_path)
    assert answer["code"] == "OK", answer
    return {gpu["Device"]: gpu["Health"] for gpu in answer["answer"].get("GPUState", [])}


def wait(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"never: {what} (last: {last})")


class SimulatedTime:
    """The simulator's clock: tick(t) writes the tree as it is t seconds after write_tree."""

    def __init__(self, simulator: Simulator, at: float) -> None:
        self.simulator = simulator
        self.at = at
        simulator.tick(at)

    def advance_until(self, condition: Callable[[], bool], what: str) -> None:
        """Simulated seconds pass, one at a time, until the condition holds."""
        for _ in range(120):
            if condition():
                return
            self.at += 1.0
            self.simulator.tick(self.at)
        raise AssertionError(f"the simulator never came to: {what}")


@contextmanager
def daemon(root: Path, socket_path: Path, rules: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    process, port = start_exporter(
        f"--path.sysfs={root}", *FAST, f"--rules.file={rules}", f"--device-plugin.socket={socket_path}"
    )
    try:
        wait_ready(port, process)
        yield process, port
    finally:
        stop(process)


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short folder for the sockets: a unix socket's path holds at most 107 bytes, and tmp_path
    can be longer than that."""
    folder = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_device_plugin_sees_a_faulted_gpu_unhealthy_until_it_recovers(tmp_path: Path, sockets: Path) -> None:
    root = tmp_path / "sys"
    simulator = Simulator(root, fleet=FLEET, scenario=SCENARIO, seed=5)
    simulator.write_tree()
    clock = SimulatedTime(simulator, 5.0)
    bdfs = [device_dir(simulator, index).name for index in range(3)]
    assert bdfs == sorted(bdfs) and all(len(bdf) == 12 and bdf == bdf.lower() for bdf in bdfs)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    # DME's folder does not exist yet, and a socket a dead server left behind is in the way elsewhere.
    socket_path = sockets / "amd-metrics-exporter" / "amdgpu_device_metrics_exporter_grpc.socket"
    stale_path = sockets / "stale" / "health.socket"
    stale_path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(stale_path))
    stale.close()
    assert stat.S_ISSOCK(stale_path.lstat().st_mode)

    with daemon(root, socket_path, rules) as (process, port):
        assert stat.S_IMODE(socket_path.lstat().st_mode) == 0o600
        assert stat.S_IMODE(socket_path.parent.lstat().st_mode) == 0o755
        assert wait(lambda: health_by_device(socket_path), "an answer") == dict.fromkeys(bdfs, "healthy")
        answer = ask(socket_path)["answer"]["GPUState"]
        assert [(gpu["ID"], gpu["Device"]) for gpu in answer] == [("0", bdfs[0]), ("1", bdfs[1]), ("2", bdfs[2])]
        assert all(len(gpu["UUID"]) == 16 for gpu in answer)

        # The fault: gpu 1's link trains at half its speed; the verdict fails pcie_link_degraded at once.
        speed = device_dir(simulator, 1) / "current_link_speed"
        clock.advance_until(lambda: speed.read_text().startswith("8.0 "), "gpu 1's link downtrained")
        faulted = {bdfs[0]: "healthy", bdfs[1]: "unhealthy", bdfs[2]: "healthy"}
        wait(lambda: health_by_device(socket_path) == faulted, "gpu 1 unhealthy, the others healthy")
        document = httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=5).json()
        assert document["unfit_gpus"] == [1]
        assert "served to ROCm's device plugin (--device-plugin.socket)" in document["note"]
        got = ask(socket_path, "GetGPUState", "1", "7")["answer"]["GPUState"]
        assert [(gpu["ID"], gpu["Device"], gpu["Health"]) for gpu in got] == [("1", bdfs[1], "unhealthy")]
        assert ask(socket_path, "SetError")["code"] == "UNIMPLEMENTED"

        # Clients that connect and never read: /metrics and the service keep answering.
        idle = []
        for _ in range(20):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(socket_path))
            client.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            idle.append(client)
        try:
            for _ in range(5):
                started = time.monotonic()
                scrape = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": "text/plain"}, timeout=5)
                assert scrape.status_code == 200 and time.monotonic() - started < 2.0
                time.sleep(0.2)
            assert health_by_device(socket_path) == faulted

            # The link retrained: healthy again.
            clock.advance_until(lambda: speed.read_text().startswith("16.0 "), "gpu 1's link retrained")
            wait(lambda: health_by_device(socket_path) == dict.fromkeys(bdfs, "healthy"), "gpu 1 healthy again")
        finally:
            for client in idle:
                client.close()

        def calls() -> dict[str, float]:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": "text/plain"}, timeout=5).text
            return {
                line.split('method="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("amdgpu_exporter_device_plugin_calls_total{")
            }

        # /metrics shows the counts as of the last published cycle: the newest calls appear with the next.
        counted = wait(lambda: (c := calls()).get("List", 0) >= 5 and c, "5 List calls counted")
        assert counted["GetGPUState"] == 1

        # One owner only: a second exporter (or DME) on the same socket is a start-up error, and the
        # first one keeps it.
        second = subprocess.run(
            [str(Path(sys.executable).parent / "amdgpu-exporter"), f"--path.sysfs={root}",
             "--web.listen-address=127.0.0.1:0", f"--device-plugin.socket={socket_path}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode != 0
        assert "a server already answers on" in second.stderr and "Traceback" not in second.stderr
        assert health_by_device(socket_path) == dict.fromkeys(bdfs, "healthy")
        assert process.poll() is None

    assert not socket_path.exists()  # removed at stop

    # The stale socket is taken over: removed and served.
    with daemon(root, stale_path, rules):
        assert wait(lambda: health_by_device(stale_path), "an answer on the former stale socket")
    assert not stale_path.exists()


def test_a_path_that_is_not_a_socket_is_left_alone(tmp_path: Path, sockets: Path) -> None:
    root = tmp_path / "sys"
    Simulator(root, fleet="MI210", scenario="idle", seed=1).write_tree()
    occupied = sockets / "health.socket"
    occupied.write_text("not a socket\n")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "amdgpu-exporter"), f"--path.sysfs={root}",
         "--web.listen-address=127.0.0.1:0", f"--device-plugin.socket={occupied}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "exists and is not a socket" in result.stderr and "Traceback" not in result.stderr
    assert occupied.read_text() == "not a socket\n"
