"""The exporter's own process (CPU, memory, file descriptors), as data for the cycle's Published.

prometheus-client's ProcessCollector reads /proc/self; its samples are copied into an immutable
ProcessStats once per cycle, so the process_* families are rendered through the same metric table
as every other family (exposition/metrics.py) and describe the same moment as the rest of a scrape.
The systemd unit's MemoryMax can be watched against process_resident_memory_bytes.
"""

from __future__ import annotations

from prometheus_client import ProcessCollector

from exporter.model import ProcessStats, frozen_map

_COLLECTOR = ProcessCollector(registry=None)


def read_process_stats() -> ProcessStats:
    """process_* sample name -> value; empty when /proc is not there (the collector then yields nothing)."""
    values = {sample.name: float(sample.value) for family in _COLLECTOR.collect() for sample in family.samples}
    return ProcessStats(frozen_map(values))
