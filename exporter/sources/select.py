"""Which source serves the devices: the --source flag, or for `auto` what the host can use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exporter.sources.base import Source, StartupError
from exporter.sources.sysfs import SysfsSource


@dataclass(frozen=True, slots=True)
class SourceChoice:
    """What select_source needs of the settings: the --source flag and what each source is built with."""

    source: str  # "auto", "sysfs", "rocm-smi" or "amd-smi"
    slow_interval: float
    read_timeout: float
    # The Sample fields the families shown are made of: a source reads no optional field outside
    # them (sysfs/table.py, OPTIONAL_FIELDS). None: the source's own choice (sysfs: UNLESS_TOLD).
    wanted: frozenset[str] | None = None


def select_source(
    settings: SourceChoice, sysfs_root: str, details: dict[str, str] | None = None
) -> tuple[Source, str, str]:
    """Returns (source, name, reason code). rocm-smi only where the library can read this root.

    The code is what /metrics (build_info) and / show: short and stable, never a sentence with
    host paths or library messages; the full explanation goes into `details` (for the log).
    """
    details = {} if details is None else details
    sysfs = SysfsSource(
        sysfs_root,
        slow_interval=settings.slow_interval,
        read_timeout=settings.read_timeout,
        wanted=settings.wanted,
    )
    if settings.source == "sysfs":
        return sysfs, "sysfs", "flag"
    if settings.source == "amd-smi":
        from exporter.sources.amd_smi import source as amd_smi

        ok, reason = amd_smi.probe_amd_smi(sysfs_root)
        if not ok:
            raise StartupError(f"--source=amd-smi was asked for but the amdsmi module cannot be used: {reason}")
        details["detail"] = reason
        return amd_smi.AmdSmiSource(fallback=sysfs, call_timeout=settings.read_timeout * 0.75), "amd-smi", "flag"
    if settings.source == "auto" and Path(sysfs_root).resolve() != Path("/sys"):
        details["detail"] = "librocm_smi64 only reads /sys"
        return sysfs, "sysfs", "auto_sysfs_root_not_sys"
    from exporter.sources.rocm_smi import source as rocm_smi

    ok, reason = rocm_smi.probe_rocm_smi(sysfs_root)
    details["detail"] = reason
    if ok:
        # The worker's own call deadline fires before the poller's, so a hung library call is
        # attributed (and the worker restarted) by the supervisor rather than merely timed out.
        source = rocm_smi.RocmSmiSource(fallback=sysfs, call_timeout=settings.read_timeout * 0.75)
        return source, "rocm-smi", "flag" if settings.source == "rocm-smi" else "auto_rocm_smi_usable"
    if settings.source == "rocm-smi":
        raise StartupError(f"--source=rocm-smi was asked for but the ROCm SMI library cannot be used: {reason}")
    return sysfs, "sysfs", "auto_rocm_smi_unusable"
