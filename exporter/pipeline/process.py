"""The exporter's own process (CPU, memory, file descriptors), as data for the cycle's Published.

Read from /proc/self once per cycle, as prometheus-client's ProcessCollector reads it (the same
sample names and values), into an immutable ProcessStats, so the process_* families are rendered
through the same metric table as every other family (exposition/metrics.py) and describe the same
moment as the rest of a scrape. The systemd unit's MemoryMax can be watched against
process_resident_memory_bytes. No /proc (not Linux): no values, and the families are left out.
"""

from __future__ import annotations

import functools
import os
import resource

from exporter.model import ProcessStats, frozen_map

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = resource.getpagesize()


@functools.cache
def _boot_time() -> float:
    """btime of /proc/stat: the unix time the kernel booted (constant for the process's life)."""
    with open("/proc/stat", "rb") as stat:
        for line in stat:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def _open_fds() -> int:
    """Descriptors open now. Linux 6.2+ gives their count as the size of /proc/self/fd (one stat, where
    listing it costs tens of microseconds with the poll's kept files open; the kernel also counts a
    descriptor a thread is still opening, such as a read stuck opening a hung device's file); older
    kernels say 0 there, and the listing is counted without the descriptor the listing itself holds."""
    size = os.stat("/proc/self/fd").st_size
    return size if size > 0 else len(os.listdir("/proc/self/fd")) - 1


def read_process_stats() -> ProcessStats:
    """process_* sample name -> value; empty when /proc is not there."""
    values: dict[str, float] = {}
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            parts = os.read(fd, 4096).rsplit(b")", 1)[-1].split()
        finally:
            os.close(fd)
        values["process_virtual_memory_bytes"] = float(parts[20])
        values["process_resident_memory_bytes"] = float(parts[21]) * _PAGE
        values["process_start_time_seconds"] = float(parts[19]) / _TICKS + _boot_time()
        values["process_cpu_seconds_total"] = (float(parts[11]) + float(parts[12])) / _TICKS
        values["process_open_fds"] = float(_open_fds())
    except OSError:
        return ProcessStats(frozen_map(values))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)  # what /proc/self/limits shows as Max open files
    if soft != resource.RLIM_INFINITY:
        values["process_max_fds"] = float(soft)
    return ProcessStats(frozen_map(values))
