"""The operators' habit today, `watch rocm-smi --showpower --showtemp --showuse`, costed per sample.

librocm_smi64 hard-codes /sys, so each run happens in a private mount namespace with the simulated
tree bound over /sys and a fresh /dev/shm (the library's per-card mutexes live there). The
namespace wrapper's own CPU (unshare, sh, two mounts) is measured with `true` in place of rocm-smi
and subtracted, so the figure is what one rocm-smi sample costs on a real node.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procstat import children_cpu, children_cpu_since

ROCM_SMI_ARGS = ("--showpower", "--showtemp", "--showuse")
_GPU_LINE = re.compile(r"^GPU\[(\d+)\]", re.MULTILINE)
_WRAPPER = 'root=$1; shift; mount --bind "$root" /sys && mount -t tmpfs tmpfs /dev/shm && exec "$@"'


class RocmSmiError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class RocmSmiCost:
    runs: int
    cpu_seconds_median: float  # rocm-smi alone (wrapper subtracted)
    cpu_seconds_raw_median: float  # including the namespace wrapper
    wrapper_cpu_seconds: float
    wall_seconds_median: float
    gcds_seen: int
    exit_code: int  # rocm-smi exits non-zero when any field is unsupported, even if it printed
    output: str


def namespace_argv(sysfs: Path, argv: list[str]) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RocmSmiError("unshare is not installed (Debian package util-linux)")
    return [unshare, "-m", "--propagation", "private", "sh", "-c", _WRAPPER, "sh", str(sysfs), *argv]


def gcds_in_output(output: str) -> int:
    """How many distinct GPU[N] indices rocm-smi printed."""
    return len(set(_GPU_LINE.findall(output)))


def _timed_run(argv: list[str], timeout: float) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    mark = children_cpu()
    started = time.monotonic()
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.monotonic() - started
    return children_cpu_since(mark).total, wall, completed


def measure_rocm_smi(sysfs: Path, runs: int = 5, timeout: float = 60.0) -> RocmSmiCost:
    binary = shutil.which("rocm-smi")
    if binary is None:
        raise RocmSmiError("rocm-smi is not installed (Debian package rocm-smi)")
    wrapper_cpu = []
    for _ in range(runs):
        cpu, _, done = _timed_run(namespace_argv(sysfs, ["true"]), timeout)
        if done.returncode != 0:
            raise RocmSmiError(f"cannot enter a mount namespace over {sysfs}: {done.stderr.strip()}")
        wrapper_cpu.append(cpu)
    argv = namespace_argv(sysfs, [binary, *ROCM_SMI_ARGS])
    _timed_run(argv, timeout)  # warm the page cache and Python's bytecode cache
    raw, walls = [], []
    completed = None
    for _ in range(runs):
        cpu, wall, completed = _timed_run(argv, timeout)
        raw.append(cpu)
        walls.append(wall)
    assert completed is not None
    output = completed.stdout + completed.stderr
    seen = gcds_in_output(completed.stdout)
    if seen == 0:
        raise RocmSmiError(f"rocm-smi saw no GPU in {sysfs} (exit {completed.returncode}):\n{output[-2000:]}")
    wrapper = statistics.median(wrapper_cpu)
    return RocmSmiCost(
        runs=runs,
        cpu_seconds_median=max(0.0, statistics.median(raw) - wrapper),
        cpu_seconds_raw_median=statistics.median(raw),
        wrapper_cpu_seconds=wrapper,
        wall_seconds_median=statistics.median(walls),
        gcds_seen=seen,
        exit_code=completed.returncode,
        output=output,
    )
