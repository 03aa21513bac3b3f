"""Which Slurm job holds each GPU: the per-GPU state files a prolog writes.

Two layouts, told apart by the file name, so a site can point --slurm.state-dir at either:
- ours (deploy/slurm/prolog.sh): `<gpu index>.<job id>`, one JSON object per file, written atomically;
  several jobs sharing a GPU each have their own file and the epilog removes only its job's.
- AMD's device-metrics-exporter prolog: `<gpu index>` in /var/run/exporter, the same JSON keys.
Both carry SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_PARTITION. The index is the gres index, which
follows rocm-smi's order (AutoDetect=rsmi), as does the exporter's `gpu` label.
- deploy/flux and deploy/pbs's prologs write ours too, with `scheduler` ("flux" | "pbs") and
  `job_id`, `job_user`, `job_partition` (the queue); the name carries the id's leading digits (a
  PBS id is "1234.server"). The claim's resource is the scheduler.

Parsing is pure (name + bytes -> claim); reading the directory is the only I/O.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

from exporter import boundedfile
from exporter.attribution.schedule import AttributionReadError, ScheduledAttribution
from exporter.attribution.text import clean_text
from exporter.log import get_logger
from exporter.model import ByGpuIndex, Claim

SOURCE = "slurm"
log = get_logger("exporter.attribution.slurm")
LABELS = ("job_id", "job_user", "job_partition")
DEFAULT_STATE_DIR = "/run/amdgpu-exporter/slurm"
MAX_FILE_BYTES = 64 * 1024  # a state file is a few hundred bytes; anything larger is not one

SCHEDULERS = ("slurm", "flux", "pbs")  # the batch systems whose prologs write these files
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
        # Bytes that are not UTF-8 (a partition or user name in another encoding) become U+FFFD:
        # the job keeps its GPUs' labels instead of vanishing.
        record = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    scheduler = _text(record.get("scheduler")) or SOURCE
    if scheduler not in SCHEDULERS:
        return None
    generic = scheduler != SOURCE
    job_id = _text(record.get("job_id" if generic else "SLURM_JOB_ID"))
    if not job_id:
        return None
    if ours is not None and (_leading_digits(job_id) if generic else job_id) != ours.group(2):
        return None
    index = int((ours or dme).group(1))  # type: ignore[union-attr]
    user, partition = ("job_user", "job_partition") if generic else ("SLURM_JOB_USER", "SLURM_JOB_PARTITION")
    labels = (
        ("job_id", job_id),
        ("job_user", _text(record.get(user))),
        ("job_partition", _text(record.get(partition))),
    )
    return Claim(ByGpuIndex(index), str(index), labels, scheduler)


def _leading_digits(job_id: str) -> str:
    match = re.match(r"\d{1,20}", job_id)
    return match.group(0) if match else ""


def _text(value: object) -> str:
    """A JSON value as a label value: strings as they are (a lone surrogate escape, `"\\ud800"`, as
    U+FFFD), numbers as written, anything else ''."""
    if isinstance(value, str):
        return clean_text(value.strip())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return ""


def claims_from_files(files: Iterable[tuple[str, bytes]]) -> tuple[Claim, ...]:
    """Pure: the claims of a directory's (name, content) pairs, in a stable order."""
    claims = {claim for name, data in files if (claim := parse_state_file(name, data)) is not None}
    return tuple(sorted(claims, key=lambda c: (c.device_id.zfill(4), c.labels)))


def read_state_files(path: str, skipped: list[tuple[str, str]] | None = None) -> list[tuple[str, bytes]]:
    """(name, content) of every file of the state directory named like a state file. Each is read
    through the bounded reader: a FIFO, device or directory standing for one, or a file over
    MAX_FILE_BYTES, is skipped (added to `skipped` as (name, why)), never waited on. A missing or
    unreadable directory raises AttributionReadError."""
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
            files.append((name, boundedfile.read_bytes(os.path.join(path, name), "Slurm state file", MAX_FILE_BYTES)))
        except boundedfile.FileReadError as error:  # removed by an epilog since listdir, too large, or not a file
            if skipped is not None and os.path.lexists(os.path.join(path, name)):
                skipped.append((name, str(error)))
            continue
    return files


class SlurmAttribution(ScheduledAttribution):
    def __init__(self, state_dir: str = DEFAULT_STATE_DIR, interval: float = 5.0) -> None:
        self.state_dir = state_dir
        self._unusable: set[tuple[str, bytes]] = set()
        # No claims kept after a failed read: the prolog's files are the whole truth.
        super().__init__(SOURCE, self._read_claims, interval, keep_for=0.0, describe=state_dir)

    def _read_claims(self) -> tuple[Claim, ...]:
        skipped: list[tuple[str, str]] = []
        files = read_state_files(self.state_dir, skipped)
        # (name, content) -> why; a file skipped unread (too large, not a file) is keyed by its reason
        reasons = {
            (name, data): "not a JSON object whose SLURM_JOB_ID matches its name"
            for name, data in files
            if parse_state_file(name, data) is None
        }
        reasons.update({(name, why.encode("utf-8", "replace")): why for name, why in skipped})
        unusable = set(reasons)
        for key in sorted(unusable - self._unusable):  # each bad file (and each new content) once
            log.warning("slurm_state_file_unusable", file=os.path.join(self.state_dir, key[0]), reason=reasons[key])
        self._unusable = unusable
        return claims_from_files(files)
