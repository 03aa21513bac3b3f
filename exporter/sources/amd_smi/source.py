"""The amd-smi source: the rocm_smi source's supervision and sysfs fallback, over the amd-smi worker."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.sources.amd_smi import convert
from exporter.sources.rocm_smi.source import RocmSmiSource, self_check
from exporter.sources.rocm_smi.supervisor import AMD_SMI_WORKER


class AmdSmiSource(RocmSmiSource):
    """`--source amd-smi`. The library reads /sys like librocm_smi64, so the fallback is a SysfsSource."""

    name = "amd-smi"
    sample_from_readings = staticmethod(convert.sample_from_readings)
    library_name = "the amdsmi module"
    worker_module = AMD_SMI_WORKER


def probe_amd_smi(sysfs_root: str, *, worker_prefix: Sequence[str] = (), timeout: float = 10.0) -> tuple[bool, str]:
    """Can the amd-smi source serve this host? The `amdsmi` module in a throwaway worker (self_check)."""
    return self_check(AmdSmiSource, "amdsmi", sysfs_root, worker_prefix, timeout)
