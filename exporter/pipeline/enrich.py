"""The enrich stage: Snapshot -> Snapshot, what can only be derived from a whole snapshot.

It adds attribution (which pod, Slurm job or process uses each device): a pure function of the
snapshot and of the attribution sources' latest reports, taken once per cycle (AttributionInputs),
so alerting, exposition and the web see the enriched snapshot and none of them has to know where
labels came from. Nothing is remembered between cycles: a pod that went away is gone from the next
snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from exporter.attribution.enrich import attribute
from exporter.attribution.model import AttributionReport
from exporter.attribution.processes import DEFAULT_TOP, ProcessReport
from exporter.model import Snapshot


@dataclass(frozen=True, slots=True)
class AttributionInputs:
    """What the attribution sources hold at one cycle (immutable reports, read without I/O)."""

    label_names: tuple[str, ...] = ()
    reports: tuple[AttributionReport, ...] = ()
    processes: ProcessReport | None = None
    process_top: int = DEFAULT_TOP


def enrich(snapshot: Snapshot, inputs: AttributionInputs | None = None) -> Snapshot:
    """Pure: the snapshot with its Attribution (unchanged when attribution is off)."""
    if inputs is None:
        return snapshot
    attribution = attribute(snapshot.devices, inputs.label_names, inputs.reports, inputs.processes, inputs.process_top)
    return replace(snapshot, attribution=attribution)
