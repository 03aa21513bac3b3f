"""The amd-smi source: the rocm_smi source's supervision and sysfs fallback, over the amd-smi worker."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from exporter.sources.amd_smi import convert
from exporter.sources.base import Source
from exporter.sources.rocm_smi.source import RocmSmiSource, self_check
from exporter.sources.rocm_smi.supervisor import AMD_SMI_WORKER


class AmdSmiSource(RocmSmiSource):
    """`--source amd-smi`. The library reads /sys like librocm_smi64, so the fallback is a SysfsSource."""

    name = "amd-smi"
    sample_from_readings = staticmethod(convert.sample_from_readings)
    library_name = "the amdsmi module"

    def __init__(self, fallback: Source | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("worker_module", AMD_SMI_WORKER)
        super().__init__(fallback, **kwargs)


def probe_amd_smi(sysfs_root: str, *, worker_prefix: Sequence[str] = (), timeout: float = 10.0) -> tuple[bool, str]:
    """Can the amd-smi source serve this host? The `amdsmi` module in a throwaway worker, with the
    rocm-smi probe's self-check (every device read once, unique_id equal to sysfs')."""
    if not worker_prefix and os.path.realpath(sysfs_root) != "/sys":
        return False, f"libamd_smi reads /sys only, and the sysfs root is {sysfs_root}"
    source = AmdSmiSource(None, worker_prefix=worker_prefix, call_timeout=timeout, quiet=True)
    return self_check(source, "amdsmi", sysfs_root)
