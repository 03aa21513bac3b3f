"""Generate the Grafana dashboards in grafana/dashboards/ from panel definitions kept as data.

    python grafana/build_dashboards.py           # rewrite the JSON files
    python grafana/build_dashboards.py --check   # exit 1 if the committed JSON is out of date

Panels are declared as `Panel`/`Query` values below; `render_*` turns them into Grafana's dashboard
JSON (schemaVersion 39). Nothing here names a datasource uid: every panel, target, variable and
annotation uses the `${datasource}` template variable, so the files import into any Grafana.

A panel whose query can legitimately return nothing (an alert that is not firing, a field only
MI300 supplies) says so in `may_be_empty`; the text lands in its description and the query test
(tests/integration/test_grafana_dashboards.py) accepts an empty result for it and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 39
FLEET_UID = "amdgpu-fleet"
NODE_UID = "amdgpu-node"
DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The junction temperature at which the in-daemon rule starts suggesting a lower gfx clock ceiling
# (DESIGN.md, Alerts); every temperature panel draws it.
HOT_CELSIUS = 85
MAY_BE_EMPTY = "May be empty:"  # the marker the query test looks for in a description

GREEN, YELLOW, ORANGE, RED, BLUE = "green", "yellow", "orange", "red", "blue"

JSON = dict[str, Any]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False  # the latest value only: tables, bar gauges
    table: bool = False  # format=table: one column per label


@dataclass(frozen=True)
class Panel:
    kind: str  # timeseries | stat | gauge | bargauge | table | heatmap | status-history
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = ""
    width: int = 8
    height: int = 8
    may_be_empty: str = ""  # why no data is a valid answer; appended to the description
    minimum: float | None = None
    maximum: float | None = None
    steps: tuple[tuple[float, str], ...] = ()  # threshold steps above the green base
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


# ---------------------------------------------------------------------------------------------
# Selectors and the MI250X package join
# ---------------------------------------------------------------------------------------------

FLEET = 'instance=~"$instance"'
NODE = 'instance="$instance", gpu=~"$gpu"'
NODE_ALL_GPUS = 'instance="$instance"'
HBM_SENSORS = 'sensor=~"memory|hbm[0-9]+"'
CORE_SENSORS = 'sensor!~"memory|hbm[0-9]+"'
# Sample age measured at scrape time: independent of the scrape interval, unlike time() - x.
SAMPLE_AGE_FLEET = (
    f"(timestamp(amdgpu_sample_timestamp_seconds{{{FLEET}}}) - amdgpu_sample_timestamp_seconds{{{FLEET}}})"
)


def by_package(metric: str, selector: str, aggregate: str = "sum") -> str:
    """A per-GCD series summed (or maxed) per physical package.

    Only die 0 of an MI250X carries power and energy (die 1 has no series), so `sum by package`
    over the device_info join is the package's value; on single-die parts package = device.
    """
    return (
        f"{aggregate} by (instance, package) ({metric}{{{selector}}}"
        f" * on(instance, gpu) group_left(package) amdgpu_device_info{{{selector}}})"
    )


def packages_of_selected_gpus(expr: str) -> str:
    """Keep the packages that contain a selected GCD (die 1 selected still shows its package)."""
    return f"{expr} and on(instance, package) amdgpu_device_info{{{NODE}}}"


def node_package(metric: str, aggregate: str = "sum") -> str:
    return packages_of_selected_gpus(by_package(metric, NODE_ALL_GPUS, aggregate))


# The cap is a package setting: MI250X die 1 has none (or reads 0), so take the max over the dies.
FLEET_PACKAGE_POWER = by_package("amdgpu_power_watts", FLEET)
FLEET_PACKAGE_CAP = by_package("amdgpu_power_cap_watts", FLEET, "max")


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
ACTIVE_MAPPING: JSON = {
    "type": "value",
    "options": {
        "0": {"text": "ok", "color": GREEN, "index": 0},
        "1": {"text": "active", "color": RED, "index": 1},
    },
}
TEMPERATURE_STEPS = ((80.0, ORANGE), (float(HOT_CELSIUS), RED))


# ---------------------------------------------------------------------------------------------
# Fleet overview
# ---------------------------------------------------------------------------------------------


def fleet_dashboard() -> Dashboard:
    health = Row(
        "Fleet health",
        (
            Panel(
                "stat",
                "GCDs up",
                "Devices (GCDs, partitions) whose last read succeeded within its deadline (amdgpu_up).",
                (Query(f"sum(amdgpu_up{{{FLEET}}})"),),
                unit="none",
                width=3,
                height=4,
            ),
            Panel(
                "stat",
                "GCDs down",
                "Devices the exporter knows but could not read in time (amdgpu_up == 0): hung, reset or "
                "fallen off the bus.",
                (Query(f"sum(1 - amdgpu_up{{{FLEET}}})"),),
                unit="none",
                width=3,
                height=4,
                steps=((1.0, RED),),
            ),
            Panel(
                "stat",
                "Stale GCDs",
                "Devices whose latest good sample was older than $stale_after seconds when it was scraped.",
                (Query(f"sum({SAMPLE_AGE_FLEET} > bool $stale_after)"),),
                unit="none",
                width=3,
                height=4,
                steps=((1.0, RED),),
            ),
            Panel(
                "stat",
                "Exporters down",
                "Scrape targets of a job that exports amdgpu metrics whose last scrape failed (Prometheus up == 0).",
                (Query("sum(1 - (up and on(job) amdgpu_exporter_build_info))"),),
                unit="none",
                width=3,
                height=4,
                steps=((1.0, RED),),
            ),
            Panel(
                "stat",
                "Hottest junction",
                f"Highest junction (hotspot) temperature of any GCD. The in-daemon rule suggests a lower gfx "
                f"clock ceiling above {HOT_CELSIUS} °C.",
                (Query(f'max(amdgpu_temperature_celsius{{{FLEET}, sensor="junction"}})'),),
                unit="celsius",
                width=3,
                height=4,
                steps=TEMPERATURE_STEPS,
            ),
            Panel(
                "stat",
                "Fleet power",
                "Total socket power. MI250X reports package power on die 0 only, so the plain sum counts "
                "every package once.",
                (Query(f"sum(amdgpu_power_watts{{{FLEET}}})"),),
                unit="watt",
                width=3,
                height=4,
            ),
            Panel(
                "gauge",
                "Fleet power / cap",
                "Total power as a share of the total of package power caps (cap = max over the dies of a "
                "package: MI250X die 1 has no cap of its own).",
                (Query(f"sum(amdgpu_power_watts{{{FLEET}}}) / sum({FLEET_PACKAGE_CAP})"),),
                unit="percentunit",
                width=3,
                height=4,
                minimum=0,
                maximum=1,
                steps=((0.8, ORANGE), (0.95, RED)),
            ),
            Panel(
                "stat",
                "In-daemon alerts firing",
                "Alerts the exporters' own rules are firing now (amdgpu_alert_firing == 1), all nodes.",
                (Query(f"count(amdgpu_alert_firing{{{FLEET}}} == 1) or vector(0)"),),
                unit="none",
                width=3,
                height=4,
                steps=((1.0, ORANGE),),
            ),
        ),
    )

    nodes = Row(
        "Nodes",
        (
            Panel(
                "table",
                "GCDs per node",
                "One row per node: devices up and down, node power and cap (packages summed through the "
                "amdgpu_device_info join), hottest junction. Click a node to open its detail dashboard.",
                (
                    Query(f"sum by (instance) (amdgpu_up{{{FLEET}}})", instant=True, table=True),
                    Query(f"sum by (instance) (1 - amdgpu_up{{{FLEET}}})", instant=True, table=True),
                    Query(f"sum by (instance) ({FLEET_PACKAGE_POWER})", instant=True, table=True),
                    Query(f"sum by (instance) ({FLEET_PACKAGE_CAP})", instant=True, table=True),
                    Query(
                        f'max by (instance) (amdgpu_temperature_celsius{{{FLEET}, sensor="junction"}})',
                        instant=True,
                        table=True,
                    ),
                ),
                unit="none",
                width=12,
                height=8,
                column_units={"Value #C": "watt", "Value #D": "watt", "Value #E": "celsius"},
                options={
                    "renameByName": {
                        "Value #A": "Up",
                        "Value #B": "Down",
                        "Value #C": "Power",
                        "Value #D": "Cap",
                        "Value #E": "Hottest junction",
                    }
                },
                links=(NODE_LINK_FROM_TABLE,),
            ),
            Panel(
                "timeseries",
                "Power per node vs cap",
                "Socket power summed per node (solid) against the sum of its package caps (dashed).",
                (
                    Query(f"sum by (instance) ({FLEET_PACKAGE_POWER})", "{{instance}} power"),
                    Query(f"sum by (instance) ({FLEET_PACKAGE_CAP})", "{{instance}} cap"),
                ),
                unit="watt",
                width=12,
                dashed=("B",),
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Fleet power vs cap",
                "Total socket power of the selected nodes against the total of their package caps.",
                (
                    Query(f"sum({FLEET_PACKAGE_POWER})", "power"),
                    Query(f"sum({FLEET_PACKAGE_CAP})", "cap"),
                ),
                unit="watt",
                width=12,
                dashed=("B",),
                minimum=0,
            ),
            Panel(
                "bargauge",
                "Package power / cap",
                "Each physical package's power as a share of its cap. MI250X: the two GCDs of a package are "
                "summed via `* on(instance, gpu) group_left(package) amdgpu_device_info` (only die 0 carries "
                "power).",
                (
                    Query(
                        f"sort_desc({FLEET_PACKAGE_POWER} / {FLEET_PACKAGE_CAP})",
                        "{{instance}} package {{package}}",
                        instant=True,
                    ),
                ),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
                steps=((0.8, ORANGE), (0.95, RED)),
            ),
        ),
    )

    temperatures = Row(
        "Temperatures",
        (
            Panel(
                "bargauge",
                "Hottest GCDs: junction",
                f"The ten GCDs with the highest junction (hotspot) temperature now; red from {HOT_CELSIUS} °C. "
                "Click a bar to open that GCD.",
                (
                    Query(
                        f'topk(10, amdgpu_temperature_celsius{{{FLEET}, sensor="junction"}})',
                        "{{instance}} gpu {{gpu}}",
                        instant=True,
                    ),
                ),
                unit="celsius",
                width=8,
                height=9,
                minimum=30,
                maximum=110,
                steps=TEMPERATURE_STEPS,
                links=(NODE_LINK_FROM_SERIES,),
            ),
            Panel(
                "bargauge",
                "Hottest GCDs: HBM",
                "The ten GCDs with the hottest memory stack now (max of the memory and hbm0..3 sensors).",
                (
                    Query(
                        f"topk(10, max by (instance, gpu) (amdgpu_temperature_celsius{{{FLEET}, {HBM_SENSORS}}}))",
                        "{{instance}} gpu {{gpu}}",
                        instant=True,
                    ),
                ),
                unit="celsius",
                width=8,
                height=9,
                minimum=30,
                maximum=110,
                steps=TEMPERATURE_STEPS,
                links=(NODE_LINK_FROM_SERIES,),
            ),
            Panel(
                "timeseries",
                "Junction temperature across the fleet",
                f"Hottest, median and coolest junction temperature over all selected GCDs; the dashed line is "
                f"{HOT_CELSIUS} °C.",
                (
                    Query(f'max(amdgpu_temperature_celsius{{{FLEET}, sensor="junction"}})', "hottest"),
                    Query(f'quantile(0.5, amdgpu_temperature_celsius{{{FLEET}, sensor="junction"}})', "median"),
                    Query(f'min(amdgpu_temperature_celsius{{{FLEET}, sensor="junction"}})', "coolest"),
                ),
                unit="celsius",
                width=8,
                height=9,
                steps=TEMPERATURE_STEPS,
                threshold_line=True,
            ),
        ),
    )

    utilisation = Row(
        "Utilisation",
        (
            Panel(
                "heatmap",
                "GFX busy distribution across GCDs",
                "How many GCDs sit at each gfx busy level over time (each GCD averaged over the step). A "
                "healthy training job keeps the mass at the top; a band near 0 is idle or stalled GCDs.",
                (Query(f'avg_over_time(amdgpu_busy_ratio{{{FLEET}, engine="gfx"}}[$__rate_interval])'),),
                unit="percentunit",
                width=12,
                height=9,
                options={
                    "calculate": True,
                    "calculation": {"yBuckets": {"mode": "size", "value": "0.1", "scale": {"type": "linear"}}},
                    "yAxis": {"axisPlacement": "left", "unit": "percentunit", "min": 0, "max": 1},
                    "cellValues": {"unit": "none"},
                },
            ),
            Panel(
                "status-history",
                "GFX busy per GCD",
                "One row per GCD, coloured by gfx busy averaged over the step: idle GCDs in a busy job stand out.",
                (
                    Query(
                        f'avg_over_time(amdgpu_busy_ratio{{{FLEET}, engine="gfx"}}[$__rate_interval])',
                        "{{instance}} gpu {{gpu}}",
                    ),
                ),
                unit="percentunit",
                width=12,
                height=9,
                minimum=0,
                maximum=1,
                options={"showValue": "never"},
                links=(NODE_LINK_FROM_SERIES,),
            ),
            Panel(
                "timeseries",
                "Mean busy per node",
                "gfx (compute) and memory (HBM controller) busy, averaged over each node's GCDs.",
                (
                    Query(
                        f'avg by (instance, engine) (amdgpu_busy_ratio{{{FLEET}, engine=~"gfx|memory"}})',
                        "{{instance}} {{engine}}",
                    ),
                ),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
            ),
            Panel(
                "timeseries",
                "VRAM used per node",
                "VRAM in use as a share of VRAM size, summed over each node's GCDs.",
                (
                    Query(
                        f'sum by (instance) (amdgpu_memory_used_bytes{{{FLEET}, pool="vram"}})'
                        f' / sum by (instance) (amdgpu_memory_total_bytes{{{FLEET}, pool="vram"}})',
                        "{{instance}}",
                    ),
                ),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
                steps=((0.9, ORANGE), (0.97, RED)),
                threshold_line=True,
            ),
        ),
    )

    energy = Row(
        "Energy",
        (
            Panel(
                "timeseries",
                "Energy per hour, per node",
                "Energy each node's GPUs used in each hour, from the hardware energy counters (die 0 of an "
                "MI250X counts the whole package). Counter resets on driver reload are handled by increase().",
                (
                    Query(
                        f"sum by (instance) (increase(amdgpu_energy_joules_total{{{FLEET}}}[1h])) / 3.6e6",
                        "{{instance}}",
                    ),
                ),
                unit="kwatth",
                width=16,
                interval="1h",
                custom={"drawStyle": "bars", "fillOpacity": 60, "stacking": {"mode": "normal", "group": "A"}},
            ),
            Panel(
                "stat",
                "Energy in the selected range",
                "GPU energy of the selected nodes over the dashboard's time range.",
                (Query(f"sum(increase(amdgpu_energy_joules_total{{{FLEET}}}[$__range])) / 3.6e6"),),
                unit="kwatth",
                width=8,
            ),
        ),
    )

    alerts = Row(
        "Alerts and clock-down suggestions",
        (
            Panel(
                "table",
                "Firing in-daemon alerts",
                "Alerts each exporter's own rules fire now (they work without Prometheus), with the device "
                "they fire on.",
                (
                    Query(
                        f"(amdgpu_alert_firing{{{FLEET}}} == 1) * on(instance, gpu) "
                        f"group_left(product, pci_bus_id) amdgpu_device_info{{{FLEET}}}",
                        instant=True,
                        table=True,
                    ),
                ),
                unit="none",
                width=8,
                may_be_empty="nothing is firing",
                hide_columns=("job", "Value"),
                links=(GCD_LINK_FROM_TABLE,),
            ),
            Panel(
                "table",
                "Firing Prometheus alerts",
                "Fleet alerts from the Prometheus rules shipped in deploy/prometheus (alert names AMDGPU*), "
                "as Prometheus evaluates them before Alertmanager routes them.",
                (
                    Query(
                        f'ALERTS{{alertstate="firing", alertname=~"AMDGPU.*", {FLEET}}}',
                        instant=True,
                        table=True,
                    ),
                ),
                unit="none",
                width=8,
                may_be_empty="nothing is firing, or this Prometheus does not load deploy/prometheus rules",
                hide_columns=("job", "Value", "alertstate"),
            ),
            Panel(
                "table",
                "Clock-down suggestions",
                "GCDs for which the exporter suggests lowering the gfx clock ceiling (it never applies it): "
                "the suggested reduction and ceiling. Apply with the command in /api/v1/alerts or the log.",
                (
                    Query(f"amdgpu_clock_down_suggested_ratio{{{FLEET}}} > 0", instant=True, table=True),
                    Query(f"amdgpu_suggested_gfx_clock_max_hertz{{{FLEET}}}", instant=True, table=True),
                ),
                unit="none",
                width=8,
                may_be_empty="no GCD is hot enough for a suggestion",
                column_units={"Value #A": "percentunit", "Value #B": "hertz"},
                options={"renameByName": {"Value #A": "Suggested reduction", "Value #B": "Suggested gfx max"}},
                hide_columns=("job",),
                links=(GCD_LINK_FROM_TABLE,),
            ),
        ),
    )

    errors = Row(
        "Errors",
        (
            Panel(
                "table",
                "ECC and XGMI errors per node",
                "Uncorrectable and correctable ECC errors since driver load, their increase over the selected "
                "range, XGMI error events in the range and retired VRAM pages. Any uncorrectable error is "
                "worth a look.",
                (
                    Query(
                        f'sum by (instance) (amdgpu_ecc_errors_total{{{FLEET}, type="uncorrectable"}})',
                        instant=True,
                        table=True,
                    ),
                    Query(
                        f'sum by (instance) (amdgpu_ecc_errors_total{{{FLEET}, type="correctable"}})',
                        instant=True,
                        table=True,
                    ),
                    Query(
                        f"round(sum by (instance) (increase(amdgpu_ecc_errors_total{{{FLEET}}}[$__range])))",
                        instant=True,
                        table=True,
                    ),
                    Query(
                        f"round(sum by (instance) (increase(amdgpu_xgmi_error_events_total{{{FLEET}}}[$__range])))",
                        instant=True,
                        table=True,
                    ),
                    Query(f"sum by (instance) (amdgpu_ras_retired_pages{{{FLEET}}})", instant=True, table=True),
                ),
                unit="none",
                width=10,
                options={
                    "renameByName": {
                        "Value #A": "Uncorrectable (since load)",
                        "Value #B": "Correctable (since load)",
                        "Value #C": "ECC in range",
                        "Value #D": "XGMI errors in range",
                        "Value #E": "Retired pages",
                    }
                },
                links=(NODE_LINK_FROM_TABLE,),
            ),
            Panel(
                "timeseries",
                "ECC errors per interval",
                "New ECC errors per step by node and type (correctable, uncorrectable, deferred).",
                (
                    Query(
                        f"sum by (instance, type) (increase(amdgpu_ecc_errors_total{{{FLEET}}}[$__rate_interval]))",
                        "{{instance}} {{type}}",
                    ),
                ),
                unit="none",
                width=5,
                custom={"drawStyle": "bars", "fillOpacity": 80},
            ),
            Panel(
                "timeseries",
                "XGMI error events per interval",
                "XGMI error events per step by node (the exporter accumulates the driver's clear-on-read "
                "xgmi_error file into a counter).",
                (
                    Query(
                        f"sum by (instance) (increase(amdgpu_xgmi_error_events_total{{{FLEET}}}[$__rate_interval]))",
                        "{{instance}}",
                    ),
                ),
                unit="none",
                width=5,
                custom={"drawStyle": "bars", "fillOpacity": 80},
            ),
            Panel(
                "stat",
                "GCDs with a narrowed PCIe link",
                "GCDs whose PCIe link trained narrower than its maximum width: a reseat or riser problem "
                "costs host bandwidth.",
                (
                    Query(
                        f"sum(amdgpu_pcie_current_link_width{{{FLEET}}} < bool amdgpu_pcie_max_link_width{{{FLEET}}})"
                    ),
                ),
                unit="none",
                width=4,
                height=8,
                steps=((1.0, ORANGE),),
            ),
        ),
    )

    stale = Row(
        "Stale and down devices",
        (
            Panel(
                "table",
                "Stale GCDs",
                "Devices whose latest good sample was more than $stale_after s old when scraped, with the "
                "age. A device that keeps failing reads goes stale while the exporter stays up.",
                (Query(f"{SAMPLE_AGE_FLEET} > $stale_after", instant=True, table=True),),
                unit="s",
                width=8,
                may_be_empty="every device is fresh",
                hide_columns=("job",),
                options={"renameByName": {"Value": "Sample age"}},
                links=(GCD_LINK_FROM_TABLE,),
            ),
            Panel(
                "table",
                "Down GCDs",
                "Devices the exporter could not read within the deadline in its last cycle.",
                (
                    Query(
                        f"(amdgpu_up{{{FLEET}}} == 0) * on(instance, gpu) "
                        f"group_left(product, pci_bus_id) amdgpu_device_info{{{FLEET}}}",
                        instant=True,
                        table=True,
                    ),
                ),
                unit="none",
                width=8,
                may_be_empty="every device is up",
                hide_columns=("job", "Value"),
                links=(GCD_LINK_FROM_TABLE,),
            ),
            Panel(
                "timeseries",
                "Oldest sample per node",
                "Age at scrape time of each node's oldest device sample; with a 1 s poll it stays near 0.",
                (Query(f"max by (instance) {SAMPLE_AGE_FLEET}", "{{instance}}"),),
                unit="s",
                width=8,
                minimum=0,
            ),
        ),
    )

    return Dashboard(
        uid=FLEET_UID,
        title="AMD GPU / Fleet overview",
        description="AMD Instinct fleet: devices up, temperatures, power vs cap, utilisation, energy, "
        "alerts and errors, from amdgpu-exporter.",
        variables=(
            datasource_variable(),
            query_variable("instance", "Node", "label_values(amdgpu_up, instance)", multi=True),
            stale_after_variable(),
        ),
        rows=(health, alerts, nodes, temperatures, utilisation, energy, errors, stale),
        time_from="now-6h",
    )


# ---------------------------------------------------------------------------------------------
# Node / GCD detail
# ---------------------------------------------------------------------------------------------


def node_dashboard() -> Dashboard:
    per_gpu = "gpu {{gpu}}"
    overview = Row(
        "Overview",
        (
            Panel(
                "stat",
                "Up",
                "Whether the exporter's last read of each selected GCD succeeded within its deadline.",
                (Query(f"amdgpu_up{{{NODE}}}", per_gpu),),
                unit="none",
                width=4,
                height=5,
                mappings=(UP_DOWN_MAPPING,),
                steps=((0.0, RED), (1.0, GREEN)),
                options={"colorMode": "background", "graphMode": "none"},
            ),
            Panel(
                "stat",
                "Junction temperature",
                f"Junction (hotspot) temperature now; red from {HOT_CELSIUS} °C.",
                (Query(f'amdgpu_temperature_celsius{{{NODE}, sensor="junction"}}', per_gpu),),
                unit="celsius",
                width=5,
                height=5,
                steps=TEMPERATURE_STEPS,
            ),
            Panel(
                "stat",
                "Package power",
                "Socket power of each package holding a selected GCD (MI250X: measured on die 0 for both).",
                (Query(node_package("amdgpu_power_watts"), "package {{package}}"),),
                unit="watt",
                width=5,
                height=5,
            ),
            Panel(
                "gauge",
                "GFX busy",
                "Share of time the gfx (compute) engine was busy.",
                (Query(f'amdgpu_busy_ratio{{{NODE}, engine="gfx"}}', per_gpu),),
                unit="percentunit",
                width=5,
                height=5,
                minimum=0,
                maximum=1,
            ),
            Panel(
                "gauge",
                "VRAM used",
                "VRAM in use as a share of VRAM size.",
                (
                    Query(
                        f'amdgpu_memory_used_bytes{{{NODE}, pool="vram"}}'
                        f' / amdgpu_memory_total_bytes{{{NODE}, pool="vram"}}',
                        per_gpu,
                    ),
                ),
                unit="percentunit",
                width=5,
                height=5,
                minimum=0,
                maximum=1,
                steps=((0.9, ORANGE), (0.97, RED)),
            ),
            Panel(
                "table",
                "Device identity",
                "What each selected GCD is: PCI address, product, package and die, serial, VBIOS, driver and "
                "partition modes (amdgpu_device_info).",
                (Query(f"amdgpu_device_info{{{NODE}}}", instant=True, table=True),),
                unit="none",
                width=24,
                height=6,
                hide_columns=("job", "instance", "Value"),
            ),
        ),
    )

    thermals = Row(
        "Temperatures and throttling",
        (
            Panel(
                "timeseries",
                "GPU temperatures",
                f"Edge, junction (hotspot) and voltage-regulator sensors (solid) with the device's own "
                f"critical/emergency limits (dashed); the red band starts at {HOT_CELSIUS} °C.",
                (
                    Query(f"amdgpu_temperature_celsius{{{NODE}, {CORE_SENSORS}}}", "gpu {{gpu}} {{sensor}}"),
                    Query(
                        f"amdgpu_temperature_threshold_celsius{{{NODE}, {CORE_SENSORS}}}",
                        "gpu {{gpu}} {{sensor}} {{threshold}} limit",
                    ),
                ),
                unit="celsius",
                width=12,
                height=9,
                steps=TEMPERATURE_STEPS,
                threshold_line=True,
                dashed=("B",),
            ),
            Panel(
                "timeseries",
                "Memory (HBM) temperatures",
                f"HBM stack sensors (memory = hottest stack, hbm0..3 per stack) with the device's memory limits "
                f"(dashed); the red band starts at {HOT_CELSIUS} °C.",
                (
                    Query(f"amdgpu_temperature_celsius{{{NODE}, {HBM_SENSORS}}}", "gpu {{gpu}} {{sensor}}"),
                    Query(
                        f"amdgpu_temperature_threshold_celsius{{{NODE}, {HBM_SENSORS}}}",
                        "gpu {{gpu}} {{sensor}} {{threshold}} limit",
                    ),
                ),
                unit="celsius",
                width=12,
                height=9,
                steps=TEMPERATURE_STEPS,
                threshold_line=True,
                dashed=("B",),
            ),
            Panel(
                "stat",
                "GCDs throttling now",
                "How many of the selected GCDs have at least one SMU throttler reason active.",
                (Query(f"sum(max by (gpu) (amdgpu_throttle_active{{{NODE}}}))"),),
                unit="none",
                width=4,
                height=8,
                steps=((1.0, ORANGE),),
            ),
            Panel(
                "status-history",
                "Throttle reasons active in the range",
                "For each SMU throttler reason that was active at some point in the range, how many of the "
                "selected GCDs had it active (0 = none). Reasons never active are left out: there are ~34.",
                (
                    Query(
                        f"sum by (reason) (amdgpu_throttle_active{{{NODE}}}) and on(reason) "
                        f"max by (reason) (max_over_time(amdgpu_throttle_active{{{NODE}}}[$__range])) > 0",
                        "{{reason}}",
                    ),
                ),
                unit="none",
                width=20,
                height=8,
                steps=((1.0, RED),),
                options={"showValue": "auto"},
                may_be_empty="no GCD throttled in the range",
            ),
        ),
    )

    power = Row(
        "Power and energy",
        (
            Panel(
                "timeseries",
                "Package power and cap",
                "Socket power of each package holding a selected GCD (solid), its current cap (dashed) and the "
                "highest cap allowed (dotted). MI250X: die 0 measures the whole package.",
                (
                    Query(node_package("amdgpu_power_watts"), "package {{package}} power"),
                    Query(node_package("amdgpu_power_cap_watts", "max"), "package {{package}} cap"),
                    Query(node_package("amdgpu_power_cap_max_watts", "max"), "package {{package}} cap max"),
                ),
                unit="watt",
                width=12,
                dashed=("B",),
                dotted=("C",),
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Energy rate",
                "Average power derived from the hardware energy counter (rate of amdgpu_energy_joules_total) "
                "per package: smoother than the sampled power and immune to missed samples.",
                (
                    Query(
                        packages_of_selected_gpus(
                            f"sum by (instance, package) (rate(amdgpu_energy_joules_total{{{NODE_ALL_GPUS}}}"
                            f"[$__rate_interval]) * on(instance, gpu) group_left(package) "
                            f"amdgpu_device_info{{{NODE_ALL_GPUS}}})"
                        ),
                        "package {{package}}",
                    ),
                ),
                unit="watt",
                width=8,
                minimum=0,
            ),
            Panel(
                "stat",
                "Energy in range",
                "Energy each package holding a selected GCD used over the dashboard's time range.",
                (
                    Query(
                        "("
                        + packages_of_selected_gpus(
                            f"sum by (instance, package) (increase(amdgpu_energy_joules_total{{{NODE_ALL_GPUS}}}"
                            f"[$__range]) * on(instance, gpu) group_left(package) "
                            f"amdgpu_device_info{{{NODE_ALL_GPUS}}})"
                        )
                        + ") / 3.6e6",
                        "package {{package}}",
                    ),
                ),
                unit="kwatth",
                width=4,
            ),
        ),
    )

    busy = Row(
        "Utilisation",
        (
            Panel(
                "timeseries",
                "GFX and memory busy (waveform)",
                "Raw gfx (compute) and memory (HBM controller) busy samples, not averaged, so the compute / "
                "communication waveform of a training step is visible: gfx high while computing, dropping "
                "during all-reduce. Zoom to a few minutes to see single steps.",
                (Query(f'amdgpu_busy_ratio{{{NODE}, engine=~"gfx|memory"}}', "gpu {{gpu}} {{engine}}"),),
                unit="percentunit",
                width=16,
                height=9,
                minimum=0,
                maximum=1,
                interval="1s",
                custom={"lineInterpolation": "stepAfter", "fillOpacity": 0},
                options={"maxDataPoints": 2000},
            ),
            Panel(
                "timeseries",
                "Busy averaged per step (all engines)",
                "gfx, memory and media busy averaged over each step: sustained load rather than the waveform.",
                (
                    Query(
                        f"avg_over_time(amdgpu_busy_ratio{{{NODE}}}[$__rate_interval])",
                        "gpu {{gpu}} {{engine}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                height=9,
                minimum=0,
                maximum=1,
            ),
        ),
    )

    memory = Row(
        "Memory",
        (
            Panel(
                "timeseries",
                "VRAM and GTT",
                "Memory in use by pool (vram, visible_vram, gtt; solid) against the pool size (dashed).",
                (
                    Query(f"amdgpu_memory_used_bytes{{{NODE}}}", "gpu {{gpu}} {{pool}} used"),
                    Query(f"amdgpu_memory_total_bytes{{{NODE}}}", "gpu {{gpu}} {{pool}} total"),
                ),
                unit="bytes",
                width=24,
                dashed=("B",),
                minimum=0,
            ),
        ),
    )

    clocks = Row(
        "Clocks and voltage",
        (
            Panel(
                "timeseries",
                "Clocks vs max",
                "Current clock per domain (solid) and the highest DPM level of that domain (dashed).",
                (
                    Query(f"amdgpu_clock_hertz{{{NODE}}}", "gpu {{gpu}} {{domain}}"),
                    Query(f"amdgpu_clock_max_hertz{{{NODE}}}", "gpu {{gpu}} {{domain}} max"),
                ),
                unit="hertz",
                width=10,
                dashed=("B",),
                minimum=0,
            ),
            Panel(
                "timeseries",
                "GFX clock / max",
                "The gfx clock as a share of its ceiling: below 1 under load means a power or thermal limit.",
                (
                    Query(
                        f'amdgpu_clock_hertz{{{NODE}, domain="gfx"}} / amdgpu_clock_max_hertz{{{NODE}, domain="gfx"}}',
                        per_gpu,
                    ),
                ),
                unit="percentunit",
                width=7,
                minimum=0,
                maximum=1.05,
            ),
            Panel(
                "timeseries",
                "Voltages",
                "Voltage by rail (gfx, soc, memory) where the device reports it.",
                (Query(f"amdgpu_voltage_volts{{{NODE}}}", "gpu {{gpu}} {{rail}}"),),
                unit="volt",
                may_be_empty="MI300X reports no voltages; MI200 reports vddgfx (hwmon in0_input) only",
                width=7,
            ),
        ),
    )

    pcie = Row(
        "PCIe",
        (
            Panel(
                "timeseries",
                "PCIe link speed",
                "Current link speed (solid) against the maximum the device supports (dashed). Idle links may "
                "train down to save power; a link that stays slow under load is a problem.",
                (
                    Query(f"amdgpu_pcie_current_link_transfers_per_second{{{NODE}}} / 1e9", "gpu {{gpu}} current"),
                    Query(f"amdgpu_pcie_max_link_transfers_per_second{{{NODE}}} / 1e9", "gpu {{gpu}} max"),
                ),
                unit="suffix:GT/s",
                width=6,
                dashed=("B",),
                minimum=0,
            ),
            Panel(
                "timeseries",
                "PCIe link width",
                "Current link width in lanes (solid) against the maximum (dashed): narrower means a seating "
                "or riser problem.",
                (
                    Query(f"amdgpu_pcie_current_link_width{{{NODE}}}", "gpu {{gpu}} current"),
                    Query(f"amdgpu_pcie_max_link_width{{{NODE}}}", "gpu {{gpu}} max"),
                ),
                unit="prefix:x",
                width=6,
                dashed=("B",),
                minimum=0,
            ),
            Panel(
                "timeseries",
                "PCIe bandwidth",
                "Measured PCIe traffic (solid; MI300: instantaneous from gpu_metrics, MI200: upper-bound "
                "estimate from pcie_bw) against the current link's capacity in one direction (dashed; "
                "GT/s x lanes x 128/130 / 8).",
                (
                    Query(f"amdgpu_pcie_bandwidth_bytes_per_second{{{NODE}}}", "gpu {{gpu}}"),
                    Query(
                        f"amdgpu_pcie_current_link_transfers_per_second{{{NODE}}} * "
                        f"amdgpu_pcie_current_link_width{{{NODE}}} * 128 / 130 / 8",
                        "gpu {{gpu}} link capacity",
                    ),
                ),
                unit="Bps",
                width=6,
                dashed=("B",),
                minimum=0,
            ),
            Panel(
                "timeseries",
                "PCIe replays",
                "PCIe replays per second (NAKs sent + received): a rising rate means a marginal link.",
                (Query(f"rate(amdgpu_pcie_replays_total{{{NODE}}}[$__rate_interval])", per_gpu),),
                unit="cps",
                width=6,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "PCIe recoveries and NAKs",
                "Link recoveries (L0 -> recovery) and NAKs by direction per second.",
                (
                    Query(f"rate(amdgpu_pcie_recoveries_total{{{NODE}}}[$__rate_interval])", "gpu {{gpu}} recovery"),
                    Query(
                        f"rate(amdgpu_pcie_naks_total{{{NODE}}}[$__rate_interval])",
                        "gpu {{gpu}} NAK {{direction}}",
                    ),
                ),
                unit="cps",
                width=24,
                height=6,
                minimum=0,
                may_be_empty="only MI300 (gpu_metrics v1_5 and later) reports recoveries and NAKs",
            ),
        ),
    )

    xgmi = Row(
        "XGMI",
        (
            Panel(
                "timeseries",
                "XGMI bandwidth per link",
                "Data read (up) and written (down) per second over each XGMI link, from the cumulative "
                "per-link counters.",
                (
                    Query(
                        f"rate(amdgpu_xgmi_read_bytes_total{{{NODE}}}[$__rate_interval])",
                        "gpu {{gpu}} link {{link}} read",
                    ),
                    Query(
                        f"rate(amdgpu_xgmi_write_bytes_total{{{NODE}}}[$__rate_interval])",
                        "gpu {{gpu}} link {{link}} write",
                    ),
                ),
                unit="Bps",
                width=12,
                height=9,
                may_be_empty="only MI300 has XGMI traffic counters; MI200 has none in the upstream kernel",
                custom={"fillOpacity": 10},
                options={"negative_y": ("B",)},
            ),
            Panel(
                "stat",
                "XGMI link width and rate",
                "Lanes per XGMI link and the link rate (lane rate x width).",
                (
                    Query(f"amdgpu_xgmi_link_width{{{NODE}}}", "gpu {{gpu}} width"),
                    Query(f"amdgpu_xgmi_link_bits_per_second{{{NODE}}}", "gpu {{gpu}} rate"),
                ),
                unit="prefix:x",
                width=6,
                height=9,
                column_units={"B": "bps"},
                may_be_empty="MI200's gpu_metrics has no XGMI link fields",
                options={"graphMode": "none"},
            ),
            Panel(
                "status-history",
                "XGMI links up",
                "Each XGMI link's state: a link that drops makes collectives fall back to slower paths.",
                (Query(f"amdgpu_xgmi_link_up{{{NODE}}}", "gpu {{gpu}} link {{link}}"),),
                unit="none",
                width=6,
                height=9,
                mappings=(UP_DOWN_MAPPING,),
                steps=((0.0, RED), (1.0, GREEN)),
                may_be_empty="only MI300 with gpu_metrics v1_7 or later reports link state",
            ),
            Panel(
                "timeseries",
                "XGMI error events",
                "XGMI error events per step (accumulated by the exporter from the clear-on-read xgmi_error file).",
                (
                    Query(
                        f"increase(amdgpu_xgmi_error_events_total{{{NODE}}}[$__rate_interval])",
                        per_gpu,
                    ),
                ),
                unit="none",
                width=8,
                custom={"drawStyle": "bars", "fillOpacity": 80},
                minimum=0,
            ),
            Panel(
                "table",
                "Topology",
                "KFD io_links from each selected GCD to its peers (another GCD's gpu index, or cpu): link "
                "type (xgmi, pcie), hops and weight.",
                (Query(f"amdgpu_topology_link_info{{{NODE}}}", instant=True, table=True),),
                unit="none",
                width=16,
                hide_columns=("job", "instance", "Value"),
            ),
        ),
    )

    ras = Row(
        "ECC / RAS",
        (
            Panel(
                "table",
                "ECC errors by block",
                "RAS error counts since driver load by block and type, summed over the selected GCDs, largest first.",
                (
                    Query(
                        f"sort_desc(sum by (block, type) (amdgpu_ecc_errors_total{{{NODE}}}))",
                        instant=True,
                        table=True,
                    ),
                ),
                unit="none",
                width=10,
                height=9,
                options={"renameByName": {"Value": "Errors"}},
            ),
            Panel(
                "timeseries",
                "ECC errors per interval",
                "New ECC errors per step by GCD, block and type.",
                (
                    Query(
                        f"sum by (gpu, block, type) (increase(amdgpu_ecc_errors_total{{{NODE}}}[$__rate_interval]))",
                        "gpu {{gpu}} {{block}} {{type}}",
                    ),
                ),
                unit="none",
                width=10,
                height=9,
                custom={"drawStyle": "bars", "fillOpacity": 80},
                minimum=0,
            ),
            Panel(
                "stat",
                "Retired VRAM pages",
                "VRAM pages RAS has retired; a growing number means failing HBM.",
                (Query(f"amdgpu_ras_retired_pages{{{NODE}}}", per_gpu),),
                unit="none",
                width=4,
                height=9,
                steps=((1.0, ORANGE), (64.0, RED)),
            ),
        ),
    )

    firmware = Row(
        "Firmware and suggestions",
        (
            Panel(
                "table",
                "Firmware and VBIOS",
                "Firmware version of every block, and the VBIOS, per selected GCD.",
                (
                    Query(
                        f"max by (gpu, block, version) (amdgpu_firmware_info{{{NODE}}}) or "
                        f"max by (gpu, block, version) (label_replace(label_replace(amdgpu_device_info{{{NODE}}}, "
                        f'"block", "vbios", "", ""), "version", "$1", "vbios", "(.*)"))',
                        instant=True,
                        table=True,
                    ),
                ),
                unit="none",
                width=10,
                height=10,
                hide_columns=("Value",),
            ),
            Panel(
                "stat",
                "Suggested gfx clock reduction",
                "How far the exporter suggests lowering the gfx clock ceiling (0 = no suggestion). It only "
                "suggests; nothing is written to the GPU.",
                (Query(f"amdgpu_clock_down_suggested_ratio{{{NODE}}}", per_gpu),),
                unit="percentunit",
                width=4,
                height=10,
                steps=((0.01, ORANGE),),
            ),
            Panel(
                "timeseries",
                "GFX clock vs suggested ceiling",
                "The gfx clock (solid) and, while a suggestion is active, the suggested ceiling (dashed).",
                (
                    Query(f'amdgpu_clock_hertz{{{NODE}, domain="gfx"}}', "gpu {{gpu}} gfx"),
                    Query(f"amdgpu_suggested_gfx_clock_max_hertz{{{NODE}}}", "gpu {{gpu}} suggested max"),
                ),
                unit="hertz",
                width=10,
                height=10,
                dashed=("B",),
                may_be_empty="the suggested ceiling exists only while a suggestion is active",
            ),
            Panel(
                "table",
                "Active alerts and suggestion",
                "In-daemon alerts firing on the selected GCDs with the suggested gfx clock ceiling.",
                (
                    Query(f"amdgpu_alert_firing{{{NODE}}} == 1", instant=True, table=True),
                    Query(f"amdgpu_suggested_gfx_clock_max_hertz{{{NODE}}}", instant=True, table=True),
                ),
                unit="none",
                width=24,
                height=5,
                column_units={"Value #B": "hertz"},
                hide_columns=("job", "instance", "Value #A"),
                options={"renameByName": {"Value #B": "Suggested gfx max"}},
                may_be_empty="nothing is firing",
            ),
        ),
    )

    exporter = Row(
        "Exporter",
        (
            Panel(
                "timeseries",
                "Poll cycle duration",
                "Wall time of one poll cycle of all devices (p50, p99). Scrapes only send the bytes rendered "
                "at the end of the last cycle, so this never delays a scrape.",
                (
                    Query(
                        "histogram_quantile(0.5, sum by (le) (rate(amdgpu_exporter_poll_duration_seconds_bucket"
                        f"{{{NODE_ALL_GPUS}}}[$__rate_interval])))",
                        "p50",
                    ),
                    Query(
                        "histogram_quantile(0.99, sum by (le) (rate(amdgpu_exporter_poll_duration_seconds_bucket"
                        f"{{{NODE_ALL_GPUS}}}[$__rate_interval])))",
                        "p99",
                    ),
                ),
                unit="s",
                width=8,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Sample age",
                "Age at scrape time of each GCD's latest good sample, and of the poll loop's last cycle.",
                (
                    Query(
                        f"timestamp(amdgpu_sample_timestamp_seconds{{{NODE}}})"
                        f" - amdgpu_sample_timestamp_seconds{{{NODE}}}",
                        per_gpu,
                    ),
                    Query(
                        f"timestamp(amdgpu_exporter_last_poll_timestamp_seconds{{{NODE_ALL_GPUS}}}) - "
                        f"amdgpu_exporter_last_poll_timestamp_seconds{{{NODE_ALL_GPUS}}}",
                        "poll loop",
                    ),
                ),
                unit="s",
                width=8,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Read timeouts",
                "Device reads that missed their deadline per step (a hung GPU shows up here first).",
                (Query(f"increase(amdgpu_exporter_read_timeouts_total{{{NODE}}}[$__rate_interval])", per_gpu),),
                unit="none",
                width=8,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Read errors, worker restarts, Alertmanager pushes",
                "Failed reads by reason, restarts of the rocm-smi worker process, and alert pushes to "
                "Alertmanager by result, per step.",
                (
                    Query(
                        f"increase(amdgpu_exporter_read_errors_total{{{NODE}}}[$__rate_interval])",
                        "gpu {{gpu}} {{reason}}",
                    ),
                    Query(
                        f"increase(amdgpu_exporter_worker_restarts_total{{{NODE_ALL_GPUS}}}[$__rate_interval])",
                        "worker restarts",
                    ),
                    Query(
                        f"increase(amdgpu_exporter_alertmanager_notifications_total{{{NODE_ALL_GPUS}}}"
                        "[$__rate_interval])",
                        "Alertmanager {{result}}",
                    ),
                ),
                unit="none",
                width=16,
                minimum=0,
                may_be_empty="no read has failed, the sysfs source has no worker, and no Alertmanager is configured",
            ),
            Panel(
                "table",
                "Exporter build",
                "Exporter version and the source it reads (sysfs or rocm-smi), with why that source was chosen.",
                (Query(f"amdgpu_exporter_build_info{{{NODE_ALL_GPUS}}}", instant=True, table=True),),
                unit="none",
                width=8,
                hide_columns=("job", "Value"),
            ),
        ),
    )

    return Dashboard(
        uid=NODE_UID,
        title="AMD GPU / Node and GCD detail",
        description="One node's AMD Instinct GCDs in detail: thermals, power, utilisation waveform, memory, "
        "clocks, PCIe, XGMI, RAS, firmware and the exporter itself.",
        variables=(
            datasource_variable(),
            query_variable("instance", "Node", "label_values(amdgpu_up, instance)"),
            query_variable("gpu", "GCD", 'label_values(amdgpu_up{instance="$instance"}, gpu)', multi=True),
        ),
        rows=(overview, thermals, power, busy, memory, clocks, pcie, xgmi, ras, firmware, exporter),
        time_from="now-1h",
        annotations=(
            {
                "datasource": DATASOURCE,
                "enable": True,
                "expr": f"amdgpu_alert_firing{{{NODE}}} == 1",
                "hide": False,
                "iconColor": "red",
                "name": "In-daemon alerts",
                "step": "10s",
                "tagKeys": "alert,severity",
                "titleFormat": "{{alert}} on gpu {{gpu}}",
                "useValueForTime": False,
            },
        ),
    )


# ---------------------------------------------------------------------------------------------
# Template variables
# ---------------------------------------------------------------------------------------------


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


def stale_after_variable() -> JSON:
    # 60 s, like the AMDGPUSamplesStale rule in deploy/prometheus.
    return {
        "current": {"text": "60", "value": "60"},
        "description": "A device sample older than this many seconds at scrape time counts as stale.",
        "hide": 0,
        "label": "Stale after (s)",
        "name": "stale_after",
        "options": [{"selected": True, "text": "60", "value": "60"}],
        "query": "60",
        "skipUrlSync": False,
        "type": "textbox",
    }


# ---------------------------------------------------------------------------------------------
# Rendering to Grafana JSON
# ---------------------------------------------------------------------------------------------

REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
GRID_WIDTH = 24


def render_target(query: Query, ref_id: str) -> JSON:
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": query.expr,
        "format": "table" if query.table else "time_series",
        "instant": query.instant,
        "legendFormat": query.legend or "__auto",
        "range": not query.instant,
        "refId": ref_id,
    }


def thresholds(panel: Panel) -> JSON:
    steps: list[JSON] = [{"color": GREEN, "value": None}]
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


def field_custom(panel: Panel) -> JSON:
    if panel.kind == "timeseries":
        custom: JSON = {
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
            "thresholdsStyle": {"mode": "dashed" if panel.threshold_line else "off"},
        }
    elif panel.kind == "status-history":
        custom = {"fillOpacity": 80, "lineWidth": 0}
    elif panel.kind == "table":
        custom = {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False}
    elif panel.kind == "heatmap":
        custom = {"scaleDistribution": {"type": "linear"}}
    else:
        custom = {}
    return {**custom, **panel.custom}


def panel_options(panel: Panel) -> JSON:
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    legend = {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True}
    tooltip = {"mode": "multi", "sort": "desc"}
    defaults: dict[str, JSON] = {
        "timeseries": {
            "legend": {**legend, "calcs": ["lastNotNull", "max"], "displayMode": "table"},
            "tooltip": tooltip,
        },
        "stat": {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": reduce,
            "showPercentChange": False,
            "textMode": "auto",
            "wideLayout": True,
        },
        "gauge": {
            "orientation": "auto",
            "reduceOptions": reduce,
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
            "reduceOptions": reduce,
            "showUnfilled": True,
            "sizing": "auto",
            "valueMode": "color",
        },
        "table": {"cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""}, "showHeader": True},
        "status-history": {
            "colWidth": 0.9,
            "legend": {**legend, "showLegend": False},
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
    # Keys that only steer the generator never reach Grafana.
    own = {k: v for k, v in panel.options.items() if k not in ("renameByName", "negative_y", "maxDataPoints")}
    return {**defaults[panel.kind], **own}


def transformations(panel: Panel) -> list[JSON]:
    if panel.kind != "table":
        return []
    result: list[JSON] = []
    if len(panel.queries) > 1:
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
        "targets": [render_target(q, REF_IDS[i]) for i, q in enumerate(panel.queries)],
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


def dashboards() -> dict[str, JSON]:
    """File name -> dashboard JSON, for every dashboard this project ships."""
    return {
        "amdgpu-fleet.json": render_dashboard(fleet_dashboard()),
        "amdgpu-node.json": render_dashboard(node_dashboard()),
    }


def to_text(dashboard: JSON) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON differs")
    parser.add_argument("--out", type=Path, default=DASHBOARD_DIR, help="directory to write (default: %(default)s)")
    args = parser.parse_args(argv)
    stale = []
    for name, dashboard in dashboards().items():
        path = args.out / name
        text = to_text(dashboard)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date, run python grafana/build_dashboards.py:", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
