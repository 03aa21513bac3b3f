"""The Grafana dashboards in grafana/dashboards/, declared as data and rendered to JSON.

panels.py   the primitives: Query, Panel, Row, Dashboard, shared mappings, links and colours
queries.py  PromQL both dashboards use (selectors, the MI250X package join, per-step rates)
thresholds.py  the levels panels colour by, read from the shipped rule files
memory_limits.py  the exporter's memory ceilings, read from the shipped systemd unit and DaemonSet
fleet.py, node.py, job.py  one function per dashboard row
variables.py, render.py  template variables; panels -> Grafana JSON

A panel whose query can legitimately return nothing (an alert that is not firing, a field only
MI300 supplies) says so in `may_be_empty`; the text lands in its description and the query test
(tests/integration/test_grafana_dashboards.py) accepts an empty result for it and nothing else.
"""

from __future__ import annotations

import json

from . import memory_limits, thresholds
from .fleet import fleet_dashboard
from .job import job_dashboard
from .node import node_dashboard
from .panels import JSON
from .render import render_dashboard


def dashboards(
    levels: thresholds.Thresholds | None = None, limits: memory_limits.MemoryLimits | None = None
) -> dict[str, JSON]:
    """File name -> dashboard JSON, for every dashboard this project ships (levels: from the shipped rules;
    limits: from the shipped systemd unit and DaemonSet)."""
    levels = levels or thresholds.load()
    limits = limits or memory_limits.load()
    return {
        "amdgpu-fleet.json": render_dashboard(fleet_dashboard(levels, limits)),
        "amdgpu-node.json": render_dashboard(node_dashboard(levels, limits)),
        "amdgpu-job.json": render_dashboard(job_dashboard(levels)),
    }


def to_text(dashboard: JSON) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"
