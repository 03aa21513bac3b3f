"""The attribution part of the enrich stage: devices + the sources' latest reports -> Attribution.

Pure: the same snapshot and reports give the same Attribution, so a pod that went away leaves no
label set behind at the next render (nothing is remembered between snapshots here; the sources
decide what they still hold).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import MappingProxyType

from exporter.attribution import processes as kfd
from exporter.attribution.matching import card_index, labels_by_gpu, resolve, xcp_index
from exporter.model import Attribution, AttributionReport, DeviceRef, DeviceState


def device_ref(state: DeviceState) -> DeviceRef:
    identity = state.identity
    xcp = xcp_index(identity.device_dir.rstrip("/").rsplit("/", 1)[-1]) if identity.device_dir else None
    return DeviceRef(
        gpu=state.gpu,
        pci_bus_id=identity.pci_bus_id.lower(),
        partition=identity.partition,
        xcp=xcp,
        card=card_index(identity.card),
        render_minor=getattr(identity, "render_minor", None),
    )


def attribute(
    devices: Sequence[DeviceState],
    label_names: Sequence[str],
    reports: Iterable[AttributionReport] = (),
    process_report: kfd.ProcessReport | None = None,
    process_top: int = kfd.DEFAULT_TOP,
) -> Attribution:
    """Pure: the Attribution of one snapshot's devices."""
    reports = tuple(reports)
    refs = tuple(device_ref(state) for state in devices)
    allocations = resolve(refs, reports)
    names = tuple(label_names)
    per_gpu = labels_by_gpu((ref.gpu for ref in refs), names, allocations)
    labels = MappingProxyType({gpu: tuple(values[name] for name in names) for gpu, values in per_gpu.items()})
    up = {report.source: report.up for report in reports}
    processes: tuple = ()
    if process_report is not None:
        up[kfd.SOURCE] = process_report.up
        if process_report.up and process_report.locations is not None:
            processes = kfd.attribute(
                refs, process_report.usages, process_report.locations, process_top, process_report.compute_units
            )
    return Attribution(names, labels, allocations, processes, MappingProxyType(up))
