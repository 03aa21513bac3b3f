"""Issue 31 case 11: the Slurm prolog caps what it writes: a bounded number of files however many
ranges SLURM_JOB_GPUS lists, and fields cut (and logged) so that a huge cluster name still gives a
state file the exporter reads: the job keeps its labels."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from exporter.attribution.slurm import MAX_FILE_BYTES, claims_from_files, read_state_files

pytestmark = pytest.mark.integration

PROLOG = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "prolog.sh"


def prolog(state: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "mi300",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state),
        **extra,
    }
    return subprocess.run(["bash", str(PROLOG)], env=env, capture_output=True, text=True, timeout=120)


def test_ten_ranges_write_a_bounded_number_of_files(tmp_path: Path) -> None:
    state = tmp_path / "slurm"
    result = prolog(state, SLURM_JOB_GPUS=",".join(f"{n * 1000}-{n * 1000 + 1023}" for n in range(10)))
    assert result.returncode == 0
    files = sorted(state.iterdir())
    assert len(files) == 128, len(files)
    assert files[0].name == "0.77" and "recorded are the first 128" in result.stderr
    # the same index listed twice is one file
    again = tmp_path / "again"
    prolog(again, SLURM_JOB_GPUS="0-3,2,3,1-2")
    assert sorted(p.name for p in again.iterdir()) == ["0.77", "1.77", "2.77", "3.77"]


def test_a_huge_cluster_name_is_cut_and_the_job_keeps_its_labels(tmp_path: Path) -> None:
    state = tmp_path / "slurm"
    result = prolog(state, SLURM_JOB_GPUS="0,1", SLURM_CLUSTER_NAME="c" * 120_000, SLURM_JOB_ACCOUNT="é" * 5000)
    assert result.returncode == 0
    assert "SLURM_CLUSTER_NAME is 120000 characters; recorded are its first 256" in result.stderr
    assert "SLURM_JOB_ACCOUNT is 5000 characters" in result.stderr
    for path in state.iterdir():
        assert path.stat().st_size < MAX_FILE_BYTES
    claims = claims_from_files(read_state_files(str(state)))
    assert [dict(claim.labels) for claim in claims] == [
        {"job_id": "77", "job_user": "alice", "job_partition": "mi300"}
    ] * 2
