"""Panels, rows and dashboards (panels.py) -> Grafana dashboard JSON (schemaVersion 39).

Every panel, target, variable and annotation names its datasource through the `${datasource}`
template variable, never a uid, so the files import into any Grafana. Panels are laid out left to
right and wrap at the grid width; ids are numbered in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from .panels import JSON, MAY_BE_EMPTY, Dashboard, Panel, Query, Row
from .queries import tidy_selector

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
GRID_WIDTH = 24


# Panels that show the latest value only, and those that show it as a table (one column per label).
# A stat or gauge queried over the range would read every series at every step for a sparkline.
INSTANT_KINDS = ("table", "bargauge", "stat", "gauge")
TABLE_KINDS = ("table",)


def render_target(query: Query, ref_id: str, kind: str) -> JSON:
    instant = kind in INSTANT_KINDS
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": tidy_selector(query.expr),
        "format": "table" if kind in TABLE_KINDS else "time_series",
        "instant": instant,
        "legendFormat": query.legend or "__auto",
        "range": not instant,
        "refId": ref_id,
    }


def thresholds(panel: Panel) -> JSON:
    steps: list[JSON] = [{"color": panel.base_color, "value": None}]
    steps += [{"color": color, "value": value} for value, color in panel.steps]
    return {"mode": "absolute", "steps": steps}


def overrides(panel: Panel) -> list[JSON]:
    result: list[JSON] = []
    styles = [(ref_id, {"fill": "dash", "dash": [10, 10]}) for ref_id in panel.dashed]
    styles += [(ref_id, {"fill": "dot", "dash": [0, 10]}) for ref_id in panel.dotted]
    for ref_id, style in styles:
        result.append(
            {
                "matcher": {"id": "byFrameRefID", "options": ref_id},
                "properties": [
                    {"id": "custom.lineStyle", "value": style},
                    {"id": "custom.fillOpacity", "value": 0},
                ],
            }
        )
    for ref_id in panel.options.get("negative_y", ()):
        result.append(
            {
                "matcher": {"id": "byFrameRefID", "options": ref_id},
                "properties": [{"id": "custom.transform", "value": "negative-Y"}],
            }
        )
    for column, unit in panel.column_units.items():
        matcher = {"id": "byFrameRefID", "options": column} if len(column) == 1 else {"id": "byName", "options": column}
        result.append({"matcher": matcher, "properties": [{"id": "unit", "value": unit}]})
    return result


# fieldConfig.defaults.custom per panel type (a time series also says whether it draws thresholds).
KIND_CUSTOM: dict[str, JSON] = {
    "timeseries": {
        "axisBorderShow": False,
        "axisPlacement": "auto",
        "drawStyle": "line",
        "fillOpacity": 10,
        "gradientMode": "none",
        "lineInterpolation": "linear",
        "lineWidth": 1,
        "pointSize": 4,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"group": "A", "mode": "none"},
    },
    "status-history": {"fillOpacity": 80, "lineWidth": 0},
    "table": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False},
    "heatmap": {"scaleDistribution": {"type": "linear"}},
}


def field_custom(panel: Panel) -> JSON:
    custom = dict(KIND_CUSTOM.get(panel.kind, {}))
    if panel.kind == "timeseries":
        custom["thresholdsStyle"] = {"mode": "dashed" if panel.threshold_line else "off"}
    return {**custom, **panel.custom}


# Each panel type's options; a panel's own `options` are merged over them.
_REDUCE = {"calcs": ["lastNotNull"], "fields": "", "values": False}
_LEGEND = {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True}
KIND_OPTIONS: dict[str, JSON] = {
    "timeseries": {
        "legend": {**_LEGEND, "calcs": ["lastNotNull", "max"], "displayMode": "table"},
        "tooltip": {"mode": "multi", "sort": "desc"},
    },
    "stat": {
        "colorMode": "value",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": _REDUCE,
        "showPercentChange": False,
        "textMode": "auto",
        "wideLayout": True,
    },
    "gauge": {
        "orientation": "auto",
        "reduceOptions": _REDUCE,
        "showThresholdLabels": False,
        "showThresholdMarkers": True,
        "sizing": "auto",
    },
    "bargauge": {
        "displayMode": "gradient",
        "maxVizHeight": 300,
        "minVizHeight": 16,
        "minVizWidth": 8,
        "namePlacement": "auto",
        "orientation": "horizontal",
        "reduceOptions": _REDUCE,
        "showUnfilled": True,
        "sizing": "auto",
        "valueMode": "color",
    },
    "table": {"cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""}, "showHeader": True},
    "status-history": {
        "colWidth": 0.9,
        "legend": {**_LEGEND, "showLegend": False},
        "rowHeight": 0.9,
        "showValue": "never",
        "tooltip": {"mode": "single", "sort": "none"},
    },
    "heatmap": {
        "calculate": True,
        "cellGap": 1,
        "color": {
            "exponent": 0.5,
            "fill": "dark-orange",
            "mode": "scheme",
            "reverse": False,
            "scale": "exponential",
            "scheme": "Oranges",
            "steps": 64,
        },
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": 1e-9},
        "legend": {"show": True},
        "rowsFrame": {"layout": "auto"},
        "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": True},
    },
}
# Panel options that only steer the generator never reach Grafana.
GENERATOR_OPTIONS = ("renameByName", "negative_y", "maxDataPoints")


def panel_options(panel: Panel) -> JSON:
    own = {k: v for k, v in panel.options.items() if k not in GENERATOR_OPTIONS}
    return {**KIND_OPTIONS[panel.kind], **own}


def transformations(panel: Panel) -> list[JSON]:
    if panel.kind != "table":
        return []
    result: list[JSON] = []
    if len(panel.targets()) > 1:
        result.append({"id": "merge", "options": {}})
    hidden = {"Time": True, "__name__": True, **{name: True for name in panel.hide_columns}}
    result.append(
        {
            "id": "organize",
            "options": {
                "excludeByName": hidden,
                "indexByName": {},
                "renameByName": dict(panel.options.get("renameByName", {})),
            },
        }
    )
    return result


def description(panel: Panel) -> str:
    if panel.may_be_empty:
        return f"{panel.description} {MAY_BE_EMPTY} {panel.may_be_empty}."
    return panel.description


def render_panel(panel: Panel, panel_id: int, x: int, y: int) -> JSON:
    defaults: JSON = {
        "color": {"mode": "palette-classic"},
        "custom": field_custom(panel),
        "links": list(panel.links),
        "mappings": list(panel.mappings),
        "thresholds": thresholds(panel),
        "unit": panel.unit,
    }
    if panel.kind in ("stat", "gauge", "bargauge"):
        defaults["color"] = {"mode": "thresholds"}
    elif panel.kind == "status-history":
        # gfx busy shades continuously; 0/1 state panels colour by their thresholds and mappings.
        defaults["color"] = {"mode": "continuous-RdYlGr"} if panel.unit == "percentunit" else {"mode": "thresholds"}
    if panel.minimum is not None:
        defaults["min"] = panel.minimum
    if panel.maximum is not None:
        defaults["max"] = panel.maximum
    rendered: JSON = {
        "datasource": DATASOURCE,
        "description": description(panel),
        "fieldConfig": {"defaults": defaults, "overrides": overrides(panel)},
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "id": panel_id,
        "options": panel_options(panel),
        "targets": [render_target(q, REF_IDS[i], panel.kind) for i, q in enumerate(panel.targets())],
        "title": panel.title,
        "transformations": transformations(panel),
        "type": panel.kind,
    }
    if panel.interval:
        rendered["interval"] = panel.interval
    if "maxDataPoints" in panel.options:
        rendered["maxDataPoints"] = panel.options["maxDataPoints"]
    return rendered


def render_rows(rows: Sequence[Row]) -> list[JSON]:
    """Lay panels out left to right, wrapping at the grid width, one expanded row header per Row."""
    panels: list[JSON] = []
    next_id = 1
    y = 0
    for row in rows:
        panels.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "id": next_id,
                "panels": [],
                "title": row.title,
                "type": "row",
            }
        )
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                y += line_height
                x, line_height = 0, 0
            panels.append(render_panel(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return panels


def render_dashboard(dashboard: Dashboard) -> JSON:
    return {
        "annotations": {"list": list(dashboard.annotations)},
        "description": dashboard.description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,  # shared crosshair: line up temperature, power and busy at one instant
        "id": None,
        "links": [
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": False,
                "keepTime": True,
                "tags": ["amdgpu"],
                "targetBlank": False,
                "title": "AMD GPU dashboards",
                "type": "dashboards",
            }
        ],
        "panels": render_rows(dashboard.rows),
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["amdgpu", "gpu", "rocm"],
        "templating": {"list": list(dashboard.variables)},
        "time": {"from": dashboard.time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": dashboard.title,
        "uid": dashboard.uid,
        "version": 1,
        "weekStart": "",
    }
