"""The enrich stage: Snapshot -> Snapshot, what can only be derived from a whole snapshot.

Today it adds nothing. It is where attribution labels (which job or container uses a device)
will be added: a pure function of the snapshot and what it is given, so alerting, exposition
and the web see the enriched snapshot and none of them has to know where labels came from.
"""

from __future__ import annotations

from exporter.model import Snapshot


def enrich(snapshot: Snapshot) -> Snapshot:
    """Pure: returns the snapshot with derived fields added (none yet)."""
    return snapshot
