"""The set of known devices and their stable `gpu` index: what discovery found, merged into what is tracked.

Identity. A device is its DeviceIdentity.key (PCI BDF, unique_id, partition). Its `gpu` index is
given once, when the key is first seen, and never changes while the process runs:
- on the first discovery (a cold start) indices follow rocm-smi's GPU[N] order, which is DRM card
  order (card0, card1, ...), so `gpu="3"` and `rocm-smi -d 3` name the same device;
- a device first seen later gets the next free index, moving nobody;
- a device that vanishes is marked gone (amdgpu_up 0, reason `gone`: the verdict's device_down) for
  FORGET_GONE_AFTER_SECONDS (10 minutes), then forgotten: it leaves the snapshot, so its series, its
  verdict and its in-daemon alerts (resolved, alerting/state.py) go with it;
- a compute partition that disappears because its socket now runs another partition mode (CPX ->
  SPX: the socket is still found, in the new mode) did not fail: it is dropped at once, never gone
  (a read that finds its files gone first asks for a rediscovery, and is not judged until it ends);
- a device that returns under a key once known (a mode switched back, a device back after it was
  forgotten) gets its index back: an index names one device for the life of the process.

A failed read of unique_id during a rediscovery ("" where a unique_id was known) is the known
device at that BDF and partition, not a new one: a phantom device would take an index for good.
A device first found without a unique_id (its read failed or hung) takes the unique_id when a later
discovery reads it, keeping its index.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.log import get_logger
from exporter.model import DeviceIdentity, DeviceState, Sample, frozen_map
from exporter.pipeline.pcie import link_max_bytes_per_second

log = get_logger("exporter.pipeline.known_devices")

Key = tuple[str, str, int]
_CARD = re.compile(r"card(\d+)")
FORGET_GONE_AFTER_SECONDS = 600.0  # a gone device is device_down this long, then forgotten


@dataclass(slots=True)
class TrackedDevice:
    """Mutable per-device bookkeeping, private to the pipeline (snapshots copy out of it)."""

    identity: DeviceIdentity
    gpu: int  # the stable `gpu` index
    sample: Sample | None = None
    up: bool = False
    down_reason: str = "not_read_yet"
    present: bool = True
    read_in_flight: bool = False  # a read of this device is running (possibly stuck) on a reader thread
    read_errors: dict[str, int] = field(default_factory=dict)
    read_timeouts: int = 0
    file_errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (file, reason) -> total
    counters: Any = None  # pipeline/counters.py state: wrap offsets and last raw values
    gone_since: float | None = None  # monotonic seconds it was marked gone
    # A partition whose read found it gone may have left with its socket's mode: "asked" while a
    # rediscovery is to say so (not judged meanwhile), "checked" once one found it still there.
    vanishing: str = ""


def rocm_smi_order(identity: DeviceIdentity) -> tuple[int, str, int]:
    """rocm-smi numbers GPU[N] in DRM card order; a card name that is not cardN sorts last, by BDF."""
    match = _CARD.fullmatch(identity.card)
    return (int(match.group(1)) if match else 1 << 30, identity.pci_bus_id, identity.partition)


class KnownDevices:
    """Every device discovery has ever found, by DeviceIdentity.key, each with its stable index."""

    def __init__(self) -> None:
        self._devices: dict[Key, TrackedDevice] = {}
        self._left: dict[Key, int] = {}  # devices dropped or forgotten -> their index, kept for their return

    def merge(self, found: Sequence[DeviceIdentity], *, incomplete: frozenset[str] = frozenset()) -> None:
        """Add new devices, refresh the identity of known ones, mark the ones not found as gone.

        `incomplete`: BDFs whose identity could not be read in full this time (a read hung or
        failed); a known device there is left as it is, neither refreshed nor gone.
        """
        cold_start = not self._devices
        ordered = sorted(found, key=rocm_smi_order) if cold_start else list(found)
        seen: set[Key] = set()
        for identity in ordered:
            tracked = self._match(identity)
            if tracked is None:
                index = self._left.pop(identity.key, None)
                tracked = TrackedDevice(identity=identity, gpu=self._next_index() if index is None else index)
                self._devices[identity.key] = tracked
                log.info(
                    "device_found",
                    gpu=tracked.gpu,
                    pci_bus_id=identity.pci_bus_id,
                    card=identity.card,
                    product=identity.product,
                )
            else:
                if tracked.identity.unique_id and not identity.unique_id:
                    # This discovery could not read unique_id: it is still the device known here.
                    identity = replace(identity, unique_id=tracked.identity.unique_id)
                if identity.key != tracked.identity.key:
                    del self._devices[tracked.identity.key]
                    self._devices[identity.key] = tracked
                tracked.identity = identity
                if not tracked.present:
                    log.info("device_returned", gpu=tracked.gpu, pci_bus_id=identity.pci_bus_id, card=identity.card)
                    tracked.present = True
                    tracked.gone_since = None
                    if tracked.down_reason == "gone":
                        tracked.down_reason = "not_read_yet"
            if tracked.vanishing == "asked":
                tracked.vanishing = "checked"  # still there: its next failed read is judged
            seen.add(identity.key)
        sockets = {(i.pci_bus_id, i.unique_id): i for i in found if i.partition == 0}
        for key, tracked in list(self._devices.items()):
            if key in seen or not tracked.present or tracked.identity.pci_bus_id in incomplete:
                continue
            socket = sockets.get((tracked.identity.pci_bus_id, tracked.identity.unique_id))
            if tracked.identity.partition > 0 and socket is not None:
                mode = tracked.identity.compute_partition
                if socket.compute_partition != mode or socket.memory_partition != tracked.identity.memory_partition:
                    self._leave(key)
                    log.info(
                        "partition_dropped",
                        gpu=tracked.gpu,
                        pci_bus_id=tracked.identity.pci_bus_id,
                        partition=tracked.identity.partition,
                        was=mode,
                        now=socket.compute_partition,
                    )
                    continue
            tracked.present = False
            tracked.up = False
            tracked.down_reason = "gone"
            tracked.gone_since = time.monotonic()
            log.warning(
                "device_gone",
                gpu=tracked.gpu,
                pci_bus_id=tracked.identity.pci_bus_id,
                card=tracked.identity.card,
                forgotten_in_seconds=FORGET_GONE_AFTER_SECONDS,
            )

    def _leave(self, key: Key) -> None:
        tracked = self._devices.pop(key)
        self._left[key] = tracked.gpu

    def forget_gone(self, now: float | None = None) -> None:
        """Forget the devices gone for FORGET_GONE_AFTER_SECONDS (monotonic `now`, by default the clock's)."""
        at = time.monotonic() if now is None else now
        for key, tracked in list(self._devices.items()):
            if tracked.gone_since is not None and at - tracked.gone_since >= FORGET_GONE_AFTER_SECONDS:
                self._leave(key)
                log.warning("device_forgotten", gpu=tracked.gpu, pci_bus_id=tracked.identity.pci_bus_id)

    def _match(self, identity: DeviceIdentity) -> TrackedDevice | None:
        tracked = self._devices.get(identity.key)
        if tracked is not None:
            return tracked
        # At the same place, one side's unique_id unknown (a failed read): the same device, not a phantom.
        place = (identity.pci_bus_id, identity.partition)
        unknown = not identity.unique_id
        for t in self._devices.values():
            if (t.identity.pci_bus_id, t.identity.partition) == place and (unknown or not t.identity.unique_id):
                return t
        return None

    def _next_index(self) -> int:
        return max((*(t.gpu for t in self._devices.values()), *self._left.values()), default=-1) + 1

    def __len__(self) -> int:
        return len(self._devices)

    def __iter__(self) -> Iterator[TrackedDevice]:
        return iter(self._devices.values())

    def states(self) -> tuple[DeviceState, ...]:
        """Every known device (gone ones included, until they are forgotten) frozen into what a Snapshot
        carries, in `gpu` order."""
        self.forget_gone()
        return tuple(
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
            for t in sorted(self._devices.values(), key=lambda t: t.gpu)
        )
