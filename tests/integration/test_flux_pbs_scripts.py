"""deploy/flux and deploy/pbs's prolog/epilog run as their batch systems run them, read back by the
exporter's state-file reader (the one --slurm.state-dir uses), as tests/integration/test_slurm_scripts.py
does for Slurm's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from exporter.attribution import slurm
from exporter.model import ByGpuIndex

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", str(DEPLOY / script), *args], env={"PATH": PATH, **env}, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr  # a failing prolog drains the node (or requeues the job)
    return result


def held(state: Path) -> dict[int, tuple[str, str, str, str]]:
    """gpu -> (scheduler, job_id, job_user, job_partition), as the exporter reads the folder."""
    found = {}
    for claim in slurm.claims_from_files(slurm.read_state_files(str(state))):
        assert isinstance(claim.device, ByGpuIndex)
        labels = dict(claim.labels)
        found[claim.device.gpu] = (claim.resource, labels["job_id"], labels["job_user"], labels["job_partition"])
    return found


def test_flux_prolog_records_the_jobs_gpus_and_the_epilog_forgets_only_that_job(tmp_path: Path) -> None:
    state = tmp_path / "run" / "slurm"
    env = {"AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state), "FLUX_JOB_USERID": "0"}
    run("flux/prolog.sh", {**env, "FLUX_JOB_ID": "123456789012", "AMDGPU_EXPORTER_JOB_GPUS": "0-1,3"})
    run("flux/prolog.sh", {**env, "FLUX_JOB_ID": "777", "AMDGPU_EXPORTER_JOB_GPUS": "2"})
    assert held(state) == {
        0: ("flux", "123456789012", "root", ""),
        1: ("flux", "123456789012", "root", ""),
        2: ("flux", "777", "root", ""),
        3: ("flux", "123456789012", "root", ""),
    }
    record = json.loads((state / "3.123456789012").read_text())
    assert record["scheduler"] == "flux" and record["gpu_index"] == 3
    run("flux/epilog.sh", {**env, "FLUX_JOB_ID": "123456789012"})
    assert held(state) == {2: ("flux", "777", "root", "")}
    # An f58 id without the flux command to decode it: said, nothing written, still exit 0
    result = run("flux/prolog.sh", {**env, "FLUX_JOB_ID": "ƒ2oLkTLb", "AMDGPU_EXPORTER_JOB_GPUS": "5"})
    assert "no usable FLUX_JOB_ID" in result.stderr and 5 not in held(state)


def test_pbs_prologue_takes_the_job_id_and_the_gpus_from_env_aux_file_or_the_whole_node(tmp_path: Path) -> None:
    state = tmp_path / "slurm"
    home = tmp_path / "pbs"
    (home / "aux").mkdir(parents=True)
    sysfs = tmp_path / "sys"
    for node, gpu_id in ((0, "0"), (1, "1234"), (2, "5678"), (3, "0"), (4, "999")):  # CPU nodes have gpu_id 0
        (sysfs / "class/kfd/kfd/topology/nodes" / str(node)).mkdir(parents=True)
        (sysfs / "class/kfd/kfd/topology/nodes" / str(node) / "gpu_id").write_text(gpu_id + "\n")
    env = {
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state),
        "PBS_HOME": str(home),
        "AMDGPU_EXPORTER_SYSFS": str(sysfs),
        "PBS_QUEUE": "gpu",
    }
    run("pbs/prologue.sh", {**env, "AMDGPU_EXPORTER_JOB_GPUS": "0"}, "1001.pbs01", "alice", "users")
    (home / "aux" / "1002[3].pbs01.gpu").write_text("node7-gpu1\nnode7-gpu2\n")  # Torque's $PBS_GPUFILE lines
    run("pbs/prologue.sh", env, "1002[3].pbs01", "bob", "users")
    assert held(state) == {
        0: ("pbs", "1001.pbs01", "alice", "gpu"),
        1: ("pbs", "1002[3].pbs01", "bob", "gpu"),
        2: ("pbs", "1002[3].pbs01", "bob", "gpu"),
    }
    run("pbs/epilogue.sh", env, "1002[3].pbs01", "bob", "users")
    run("pbs/epilogue.sh", env, "100.pbs01", "x", "users")  # a prefix of 1001: no effect
    assert held(state) == {0: ("pbs", "1001.pbs01", "alice", "gpu")}
    run("pbs/epilogue.sh", env, "1001.pbs01", "alice", "users")
    # No list at all: every GPU of the node (3 KFD GPU nodes here)
    run("pbs/prologue.sh", env, "2000.pbs01", "carol", "users")
    assert sorted(held(state)) == [0, 1, 2]
    run("pbs/epilogue.sh", env, "2000.pbs01")
    assert os.listdir(state) == []
    result = run("pbs/prologue.sh", env, "../../etc/passwd", "eve")
    assert "no usable PBS job id" in result.stderr and os.listdir(state) == []


def test_a_record_whose_scheduler_or_id_does_not_match_its_name_is_not_a_claim() -> None:
    good = {"scheduler": "pbs", "job_id": "42.server", "job_user": "u", "job_partition": "q"}
    assert slurm.parse_state_file("0.42", json.dumps(good).encode()) is not None
    assert slurm.parse_state_file("0.43", json.dumps(good).encode()) is None
    assert slurm.parse_state_file("0.42", json.dumps({**good, "scheduler": "lsf"}).encode()) is None
    assert slurm.parse_state_file("0.42", json.dumps({**good, "job_id": "server.42"}).encode()) is None
