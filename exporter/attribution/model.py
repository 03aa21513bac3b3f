"""What attribution sources report, and how it is matched to the snapshot's devices.

Each attribution source (kubernetes, slurm, processes) reads on its own schedule and publishes an
immutable AttributionReport: claims on devices named the way that source names them (a PCI BDF, a
partition's platform device, a DRA device name, a Slurm gres index, a KFD gpu_id). Matching those
names to the exporter's devices is one pure function, `resolve`, over DeviceRefs taken from the
snapshot; the enrich stage then turns the matches into labels. Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

_EMPTY: Mapping = MappingProxyType({})
_BDF = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_XCP = re.compile(r"^amdgpu_xcp[._](\d{1,3})$", re.IGNORECASE)
_CARD = re.compile(r"^card(\d+)$")


def normalize_bdf(text: str) -> str | None:
    """'0000:19:00.0' in any case, or '19:00.0' (domain 0) -> '0000:19:00.0'; None if not a BDF."""
    match = _BDF.match(text.strip())
    if match is None:
        return None
    domain, bus, dev, fn = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def xcp_index(text: str) -> int | None:
    """'amdgpu_xcp_3' (ROCm DKMS) or 'amdgpu_xcp.3' (some kernels) -> 3; None otherwise."""
    match = _XCP.match(text.strip())
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """What matching needs to know about one device of the snapshot."""

    gpu: int  # the `gpu` label
    pci_bus_id: str  # lower-case BDF
    partition: int = 0  # compute partition index on its socket (0 for a whole GPU)
    xcp: int | None = None  # N of the amdgpu_xcp_N platform device holding a partition > 0
    card: int | None = None  # DRM card index (cardN)
    render_minor: int | None = None  # renderD minor (128...)


@dataclass(frozen=True, slots=True)
class ByBdf:
    """A whole GPU or its partition 0, named by its PCI function."""

    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class ByXcp:
    """A partition > 0, named by its platform device amdgpu_xcp_N."""

    xcp: int


@dataclass(frozen=True, slots=True)
class ByDrm:
    """A device named by its DRM minors (AMD's DRA driver: gpu-<card>-<renderD>)."""

    card: int
    render_minor: int | None = None


@dataclass(frozen=True, slots=True)
class ByPhysicalIndex:
    """The n-th physical GPU in PCI BDF order, partition 0 (DRA auto-partition: gpu-<n>-<cpx>-<nps4>)."""

    index: int


@dataclass(frozen=True, slots=True)
class ByGpuIndex:
    """The device with this `gpu` label (Slurm gres index: rocm-smi's order, as is `gpu`)."""

    gpu: int


@dataclass(frozen=True, slots=True)
class ByLocation:
    """A device by PCI function and partition (KFD topology: location_id + domain)."""

    pci_bus_id: str
    partition: int


DeviceName = ByBdf | ByXcp | ByDrm | ByPhysicalIndex | ByGpuIndex | ByLocation


@dataclass(frozen=True, slots=True)
class Claim:
    """One holder of one device, as a source reports it. `labels` are the holder's attribution labels."""

    device: DeviceName
    device_id: str  # the device as the source spelled it, for logs and the allocation series
    labels: tuple[tuple[str, str], ...] = ()  # (name, value) pairs, hashable so claims can be diffed
    resource: str = ""  # "amd.com/gpu", "gpu.amd.com" (DRA driver), "slurm"


@dataclass(frozen=True, slots=True)
class AttributionReport:
    """The latest result of one attribution source: immutable, replaced wholesale on each read."""

    source: str  # "kubernetes" | "slurm"
    up: bool  # the last read succeeded (within its deadline)
    claims: tuple[Claim, ...] = ()
    taken_at: float = 0.0
    error: str = ""  # one line, "" when up


@dataclass(frozen=True, slots=True)
class Allocation:
    """A claim matched to a device of the snapshot."""

    gpu: int
    source: str
    device_id: str
    resource: str
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process on one of the snapshot's devices (from the KFD's per-process files)."""

    gpu: int
    pid: int
    comm: str
    vram_bytes: int | None
    sdma_seconds: float | None
    cu_occupancy: int | None  # compute units its waves occupy
    cu_occupancy_ratio: float | None = None  # of the device's compute units, 0..1


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who is on each device: what the enrich stage adds to a snapshot. Immutable.

    `label_names` are fixed by configuration (pod/namespace/container with --kubernetes, job_id/
    job_user/job_partition with --slurm.state-dir), so every per-GPU series keeps one label set;
    `labels[gpu]` holds their values in that order ("" where the device is not allocated).
    """

    label_names: tuple[str, ...] = ()
    labels: Mapping[int, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    allocations: tuple[Allocation, ...] = ()
    processes: tuple[ProcessUsage, ...] = ()
    sources_up: Mapping[str, bool] = field(default_factory=lambda: _EMPTY)  # source -> its last read succeeded

    def values_for(self, gpu: int) -> tuple[str, ...]:
        return self.labels.get(gpu) or ("",) * len(self.label_names)


def device_ref_matches(ref: DeviceRef, name: DeviceName, physical: Sequence[str]) -> bool:
    """Whether `name` designates `ref`. `physical` is the sorted distinct BDFs of the snapshot."""
    if isinstance(name, ByBdf):
        return ref.pci_bus_id == name.pci_bus_id and ref.partition == 0
    if isinstance(name, ByXcp):
        return ref.xcp == name.xcp
    if isinstance(name, ByDrm):
        if ref.card != name.card:
            return False
        return name.render_minor is None or ref.render_minor in (None, name.render_minor)
    if isinstance(name, ByPhysicalIndex):
        return 0 <= name.index < len(physical) and ref.pci_bus_id == physical[name.index] and ref.partition == 0
    if isinstance(name, ByGpuIndex):
        return ref.gpu == name.gpu
    return ref.pci_bus_id == name.pci_bus_id and ref.partition == name.partition


def resolve(refs: Sequence[DeviceRef], reports: Iterable[AttributionReport]) -> tuple[Allocation, ...]:
    """Pure: every claim of every report, matched to the snapshot's devices.

    A report that is down still holds the claims its source keeps for a while after its last good
    read (schedule.py); the source, not this function, decides when they expire. A claim that matches
    no device (a GPU this exporter does not see, a VFIO-bound device) is dropped; the result is
    sorted, so equal inputs give equal outputs whatever order a source listed things in.
    """
    physical = sorted({ref.pci_bus_id for ref in refs})
    found: set[Allocation] = set()
    result: list[Allocation] = []
    for report in reports:
        for claim in report.claims:
            for ref in refs:
                if device_ref_matches(ref, claim.device, physical):
                    allocation = Allocation(ref.gpu, report.source, claim.device_id, claim.resource, claim.labels)
                    if allocation not in found:
                        found.add(allocation)
                        result.append(allocation)
    result.sort(key=lambda a: (a.gpu, a.source, a.labels, a.resource, a.device_id))
    return tuple(result)


def labels_by_gpu(
    gpus: Iterable[int], label_names: Sequence[str], allocations: Iterable[Allocation]
) -> Mapping[int, Mapping[str, str]]:
    """Pure: the attribution label values of every device, each with every name in `label_names`.

    An unallocated device gets "" for each (its series keep one stable label set). A device held by
    several holders at once (a shared DRA claim, an oversubscribed Slurm GPU) gets each label's distinct
    values sorted and joined with ","; amdgpu_allocation_info keeps one series per holder for joins.
    """
    values: dict[int, dict[str, set[str]]] = {gpu: {name: set() for name in label_names} for gpu in gpus}
    for allocation in allocations:
        per_gpu = values.get(allocation.gpu)
        if per_gpu is None:
            continue
        for name, value in allocation.labels:
            if name in per_gpu and value:
                per_gpu[name].add(value)
    return MappingProxyType(
        {
            gpu: MappingProxyType({name: ",".join(sorted(found)) for name, found in per_gpu.items()})
            for gpu, per_gpu in values.items()
        }
    )


def card_index(card: str) -> int | None:
    """'card3' -> 3."""
    match = _CARD.match(card)
    return int(match.group(1)) if match else None
