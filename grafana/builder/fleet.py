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
    FLEET_PACKAGE_CAP,
    FLEET_PACKAGE_POWER,
    HBM_SENSORS,
    JOULES_PER_KWH,
    SAMPLE_AGE_FLEET,
    exporter_process,
    junction,
    per_step,
    with_identity,
)
from .thresholds import Thresholds
from .variables import datasource_variable, query_variable, stale_after_variable


def tile(title: str, description: str, expr: str, unit: str = "none", steps: Steps = ()) -> Panel:
    """A number in the fleet health strip."""
    return Panel("stat", title, description, expr, unit=unit, width=3, height=4, steps=steps)


def health_row(t: Thresholds) -> Row:
    return Row(
        "Fleet health",
        (
            tile(
                "GCDs up",
                "Devices (GCDs, partitions) whose last read succeeded within its deadline (amdgpu_up).",
                f"sum(amdgpu_up{{{FLEET}}})",
            ),
            tile(
                "GCDs down",
                "Devices the exporter knows but could not read in time (amdgpu_up == 0): hung, reset or "
                "fallen off the bus.",
                f"sum(1 - amdgpu_up{{{FLEET}}})",
                steps=ANY_IS_BAD,
            ),
            tile(
                "Stale GCDs",
                "Devices whose latest good sample was older than $stale_after seconds when it was scraped.",
                f"sum({SAMPLE_AGE_FLEET} > bool $stale_after)",
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
                f"max({junction(FLEET)})",
                unit="celsius",
                steps=temperature_steps(t),
            ),
            tile(
                "Fleet power",
                "Total socket power. MI250X reports package power on die 0 only, so the plain sum counts "
                "every package once.",
                f"sum(amdgpu_power_watts{{{FLEET}}})",
                unit="watt",
            ),
            Panel(
                "gauge",
                "Fleet power / cap",
                "Total power as a share of the total of package power caps (cap = max over the dies of a "
                "package: MI250X die 1 has no cap of its own).",
                f"sum(amdgpu_power_watts{{{FLEET}}}) / sum({FLEET_PACKAGE_CAP})",
                unit="percentunit",
                width=3,
                height=4,
                minimum=0,
                maximum=1,
                steps=power_cap_steps(t),
            ),
            tile(
                "In-daemon alerts firing",
                "Alerts the exporters' own rules are firing now (amdgpu_alert_firing == 1), all nodes.",
                f"count(amdgpu_alert_firing{{{FLEET}}} == 1) or vector(0)",
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
                "One row per node: devices up and down, node power and cap (packages summed through the "
                "amdgpu_device_info join), hottest junction. Click a node to open its detail dashboard.",
                (
                    f"sum by (instance) (amdgpu_up{{{FLEET}}})",
                    f"sum by (instance) (1 - amdgpu_up{{{FLEET}}})",
                    f"sum by (instance) ({FLEET_PACKAGE_POWER})",
                    f"sum by (instance) ({FLEET_PACKAGE_CAP})",
                    f"max by (instance) ({junction(FLEET)})",
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
            against_reference(
                "Power per node vs cap",
                "Socket power summed per node (solid) against the sum of its package caps (dashed).",
                Query(f"sum by (instance) ({FLEET_PACKAGE_POWER})", "{{instance}} power"),
                Query(f"sum by (instance) ({FLEET_PACKAGE_CAP})", "{{instance}} cap"),
                unit="watt",
                width=12,
            ),
            against_reference(
                "Fleet power vs cap",
                "Total socket power of the selected nodes against the total of their package caps.",
                Query(f"sum({FLEET_PACKAGE_POWER})", "power"),
                Query(f"sum({FLEET_PACKAGE_CAP})", "cap"),
                unit="watt",
                width=12,
            ),
            Panel(
                "bargauge",
                "Package power / cap",
                "Each physical package's power as a share of its cap. MI250X: the two GCDs of a package are "
                "summed via `* on(instance, gpu) group_left(package) amdgpu_device_info` (only die 0 carries "
                "power).",
                Query(f"sort_desc({FLEET_PACKAGE_POWER} / {FLEET_PACKAGE_CAP})", "{{instance}} package {{package}}"),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
                steps=power_cap_steps(t),
            ),
        ),
    )


def hottest_ten(t: Thresholds, title: str, description: str, per_gcd: str) -> Panel:
    """A bar per GCD for the ten hottest by a per-GCD temperature; a click opens that GCD."""
    return Panel(
        "bargauge",
        title,
        description,
        Query(f"topk(10, {per_gcd})", "{{instance}} gpu {{gpu}}"),
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
                "Hottest GCDs: junction",
                "The ten GCDs with the highest junction (hotspot) temperature now; red from "
                f"{celsius(t.junction_hot_celsius)}. Click a bar to open that GCD.",
                junction(FLEET),
            ),
            hottest_ten(
                t,
                "Hottest GCDs: HBM",
                "The ten GCDs with the hottest memory stack now (max of the memory and hbm0..3 sensors).",
                f"max by (instance, gpu) (amdgpu_temperature_celsius{{{FLEET}, {HBM_SENSORS}}})",
            ),
            Panel(
                "timeseries",
                "Junction temperature across the fleet",
                f"Hottest, median and coolest junction temperature over all selected GCDs; the dashed line is "
                f"{celsius(t.junction_hot_celsius)}.",
                (
                    Query(f"max({junction(FLEET)})", "hottest"),
                    Query(f"quantile(0.5, {junction(FLEET)})", "median"),
                    Query(f"min({junction(FLEET)})", "coolest"),
                ),
                unit="celsius",
                width=8,
                height=9,
                steps=temperature_steps(t),
                threshold_line=True,
            ),
        ),
    )


def utilisation_row() -> Row:
    return Row(
        "Utilisation",
        (
            Panel(
                "heatmap",
                "GFX busy distribution across GCDs",
                "How many GCDs sit at each gfx busy level over time (each GCD averaged over the step). A "
                "healthy training job keeps the mass at the top; a band near 0 is idle or stalled GCDs.",
                f'avg_over_time(amdgpu_busy_ratio{{{FLEET}, engine="gfx"}}[$__rate_interval])',
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
                Query(
                    f'avg_over_time(amdgpu_busy_ratio{{{FLEET}, engine="gfx"}}[$__rate_interval])',
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
                "Mean busy per node",
                "gfx (compute) and memory (HBM controller) busy, averaged over each node's GCDs.",
                Query(
                    f'avg by (instance, engine) (amdgpu_busy_ratio{{{FLEET}, engine=~"gfx|memory"}})',
                    "{{instance}} {{engine}}",
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
                Query(
                    f'sum by (instance) (amdgpu_memory_used_bytes{{{FLEET}, pool="vram"}})'
                    f' / sum by (instance) (amdgpu_memory_total_bytes{{{FLEET}, pool="vram"}})',
                    "{{instance}}",
                ),
                unit="percentunit",
                width=12,
                minimum=0,
                maximum=1,
                steps=VRAM_STEPS,
                threshold_line=True,
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
                "MI250X counts the whole package). Counter resets on driver reload are handled by increase().",
                Query(
                    f"sum by (instance) (increase(amdgpu_energy_joules_total{{{FLEET}}}[1h])) / {JOULES_PER_KWH}",
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
                "GPU energy of the selected nodes over the dashboard's time range.",
                f"sum(increase(amdgpu_energy_joules_total{{{FLEET}}}[$__range])) / {JOULES_PER_KWH}",
                unit="kwatth",
                width=8,
            ),
        ),
    )


def _gpu_hours_by(info: str, label: str, present: str) -> str:
    """GCD-hours per `label` over the dashboard's range: allocated GCDs counted each minute, / 60."""
    held = f'count by ({label}, instance, gpu) ({info}{{{FLEET}, {present}!=""}})'
    return f"sum by ({label}) (sum_over_time(({held})[$__range:1m])) / 60"


def _energy_by(label: str) -> str:
    # Every per-GCD series carries the attribution labels, so each holder's share is its series' increase.
    return (
        f'sum by ({label}) (increase(amdgpu_energy_joules_total{{{FLEET}, {label}!=""}}[$__range])) / {JOULES_PER_KWH}'
    )


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
                "GCD-hours each Kubernetes namespace held over the dashboard's range (allocated GCDs counted "
                "once a minute).",
                Query(_gpu_hours_by("amdgpu_allocation_info", "namespace", "pod"), "{{namespace}}"),
                unit="h",
                width=6,
                may_be_empty=on_kubernetes,
            ),
            Panel(
                "bargauge",
                "Energy by namespace",
                "GPU energy used by each namespace's pods over the range, from the energy counters of the GCDs "
                "they held (die 0 of an MI250X counts the whole package).",
                Query(_energy_by("namespace"), "{{namespace}}"),
                unit="kwatth",
                width=6,
                may_be_empty=on_kubernetes,
            ),
            Panel(
                "bargauge",
                "GCD-hours by Slurm user",
                "GCD-hours each Slurm user's jobs held over the range (allocated GCDs counted once a minute).",
                Query(_gpu_hours_by("amdgpu_job_info", "job_user", "job_id"), "{{job_user}}"),
                unit="h",
                width=6,
                may_be_empty=on_slurm,
            ),
            Panel(
                "bargauge",
                "Energy by Slurm user",
                "GPU energy used by each Slurm user's jobs over the range, from the GCDs' energy counters.",
                Query(_energy_by("job_user"), "{{job_user}}"),
                unit="kwatth",
                width=6,
                may_be_empty=on_slurm,
            ),
        ),
    )


def devices_where(title: str, description: str, condition: str, may_be_empty: str) -> Panel:
    """A table of the GCDs where `<metric> <op> <value>` holds, with product and PCI address; a row opens the GCD."""
    metric, comparison = condition.split(" ", 1)
    return Panel(
        "table",
        title,
        description,
        with_identity(f"({metric}{{{FLEET}}} {comparison})", FLEET),
        unit="none",
        width=8,
        may_be_empty=may_be_empty,
        hide_columns=("job", "Value"),
        links=(GCD_LINK_FROM_TABLE,),
    )


def alerts_row() -> Row:
    return Row(
        "Alerts and clock-down suggestions",
        (
            devices_where(
                "Firing in-daemon alerts",
                "Alerts each exporter's own rules fire now (they work without Prometheus), with the device "
                "they fire on.",
                "amdgpu_alert_firing == 1",
                may_be_empty="nothing is firing",
            ),
            Panel(
                "table",
                "Firing Prometheus alerts",
                "Fleet alerts from the Prometheus rules shipped in deploy/prometheus (alert names AMDGPU*), "
                "as Prometheus evaluates them before Alertmanager routes them.",
                f'ALERTS{{alertstate="firing", alertname=~"AMDGPU.*", {FLEET}}}',
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
                    f"amdgpu_clock_down_suggested_ratio{{{FLEET}}} > 0",
                    f"amdgpu_suggested_gfx_clock_max_hertz{{{FLEET}}}",
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


def errors_row() -> Row:
    return Row(
        "Errors",
        (
            Panel(
                "table",
                "ECC and XGMI errors per node",
                "Uncorrectable and correctable ECC errors since driver load, their increase over the selected "
                "range, XGMI error events in the range and retired VRAM pages. Any uncorrectable error is "
                "worth a look.",
                (
                    f'sum by (instance) (amdgpu_ecc_errors_total{{{FLEET}, type="uncorrectable"}})',
                    f'sum by (instance) (amdgpu_ecc_errors_total{{{FLEET}, type="correctable"}})',
                    f"round(sum by (instance) (increase(amdgpu_ecc_errors_total{{{FLEET}}}[$__range])))",
                    f"round(sum by (instance) (increase(amdgpu_xgmi_error_events_total{{{FLEET}}}[$__range])))",
                    f"sum by (instance) (amdgpu_ras_retired_pages{{{FLEET}}})",
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
                Query(
                    f"sum by (instance, type) ({per_step('increase', 'amdgpu_ecc_errors_total', FLEET)})",
                    "{{instance}} {{type}}",
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
                Query(
                    f"sum by (instance) ({per_step('increase', 'amdgpu_xgmi_error_events_total', FLEET)})",
                    "{{instance}}",
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
                f"sum(amdgpu_pcie_current_link_width{{{FLEET}}} < bool amdgpu_pcie_max_link_width{{{FLEET}}})",
                unit="none",
                width=4,
                height=8,
                steps=ANY_IS_WORTH_A_LOOK,
            ),
        ),
    )


def stale_row() -> Row:
    return Row(
        "Stale and down devices",
        (
            Panel(
                "table",
                "Stale GCDs",
                "Devices whose latest good sample was more than $stale_after s old when scraped, with the "
                "age. A device that keeps failing reads goes stale while the exporter stays up.",
                f"{SAMPLE_AGE_FLEET} > $stale_after",
                unit="s",
                width=8,
                may_be_empty="every device is fresh",
                hide_columns=("job",),
                options={"renameByName": {"Value": "Sample age"}},
                links=(GCD_LINK_FROM_TABLE,),
            ),
            devices_where(
                "Down GCDs",
                "Devices the exporter could not read within the deadline in its last cycle.",
                "amdgpu_up == 0",
                may_be_empty="every device is up",
            ),
            Panel(
                "timeseries",
                "Oldest sample per node",
                "Age at scrape time of each node's oldest device sample; with a 1 s poll it stays near 0.",
                Query(f"max by (instance) {SAMPLE_AGE_FLEET}", "{{instance}}"),
                unit="s",
                width=8,
                minimum=0,
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
                "Failed sysfs file reads per step by node and reason, summed over GCDs and files (the node "
                "dashboard's exporter health row has them per file).",
                Query(
                    f"sum by (instance, reason) ({per_step('increase', 'amdgpu_exporter_file_errors_total', FLEET)})",
                    "{{instance}} {{reason}}",
                ),
                unit="none",
                width=9,
                minimum=0,
                may_be_empty="no exporter has failed a sysfs file read",
                links=(NODE_LINK_FROM_SERIES,),
            ),
            against_reference(
                "Exporter resident memory per node",
                "Resident memory of each node's exporter against the smaller of the ceilings the project ships "
                f"(systemd MemoryMax {mebibytes(limits.systemd_memory_max_bytes)}, DaemonSet limit "
                f"{mebibytes(limits.kubernetes_memory_limit_bytes)}), dashed.",
                Query(resident, "{{instance}}"),
                Query(f"vector({promql_number(tightest)})", "tighter shipped limit"),
                unit="bytes",
                width=9,
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
                "range, all nodes.",
                f"round(sum(increase(amdgpu_exporter_stage_failures_total{{{FLEET}}}[$__range])))",
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
            query_variable("instance", "Node", "label_values(amdgpu_up, instance)", multi=True),
            stale_after_variable(t.stale_after_seconds),
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
