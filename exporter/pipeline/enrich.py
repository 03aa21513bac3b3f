"""The enrich stage: Snapshot -> Snapshot, what can only be derived from a whole snapshot.

It adds attribution (which pod, Slurm job or process uses each device): a pure function of the
snapshot and of the attribution sources' latest reports, taken once per cycle (AttributionInputs),
so alerting, exposition and the web see the enriched snapshot and none of them has to know where
labels came from. Nothing is remembered between cycles: a pod that went away is gone from the next
snapshot.
"""

from __future__ import annotations

from dataclasses import replace

from exporter.attribution.attribute import attribute
from exporter.attribution.sources import AttributionInputs
from exporter.model import Snapshot


def enrich(snapshot: Snapshot, inputs: AttributionInputs | None = None) -> Snapshot:
    """Pure: the snapshot with its Attribution (unchanged when attribution is off)."""
    if inputs is None:
        return snapshot
    attribution = attribute(snapshot.devices, inputs.label_names, inputs.reports, inputs.processes, inputs.process_top)
    return replace(snapshot, attribution=attribution)
