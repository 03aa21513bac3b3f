"""`job-report ID --prometheus URL`: the report built from a real Prometheus (Debian's) that scraped the
daemon while a Slurm job ran on both dies of a simulated MI250X, against the daemon's own report."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.realtools import EXPORTER, free_port, require_tool, start_exporter, wait_ready

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def slurm(script: str, state: Path, job_id: str, gpus: str) -> None:
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_USER": "dana",
        "SLURM_JOB_GPUS": gpus,
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state),
        "AMDGPU_EXPORTER_ACCOUNTING_RECORD": "off",
    }
    subprocess.run(["bash", str(DEPLOY / script)], env=env, check=True, timeout=30)


def wait_for(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[int, str, Path]]:
    prometheus = require_tool("prometheus")
    root = tmp_path / "sys"
    simulator = subprocess.Popen(
        [EXPORTER, "simulate", "--path.sysfs", str(root), "--fleet", "MI250X", "--scenario", "training:period=10"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = tmp_path / "slurm"
    processes: list[subprocess.Popen[bytes]] = [simulator]
    try:
        wait_for(lambda: (root / "class" / "drm").is_dir() and len(os.listdir(root / "class" / "drm")) >= 2, 30, "tree")
        time.sleep(1)
        daemon, port = start_exporter(
            f"--path.sysfs={root}", f"--slurm.state-dir={state}", f"--accounting.state-file={tmp_path / 'jobs.json'}"
        )
        processes.append(daemon)
        wait_ready(port, daemon)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "amdgpu-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = free_port()
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(server)
        url = f"http://127.0.0.1:{prom_port}"

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, "prometheus ready")
        yield port, url, state
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(10)


def test_a_report_from_prometheus_agrees_with_the_daemons(node: tuple[int, str, Path]) -> None:
    port, url, state = node
    time.sleep(3)
    slurm("prolog.sh", state, "900", "0-1")
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs/900").status_code == 200, 10, "job seen")
    time.sleep(15)
    slurm("epilog.sh", state, "900", "")
    daemon = wait_for(
        lambda: (d := httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs/900").json()).get("state") == "ended" and d,
        10,
        "job ended",
    )
    time.sleep(3)
    answer = subprocess.run(
        [EXPORTER, "job-report", "900", "--json", f"--prometheus={url}", "--since=600"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    report = json.loads(answer.stdout)
    assert report["gpus"] == [0, 1] and report["state"] == "ended" and report["labels"]["job_user"] == "dana"
    # Prometheus saw the daemon's count up to its last scrape before the job ended: within a few seconds' energy
    exact = daemon["totals"]["energy_joules"]
    print(f"daemon {exact:.1f} J, from Prometheus {report['totals']['energy_joules']:.1f} J")
    assert 0.75 * exact <= report["totals"]["energy_joules"] <= exact
    # first to last scrape that saw it (1 s apart here) against first cycle that saw it to first that did not
    assert 0 <= daemon["duration_seconds"] - report["duration_seconds"] <= 5
    assert all(len(d["history"]["time"]) >= 8 for d in report["devices"])
    page = subprocess.run(
        [EXPORTER, "job-report", "900", "--html", f"--prometheus={url}", "--since=600"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert page.returncode == 0 and "<svg" in page.stdout and "polyline" in page.stdout
    missing = subprocess.run(
        [EXPORTER, "job-report", "901", f"--prometheus={url}", "--since=600"], capture_output=True, text=True
    )
    assert missing.returncode == 1 and missing.stderr.startswith("amdgpu-exporter: error: Prometheus has no")
