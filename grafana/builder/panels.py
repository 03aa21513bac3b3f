"""The primitives dashboards are declared with: queries, panels, rows, dashboards, and the field
settings several panels share (value mappings, data links). Plain frozen data: render.py turns it
into Grafana JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .thresholds import POWER_CAP_WARNING_RATIO, VRAM_USED_CRITICAL_RATIO, VRAM_USED_WARNING_RATIO, Thresholds

JSON = dict[str, Any]

FLEET_UID = "amdgpu-fleet"
NODE_UID = "amdgpu-node"
MAY_BE_EMPTY = "May be empty:"  # the marker the query test looks for in a description
GREEN, ORANGE, RED = "green", "orange", "red"


@dataclass(frozen=True)
class Query:
    """One target. Tables query the latest value as a table and bar gauges the latest value; every
    other panel a range (render.py decides from the panel type)."""

    expr: str
    legend: str = ""


Queries = str | Query | tuple[str | Query, ...]
Steps = tuple[tuple[float, str], ...]  # (from this value, colour), above the green base


@dataclass(frozen=True)
class Panel:
    kind: str  # timeseries | stat | gauge | bargauge | table | heatmap | status-history
    title: str
    description: str
    queries: Queries  # a bare string is a query with Grafana's automatic legend
    unit: str = ""
    width: int = 8
    height: int = 8
    may_be_empty: str = ""  # why no data is a valid answer; appended to the description
    minimum: float | None = None
    maximum: float | None = None
    steps: Steps = ()  # threshold steps above the base colour
    base_color: str = GREEN  # colour below the first step (a share that should be high starts orange)
    threshold_line: bool = False  # draw the threshold steps as dashed lines on a time series
    dashed: tuple[str, ...] = ()  # refIds drawn as dashed reference lines (limits, caps, maxima)
    dotted: tuple[str, ...] = ()  # refIds drawn as dotted lines (a second kind of reference)
    column_units: Mapping[str, str] = field(default_factory=dict)  # table column / refId -> unit
    mappings: tuple[JSON, ...] = ()
    links: tuple[JSON, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # merged over the kind's defaults
    custom: Mapping[str, Any] = field(default_factory=dict)  # merged over fieldConfig.defaults.custom
    interval: str = ""  # minimum query step
    hide_columns: tuple[str, ...] = ()  # table columns to hide besides Time and __name__

    def targets(self) -> tuple[Query, ...]:
        items = self.queries if isinstance(self.queries, tuple) else (self.queries,)
        return tuple(Query(item) if isinstance(item, str) else item for item in items)


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[JSON, ...]
    rows: tuple[Row, ...]
    time_from: str
    annotations: tuple[JSON, ...] = ()


def temperature_steps(thresholds: Thresholds) -> Steps:
    """Orange where the in-daemon junction alert would clear, red where it fires."""
    hot, cool = thresholds.junction_hot_celsius, thresholds.junction_cool_celsius
    return ((cool, ORANGE), (hot, RED)) if cool < hot else ((hot, RED),)


def power_cap_steps(thresholds: Thresholds) -> Steps:
    return ((POWER_CAP_WARNING_RATIO, ORANGE), (thresholds.power_at_cap_ratio, RED))


def celsius(value: float) -> str:
    return f"{value:g} °C"


def node_link(instance: str = "${__field.labels.instance}", gpu: str = "${__field.labels.gpu}") -> JSON:
    """A data link to the node dashboard for the clicked node (and GCD; "" keeps all GCDs)."""
    gpu_param = f"&var-gpu={gpu}" if gpu else ""
    return {
        "title": "Open node / GCD detail",
        "url": f"/d/{NODE_UID}/amdgpu-node?${{datasource:queryparam}}&var-instance={instance}{gpu_param}"
        "&${__url_time_range}",
        "targetBlank": False,
    }


NODE_LINK_FROM_SERIES = node_link()
# Table rows: the columns keep their label names (instance, gpu) so the links can read them.
NODE_LINK_FROM_TABLE = node_link("${__data.fields.instance}", "")
GCD_LINK_FROM_TABLE = node_link("${__data.fields.instance}", "${__data.fields.gpu}")


UP_DOWN_MAPPING: JSON = {
    "type": "value",
    "options": {
        "0": {"text": "DOWN", "color": RED, "index": 0},
        "1": {"text": "UP", "color": GREEN, "index": 1},
    },
}
UP_DOWN_STEPS = ((0.0, RED), (1.0, GREEN))
# Counts that should be 0: any is a fault (red), or worth a look (orange).
ANY_IS_BAD = ((1.0, RED),)
ANY_IS_WORTH_A_LOOK = ((1.0, ORANGE),)
VRAM_STEPS = ((VRAM_USED_WARNING_RATIO, ORANGE), (VRAM_USED_CRITICAL_RATIO, RED))


def against_reference(
    title: str,
    description: str,
    value: Query,
    reference: Query,
    *,
    unit: str,
    width: int,
    height: int = 8,
    minimum: float | None = 0,
    may_be_empty: str = "",
    second_reference: Query | None = None,
    interval: str = "",
) -> Panel:
    """A time series of a value (solid) against its limit, cap or maximum (dashed; a second one dotted)."""
    queries = (value, reference) if second_reference is None else (value, reference, second_reference)
    return Panel(
        "timeseries",
        title,
        description,
        queries,
        unit=unit,
        width=width,
        height=height,
        minimum=minimum,
        may_be_empty=may_be_empty,
        dashed=("B",),
        dotted=("C",) if second_reference else (),
        interval=interval,
    )
