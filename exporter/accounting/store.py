"""The ledger kept across daemon restarts: one small JSON file, written atomically.

The file holds the running jobs, the ended ones kept (ledger.Limits) and each device's last counter
readings, so the first cycle after a restart charges the running jobs with the energy of the gap.
Writing: a temporary file in the same folder, fsync, rename over the name. Reading: the bounded
reader (boundedfile); a file that is not ours (bad JSON, another version, too large) is logged and
set aside as `<file>.bad`, never a reason not to start.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from exporter import boundedfile
from exporter.accounting.ledger import Ledger, Reading
from exporter.log import get_logger
from exporter.model import DeviceUsage, JobUsage, frozen_map

log = get_logger("exporter.accounting")
FORMAT = 1
MAX_FILE_BYTES = 32 * 1024 * 1024  # Limits' 2000 ended jobs of 8 GPUs without plots are ~6 MB
DEFAULT_STATE_FILE = "/var/lib/amdgpu-exporter/jobs.json"


def _key(key: tuple[Any, ...]) -> str:
    return "|".join(str(part) for part in key)


def _unkey(text: str) -> tuple[str, str, int]:
    bdf, unique_id, partition = text.split("|")
    return (bdf, unique_id, int(partition))


def usage_json(usage: DeviceUsage) -> dict[str, Any]:
    return {
        "gpu": usage.gpu,
        "device_key": _key(usage.device_key),
        "package": usage.package,
        "die": usage.die,
        "partition": usage.partition,
        "product": usage.product,
        "place": usage.place,
        "held_seconds": usage.held_seconds,
        "energy_joules": usage.energy_joules,
        "package_energy_joules": usage.package_energy_joules,
        "busy_seconds": dict(usage.busy_seconds),
        "peak_power_watts": usage.peak_power_watts,
        "peak_temperatures_celsius": dict(usage.peak_temperatures_celsius),
        "vram_peak_bytes": usage.vram_peak_bytes,
        "throttled_seconds": dict(usage.throttled_seconds),
        "errors": dict(usage.errors),
        "failed_checks": list(usage.failed_checks),
        "history": [list(point) for point in usage.history],
        "history_stride": usage.history_stride,
        "history_skipped": usage.history_skipped,
    }


def job_json(job: JobUsage) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "scheduler": job.scheduler,
        "labels": dict(job.labels),
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "updated_at": job.updated_at,
        "held_gpus": list(job.held_gpus),
        "devices": [usage_json(d) for d in job.devices],
    }


def _number(value: Any) -> float | None:
    """A JSON number or null; anything else is not a state file of ours."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _usage(data: Mapping[str, Any]) -> DeviceUsage:
    def point(p: list[Any]) -> tuple[float, float | None, float | None, float | None]:
        if len(p) != 4:
            raise ValueError("a history point has 4 values")
        return (float(p[0]), _number(p[1]), _number(p[2]), _number(p[3]))

    return DeviceUsage(
        gpu=int(data["gpu"]),
        device_key=_unkey(data["device_key"]),
        package=str(data["package"]),
        die=int(data["die"]),
        partition=int(data["partition"]),
        product=str(data["product"]),
        place=str(data.get("place", "")),
        held_seconds=float(data["held_seconds"]),
        energy_joules=float(data["energy_joules"]),
        package_energy_joules=float(data["package_energy_joules"]),
        busy_seconds=frozen_map({str(k): float(v) for k, v in data["busy_seconds"].items()}),
        peak_power_watts=_number(data["peak_power_watts"]),
        peak_temperatures_celsius=frozen_map({str(k): float(v) for k, v in data["peak_temperatures_celsius"].items()}),
        vram_peak_bytes=_number(data["vram_peak_bytes"]),
        throttled_seconds=frozen_map({str(k): float(v) for k, v in data["throttled_seconds"].items()}),
        errors=frozen_map({str(k): int(v) for k, v in data["errors"].items()}),
        failed_checks=tuple(str(c) for c in data["failed_checks"]),
        history=tuple(point(p) for p in data["history"]),
        history_stride=int(data["history_stride"]),
        history_skipped=int(data["history_skipped"]),
    )


def job_from_json(data: Mapping[str, Any]) -> JobUsage:
    return JobUsage(
        job_id=str(data["job_id"]),
        scheduler=str(data["scheduler"]),
        labels=tuple((str(k), str(v)) for k, v in data["labels"].items()),
        started_at=float(data["started_at"]),
        ended_at=None if data["ended_at"] is None else float(data["ended_at"]),
        updated_at=float(data["updated_at"]),
        devices=tuple(_usage(d) for d in data["devices"]),
        held_gpus=tuple(int(g) for g in data["held_gpus"]),
    )


def ledger_json(ledger: Ledger) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "taken_at": ledger.taken_at,
        "readings": {
            _key(key): {
                "energy_joules": r.energy_joules,
                "errors": dict(r.errors),
                "throttle_residency_seconds": dict(r.throttle_residency_seconds),
            }
            for key, r in ledger.readings.items()
        },
        "running": [job_json(job) for job in ledger.running],
        "ended": [job_json(job) for job in ledger.ended],
    }


def ledger_from_json(data: Any) -> Ledger:
    """Pure: the ledger a state file holds; ValueError when it is not one of ours."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not an accounting state file of format {FORMAT}")
    try:
        readings = {
            _unkey(key): Reading(
                _number(value["energy_joules"]),
                frozen_map({str(k): float(v) for k, v in value["errors"].items()}),
                frozen_map({str(k): float(v) for k, v in value["throttle_residency_seconds"].items()}),
            )
            for key, value in data["readings"].items()
        }
        return Ledger(
            running=tuple(job_from_json(job) for job in data["running"]),
            ended=tuple(job_from_json(job) for job in data["ended"]),
            readings=frozen_map(readings),
            taken_at=None if data["taken_at"] is None else float(data["taken_at"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as error:
        raise ValueError(f"malformed accounting state file: {type(error).__name__}: {error}") from None


class LedgerStore:
    """The state file: load once at start, save after each cycle that changed something."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._failing = False

    def load(self) -> Ledger:
        if not self.path or not os.path.exists(self.path):
            return Ledger()
        try:
            text = boundedfile.read_text(self.path, "accounting state file", MAX_FILE_BYTES)
            ledger = ledger_from_json(json.loads(text))
        except (boundedfile.FileReadError, ValueError, RecursionError) as error:
            aside = self.path + ".bad"
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = ""
            log.error("accounting_state_unusable", file=self.path, error=str(error), moved_to=aside or None)
            return Ledger()
        log.info("accounting_state_loaded", file=self.path, running=len(ledger.running), ended=len(ledger.ended))
        return ledger

    def save(self, ledger: Ledger, durable: bool = True) -> bool:
        """Write atomically; `durable` also fsyncs (a job started or ended; every cycle in between
        only renames: a crash then keeps the last synced file, and its counter readings still make
        the next start charge the whole gap). A failure is logged once (and once when it works
        again), never raised."""
        if not self.path:
            return False
        data = json.dumps(ledger_json(ledger), separators=(",", ":")).encode()
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, mode=0o755, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".jobs.", dir=folder)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    if durable:
                        os.fsync(out.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as error:
            if not self._failing:
                log.error("accounting_state_not_written", file=self.path, error=error.strerror or str(error))
            self._failing = True
            return False
        if self._failing:
            log.info("accounting_state_written_again", file=self.path)
        self._failing = False
        return True
