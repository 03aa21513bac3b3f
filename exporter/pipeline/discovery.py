"""The set of known devices: what discovery found, merged into what the poller already tracks.

Devices that vanish stay known, marked gone, so their series disappear from /metrics while
amdgpu_up says why; a device that comes back keeps its counters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample

log = get_logger("exporter.pipeline.discovery")


@dataclass(slots=True)
class TrackedDevice:
    """Mutable per-device bookkeeping, private to the pipeline (snapshots copy out of it)."""

    identity: DeviceIdentity
    sample: Sample | None = None
    up: bool = False
    down_reason: str = "not_read_yet"
    present: bool = True
    read_in_flight: bool = False  # a read of this device is running (possibly stuck) on a reader thread
    read_errors: dict[str, int] = field(default_factory=dict)
    read_timeouts: int = 0


class KnownDevices:
    """Every device discovery has ever found, by DeviceIdentity.key."""

    def __init__(self) -> None:
        self._devices: dict[tuple[str, str, int], TrackedDevice] = {}

    def merge(self, found: Sequence[DeviceIdentity]) -> None:
        """Add new devices, refresh the identity of known ones, mark the ones not found as gone."""
        seen = set()
        for identity in found:
            seen.add(identity.key)
            tracked = self._devices.get(identity.key)
            if tracked is None:
                self._devices[identity.key] = TrackedDevice(identity=identity)
                log.info("device_found", pci_bus_id=identity.pci_bus_id, card=identity.card, product=identity.product)
            else:
                tracked.identity = identity
                tracked.present = True
        for key, tracked in self._devices.items():
            if key not in seen and tracked.present:
                tracked.present = False
                tracked.up = False
                tracked.down_reason = "gone"
                log.warning("device_gone", pci_bus_id=tracked.identity.pci_bus_id, card=tracked.identity.card)

    def __len__(self) -> int:
        return len(self._devices)

    def __iter__(self) -> Iterator[TrackedDevice]:
        return iter(self._devices.values())

    def in_pci_order(self) -> list[TrackedDevice]:
        """The order the `gpu` label numbers devices in."""
        return sorted(self._devices.values(), key=lambda t: (t.identity.pci_bus_id, t.identity.partition))
