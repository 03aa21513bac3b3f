"""AMD device-metrics-exporter (DME) names beside this exporter's: one table, two generated files.

DME_METRICS lists the metric names DME's Grafana dashboards query, with DME's unit and the series of
this exporter each is computed from (None: this exporter has no source for it, and why). From it,
and from the metric table for this exporter's side (labels, unit, type), this module writes
docs/migrating-from-dme.md's mapping table and deploy/prometheus/dme-compat.rules.yml, the
recording rules that give DME's names, units and labels during a migration. A unit test fails when
either file is stale:

    python -m exporter.exposition.dme_reference --write
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from exporter.exposition.metrics import METRICS

# DME label <- this exporter's label. `hostname` and `gpu_id` come from the target label `node` and
# the per-device `gpu`; the rest are amdgpu_device_info's identity labels. card_model is the board's
# part number (FRU product_number, "102-G30211-00"), as DME's, on which its dashboards pick the
# MI300-class panels; where a board has none it is the product name, as DME falls back to its
# card_series. DME's gpu_uuid differs (DME derives a UUID from the ASIC serial; this is the same
# ASIC's unique_id).
DME_LABELS = (
    ("hostname", "node"),
    ("gpu_id", "gpu"),
    ("gpu_uuid", "unique_id"),
    ("serial_number", "serial"),
    ("card_model", "product_number"),
    ("card_series", "product"),
    ("gpu_partition_id", "partition"),
    ("vbios_version", "vbios"),
    ("driver_version", "driver"),
)
# A DME label whose own source may be empty: the label it takes then.
FALLBACKS = {"card_model": "product"}
# Labels both exporters carry as they are: the attribution labels (--slurm.state-dir, --kubernetes)
# and target labels such as cluster_name, which the scrape config sets.
PASSED_THROUGH = ("job_id", "pod", "namespace", "container", "cluster_name")
ATTRIBUTION = ("pod", "namespace", "container", "job_id", "job_user", "job_partition")
# The attribution series the identity series joins, and the labels each gives: DME's job and node
# dashboards select job_id and pod on every metric, which this exporter puts on its per-GPU series
# only with --attribution.series-labels; joined here, they need no more than the _info series.
HOLDERS = (
    ("amdgpu_job_info", ("job_id", "job_user", "job_partition")),
    ("amdgpu_allocation_info", ("pod", "namespace", "container")),
)
IDENTITY_SERIES = "gpu:amdgpu_device_info:dme_labels"
# Every group once a minute: DME's dashboards open at 6 h and 24 h and DME's own agent refreshes its
# values every 30 s, so a minute is what its panels show; at the scrape's 15 s the rules cost a whole
# Prometheus core at 300 nodes (issue 34). The identity (with the job and pod holding each GPU) is
# joined once a minute in the first group; the other groups join that recorded series, so a value is
# at most a minute older than the scrape, and a job's labels reach it up to two minutes after the job
# starts. Split by what the rules read, so that each group stays a small share of its minute and
# Prometheus evaluates them side by side. DME's hardware labels (ten label_replace calls over every
# GPU's info series, the costliest rule at 1,000 nodes) are renamed every 2 minutes in their own group:
# they change only with the hardware or its partition mode.
INTERVAL = "1m"
HARDWARE_INTERVAL = "2m"
HARDWARE_GROUP = "dme-compat-hardware"
HARDWARE_SERIES = "gpu:amdgpu_device_info:dme_hardware_labels"
IDENTITY_GROUP = "dme-compat-identity"


@dataclass(frozen=True, slots=True)
class DmeMetric:
    """One DME metric: its name and unit, and the PromQL over this exporter's series (before the identity
    join) that gives it in DME's unit, or None with `note` saying why there is no source."""

    name: str
    unit: str
    family: str | None  # this exporter's family (its name in the metric table)
    source: str | None
    note: str = ""
    per_gpu: bool = True  # False: a node-level figure, no identity join


_PROFILER = "a profiler counter: DME reads it through rocprofiler, which this exporter does not run (sysfs has none)"

DME_METRICS = (
    DmeMetric(
        "gpu_nodes_total",
        "GPUs",
        "amdgpu_device_present",
        f"count without (gpu, {', '.join(ATTRIBUTION)}) (amdgpu_device_present == 1)",
        "GPUs (partitions) on the node",
        per_gpu=False,
    ),
    DmeMetric(
        "gpu_health",
        "1 healthy, 0 not",
        "amdgpu_health_status",
        "amdgpu_health_status",
        "the health verdict (docs/health.md), 0 also while the device cannot be read; DME marks a GPU unhealthy"
        " once an ECC count passes its threshold (0 by default) or while its newest fatal CPER is young, and"
        " the ECC verdict stays until the counts reset; here every check clears by its own rule",
    ),
    DmeMetric("gpu_edge_temperature", "°C", "amdgpu_temperature_celsius", 'amdgpu_temperature_celsius{sensor="edge"}'),
    DmeMetric(
        "gpu_junction_temperature", "°C", "amdgpu_temperature_celsius", 'amdgpu_temperature_celsius{sensor="junction"}'
    ),
    DmeMetric(
        "gpu_memory_temperature", "°C", "amdgpu_temperature_celsius", 'amdgpu_temperature_celsius{sensor="memory"}'
    ),
    DmeMetric(
        "gpu_hbm_temperature",
        "°C",
        "amdgpu_temperature_celsius",
        'label_replace(amdgpu_temperature_celsius{sensor=~"hbm[0-9]+"}, "hbm_index", "$1", "sensor", "hbm([0-9]+)")',
        "one series per HBM stack, label hbm_index",
    ),
    DmeMetric("gpu_package_power", "W", "amdgpu_power_watts", "amdgpu_power_watts"),
    DmeMetric(
        "gpu_average_package_power",
        "W",
        "amdgpu_power_watts",
        "amdgpu_power_watts",
        "the same series as gpu_package_power: the kernel gives one power value per device",
    ),
    DmeMetric("gpu_energy_consumed", "µJ", "amdgpu_energy_joules", "amdgpu_energy_joules_total * 1e6"),
    DmeMetric("gpu_gfx_activity", "%", "amdgpu_busy_ratio", 'amdgpu_busy_ratio{engine="gfx"} * 100'),
    DmeMetric(
        "gpu_gfx_busy_instantaneous",
        "%",
        "amdgpu_xcc_busy_ratio",
        '(label_replace(amdgpu_xcc_busy_ratio, "xcc_index", "$1", "xcc", "(.*)")'
        ' or on (instance, job, gpu) label_replace(amdgpu_busy_ratio{engine="gfx"}, "xcc_index", "0", "", "")) * 100',
        "one series per XCC of a device (MI300-class), label xcc_index; a device without per-XCC figures"
        " (MI200) gives its gfx busy as xcc_index 0",
    ),
    DmeMetric("gpu_used_vram", "MB", "amdgpu_memory_used_bytes", 'amdgpu_memory_used_bytes{pool="vram"} / 1048576'),
    DmeMetric(
        "gpu_total_vram",
        "MB",
        "amdgpu_memory_total_bytes",
        'amdgpu_memory_total_bytes{pool="vram"} / 1048576',
    ),
    DmeMetric(
        "gpu_vram_max_bandwidth",
        "GB/s",
        "amdgpu_memory_max_bandwidth_bytes_per_second",
        "amdgpu_memory_max_bandwidth_bytes_per_second / 1e9",
        "MI300-class (gpu_metrics v1_7+), partition 0 of a partitioned socket",
    ),
    DmeMetric(
        "gpu_min_clock",
        "MHz",
        "amdgpu_clock_min_hertz",
        "amdgpu_clock_min_hertz / 1e6",
        "label domain (gfx, memory, fabric, soc, video, decode) where DME has clock_type",
    ),
    DmeMetric(
        "gpu_ecc_correct_total",
        "errors",
        "amdgpu_ecc_errors",
        'sum without (block, type) (amdgpu_ecc_errors_total{type="correctable"})',
        "the sum over RAS blocks",
    ),
    DmeMetric(
        "gpu_ecc_uncorrect_total",
        "errors",
        "amdgpu_ecc_errors",
        'sum without (block, type) (amdgpu_ecc_errors_total{type="uncorrectable"})',
        "the sum over RAS blocks",
    ),
    DmeMetric(
        "pcie_max_speed",
        "GT/s",
        "amdgpu_pcie_max_link_transfers_per_second",
        "amdgpu_pcie_max_link_transfers_per_second / 1e9",
    ),
    DmeMetric(
        "pcie_bandwidth",
        "Mb/s",
        "amdgpu_pcie_bandwidth_bytes_per_second",
        "amdgpu_pcie_bandwidth_bytes_per_second * 8 / 1e6",
    ),
    DmeMetric("pcie_replay_count", "count", "amdgpu_pcie_replays", "amdgpu_pcie_replays_total"),
    DmeMetric("pcie_recovery_count", "count", "amdgpu_pcie_recoveries", "amdgpu_pcie_recoveries_total"),
    DmeMetric("pcie_nack_sent_count", "count", "amdgpu_pcie_naks", 'amdgpu_pcie_naks_total{direction="sent"}'),
    DmeMetric("pcie_nack_received_count", "count", "amdgpu_pcie_naks", 'amdgpu_pcie_naks_total{direction="received"}'),
    DmeMetric(
        "pcie_replay_rollover_count",
        "count",
        "amdgpu_pcie_replay_rollovers",
        "amdgpu_pcie_replay_rollovers_total",
        "MI300-class",
    ),
    DmeMetric("gpu_prof_sm_active", "%", None, None, _PROFILER),
    DmeMetric("gpu_prof_occupancy_per_cu", "waves per CU", None, None, _PROFILER),
    DmeMetric("gpu_prof_occupancy_per_active_cu", "waves per CU", None, None, _PROFILER),
    DmeMetric("gpu_prof_simd_utilization", "0-1", None, None, _PROFILER),
    DmeMetric("gpu_prof_tensor_active_percent", "%", None, None, _PROFILER),
    DmeMetric("gpu_prof_gui_util_percent", "%", None, None, _PROFILER),
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "migrating-from-dme.md"
RULES = ROOT / "deploy" / "prometheus" / "dme-compat.rules.yml"
BEGIN = "<!-- dme-reference:begin (generated by python -m exporter.exposition.dme_reference --write) -->"
END = "<!-- dme-reference:end -->"


def sourced() -> tuple[DmeMetric, ...]:
    return tuple(metric for metric in DME_METRICS if metric.source is not None)


def render_table() -> str:
    specs = {spec.name: spec for spec in METRICS}
    rows = [
        "| DME metric | DME unit | this exporter's family | type | unit | labels | computed as / why not |",
        "|---|---|---|---|---|---|---|",
    ]
    for metric in DME_METRICS:
        if metric.family is None:
            rows.append(f"| `{metric.name}` | {metric.unit} | none | | | | {metric.note} |")
            continue
        spec = specs[metric.family]
        how = f"`{metric.source}`" + (f"; {metric.note}" if metric.note else "")
        rows.append(
            f"| `{metric.name}` | {metric.unit} | `{spec.exposed_name}` | {spec.kind} | {spec.unit} | "
            f"{', '.join(spec.labels)} | {how.replace('|', '&#124;')} |"
        )
    rows += ["", "| DME label | from this exporter's label |", "|---|---|"]
    rows += [
        f"| `{dme}` | `{ours}`" + (f", `{FALLBACKS[dme]}` where that is empty" if dme in FALLBACKS else "") + " |"
        for dme, ours in DME_LABELS
    ]
    rows += [f"| `{label}` | `{label}` (the same) |" for label in PASSED_THROUGH]
    rows.append("")
    rows.append(
        "`job_id` and `pod` (with `namespace`, `container`, `job_user`, `job_partition`) reach every series"
        " from `amdgpu_job_info` and `amdgpu_allocation_info` through the identity series: no"
        " `--attribution.series-labels` needed."
    )
    return "\n".join([BEGIN, *rows, END])


def replace_table(doc: str) -> str:
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC.name} has no dme-reference markers")
    return doc[:start] + render_table() + doc[end + len(END) :]


def _renamed(expr: str) -> str:
    for dme, ours in DME_LABELS:
        if dme in FALLBACKS:
            expr = f'label_replace({expr}, "{dme}", "$1", "{FALLBACKS[dme]}", "(.*)")'
            expr = f'label_replace({expr}, "{dme}", "$1", "{ours}", "(.+)")'
        else:
            expr = f'label_replace({expr}, "{dme}", "$1", "{ours}", "(.*)")'
    return expr


def _with_holders(identity: str) -> str:
    """The identity series with each GPU's job and pod labels where it has a holder, unchanged where
    not: the right side is the holder, or for a GPU with none a bare (instance, job, gpu) series of
    value 1, so that no GPU drops out of the join. One holder per GPU and source (topk 1): two at
    once (a shared GPU) must not make the join fail for the whole node."""
    expr = identity
    bare = "max by (instance, job, gpu) (amdgpu_device_info)"
    for series, labels in HOLDERS:
        holder = f"topk by (instance, job, gpu) (1, {series})"
        join = f"on (instance, job, gpu) group_left ({', '.join(labels)})"
        expr = f"{expr} * {join} ({holder} or on (instance, job, gpu) {bare})"
    return expr


def group_of(metric: DmeMetric) -> str:
    """The rule group of a DME metric's rule (DME_METRICS keeps each group's metrics together)."""
    if not metric.per_gpu or metric.name == "gpu_health":
        return IDENTITY_GROUP
    if metric.name.startswith("pcie_"):
        return "dme-compat-pcie"
    if metric.name.startswith("gpu_ecc_"):
        return "dme-compat-ecc"
    if any(word in metric.name for word in ("temperature", "power", "energy")):
        return "dme-compat-thermal-power"
    if "gfx" in metric.name:
        return "dme-compat-activity"
    return "dme-compat-memory-clock"


def render_rules() -> str:
    identity = ", ".join([*(dme for dme, _ in DME_LABELS), *(label for _, labels in HOLDERS for label in labels)])
    without_attribution = f"max without ({', '.join(ATTRIBUTION)}) (amdgpu_device_info)"
    lines = [
        "# GENERATED by `python -m exporter.exposition.dme_reference --write` from its DME_METRICS table; edit",
        "# that table, not this file (a unit test fails when they differ). docs/migrating-from-dme.md explains.",
        "#",
        "# Recording rules giving AMD device-metrics-exporter's metric names, units and labels from",
        "# amdgpu-exporter's series, so DME's dashboards and alerts keep working during a migration.",
        "# Needs the `node` target label of the documented scrape configs (-> hostname); cluster_name, job_id",
        "# and pod pass through when the target or the exporter sets them. Delete this file after the move.",
        "#",
        "# The groups run once a minute, the hardware labels every 2 minutes: values are at most a minute",
        "# older than the scrape, a job's labels reach them up to two minutes after it starts, a new GPU or",
        "# partition mode up to four (docs/migrating-from-dme.md, Cost).",
        "groups:",
        f"  - name: {HARDWARE_GROUP}",
        f"    interval: {HARDWARE_INTERVAL}",
        "    rules:",
        "      # DME's hardware labels for each device, renamed from amdgpu_device_info's.",
        f"      - record: {HARDWARE_SERIES}",
        "        expr: >-",
        f"          {_renamed(without_attribution)}",
        f"  - name: {IDENTITY_GROUP}",
        f"    interval: {INTERVAL}",
        "    rules:",
        "      # DME's identity labels for each device, once, with the job and pod holding it (amdgpu_job_info,",
        "      # amdgpu_allocation_info): every rule below joins this one series per GPU.",
        f"      - record: {IDENTITY_SERIES}",
        "        expr: >-",
        f"          {_with_holders(HARDWARE_SERIES)}",
    ]
    group = IDENTITY_GROUP
    for metric in sourced():
        assert metric.source is not None
        if group_of(metric) != group:
            group = group_of(metric)
            lines += [f"  - name: {group}", f"    interval: {INTERVAL}", "    rules:"]
        lines.append(f"      - record: {metric.name}")
        if metric.per_gpu:
            lines += [
                "        expr: >-",
                f"          ({metric.source})",
                f"          * on (instance, job, gpu) group_left ({identity})",
                f"          {IDENTITY_SERIES}",
            ]
        else:
            lines += ["        expr: >-", f'          label_replace({metric.source}, "hostname", "$1", "node", "(.*)")']
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"]:
        DOC.write_text(replace_table(DOC.read_text(encoding="utf-8")), encoding="utf-8")
        RULES.write_text(render_rules(), encoding="utf-8")
    else:
        print(render_table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
