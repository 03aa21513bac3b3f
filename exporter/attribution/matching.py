"""How the attribution sources' claims are matched to the snapshot's devices.

Each attribution source (kubernetes, slurm, processes) reads on its own schedule and publishes an
immutable AttributionReport (exporter/model.py): claims on devices named the way that source names
them (a PCI BDF, a partition's platform device, a DRA device name, a Slurm gres index, a KFD gpu_id).
Matching those names to the exporter's devices is one pure function, `resolve`, over DeviceRefs
taken from the snapshot; the enrich stage then turns the matches into labels. Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from exporter.attribution.text import clean_text
from exporter.model import (
    Allocation,
    AttributionReport,
    ByBdf,
    ByDrm,
    ByGpuIndex,
    ByPhysicalIndex,
    ByXcp,
    DeviceName,
    DeviceRef,
)

_BDF = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_XCP = re.compile(r"^amdgpu_xcp[._](\d{1,3})$", re.IGNORECASE)
# A label value longer than this is cut (a pod name is at most 253; a joined list is counted past it).
MAX_LABEL_CHARS = 128
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
    for report in reports:
        for claim in report.claims:
            for ref in refs:
                if device_ref_matches(ref, claim.device, physical):
                    # every source's values pass here: a lone surrogate (any reader's) becomes U+FFFD
                    labels = tuple((name, clean_text(value[:MAX_LABEL_CHARS])) for name, value in claim.labels)
                    device_id, resource = clean_text(claim.device_id), clean_text(claim.resource)
                    found.add(Allocation(ref.gpu, report.source, device_id, resource, labels))
    return tuple(sorted(found, key=lambda a: (a.gpu, a.source, a.labels, a.resource, a.device_id)))


def labels_by_gpu(
    gpus: Iterable[int], label_names: Sequence[str], allocations: Iterable[Allocation]
) -> Mapping[int, Mapping[str, str]]:
    """Pure: the attribution label values of every device, each with every name in `label_names`.

    An unallocated device gets "" for each (its series keep one stable label set). A device held by
    several holders at once (a shared DRA claim, an oversubscribed Slurm GPU) gets each label's distinct
    values sorted and joined with ","; amdgpu_allocation_info keeps one series per holder for joins.
    A joined value is at most MAX_LABEL_CHARS long: the holders that do not fit are counted ("+496"),
    so 500 pods on one GPU cannot make every series of it kilobytes long (Prometheus' label length
    limits would then fail the whole scrape).
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
            gpu: MappingProxyType({name: joined_label_value(found) for name, found in per_gpu.items()})
            for gpu, per_gpu in values.items()
        }
    )


def joined_label_value(values: Iterable[str]) -> str:
    """Sorted and comma-joined within MAX_LABEL_CHARS; what does not fit is counted as "+N"."""
    ordered = sorted({value[:MAX_LABEL_CHARS] for value in values})
    shown: list[str] = []
    length = -1  # no comma before the first value
    for index, value in enumerate(ordered):
        rest = len(ordered) - index - 1
        if length + 1 + len(value) + (len(f",+{rest}") if rest else 0) > MAX_LABEL_CHARS:
            break
        shown.append(value)
        length += 1 + len(value)
    if len(shown) < len(ordered):
        shown.append(f"+{len(ordered) - len(shown)}")
    return ",".join(shown)


def card_index(card: str) -> int | None:
    """'card3' -> 3."""
    match = _CARD.match(card)
    return int(match.group(1)) if match else None
