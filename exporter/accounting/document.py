"""The job documents of /api/v1/jobs and /api/v1/jobs/{id} (pure; docs/accounting.md).

`job-report` renders the same document (from the daemon, or built from Prometheus), so the API and
the report can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exporter.model import DeviceUsage, JobUsage

SPLIT_RULE = (
    "a package's energy counter (MI250X: die 0; partitioned MI300-class socket: partition 0) is split among "
    "its dies or partitions each cycle by their share of gfx busy-seconds, equally when none is busy"
)


def _sum(maps: Iterable[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for values in maps:
        for name, value in values.items():
            total[name] = total.get(name, 0) + value
    return total


def _highest(maps: Iterable[Mapping[str, float]]) -> dict[str, float]:
    peak: dict[str, float] = {}
    for values in maps:
        for name, value in values.items():
            peak[name] = max(value, peak.get(name, value))
    return peak


def _socket_errors(devices: Iterable[DeviceUsage]) -> dict[str, float]:
    """The job's error increases, each counter once: partitions 1..N-1 report their socket's (read on
    partition 0), so a package's partitions > 0 count once, and not at all beside its partition 0."""
    own: list[Mapping[str, float]] = []
    borrowed: dict[str, list[Mapping[str, float]]] = {}
    for device in devices:
        if device.partition:
            borrowed.setdefault(device.package, []).append(device.errors)
        else:
            own.append(device.errors)
    held_leads = {d.package for d in devices if not d.partition}
    counted = [_highest(errors) for package, errors in borrowed.items() if package not in held_leads]
    return _sum([*own, *counted])


def _mean(total: float, seconds: float) -> float | None:
    return total / seconds if seconds > 0 else None


def device_document(usage: DeviceUsage, history: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {
        "gpu": usage.gpu,
        "product": usage.product,
        "package": usage.package,
        "die": usage.die,
        "partition": usage.partition,
        "place": usage.place,
        "held_seconds": usage.held_seconds,
        "energy_joules": usage.energy_joules,
        "package_energy_joules": usage.package_energy_joules,
        "energy_share_ratio": usage.energy_joules / usage.package_energy_joules
        if usage.package_energy_joules
        else None,
        "mean_power_watts": _mean(usage.energy_joules, usage.held_seconds),
        "peak_power_watts": usage.peak_power_watts,
        "busy_seconds": dict(usage.busy_seconds),
        "mean_busy_ratio": {e: s / usage.held_seconds for e, s in usage.busy_seconds.items()}
        if usage.held_seconds
        else {},
        "peak_temperatures_celsius": dict(usage.peak_temperatures_celsius),
        "vram_peak_bytes": usage.vram_peak_bytes,
        "throttled_seconds": dict(usage.throttled_seconds),
        "errors": {name: int(value) for name, value in usage.errors.items()},
        "failed_checks": list(usage.failed_checks),
    }
    if history:
        data["history"] = {
            "time": [p[0] for p in usage.history],
            "power_watts": [p[1] for p in usage.history],
            "gfx_busy_ratio": [p[2] for p in usage.history],
            "junction_celsius": [p[3] for p in usage.history],
        }
    return data


def job_document(job: JobUsage, node: str = "", history: bool = True) -> dict[str, Any]:
    """One job: its totals over every device it held and each device's figures (with the plots' points)."""
    devices = job.devices
    end = job.ended_at if job.ended_at is not None else job.updated_at
    energy, held = job.energy_joules, job.gpu_seconds
    peaks = [d.peak_power_watts for d in devices if d.peak_power_watts is not None]
    vram = [d.vram_peak_bytes for d in devices if d.vram_peak_bytes is not None]
    return {
        "job_id": job.job_id,
        "scheduler": job.scheduler,
        "state": "running" if job.ended_at is None else "ended",
        "node": node,
        "labels": dict(job.labels),
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "updated_at": job.updated_at,
        "duration_seconds": max(0.0, end - job.started_at),
        "gpus": [d.gpu for d in devices] or list(job.held_gpus),
        "totals": {
            "energy_joules": energy,
            "gpu_seconds": held,
            "gpu_hours": held / 3600.0,
            "mean_power_watts": _mean(energy, max(0.0, end - job.started_at)),
            "peak_device_power_watts": max(peaks) if peaks else None,
            "busy_seconds": _sum(d.busy_seconds for d in devices),
            "peak_temperatures_celsius": _highest(d.peak_temperatures_celsius for d in devices),
            "vram_peak_bytes": max(vram) if vram else None,
            "throttled_seconds": _sum(d.throttled_seconds for d in devices),
            "errors": {k: int(v) for k, v in _socket_errors(devices).items()},
            "failed_checks": sorted({c for d in devices for c in d.failed_checks}),
        },
        "split_rule": SPLIT_RULE,
        "devices": [device_document(d, history) for d in devices],
    }


def jobs_document(running: Iterable[JobUsage], ended: Iterable[JobUsage], node: str = "") -> dict[str, Any]:
    """/api/v1/jobs: every running job and the ended ones kept (newest first), without plots."""
    return {
        "node": node,
        "split_rule": SPLIT_RULE,
        "running": [job_document(job, node, history=False) for job in running],
        "ended": [job_document(job, node, history=False) for job in reversed(tuple(ended))],
    }


def accounting_record(document: Mapping[str, Any]) -> str:
    """The one-line record of a job's end (the log line; Slurm's AdminComment): key=value, no spaces."""
    totals = document["totals"]
    fields = {
        "amdgpu_energy_j": f"{totals['energy_joules']:.0f}",
        "gpu_s": f"{totals['gpu_seconds']:.0f}",
        "gpus": len(document["gpus"]),
        "gfx_busy_s": f"{totals['busy_seconds'].get('gfx', 0.0):.0f}",
        "peak_junction_c": f"{totals['peak_temperatures_celsius'].get('junction', 0.0):.0f}",
        "vram_peak_gib": f"{(totals['vram_peak_bytes'] or 0) / 2**30:.1f}",
        "ecc_ue": int(totals["errors"].get("ecc_uncorrectable", 0)),
        "failed_checks": "+".join(totals["failed_checks"]) or "none",
    }
    return ",".join(f"{name}={value}" for name, value in fields.items())
