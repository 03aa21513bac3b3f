"""Which Slurm job holds each GPU: the per-GPU state files a prolog writes.

Two layouts, told apart by the file name, so a site can point --slurm.state-dir at either:
- ours (deploy/slurm/prolog.sh): `<gpu index>.<job id>`, one JSON object per file, written atomically;
  several jobs sharing a GPU each have their own file and the epilog removes only its job's.
- AMD's device-metrics-exporter prolog: `<gpu index>` in /var/run/exporter, the same JSON keys.
Both carry SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_PARTITION. The index is the gres index, which
follows rocm-smi's order (AutoDetect=rsmi), as does the exporter's `gpu` label.

Parsing is pure (name + bytes -> claim); reading the directory is the only I/O.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable

from exporter.attribution.schedule import AttributionReadError, ScheduledAttribution
from exporter.model import ByGpuIndex, Claim

SOURCE = "slurm"
LABELS = ("job_id", "job_user", "job_partition")
DEFAULT_STATE_DIR = "/run/amdgpu-exporter/slurm"
MAX_FILE_BYTES = 64 * 1024  # a state file is a few hundred bytes; anything larger is not one

_OURS = re.compile(r"^(\d{1,4})\.(\d{1,20})$")
_DME = re.compile(r"^(\d{1,4})$")


def parse_state_file(name: str, data: bytes) -> Claim | None:
    """Pure: one state file -> the claim it records; None for files that are not state files.

    A file whose job id disagrees with its name, that is not a JSON object, or has no job id is not a
    record of a job (a half-written file from a non-atomic prolog, an editor's backup): None.
    """
    ours = _OURS.match(name)
    dme = None if ours else _DME.match(name)
    if ours is None and dme is None:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    job_id = _text(record.get("SLURM_JOB_ID"))
    if not job_id:
        return None
    if ours is not None and job_id != ours.group(2):
        return None
    index = int((ours or dme).group(1))  # type: ignore[union-attr]
    labels = (
        ("job_id", job_id),
        ("job_user", _text(record.get("SLURM_JOB_USER"))),
        ("job_partition", _text(record.get("SLURM_JOB_PARTITION"))),
    )
    return Claim(ByGpuIndex(index), str(index), labels, SOURCE)


def _text(value: object) -> str:
    """A JSON value as a label value: strings as they are, numbers as written, anything else ''."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return ""


def claims_from_files(files: Iterable[tuple[str, bytes]]) -> tuple[Claim, ...]:
    """Pure: the claims of a directory's (name, content) pairs, in a stable order."""
    claims = {claim for name, data in files if (claim := parse_state_file(name, data)) is not None}
    return tuple(sorted(claims, key=lambda c: (c.device_id.zfill(4), c.labels)))


def read_state_dir(path: str) -> tuple[Claim, ...]:
    """The claims of a state directory. A missing or unreadable directory raises AttributionReadError."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        raise AttributionReadError(
            f"Slurm state directory {path} does not exist (no job has run since boot, or the path is wrong)"
        ) from None
    except OSError as error:
        raise AttributionReadError(f"cannot list Slurm state directory {path}: {error.strerror}") from None
    files: list[tuple[str, bytes]] = []
    for name in names:
        if not (_OURS.match(name) or _DME.match(name)):
            continue
        try:
            with open(os.path.join(path, name), "rb") as handle:
                files.append((name, handle.read(MAX_FILE_BYTES)))
        except OSError:  # removed by an epilog between listdir and open, or not a file
            continue
    return claims_from_files(files)


class SlurmAttribution(ScheduledAttribution):
    """Reads the state directory every `interval` seconds."""

    def __init__(
        self,
        state_dir: str = DEFAULT_STATE_DIR,
        interval: float = 5.0,
        keep_for: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = state_dir
        super().__init__(SOURCE, lambda: read_state_dir(state_dir), interval, keep_for, clock, describe=state_dir)
