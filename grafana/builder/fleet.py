"""AMD GPU / Fleet overview: every node at a glance, one function per row of the dashboard."""

from __future__ import annotations

from .memory_limits import MEMORY_WARNING_RATIO, MemoryLimits, mebibytes, promql_number
from .panels import (
    ANY_IS_BAD,
    ANY_IS_WORTH_A_LOOK,
    FLEET_UID,
    GCD_LINK_FROM_TABLE,
    NODE_LINK_FROM_SERIES,
    NODE_LINK_FROM_TABLE,
    VRAM_STEPS,
    Dashboard,
    Panel,
    Query,
    Row,
    Steps,
    against_reference,
    celsius,
    power_cap_steps,
    temperature_steps,
)
from .queries import (
    FLEET,
    HBM_SENSORS,
    JOULES_PER_KWH,
    NODE_CAP,
    NODE_DEVICES,
    NODE_HOTTEST_JUNCTION,
    NODE_POWER,
    NODE_SAMPLE_AGE,
    NODE_UP,
    PACKAGE_POWER_SHARE,
    exporter_process,
    integral_over_range,
    sample_age_now,
    with_identity,
)
from .thresholds import Thresholds
from .variables import adhoc_filter_variable, datasource_variable, query_variable, stale_after_variable

# The node whose GCDs the per-GCD panel draws (the variable gcd_instance): the fleet dashboard reads no
# per-GCD series over a range for the whole fleet, only a node's few (issue 34; docs/recording-rules.md).
ONE_NODE = 'instance="$gcd_instance"'
NODE_ENERGY_RATE = f"instance:amdgpu_energy_joules:rate5m{{{FLEET}}}"
# GCDs known and GCDs read per node (recorded): down = known - read.
NODE_DOWN = f"sum by (instance) ({NODE_DEVICES}) - sum by (instance) ({NODE_UP})"
NODE_ALERTS_FIRING = f"instance_alert:amdgpu_alert_firing:sum{{{FLEET}}}"
NODE_CLOCK_DOWN = f"instance:amdgpu_clock_down_suggested_ratio:max{{{FLEET}}}"
NODE_BUSY = f'instance:amdgpu_busy_ratio:avg{{{FLEET}, engine=~"gfx|memory"}}'
NODE_GFX_BUSY = f'instance:amdgpu_busy_ratio:avg{{{FLEET}, engine="gfx"}}'
NODE_VRAM_USED = f"instance:amdgpu_vram_used:ratio{{{FLEET}}}"
# Nodes at or above each level of mean gfx busy, and the idle ones: a distribution computed by
# Prometheus (a few series, one comparison each), where a heatmap calculated in the browser fetched
# every node's series.
GFX_BUSY_BANDS = (
    (">= 0.75", "at least 75 % busy"),
    (">= 0.5", "at least 50 %"),
    (">= 0.25", "at least 25 %"),
    (">= 0.05", "at least 5 %"),
    ("< 0.05", "idle (< 5 %)"),
)
# The hottest memory stack per node: the recorded per-node max of the memory and hbm0..3 sensors.
NODE_HOTTEST_HBM = f"max by (instance) (instance_sensor:amdgpu_temperature_celsius:max{{{FLEET}, {HBM_SENSORS}}})"
# Per-holder series can be as many a node as its devices (a CPX node: 64 pods): counted every 5 minutes.
HOLDER_STEP_SECONDS = "300"
# A graph of a recorded series steps no finer than its rule group records it (amdgpu-recording every
# 30 s, amdgpu-recording-minutely every minute): a finer step draws the same value again and costs a
# lookup per node per step (at 6 h: 720 or 360 steps a series instead of ~1,000).
RECORDED_30S = "30s"
RECORDED_1M = "1m"
# Graphs over the fleet draw a few aggregates over the nodes (highest, mean, lowest), not a line a
# node: at 1,000 nodes and 6 h a line a node is 720,000 points to encode and draw (5 to 12 s a query
# measured on the benchmark machine, bench/RESULTS-fleet.md), and a thousand lines show nothing one
# can read. With a node filter set, the aggregates are that node's value; the node dashboard draws
# each GCD.


NO_HEALTH_CHECKS = "the exporters do not export the health verdict (amdgpu_health_status)"


def tile(
    title: str, description: str, expr: str, unit: str = "none", steps: Steps = (), may_be_empty: str = ""
) -> Panel:
    """A number in the fleet health strip."""
    return Panel("stat", title, description, expr, unit=unit, width=3, height=4, steps=steps, may_be_empty=may_be_empty)


def health_row(t: Thresholds) -> Row:
    return Row(
        "Fleet health",
        (
            tile(
                "GCDs up",
                "Devices (GCDs, partitions) whose last read succeeded within its deadline (amdgpu_up, summed "
                "per node by the recording rules).",
                f"sum({NODE_UP})",
            ),
            tile(
                "GCDs down",
                "Devices the exporter knows but could not read in time (amdgpu_up == 0): hung, reset or "
                "fallen off the bus.",
                f"sum({NODE_DEVICES}) - sum({NODE_UP})",
                steps=ANY_IS_BAD,
            ),
            tile(
                "Nodes with stale GCDs",
                "Nodes with a device whose latest good sample was older than $stale_after seconds when last "
                "scraped (the recorded per-node oldest age, instance:amdgpu_sample_age_seconds:max, once a "
                "minute: up to a minute late). The table in 'Stale and down devices' names the nodes.",
                f"count({NODE_SAMPLE_AGE} > $stale_after) or vector(0)",
                steps=ANY_IS_BAD,
            ),
            tile(
                "Exporters down",
                "Scrape targets of a job that exports amdgpu metrics whose last scrape failed (Prometheus up == 0).",
                "sum(1 - (up and on(job) amdgpu_exporter_build_info))",
                steps=ANY_IS_BAD,
            ),
            tile(
                "Hottest junction",
                "Highest junction (hotspot) temperature of any GCD. The in-daemon rule suggests a lower gfx "
                f"clock ceiling above {celsius(t.junction_hot_celsius)}.",
                f"max({NODE_HOTTEST_JUNCTION})",
                unit="celsius",
                steps=temperature_steps(t),
            ),
            tile(
                "Fleet power",
                "Total socket power. MI250X reports package power on die 0 only, so the plain sum counts "
                "every package once.",
                f"sum({NODE_POWER})",
                unit="watt",
            ),
            Panel(
                "gauge",
                "Fleet power / cap",
                "Total power as a share of the total of package power caps (cap = max over the dies of a "
                "package: MI250X die 1 has no cap of its own).",
                f"sum({NODE_POWER}) / sum({NODE_CAP})",
                unit="percentunit",
                width=3,
                height=4,
                minimum=0,
                maximum=1,
                steps=power_cap_steps(t),
            ),
            tile(
                "Unfit GCDs",
                "Devices the exporter's health checks find unfit (amdgpu_health_status 0), counted per node by "
                "the recording rules (instance:amdgpu_health_unfit:count).",
                f"sum(instance:amdgpu_health_unfit:count{{{FLEET}}})",
                steps=ANY_IS_BAD,
                may_be_empty=NO_HEALTH_CHECKS,
            ),
            tile(
                "In-daemon alerts firing",
                "Alerts the exporters' own rules are firing now, counted per device (amdgpu_alert_firing, summed "
                "per node and alert by the recording rules), all nodes.",
                f"sum({NODE_ALERTS_FIRING}) or vector(0)",
                steps=ANY_IS_WORTH_A_LOOK,
            ),
        ),
    )


def nodes_row(t: Thresholds) -> Row:
    return Row(
        "Nodes",
        (
            Panel(
                "table",
                "GCDs per node",
                "One row per node: devices up and down, node power and cap (package caps summed per node by "
                "the recording rules), hottest junction. Click a node to open its detail dashboard.",
                (
                    f"sum by (instance) ({NODE_UP})",
                    f"sum by (instance) ({NODE_DEVICES}) - sum by (instance) ({NODE_UP})",
                    f"sum by (instance) ({NODE_POWER})",
                    f"sum by (instance) ({NODE_CAP})",
                    f"max by (instance) ({NODE_HOTTEST_JUNCTION})",
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
                "Node power across the fleet",
                "The highest, mean and lowest node power of the selected nodes (socket power summed per node "
                "by the recording rules), against the largest node cap (dashed). 'GCDs per node' lists each "
                "node's power and cap now.",
                (
                    Query(f"max({NODE_POWER})", "highest node"),
                    Query(f"max({NODE_CAP})", "largest node cap"),
                    Query(f"avg({NODE_POWER})", "mean node"),
                    Query(f"min({NODE_POWER})", "lowest node"),
                ),
                unit="watt",
                width=12,
                minimum=0,
                dashed=("B",),
                interval=RECORDED_30S,
            ),
            against_reference(
                "Fleet power vs cap",
                "Total socket power of the selected nodes against the total of their package caps.",
                Query(f"sum({NODE_POWER})", "power"),
                Query(f"sum({NODE_CAP})", "cap"),
                unit="watt",
                width=12,
                interval=RECORDED_30S,
            ),
            Panel(
                "bargauge",
                "Package power / cap",
                "The 20 physical packages closest to their power cap, power as a share of the cap "
                "(instance_package:amdgpu_power_cap:ratio; a bar a package of the whole fleet was 7,000 bars at "
                "1,000 nodes, 0.7 s a query). MI250X: the recording rule sums the two GCDs of a package through "
                "the device's package label (only die 0 carries power) and takes the larger cap of the two.",
                Query(f"topk(20, {PACKAGE_POWER_SHARE})", "{{instance}} package {{package}}"),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
                steps=power_cap_steps(t),
            ),
            Panel(
                "bargauge",
                "Unfit GCDs per node",
                "Nodes with devices the exporter's health checks find unfit, and how many "
                "(instance:amdgpu_health_unfit:count). The node dashboard's health table names the failing checks.",
                Query(
                    f"sort_desc(instance:amdgpu_health_unfit:count{{{FLEET}}} > 0)",
                    "{{instance}}",
                ),
                unit="none",
                width=12,
                minimum=0,
                steps=ANY_IS_BAD,
                may_be_empty=f"every GCD is fit, or {NO_HEALTH_CHECKS}",
                links=(NODE_LINK_FROM_SERIES,),
            ),
        ),
    )


def hottest_ten(t: Thresholds, title: str, description: str, per_node: str) -> Panel:
    """A bar per node for the ten hottest by a recorded per-node temperature; a click opens that node
    (its dashboard names the GCD). One sample a node: no per-GCD scan of the fleet."""
    return Panel(
        "bargauge",
        title,
        description,
        Query(f"topk(10, {per_node})", "{{instance}}"),
        unit="celsius",
        width=8,
        height=9,
        minimum=30,
        maximum=110,
        steps=temperature_steps(t),
        links=(NODE_LINK_FROM_SERIES,),
    )


def temperatures_row(t: Thresholds) -> Row:
    return Row(
        "Temperatures",
        (
            hottest_ten(
                t,
                "Hottest nodes: junction",
                "The ten nodes with the highest junction (hotspot) temperature of any of their GCDs now (the "
                f"recorded per-node max); red from {celsius(t.junction_hot_celsius)}. Click a bar to open that "
                "node: its dashboard draws each GCD.",
                f"max by (instance) ({NODE_HOTTEST_JUNCTION})",
            ),
            hottest_ten(
                t,
                "Hottest nodes: HBM",
                "The ten nodes with the hottest memory stack now (the recorded per-node max of the memory and "
                "hbm0..3 sensors). Click a bar to open that node.",
                NODE_HOTTEST_HBM,
            ),
            Panel(
                "timeseries",
                "Junction temperature across the fleet",
                f"Hottest and coolest junction temperature over all selected GCDs, and the mean of the nodes' "
                f"means (from the per-node recorded series); the dashed line is {celsius(t.junction_hot_celsius)}.",
                (
                    Query(f"max({NODE_HOTTEST_JUNCTION})", "hottest"),
                    Query(
                        f'avg(instance_sensor:amdgpu_temperature_celsius:avg{{{FLEET}, sensor="junction"}})',
                        "mean of node means",
                    ),
                    Query(
                        f'min(instance_sensor:amdgpu_temperature_celsius:min{{{FLEET}, sensor="junction"}})', "coolest"
                    ),
                ),
                unit="celsius",
                width=8,
                height=9,
                steps=temperature_steps(t),
                threshold_line=True,
                interval=RECORDED_30S,
            ),
        ),
    )


def utilisation_row() -> Row:
    return Row(
        "Utilisation",
        (
            Panel(
                "timeseries",
                "Nodes by gfx busy",
                "How many nodes are at least 75, 50, 25 and 5 % gfx busy over time, and how many idle below 5 % "
                "(each node's mean over its GCDs, the recorded instance:amdgpu_busy_ratio:avg). A healthy "
                "training fleet keeps the top line near the node count; idle nodes are idle or stalled. One "
                "GCD's stall shows in the panel beside it, per GCD of one node.",
                tuple(Query(f"count({NODE_GFX_BUSY} {band}) or vector(0)", legend) for band, legend in GFX_BUSY_BANDS),
                unit="none",
                width=12,
                height=9,
                minimum=0,
                # counts over every node at each step: a point a minute (each step compares every node)
                interval=RECORDED_1M,
            ),
            Panel(
                "status-history",
                "GFX busy per GCD of one node",
                "One row per GCD of the node picked in 'Node (per-GCD panel)', coloured by gfx busy averaged over "
                "the step: idle GCDs in a busy job stand out. One node at a time: every GCD of the fleet over the "
                "range would be the dashboard's most expensive query by far.",
                Query(
                    f'avg_over_time(amdgpu_busy_ratio{{{FLEET}, {ONE_NODE}, engine="gfx"}}[$__rate_interval])',
                    "{{instance}} gpu {{gpu}}",
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
                "Busy across nodes",
                "gfx (compute) and memory (HBM controller) busy: the mean over the selected nodes and the lowest "
                "node (each node's mean over its GCDs, instance:amdgpu_busy_ratio:avg).",
                (
                    Query(f"avg by (engine) ({NODE_BUSY})", "mean {{engine}}"),
                    Query(f"min by (engine) ({NODE_BUSY})", "lowest node {{engine}}"),
                ),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
                interval=RECORDED_1M,
            ),
            Panel(
                "timeseries",
                "VRAM used across nodes",
                "VRAM in use as a share of VRAM size, summed over each node's GCDs "
                "(instance:amdgpu_vram_used:ratio): the fullest node and the mean of the selected nodes.",
                (
                    Query(f"max({NODE_VRAM_USED})", "fullest node"),
                    Query(f"avg({NODE_VRAM_USED})", "mean"),
                ),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
                steps=VRAM_STEPS,
                threshold_line=True,
                interval=RECORDED_30S,
            ),
        ),
    )


def energy_row() -> Row:
    return Row(
        "Energy",
        (
            Panel(
                "timeseries",
                "Energy per hour, per node",
                "Energy each node's GPUs used in each hour, from the hardware energy counters (die 0 of an "
                "MI250X counts the whole package): the hour's mean of the recorded per-node power from their "
                "rate (instance:amdgpu_energy_joules:rate5m, resets handled) x 1 h. An hour in which a node "
                "was scraped only part of the time counts at that part's mean power.",
                Query(
                    f"sum by (instance) (avg_over_time({NODE_ENERGY_RATE}[1h])) * 3600 / {JOULES_PER_KWH}",
                    "{{instance}}",
                ),
                unit="kwatth",
                width=16,
                interval="1h",
                custom={"drawStyle": "bars", "fillOpacity": 60, "stacking": {"mode": "normal", "group": "A"}},
            ),
            Panel(
                "stat",
                "Energy in the selected range",
                "GPU energy of the selected nodes over the dashboard's time range (the recorded per-node power "
                "summed over the range).",
                f"sum({integral_over_range(NODE_ENERGY_RATE)}) / {JOULES_PER_KWH}",
                unit="kwatth",
                width=8,
            ),
        ),
    )


def _gpu_hours_by(label: str) -> str:
    """GCD-hours per `label` over the dashboard's range: the recorded count of GCDs each holder has on
    each node (from the attribution info series), summed over the range, in hours."""
    recorded = f"instance_{label}:amdgpu_allocated_gpus:count{{{FLEET}}}"
    return f"sum by ({label}) ({integral_over_range(recorded, HOLDER_STEP_SECONDS)}) / 3600"


def _energy_by(label: str) -> str:
    """Energy per holder over the range: the recorded per-holder power (the energy counters' rate joined
    with the attribution info series) summed every 5 minutes of the range. Works with or without the
    attribution labels on every series."""
    recorded = f"instance_{label}:amdgpu_energy_joules:rate5m{{{FLEET}}}"
    return f"sum by ({label}) ({integral_over_range(recorded, HOLDER_STEP_SECONDS)}) / {JOULES_PER_KWH}"


def usage_row() -> Row:
    """GPU-hours and energy by Kubernetes namespace and by Slurm user (needs --kubernetes / --slurm.state-dir)."""
    on_kubernetes = "the exporters run without --kubernetes, or no pod held a GCD in the range"
    on_slurm = "the exporters run without --slurm.state-dir, or no job held a GCD in the range"
    return Row(
        "Usage by namespace and user",
        (
            Panel(
                "bargauge",
                "GCD-hours by namespace",
                "GCD-hours each Kubernetes namespace held over the dashboard's range (allocated GCDs per node, "
                "recorded from amdgpu_allocation_info, counted every 5 minutes).",
                Query(_gpu_hours_by("namespace"), "{{namespace}}"),
                unit="h",
                width=6,
                may_be_empty=on_kubernetes,
            ),
            Panel(
                "bargauge",
                "Energy by namespace",
                "GPU energy used by each namespace's pods over the range, from the energy counters of the GCDs "
                "they held (die 0 of an MI250X counts the whole package), sampled every 5 minutes; a GCD shared "
                "by two namespaces counts for both.",
                Query(_energy_by("namespace"), "{{namespace}}"),
                unit="kwatth",
                width=6,
                may_be_empty=on_kubernetes,
            ),
            Panel(
                "bargauge",
                "GCD-hours by Slurm user",
                "GCD-hours each Slurm user's jobs held over the range (allocated GCDs per node, recorded from "
                "amdgpu_job_info, counted every 5 minutes).",
                Query(_gpu_hours_by("job_user"), "{{job_user}}"),
                unit="h",
                width=6,
                may_be_empty=on_slurm,
            ),
            Panel(
                "bargauge",
                "Energy by Slurm user",
                "GPU energy used by each Slurm user's jobs over the range, from the GCDs' energy counters "
                "(sampled every 5 minutes).",
                Query(_energy_by("job_user"), "{{job_user}}"),
                unit="kwatth",
                width=6,
                may_be_empty=on_slurm,
            ),
        ),
    )


def devices_where(
    title: str, description: str, condition: str, may_be_empty: str, selector: str = FLEET, width: int = 8
) -> Panel:
    """A table of the GCDs where `<metric> <op> <value>` holds, with product and PCI address; a row opens the GCD."""
    metric, comparison = condition.split(" ", 1)
    return Panel(
        "table",
        title,
        description,
        with_identity(f"({metric}{{{selector}}} {comparison})", selector),
        unit="none",
        width=width,
        may_be_empty=may_be_empty,
        hide_columns=("job", "Value"),
        links=(GCD_LINK_FROM_TABLE,),
    )


def alerts_row() -> Row:
    return Row(
        "Alerts and clock-down suggestions",
        (
            Panel(
                "table",
                "Nodes with firing in-daemon alerts",
                "Alerts each exporter's own rules fire now (they work without Prometheus): the node, the alert "
                "and how many of its devices fire it (instance_alert:amdgpu_alert_firing:sum). Click a node to "
                "open its dashboard.",
                f"{NODE_ALERTS_FIRING} > 0",
                unit="none",
                width=6,
                may_be_empty="nothing is firing",
                hide_columns=("job",),
                options={"renameByName": {"Value": "Devices firing"}},
                links=(NODE_LINK_FROM_TABLE,),
            ),
            Panel(
                "table",
                "Firing Prometheus alerts",
                "Fleet alerts from the Prometheus rules shipped in deploy/prometheus (alert names AMDGPU*), "
                "as Prometheus evaluates them before Alertmanager routes them.",
                f'ALERTS{{alertstate="firing", alertname=~"AMDGPU.*", {FLEET}}}',
                unit="none",
                width=6,
                may_be_empty="nothing is firing, or this Prometheus does not load deploy/prometheus rules",
                hide_columns=("job", "Value", "alertstate"),
            ),
            Panel(
                "table",
                "Nodes with clock-down suggestions",
                "Nodes for which the exporter suggests lowering a GCD's gfx clock ceiling (it never applies it), "
                "with the largest suggested reduction (instance:amdgpu_clock_down_suggested_ratio:max). The "
                "table beside lists the GCDs of the node picked in 'Node (per-GCD panel)'.",
                f"{NODE_CLOCK_DOWN} > 0",
                unit="percentunit",
                width=6,
                may_be_empty="no GCD is hot enough for a suggestion",
                hide_columns=("job",),
                options={"renameByName": {"Value": "Largest suggested reduction"}},
                links=(NODE_LINK_FROM_TABLE,),
            ),
            Panel(
                "table",
                "Clock-down suggestions of one node",
                "GCDs of the node picked in 'Node (per-GCD panel)' for which the exporter suggests lowering the "
                "gfx clock ceiling: the suggested reduction and ceiling. Apply with the command in "
                "/api/v1/alerts or the log.",
                (
                    f"amdgpu_clock_down_suggested_ratio{{{ONE_NODE}}} > 0",
                    f"amdgpu_suggested_gfx_clock_max_hertz{{{ONE_NODE}}}",
                ),
                unit="none",
                width=6,
                may_be_empty="no GCD is hot enough for a suggestion",
                column_units={"Value #A": "percentunit", "Value #B": "hertz"},
                options={"renameByName": {"Value #A": "Suggested reduction", "Value #B": "Suggested gfx max"}},
                hide_columns=("job",),
                links=(GCD_LINK_FROM_TABLE,),
            ),
        ),
    )


def errors_row() -> Row:
    return Row(
        "Errors",
        (
            Panel(
                "table",
                "ECC and XGMI errors per node",
                "Uncorrectable and correctable ECC errors since driver load, their increase over the selected "
                "range, XGMI error events in the range and retired VRAM pages, from the per-node recorded "
                "series (the in-range columns sum the nodes' 5-minute increases, one every 5 minutes). Any "
                "uncorrectable error is worth a look.",
                (
                    f'sum by (instance) (instance_type:amdgpu_ecc_errors:sum{{{FLEET}, type="uncorrectable"}})',
                    f'sum by (instance) (instance_type:amdgpu_ecc_errors:sum{{{FLEET}, type="correctable"}})',
                    f"round(sum by (instance) (sum_over_time(instance_type:amdgpu_ecc_errors:increase5m{{{FLEET}}}"
                    "[$__range:5m])))",
                    f"round(sum by (instance) (sum_over_time(instance:amdgpu_xgmi_error_events:increase5m{{{FLEET}}}"
                    "[$__range:5m])))",
                    f"sum by (instance) (instance:amdgpu_ras_retired_pages:sum{{{FLEET}}})",
                ),
                unit="none",
                width=10,
                may_be_empty="the in-range columns need the first 5 minutes of recorded history",
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
                "ECC errors per 5 minutes",
                "New ECC errors of the selected nodes in the 5 minutes before each point, by type (correctable, "
                "uncorrectable, deferred), from the per-node recorded increase; the table beside names the nodes.",
                Query(
                    f"sum by (type) (instance_type:amdgpu_ecc_errors:increase5m{{{FLEET}}})",
                    "{{type}}",
                ),
                unit="none",
                width=5,
                interval="5m",
                custom={"drawStyle": "bars", "fillOpacity": 80},
            ),
            Panel(
                "timeseries",
                "XGMI error events per 5 minutes",
                "XGMI error events of the selected nodes in the 5 minutes before each point (the exporter "
                "accumulates the driver's clear-on-read xgmi_error file into a counter), from the per-node "
                "recorded increase; the table beside names the nodes.",
                Query(
                    f"sum(instance:amdgpu_xgmi_error_events:increase5m{{{FLEET}}})",
                    "XGMI error events",
                ),
                unit="none",
                width=5,
                interval="5m",
                custom={"drawStyle": "bars", "fillOpacity": 80},
            ),
            Panel(
                "stat",
                "GCDs with a narrowed PCIe link",
                "GCDs whose PCIe link trained narrower than its maximum width: a reseat or riser problem "
                "costs host bandwidth (counted per node once a minute by the recording rules, "
                "instance:amdgpu_pcie_link_narrowed:count).",
                f"sum(instance:amdgpu_pcie_link_narrowed:count{{{FLEET}}})",
                unit="none",
                width=4,
                height=8,
                steps=ANY_IS_WORTH_A_LOOK,
            ),
        ),
    )


def stale_row() -> Row:
    """Per node for the fleet (recorded counts and maxima, one sample a node); per GCD only for the node
    picked in 'Node (per-GCD panel)': an instant per-GCD table of the fleet reads a sample a GCD (22 k
    at 1,000 nodes) and joins the identity of each."""
    return Row(
        "Stale and down devices",
        (
            Panel(
                "table",
                "Nodes with down or stale GCDs",
                "One row per node with a device down now (known minus read, from the recorded per-node "
                "counts) or whose oldest device sample was older than $stale_after s when last scraped "
                "(instance:amdgpu_sample_age_seconds:max, recorded once a minute). Click a node to open its "
                "dashboard; pick it in 'Node (per-GCD panel)' for the GCDs beside.",
                (
                    f"{NODE_DOWN} > 0",
                    f"max by (instance) ({NODE_SAMPLE_AGE}) > $stale_after",
                ),
                unit="none",
                width=6,
                may_be_empty="every device is up and fresh",
                column_units={"Value #B": "s"},
                options={"renameByName": {"Value #A": "Down", "Value #B": "Oldest sample age"}},
                links=(NODE_LINK_FROM_TABLE,),
            ),
            devices_where(
                "Down GCDs of one node",
                "Devices of the node picked in 'Node (per-GCD panel)' the exporter could not read within the "
                "deadline in its last cycle.",
                "amdgpu_up == 0",
                may_be_empty="every device of the node is up",
                selector=ONE_NODE,
                width=6,
            ),
            Panel(
                "table",
                "Stale GCDs of one node",
                "Devices of the node picked in 'Node (per-GCD panel)' whose latest good sample is more than "
                "$stale_after s old now (as AMDGPUSamplesStale computes it), with the age. A device that keeps "
                "failing reads goes stale while the exporter stays up.",
                f"{sample_age_now(ONE_NODE)} > $stale_after",
                unit="s",
                width=6,
                may_be_empty="every device of the node is fresh",
                hide_columns=("job",),
                options={"renameByName": {"Value": "Sample age"}},
                links=(GCD_LINK_FROM_TABLE,),
            ),
            Panel(
                "timeseries",
                "Oldest sample across nodes",
                "Age at scrape time of the oldest device sample (instance:amdgpu_sample_age_seconds:max): of the "
                "worst node and the mean over the nodes; with a 1 s poll both stay near 0.",
                (
                    Query(f"max({NODE_SAMPLE_AGE})", "worst node"),
                    Query(f"avg({NODE_SAMPLE_AGE})", "mean"),
                ),
                unit="s",
                width=6,
                minimum=0,
                interval=RECORDED_1M,
            ),
        ),
    )


def exporter_health_row(limits: MemoryLimits) -> Row:
    resident = exporter_process("process_resident_memory_bytes", FLEET)
    tightest = limits.tightest_bytes
    return Row(
        "Exporter health",
        (
            Panel(
                "timeseries",
                "Exporter file errors per node",
                "Failed sysfs file reads per minute by node and reason, summed over GCDs and files by the recording "
                "rules (the node dashboard's exporter health row has them per file).",
                Query(
                    f"sum by (instance, reason) (instance_reason:amdgpu_exporter_file_errors:rate5m{{{FLEET}}}) * 60",
                    "{{instance}} {{reason}}",
                ),
                unit="none",
                width=9,
                minimum=0,
                interval=RECORDED_1M,
                may_be_empty="no exporter has failed a sysfs file read",
                links=(NODE_LINK_FROM_SERIES,),
            ),
            against_reference(
                "Exporter resident memory across nodes",
                "Resident memory of the largest exporter and the mean over them against the smaller of the ceilings "
                f"the project ships (systemd MemoryMax {mebibytes(limits.systemd_memory_max_bytes)}, DaemonSet "
                f"limit {mebibytes(limits.kubernetes_memory_limit_bytes)}), dashed; the tile beside counts the "
                "exporters near it.",
                Query(f"max({resident})", "largest exporter"),
                Query(f"vector({promql_number(tightest)})", "tighter shipped limit"),
                unit="bytes",
                width=9,
                # a memory trend: a point every 5 minutes is enough, and each step joins every node's build
                # info (at 1,000 nodes and a 1-minute step, 0.7 s a query)
                interval="5m",
                second_reference=Query(f"avg({resident})", "mean exporter"),
            ),
            tile(
                "Exporters near their memory limit",
                f"Exporters whose resident memory is above {MEMORY_WARNING_RATIO:.0%} of the tighter shipped "
                f"ceiling ({mebibytes(tightest)}): a leak, or a limit too small for the node.",
                f"count({resident} > {promql_number(round(MEMORY_WARNING_RATIO * tightest))}) or vector(0)",
                steps=ANY_IS_WORTH_A_LOOK,
            ),
            tile(
                "Exporter stage failures",
                "Failures of the exporter's stages after a poll (rules, render, Alertmanager) over the selected "
                "range, all nodes (the recorded 5-minute increases per node, summed every 5 minutes).",
                f"round(sum(sum_over_time(instance:amdgpu_exporter_stage_failures:increase5m{{{FLEET}}}[$__range:5m])))"
                " or vector(0)",
                steps=ANY_IS_WORTH_A_LOOK,
            ),
        ),
    )


def fleet_dashboard(t: Thresholds, limits: MemoryLimits) -> Dashboard:
    return Dashboard(
        uid=FLEET_UID,
        title="AMD GPU / Fleet overview",
        description="AMD Instinct fleet: devices up, temperatures, power vs cap, utilisation, energy, "
        "alerts and errors, from amdgpu-exporter.",
        variables=(
            datasource_variable(),
            adhoc_filter_variable(),
            stale_after_variable(t.stale_after_seconds),
            query_variable("gcd_instance", "Node (per-GCD panel)", "label_values(instance:amdgpu_up:count, instance)"),
        ),
        rows=(
            health_row(t),
            alerts_row(),
            nodes_row(t),
            temperatures_row(t),
            utilisation_row(),
            energy_row(),
            usage_row(),
            errors_row(),
            stale_row(),
            exporter_health_row(limits),
        ),
        time_from="now-6h",
    )
