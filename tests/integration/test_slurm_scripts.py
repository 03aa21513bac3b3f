"""deploy/slurm/prolog.sh and epilog.sh run with the environment slurmd gives them, read back by the exporter."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from exporter.attribution import slurm
from exporter.model import ByGpuIndex

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def slurmd_env(state_dir: Path, job_id: str, **extra: str) -> dict[str, str]:
    """What slurmd puts in a Prolog/Epilog's environment (PrologFlags=Alloc), plus the state dir."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1001",
        "SLURM_JOB_PARTITION": "mi300",
        "SLURM_JOB_ACCOUNT": "physics",
        "SLURM_CLUSTER_NAME": "frontier-ish",
        "SLURM_JOB_NODELIST": "node[001-002]",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state_dir),
    }
    env.update(extra)
    return env


def run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["bash", str(DEPLOY / script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr  # a failing prolog/epilog drains the node
    return result


def jobs_by_gpu(state_dir: Path) -> dict[int, str]:
    claims = slurm.claims_from_files(slurm.read_state_files(str(state_dir)))
    result: dict[int, str] = {}
    for claim in claims:
        assert isinstance(claim.device, ByGpuIndex)
        result[claim.device.gpu] = dict(claim.labels)["job_id"]
    return result


def test_concurrent_jobs_on_disjoint_gpus_then_epilog_cleanup(tmp_path: Path) -> None:
    state = tmp_path / "run" / "amdgpu-exporter" / "slurm"  # created by the first prolog
    jobs = {"101": "0-2", "102": "3,4", "103": "[5-6],7"}
    threads = [
        threading.Thread(target=run, args=("prolog.sh", slurmd_env(state, job, SLURM_JOB_GPUS=gpus)))
        for job, gpus in jobs.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert jobs_by_gpu(state) == {0: "101", 1: "101", 2: "101", 3: "102", 4: "102", 5: "103", 6: "103", 7: "103"}
    assert oct(state.stat().st_mode & 0o777) == "0o755"
    record = json.loads((state / "4.102").read_text())
    assert record["SLURM_JOB_USER"] == "alice" and record["SLURM_JOB_PARTITION"] == "mi300"
    assert oct((state / "4.102").stat().st_mode & 0o777) == "0o644"

    run("epilog.sh", slurmd_env(state, "102", SLURM_SCRIPT_CONTEXT="epilog_slurmd"))
    assert jobs_by_gpu(state) == {0: "101", 1: "101", 2: "101", 5: "103", 6: "103", 7: "103"}
    run("epilog.sh", slurmd_env(state, "10", SLURM_SCRIPT_CONTEXT="epilog_slurmd"))  # a prefix of 101: no effect
    assert len(jobs_by_gpu(state)) == 6
    for job in ("101", "103"):
        run("epilog.sh", slurmd_env(state, job, SLURM_SCRIPT_CONTEXT="epilog_slurmd"))
    assert os.listdir(state) == []


def test_fallbacks_and_odd_values(tmp_path: Path) -> None:
    state = tmp_path / "slurm"
    # No SLURM_JOB_GPUS: ROCR_VISIBLE_DEVICES (UUIDs skipped), then GPU_DEVICE_ORDINAL.
    run("prolog.sh", slurmd_env(state, "7", ROCR_VISIBLE_DEVICES="1,GPU-4f2a9c0d11223344,2"))
    run("prolog.sh", slurmd_env(state, "8", GPU_DEVICE_ORDINAL="5"))
    # A user name that needs escaping in JSON.
    run("prolog.sh", slurmd_env(state, "9", SLURM_JOB_GPUS="6", SLURM_JOB_USER='o"brien\\x\t'))
    assert jobs_by_gpu(state) == {1: "7", 2: "7", 5: "8", 6: "9"}
    claims = {c.device_id: dict(c.labels) for c in slurm.claims_from_files(slurm.read_state_files(str(state)))}
    assert claims["6"]["job_user"] == 'o"brien\\x'
    # No GPUs, no job id: nothing written, still exit 0.
    run("prolog.sh", slurmd_env(state, "10"))
    result = run("prolog.sh", slurmd_env(state, "", SLURM_JOBID="", SLURM_JOB_GPUS="0"))
    assert "no numeric SLURM_JOB_ID" in result.stderr
    assert len(os.listdir(state)) == 4


def test_unwritable_state_dir_never_fails_the_job(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run("prolog.sh", slurmd_env(blocker / "slurm", "11", SLURM_JOB_GPUS="0"))
    assert "cannot create" in result.stderr


def test_readers_never_see_a_half_written_file(tmp_path: Path) -> None:
    state = tmp_path / "slurm"
    state.mkdir()
    stop = threading.Event()
    seen: list[int] = []
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for name in os.listdir(state):
                if name.startswith(".tmp."):
                    continue
                try:
                    data = (state / name).read_bytes()
                except FileNotFoundError:
                    continue
                if slurm.parse_state_file(name, data) is None:
                    bad.append(name)
                seen.append(1)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for job in range(200, 215):
            run("prolog.sh", slurmd_env(state, str(job), SLURM_JOB_GPUS="0-7"))
            run("epilog.sh", slurmd_env(state, str(job)))
    finally:
        stop.set()
        thread.join()
    assert seen and not bad


def test_amd_exporter_layout_is_read_too(tmp_path: Path) -> None:
    # What AMD's device-metrics-exporter prolog leaves in /var/run/exporter/<index>.
    for index in (0, 1):
        record = {"SLURM_JOB_ID": "555", "SLURM_JOB_USER": "bob", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": "0,1"}
        (tmp_path / str(index)).write_text(" ".join(json.dumps(record, indent=1).split()) + "\n")
    assert jobs_by_gpu(tmp_path) == {0: "555", 1: "555"}


def test_missing_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    source = slurm.SlurmAttribution(str(tmp_path / "absent"))
    report = source.read_once()
    assert not report.up and "does not exist" in report.error
    (tmp_path / "absent").mkdir()
    assert source.read_once().up
