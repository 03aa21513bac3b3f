"""Issue 31, whole-node failures, through the daemon as a process: what a file or a peer sends must
not take /metrics down, and nothing heavy runs on the event loop.

- a lone surrogate escape (`"\\ud800"`) or invalid UTF-8 in a Slurm state file: every answer stays 200;
- /api/v1/devices carries a count of CPER records; the records are paged at /api/v1/devices/{gpu}/cper;
- a SIGHUP whose config lists thousands of globs: /metrics keeps answering while it is read;
- POST /metrics: 405 without rendering, readiness untouched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.realtools import start_exporter, stop, wait_ready

pytestmark = pytest.mark.integration


class Log:
    """The daemon's JSON log lines, read from its stderr as they come (the pipe never fills)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.lines: list[dict] = []
        assert process.stderr is not None
        threading.Thread(target=self._read, args=(process.stderr,), daemon=True).start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for raw in stream:
            try:
                self.lines.append(json.loads(raw))
            except ValueError:
                self.lines.append({"event": raw.decode(errors="replace")})

    def events(self, event: str) -> list[dict]:
        return [line for line in self.lines if line.get("event") == event]


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        yield Path(tmp)


def _get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)


def _job_users(text: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.labels["job_user"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "amdgpu_job_info"
    }


def test_a_lone_surrogate_or_bad_utf8_in_a_slurm_state_file_keeps_every_answer_up(work: Path) -> None:
    state = work / "slurm"
    state.mkdir()
    # What Python's json.dumps writes for a Latin-1 account name read in a non-UTF-8 environment.
    (state / "0.42").write_bytes(b'{"SLURM_JOB_ID":"42","SLURM_JOB_USER":"\\ud800","SLURM_JOB_PARTITION":"\\udfff"}')
    (state / "1.43").write_bytes(b'{"SLURM_JOB_ID":"43","SLURM_JOB_USER":"j\xf6rg","SLURM_JOB_PARTITION":"p"}')
    # what the old prolog wrote for a 120 kB cluster name: skipped as too large, and now said so
    (state / "1.44").write_text('{"SLURM_JOB_ID":"44","SLURM_CLUSTER_NAME":"' + "c" * 120_000 + '"}')
    process, port = start_exporter("--demo", "--demo.fleet=2xMI210", "--interval=0.25s", f"--slurm.state-dir={state}")
    log = Log(process)
    try:
        wait_ready(port, process)
        deadline = time.monotonic() + 20
        while True:
            metrics = _get(port, "/metrics")
            assert metrics.status_code == 200, metrics.text
            users = _job_users(metrics.text)
            if len(users) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert users == {"\ufffd", "j\ufffdrg"}
        for accept in ("application/openmetrics-text; version=1.0.0", "text/plain"):
            response = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept}, timeout=10)
            assert response.status_code == 200
        devices = _get(port, "/api/v1/devices")
        assert devices.status_code == 200
        holders = {d["gpu"]: d["holders"] for d in devices.json()["devices"]}
        assert holders[0][0]["job_user"] == "\ufffd" and holders[0][0]["job_partition"] == "\ufffd"
        assert _get(port, "/readyz").status_code == 200, _get(port, "/readyz").text
        assert _get(port, "/").status_code == 200
        (skipped,) = [line for line in log.events("slurm_state_file_unusable") if line["file"].endswith("/1.44")]
        assert "larger than" in skipped["reason"], skipped
    finally:
        stop(process)


def test_devices_document_counts_cper_records_and_pages_them_at_their_own_endpoint(work: Path) -> None:
    process, port = start_exporter(
        "--demo",
        "--demo.fleet=1xMI300X",
        "--demo.scenario=idle:faults=cper_fatal.0,fault_at=0,fault_for=600",
        "--interval=0.25s",
        "--slow-interval=0.25s",
    )
    try:
        wait_ready(port, process)
        deadline = time.monotonic() + 30
        while True:
            device = _get(port, "/api/v1/devices").json()["devices"][0]
            sample = device["sample"]
            assert "cper_records" not in sample, "the records are paged at their own endpoint"
            if sample["cper_record_count"] >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        count = sample["cper_record_count"]
        assert count >= 3
        first = _get(port, "/api/v1/devices/0/cper?limit=2").json()
        assert first["gpu"] == 0 and first["offset"] == 0 and first["total"] >= count
        assert len(first["records"]) == 2 and first["next_offset"] == 2
        assert set(first["records"][0]) == {"timestamp", "severity", "afids", "record_id"}
        assert first["records"][0]["severity"] == "fatal"
        rest = _get(port, f"/api/v1/devices/0/cper?offset={first['next_offset']}&limit=1000").json()
        assert rest["offset"] == 2 and rest["next_offset"] is None
        assert [r["timestamp"] for r in first["records"] + rest["records"]] == sorted(
            r["timestamp"] for r in first["records"] + rest["records"]
        )
        assert _get(port, "/api/v1/devices/7/cper").status_code == 404
        assert _get(port, "/api/v1/devices/0/cper?limit=-1").status_code == 400
        assert _get(port, "/api/v1/devices/x/cper").status_code == 400
    finally:
        stop(process)


def test_a_sighup_with_thousands_of_globs_does_not_hold_metrics(work: Path) -> None:
    config = work / "config.yaml"
    config.write_text("families:\n  include: []\n", encoding="utf-8")
    process, port = start_exporter("--demo", "--demo.fleet=1xMI210", "--interval=0.5s", f"--config.file={config}")
    log = Log(process)
    try:
        wait_ready(port, process)
        # Distinct globs that all match (each the whole amdgpu_ table): seconds of fnmatch to work out.
        globs = "".join(f"    - 'amdgpu_*[!{n}]'\n" for n in range(4000))
        config.write_text("families:\n  include:\n" + globs, encoding="utf-8")
        os.kill(process.pid, signal.SIGHUP)
        answered_during = 0
        deadline = time.monotonic() + 120
        while not log.events("reloaded") and not log.events("reload_failed"):
            assert time.monotonic() < deadline, "no reload within 120 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200:
                    answered_during += 1 if not log.events("reloaded") else 0
            except httpx.TimeoutException:
                pass
            time.sleep(0.05)
        assert log.events("reloaded"), log.events("reload_failed")
        assert answered_during >= 3, f"/metrics answered {answered_during} times while the reload ran"
        assert _get(port, "/metrics").status_code == 200
        # 32,000: the file is refused at once, before YAML reads it; what runs is kept
        config.write_text("families:\n  include:\n" + globs * 8, encoding="utf-8")
        os.kill(process.pid, signal.SIGHUP)
        deadline = time.monotonic() + 60
        while not log.events("reload_failed"):
            assert time.monotonic() < deadline, "the over-long list was not refused"
            time.sleep(0.05)
        assert "larger than 256 KiB" in log.events("reload_failed")[0]["error"]
        assert _get(port, "/metrics").status_code == 200
    finally:
        stop(process)


def test_post_metrics_is_refused_without_rendering(work: Path) -> None:
    state = work / "slurm"
    state.mkdir()
    process, port = start_exporter("--demo", "--demo.fleet=1xMI210", "--interval=0.25s", f"--slurm.state-dir={state}")
    try:
        wait_ready(port, process)
        for _ in range(3):
            response = httpx.post(f"http://127.0.0.1:{port}/metrics", content=b"x", timeout=10)
            assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD"
            assert response.text == "method not allowed\n"
        assert _get(port, "/readyz").status_code == 200
    finally:
        stop(process)
