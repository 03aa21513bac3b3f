"""End to end: `amdgpu-exporter --demo` as a real process, scraped over HTTP, checked against
the simulator's own truth for all 8 GCDs; plus the one-sentence failures an operator can hit."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.realtools import EXPORTER, start_exporter, wait_for_cycles, wait_ready

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # every test here starts the daemon as a process

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Series:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, tuple(sorted(labels.items()))))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    truth = tmp_path_factory.mktemp("demo") / "truth.json"
    proc, port = start_exporter(
        "--demo",
        "--demo.fleet=4xMI250X",
        "--demo.scenario=idle",
        f"--demo.truth-file={truth}",
        "--collectors.include=*",  # every family, the ones off by default too: each is held to the truth
        "--window.all-series",
        "--interval=500ms",
        "--slow-interval=1s",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(port, proc, timeout=30)
        # Past the first slow-schedule refresh (1 s: two cycles of 500 ms, and two more published) and
        # the first pcie_bw read of every GCD (its bandwidth series are there).
        wait_for_cycles(port, 4)
        deadline = time.monotonic() + 30
        while len(bandwidth_gpus(httpx.get(url + "/metrics", timeout=5).text)) < 8:
            assert time.monotonic() < deadline, "no pcie_bw read for every GCD"
            time.sleep(0.1)
        yield url, truth, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def bandwidth_gpus(text: str) -> set[str]:
    """The GCDs whose PCIe bandwidth (the background pcie_bw read) /metrics shows."""
    names = ("amdgpu_pcie_bandwidth_bytes_per_second", "amdgpu_pcie_bandwidth_upper_bound_bytes_per_second")
    return {gpu for (name, labels) in parse(text) if name in names for key, gpu in labels if key == "gpu"}


def load_truth(path: Path) -> list[dict]:
    return json.loads(path.read_text())["devices"]


def test_metrics_match_the_simulator_for_every_gcd(demo: tuple[str, Path, subprocess.Popen[bytes]]) -> None:
    url, truth_path, _ = demo
    before = load_truth(truth_path)
    response = httpx.get(url + "/metrics", timeout=5)
    after = load_truth(truth_path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    series = parse(response.text)
    assert len(before) == 8
    for dev_before, dev_after in zip(before, after, strict=True):
        gpu = str(dev_before["gpu"])
        ident = dev_before["identity"]
        first, last = dev_before["sample"], dev_after["sample"]
        assert value(series, "amdgpu_up", gpu=gpu) == 1.0
        info = [labels for (name, labels) in series if name == "amdgpu_device_info" and ("gpu", gpu) in labels]
        assert len(info) == 1
        info_labels = dict(info[0])
        for key, label in (
            ("pci_bus_id", "pci_bus_id"),
            ("unique_id", "unique_id"),
            ("serial", "serial"),
            ("product", "product"),
            ("package", "package"),
            ("vbios", "vbios"),
            ("card", "card"),
        ):
            assert info_labels[label] == str(ident[key]), (gpu, label)
        assert info_labels["die"] == str(ident["die"])
        assert value(series, "amdgpu_sample_timestamp_seconds", gpu=gpu) > time.time() - 5

        for sensor in ("edge", "junction", "memory", "hbm0", "hbm1", "hbm2", "hbm3"):
            ours = value(series, "amdgpu_temperature_celsius", gpu=gpu, sensor=sensor)
            lo = min(first["temperatures"][sensor], last["temperatures"][sensor]) - 1.0
            hi = max(first["temperatures"][sensor], last["temperatures"][sensor]) + 1.0
            assert ours is not None and lo <= ours <= hi, (gpu, sensor, ours, lo, hi)
        for sensor_threshold, expected in first["temperature_thresholds"].items():
            sensor, threshold = sensor_threshold.split("/")
            assert (
                value(series, "amdgpu_temperature_threshold_celsius", gpu=gpu, sensor=sensor, threshold=threshold)
                == expected
            )
        # MI250X: die 1 has no power or energy series at all; die 0 has both.
        power = value(series, "amdgpu_power_watts", gpu=gpu)
        energy = value(series, "amdgpu_energy_joules_total", gpu=gpu)
        if ident["die"] == 1:
            assert power is None and energy is None
            assert first["power_watts"] is None
        else:
            assert power is not None and abs(power - first["power_watts"]) <= 0.05 * first["power_watts"] + 1
            assert energy is not None
            assert first["energy_joules"] - 3 * first["power_watts"] <= energy <= last["energy_joules"]
        for engine, expected in first["busy"].items():
            assert value(series, "amdgpu_busy_ratio", gpu=gpu, engine=engine) == pytest.approx(expected, abs=0.02)
        for pool, expected in first["memory_total_bytes"].items():
            assert value(series, "amdgpu_memory_total_bytes", gpu=gpu, pool=pool) == expected
        for pool, expected in first["memory_used_bytes"].items():
            assert value(series, "amdgpu_memory_used_bytes", gpu=gpu, pool=pool) == pytest.approx(expected, rel=0.01)
        for domain, expected in first["clocks_max_hertz"].items():
            assert value(series, "amdgpu_clock_max_hertz", gpu=gpu, domain=domain) == expected
        assert value(series, "amdgpu_clock_hertz", gpu=gpu, domain="gfx") == first["clocks_hertz"]["gfx"]
        assert (
            value(series, "amdgpu_pcie_max_link_transfers_per_second", gpu=gpu)
            == first["pcie_max_link_transfers_per_second"]
        )
        assert value(series, "amdgpu_pcie_current_link_width", gpu=gpu) == first["pcie_link_width"]
        assert value(series, "amdgpu_pcie_max_link_width", gpu=gpu) == first["pcie_max_link_width"]
        for block_type, expected in first["ecc_errors"].items():
            block, kind = block_type.split("/")
            assert value(series, "amdgpu_ecc_errors_total", gpu=gpu, block=block, type=kind) == expected
        # Said once per package, on its first device (die 0): the two dies run the same firmware.
        for block, version in ident["firmware"].items():
            expected_firmware = 1.0 if ident["die"] == 0 else None
            assert value(series, "amdgpu_firmware_info", gpu=gpu, block=block, version=version) == expected_firmware
        gpu_by_bdf = {d["identity"]["pci_bus_id"]: str(d["gpu"]) for d in before}
        links = {
            (d["peer"], d["type"], d["weight"])
            for (name, labels) in series
            if name == "amdgpu_topology_link_info" and ("gpu", gpu) in labels
            for d in [dict(labels)]
        }
        expected_links = {
            (gpu_by_bdf.get(link["peer_pci_bus_id"], "cpu"), link["link_type"], str(link["weight"]))
            for link in ident["topology"]
        }
        assert expected_links <= links and {t for _, t, _ in links} == {"pcie", "xgmi"}


def test_negotiation_gzip_openmetrics_and_api(demo: tuple[str, Path, subprocess.Popen[bytes]]) -> None:
    url, _, _ = demo
    with httpx.Client(timeout=5) as client:
        om = client.get(url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.endswith("# EOF\n")
        raw = client.get(url + "/metrics", headers={"Accept-Encoding": "gzip"}, extensions={})
        assert raw.headers["content-encoding"] == "gzip"  # httpx decodes it for us
        assert "amdgpu_up{" in raw.text
        with client.stream("GET", url + "/metrics", headers={"Accept-Encoding": "gzip"}) as streamed:
            body = b"".join(streamed.iter_raw())
        assert gzip.decompress(body).startswith(b"# HELP")
        devices = client.get(url + "/api/v1/devices").json()
        assert len(devices["devices"]) == 8 and devices["source"] == "sysfs"
        assert all(d["up"] and d["sample"]["temperatures"]["junction"] > 0 for d in devices["devices"])
        alerts = client.get(url + "/api/v1/alerts").json()
        assert isinstance(alerts["alerts"], list)
        assert client.get(url + "/healthz").status_code == 200
        landing = client.get(url + "/")
        assert landing.status_code == 200 and "/metrics" in landing.text
        assert client.post(url + "/metrics").status_code == 405


def test_sigterm_stops_cleanly(demo: tuple[str, Path, subprocess.Popen[bytes]]) -> None:
    _, _, proc = demo
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    stderr = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "Traceback" not in stderr
    events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert "listening" in events and events[-1] == "stopped"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXPORTER, *args], capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})}
    )


def test_no_gpu_is_one_clear_sentence(tmp_path: Path) -> None:
    empty = tmp_path / "sys"
    (empty / "class" / "drm").mkdir(parents=True)
    result = run_cli(f"--path.sysfs={empty}", "--web.listen-address=127.0.0.1:0", "--log.format=json")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("amdgpu-exporter: error: no AMD GPU found") and "--demo" in last
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--interval=soon"], "--interval"),
        (["--source=cuda"], "--source"),
        (["--demo", "--demo.fleet=3xH100"], "demo.fleet"),
        (["--rules.file=/nonexistent/rules.yaml"], "rules"),
        (["--config.file=/nonexistent.yaml"], "config file /nonexistent.yaml: cannot read it"),
    ],
)
def test_bad_input_is_one_clear_sentence(args: list[str], needle: str) -> None:
    result = run_cli(*args, "--web.listen-address=127.0.0.1:0")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert needle in result.stderr.strip().splitlines()[-1]


def test_busy_port_is_one_clear_sentence() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--demo", f"--web.listen-address=127.0.0.1:{port}")
    assert result.returncode == 2
    assert "cannot listen on 127.0.0.1" in result.stderr and "Traceback" not in result.stderr
