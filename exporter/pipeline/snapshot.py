"""Freezing the poller's bookkeeping into the immutable Snapshot every later stage reads."""

from __future__ import annotations

import time

from exporter.model import DeviceState, Snapshot, SourceStats, frozen_map
from exporter.pipeline.discovery import KnownDevices
from exporter.pipeline.pcie import link_max_bytes_per_second


def freeze(
    devices: KnownDevices,
    *,
    duration: float,
    source_name: str,
    cycle: int,
    source_stats: SourceStats,
    discoveries: int = 0,
    discovery_failures: int = 0,
) -> Snapshot:
    """One Snapshot of every known device (gone ones included), in `gpu` order."""
    states = tuple(
        DeviceState(
            identity=t.identity,
            gpu=t.gpu,
            sample=t.sample,
            up=t.up,
            down_reason=t.down_reason,
            read_errors=frozen_map(t.read_errors),
            read_timeouts=t.read_timeouts,
            present=t.present,
            file_errors=frozen_map(t.file_errors),
            pcie_link_max_bytes_per_second=link_max_bytes_per_second(t.sample),
        )
        for t in devices.in_gpu_order()
    )
    return Snapshot(
        taken_at=time.time(),
        monotonic_at=time.monotonic(),
        devices=states,
        poll_duration_seconds=duration,
        source=source_name,
        cycle=cycle,
        source_stats=source_stats,
        discoveries=discoveries,
        discovery_failures=discovery_failures,
    )
