"""Template variables: the datasource, label_values() pickers and the stale-age textbox."""

from __future__ import annotations

from .panels import JSON
from .render import DATASOURCE


def datasource_variable() -> JSON:
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
        "type": "datasource",
    }


def adhoc_filter_variable() -> JSON:
    """Label filters Grafana adds to every selector of the dashboard's queries: none by default, so the
    whole fleet is read without a node matcher (a regex variable's All would add instance=~".*" to
    every selector). Filter on node, instance or any target label (cluster, rack, ...)."""
    return {
        "datasource": DATASOURCE,
        "description": "Narrow every panel to nodes by any label (node, instance, cluster, ...); none = all nodes.",
        "filters": [],
        "hide": 0,
        "label": "Filters",
        "name": "filters",
        "skipUrlSync": False,
        "type": "adhoc",
    }


def query_variable(name: str, label: str, query: str, multi: bool = False) -> JSON:
    variable: JSON = {
        "current": {},
        "datasource": DATASOURCE,
        "definition": query,
        "hide": 0,
        "includeAll": multi,
        "label": label,
        "multi": multi,
        "name": name,
        "options": [],
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,  # on time range change: nodes come and go
        "regex": "",
        "skipUrlSync": False,
        "sort": 3,  # numerical ascending: gpu 2 before gpu 10
        "type": "query",
    }
    if multi:
        variable["allValue"] = ".*"
        variable["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


def stale_after_variable(seconds: float) -> JSON:
    """A textbox defaulting to the age at which the shipped rules call a sample stale."""
    default = f"{seconds:g}"
    return {
        "current": {"text": default, "value": default},
        "description": "A device sample older than this many seconds at scrape time counts as stale.",
        "hide": 0,
        "label": "Stale after (s)",
        "name": "stale_after",
        "options": [{"selected": True, "text": default, "value": default}],
        "query": default,
        "skipUrlSync": False,
        "type": "textbox",
    }
