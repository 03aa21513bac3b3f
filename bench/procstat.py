"""CPU time and memory of a running process, read from /proc (no psutil needed).

/proc/<pid>/stat utime+stime count in clock ticks (10 ms on most kernels), so a CPU figure is only
as good as the interval it covers: callers measure over whole load runs, not single requests.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (its threads included)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        stat = handle.read()
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _TICKS_PER_SECOND


def rss_bytes(pid: int) -> int:
    """Resident set size now (VmRSS)."""
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """Highest resident set size so far (VmHWM)."""
    return _status_kib(pid, "VmHWM") * 1024


def file_rss_bytes(pid: int) -> int:
    """The part of the resident set that maps files (RssFile: for Prometheus, its mmapped chunks and
    blocks, which the kernel can drop and Go's GOMEMLIMIT does not count)."""
    return _status_kib(pid, "RssFile") * 1024


def thread_count(pid: int) -> int:
    return _status_kib(pid, "Threads")


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


@dataclass(frozen=True, slots=True)
class ChildCpu:
    """CPU used by waited-for child processes (and their waited-for descendants) between two marks."""

    user: float
    system: float

    @property
    def total(self) -> float:
        return self.user + self.system


def children_cpu() -> ChildCpu:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ChildCpu(usage.ru_utime, usage.ru_stime)


def children_cpu_since(mark: ChildCpu) -> ChildCpu:
    now = children_cpu()
    return ChildCpu(now.user - mark.user, now.system - mark.system)
