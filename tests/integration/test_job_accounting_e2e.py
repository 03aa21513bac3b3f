"""Per-job accounting end to end: the real daemon on a simulated MI250X and CPX MI300X, Slurm jobs
presented by deploy/slurm/prolog.sh and epilog.sh, the reports read from /api/v1/jobs and the
`job-report` command, the daemon restarted in the middle of the jobs.

What the reports must add up to is read independently: a thread polls /api/v1/devices (the
counters the daemon read each cycle, keyed by the cycle's taken_at) all along, and a job's start and
end are cycle instants, so the package counter's increase over a job's life is looked up, not
computed by the code under test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.realtools import EXPORTER, start_exporter, wait_ready

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
FLEET = "MI250X,MI300X:CPX"  # gpu 0/1: the MI250X's dies; gpu 2..9: the socket's partitions 0..7


class CounterLog:
    """Every cycle's energy counters as /api/v1/devices shows them: {taken_at: {gpu: joules}}."""

    def __init__(self) -> None:
        self.cycles: dict[float, dict[int, float]] = {}
        self.port: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                if self.port is not None:
                    try:
                        doc = client.get(f"http://127.0.0.1:{self.port}/api/v1/devices").json()
                        self.cycles[doc["taken_at"]] = {
                            d["gpu"]: d["sample"]["energy_joules"]
                            for d in doc["devices"]
                            if d.get("sample") and d["sample"]["energy_joules"] is not None
                        }
                    except (httpx.HTTPError, ValueError, KeyError):
                        pass
                time.sleep(0.1)

    def energy(self, taken_at: float, gpu: int) -> float:
        assert taken_at in self.cycles, f"cycle {taken_at} was not seen by the poller of /api/v1/devices"
        return self.cycles[taken_at][gpu]

    def wait_for_cycle(self, taken_at: float) -> None:
        wait_for(lambda: taken_at in self.cycles, 10, f"the poller of /api/v1/devices to see cycle {taken_at}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def slurm(script: str, state: Path, job_id: str, gpus: str, **extra: str) -> None:
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        **extra,
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_USER": f"user{job_id}",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_GPUS": gpus,
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state),
    }
    result = subprocess.run(["bash", str(DEPLOY / script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def publish(link: Path, staged: Path, generation: int) -> None:
    """The staged prolog files appear to the daemon at one instant: a copy swapped in by renaming a link."""
    copy = link.parent / f"generation-{generation}"
    shutil.copytree(staged, copy)
    tmp = link.parent / "link.tmp"
    tmp.symlink_to(copy)
    os.replace(tmp, link)


def job(port: int, job_id: str) -> dict[str, Any]:
    """The job's document; {} while the daemon has not seen it yet (404)."""
    answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs/{job_id}", timeout=5)
    if answer.status_code == 404:
        return {}
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "sys"
    proc = subprocess.Popen(
        [EXPORTER, "simulate", "--path.sysfs", str(root), "--fleet", FLEET, "--scenario", "training:period=20"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: (root / "class" / "drm").is_dir() and len(os.listdir(root / "class" / "drm")) >= 10, 30, "tree"
        )
        time.sleep(1.0)
        yield root
    finally:
        proc.terminate()
        proc.wait(10)


def test_jobs_on_dies_and_partitions_add_up_to_the_counters_across_a_restart(simulator: Path, tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    link = tmp_path / "slurm"
    staged.mkdir()
    generation = 0
    publish(link, staged, generation)
    state_file = tmp_path / "lib" / "jobs.json"
    args = (
        f"--path.sysfs={simulator}",
        f"--slurm.state-dir={link}",
        f"--accounting.state-file={state_file}",
        "--node-name=node-a",
        # Cycles 2 s apart: the poller of /api/v1/devices (every 0.1 s) has room to see every one on
        # a loaded 2-core machine before the next replaces it.
        "--interval=2s",
    )
    log = CounterLog()
    proc, port = start_exporter(*args)
    try:
        wait_ready(port, proc)
        log.port = port
        # Three jobs at one instant: the two dies of the MI250X, and partition 3 of the CPX socket.
        for job_id, gpus in (("701", "0"), ("702", "1"), ("703", "5")):
            slurm("prolog.sh", staged, job_id, gpus)
        generation += 1
        publish(link, staged, generation)
        wait_for(lambda: len(httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs").json()["running"]) == 3, 15, "3 jobs")
        time.sleep(4)
        # A job shorter than a scrape interval (15 s), on partition 5.
        slurm("prolog.sh", staged, "704", "7")
        generation += 1
        publish(link, staged, generation)
        wait_for(lambda: job(port, "704").get("state") == "running", 10, "job 704 seen")
        time.sleep(3)
        slurm("epilog.sh", staged, "704", "")
        generation += 1
        publish(link, staged, generation)
        short = wait_for(lambda: (j := job(port, "704")).get("state") == "ended" and j, 10, "job 704 ended")
        # The job's document and /api/v1/devices change with the same cycle: the poller must have
        # seen that cycle before it is paused, or the end's counters were never logged.
        log.wait_for_cycle(short["ended_at"])

        # The daemon restarts in the middle of the three jobs.
        log.port = None
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        assert state_file.is_file()
        time.sleep(3)  # the jobs run on, unseen
        proc, port = start_exporter(*args)
        wait_ready(port, proc)
        log.port = port
        time.sleep(5)
        # 701's epilog waits for the daemon to see the end, then stores the record with scontrol.
        fake = tmp_path / "bin"
        fake.mkdir()
        calls = tmp_path / "scontrol.calls"
        (fake / "scontrol").write_text(
            f'#!/bin/bash\necho "$@" >> {calls}\n'
            '[ "$2" = show ] && echo "JobId=$4 JobName=x AdminComment= Extra=(null)"\nexit 0\n'
        )
        (fake / "scontrol").chmod(0o755)
        path = f"{fake}:{Path(EXPORTER).parent}:/usr/sbin:/usr/bin:/sbin:/bin"
        epilog = threading.Thread(
            target=slurm,
            args=("epilog.sh", staged, "701", ""),
            kwargs={"PATH": path, "AMDGPU_EXPORTER_URL": f"http://127.0.0.1:{port}"},
        )
        epilog.start()
        time.sleep(0.5)  # it has removed 701's file
        for job_id in ("702", "703"):
            slurm("epilog.sh", staged, job_id, "", AMDGPU_EXPORTER_ACCOUNTING_RECORD="off")
        generation += 1
        publish(link, staged, generation)
        epilog.join(30)
        reports = {
            job_id: wait_for(
                lambda j=job_id: (r := job(port, j)).get("state") == "ended" and r, 10, f"job {job_id} ended"
            )
            for job_id in ("701", "702", "703")
        }
        log.wait_for_cycle(reports["701"]["ended_at"])
        short_after = job(port, "704")  # kept across the restart
        text = subprocess.run(
            [EXPORTER, "job-report", "702", f"--url=http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        page = subprocess.run(
            [EXPORTER, "job-report", "703", "--html", f"--url=http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        stderr_log = ""
    finally:
        log.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=10)
            stderr_log = err.decode()
        except subprocess.TimeoutExpired:
            proc.kill()
    one, two, part = reports["701"], reports["702"], reports["703"]
    # One instant for the three: the same cycles start and end them.
    assert one["started_at"] == two["started_at"] == part["started_at"]
    assert one["ended_at"] == two["ended_at"] == part["ended_at"]
    start, end = one["started_at"], one["ended_at"]

    # The MI250X: die 0 and die 1 together used the package's counter increase (die 0's), within 1 %.
    package = log.energy(end, 0) - log.energy(start, 0)
    dies = one["totals"]["energy_joules"] + two["totals"]["energy_joules"]
    print(f"MI250X package: counter increase {package:.3f} J, jobs 701+702 {dies:.3f} J ({dies / package - 1:+.1e})")
    assert package > 0 and abs(dies - package) <= 0.01 * package
    assert two["totals"]["energy_joules"] > 0.2 * package  # die 1 gets its share, not 0 J
    assert one["devices"][0]["package_energy_joules"] == pytest.approx(package, rel=1e-9)

    # The CPX socket: partition 3's job gets its share of partition 0's counter.
    socket = log.energy(end, 2) - log.energy(start, 2)
    device = part["devices"][0]
    print(f"CPX socket: counter increase {socket:.1f} J, job 703 (partition 3) {device['energy_joules']:.1f} J")
    assert device["partition"] == 3
    assert device["package_energy_joules"] == pytest.approx(socket, rel=1e-9)
    assert 0.02 * socket < device["energy_joules"] < 0.5 * socket

    # Held across the restart: every second from the first cycle to the last, the gap included.
    for report in (one, two, part):
        assert report["totals"]["gpu_seconds"] == pytest.approx(end - start, abs=1e-6)
        assert report["devices"][0]["history"]["time"]

    # The short job: exactly its cycles' counter increase, and kept across the restart.
    s_start, s_end = short["started_at"], short["ended_at"]
    assert s_end - s_start < 15
    s_device = short["devices"][0]
    assert s_device["package_energy_joules"] == pytest.approx(log.energy(s_end, 2) - log.energy(s_start, 2), rel=1e-9)
    assert 0 < s_device["energy_joules"] < s_device["package_energy_joules"]
    assert short["totals"]["gpu_seconds"] == pytest.approx(s_end - s_start, abs=1e-6)
    print(
        f"short job 704: {s_end - s_start:.2f} s, socket counter increase "
        f"{log.energy(s_end, 2) - log.energy(s_start, 2):.3f} J, its base {s_device['package_energy_joules']:.3f} J, "
        f"its share {s_device['energy_joules']:.3f} J"
    )
    assert short_after["totals"] == short["totals"]

    assert text.returncode == 0, text.stderr
    assert "slurm job 702 on node-a: ended" in text.stdout and "die 1" in text.stdout
    assert page.returncode == 0 and page.stdout.startswith("<!DOCTYPE html>") and "<svg" in page.stdout
    assert "http://" not in page.stdout.replace("http://www.w3.org", "")  # no external asset
    stored = calls.read_text().splitlines()
    assert stored[0] == "-o show job 701"
    assert stored[1].startswith("update JobId=701 AdminComment=amdgpu_energy_j=")
    assert f"amdgpu_energy_j={one['totals']['energy_joules']:.0f}," in stored[1]
    assert '"event": "job_accounted"' in stderr_log and "amdgpu_energy_j=" in stderr_log
    out = os.environ.get("JOB_REPORT_HTML")
    if out:  # docs/job-report.png is a screenshot of this page
        Path(out).write_text(page.stdout)
    print(
        f"job 701 {one['totals']['energy_joules']:.1f} J, 702 {two['totals']['energy_joules']:.1f} J, "
        f"703 {part['totals']['energy_joules']:.1f} J, 704 {short['totals']['energy_joules']:.1f} J "
        f"over {s_end - s_start:.2f} s",
        file=sys.stderr,
    )
