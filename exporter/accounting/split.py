"""The split of a shared package's energy among its dies or partitions (pure; docs/accounting.md).

An MI250X package has one energy counter, read on die 0 (die 1's gpu_metrics carries none, and
amd-smi reports die 1's energy as not supported); a partitioned MI300-class socket has one, read on
partition 0 (partitions 1..N-1 are platform devices with no power or energy of their own; amd-smi
shows the socket's figures on partition 0 only). Over each interval the counter's increase is split
among the package's devices by their share of gfx busy-seconds (each device's gfx busy at the
interval's end times the interval), and equally when none is busy or any of them has no busy figure
(a v1_5 table, a device down). The shares always sum to the increase: a die or partition nobody
holds keeps its share, unattributed, so no job pays for another's idle neighbour.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.model import DeviceState

# A counter that drops was reset (driver reload, GPU reset): the interval counts nothing.
DeviceKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class PackageShare:
    """One device's part of its package's energy over one interval."""

    gpu: int
    package: str
    lead_gpu: int  # the device the package's counter is read on (die 0, partition 0)
    ratio: float  # of the package's increase, 0..1; a package's ratios sum to 1
    energy_joules: float
    package_energy_joules: float  # the package's whole increase


def split_ratios(busy: Sequence[float | None]) -> tuple[float, ...]:
    """Pure: each device's ratio from its gfx busy (None: no figure); equal when idle or unknown."""
    if not busy:
        return ()
    if any(b is None for b in busy) or sum(b for b in busy if b is not None) <= 0:
        return tuple(1.0 / len(busy) for _ in busy)
    total = sum(b for b in busy if b is not None)
    return tuple((b or 0.0) / total for b in busy)


def _package(state: DeviceState) -> str:
    return state.identity.package or state.identity.pci_bus_id


def package_shares(devices: Iterable[DeviceState], previous: Mapping[DeviceKey, object]) -> tuple[PackageShare, ...]:
    """Pure: every up device's share of its package's energy increase since its last reading.

    `previous` maps device keys to readings (anything with `energy_joules`); a package whose lead has
    no earlier reading (the first cycle) counts nothing yet.
    """
    packages: dict[str, list[DeviceState]] = {}
    for state in devices:
        if state.sample is not None:
            packages.setdefault(_package(state), []).append(state)
    shares: list[PackageShare] = []
    for package, members in packages.items():
        members.sort(key=lambda s: (s.identity.die, s.identity.partition, s.gpu))
        lead = next((s for s in members if s.sample is not None and s.sample.energy_joules is not None), members[0])
        now = lead.sample.energy_joules if lead.sample is not None else None
        before = getattr(previous.get(lead.identity.key), "energy_joules", None)
        increase = now - before if now is not None and before is not None and now >= before else 0.0
        ratios = split_ratios([s.sample.busy.get("gfx") if s.sample is not None else None for s in members])
        shares.extend(
            PackageShare(s.gpu, package, lead.gpu, ratio, increase * ratio, increase)
            for s, ratio in zip(members, ratios, strict=True)
        )
    return tuple(shares)
