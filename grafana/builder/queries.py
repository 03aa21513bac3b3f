"""PromQL fragments both dashboards use: selectors, the MI250X package join, per-step rates and ages.

Template variables: $instance (one node) and $gpu (a regex of GCD indices) on the node dashboard.
The fleet dashboard filters through an ad hoc filter variable, which Grafana adds to every selector
only when a filter is set: with none (all nodes) a query carries no node matcher at all, where an
`instance=~"$instance"` variable would carry `instance=~".*"` in every selector.
"""

from __future__ import annotations

import re

# The fleet dashboard's node matcher: none (the ad hoc filter adds it). The fragments below leave an
# empty slot where it would go; tidy_selector() removes the slot.
FLEET = ""
NODE = 'instance="$instance", gpu=~"$gpu"'
NODE_ALL_GPUS = 'instance="$instance"'
HBM_SENSORS = 'sensor=~"memory|hbm[0-9]+"'
CORE_SENSORS = 'sensor!~"memory|hbm[0-9]+"'
PER_GPU = "gpu {{gpu}}"  # the legend of a series per GCD
JOULES_PER_KWH = "3.6e6"


def tidy_selector(expr: str) -> str:
    """Drop the empty matcher slot FLEET leaves: `x{, a="b"}` -> `x{a="b"}`, `x{}` -> `x`."""
    expr = re.sub(r"\{\s*,\s*", "{", expr)
    expr = re.sub(r",\s*\}", "}", expr)
    return expr.replace("{}", "")


def junction(selector: str) -> str:
    return f'amdgpu_temperature_celsius{{{selector}, sensor="junction"}}'


def per_step(function: str, metric: str, selector: str) -> str:
    """rate() or increase() of a counter over Grafana's step ($__rate_interval)."""
    return f"{function}({metric}{{{selector}}}[$__rate_interval])"


def age_at_scrape(metric: str, selector: str) -> str:
    """How old a timestamp was when it was scraped: independent of the scrape interval, unlike time() - x.
    Reads every selected series at every step: only for one node's few series."""
    return f"timestamp({metric}{{{selector}}}) - {metric}{{{selector}}}"


def sample_age_now(selector: str) -> str:
    """Age now, as AMDGPUSamplesStale computes it (compared with the alert's own age, $stale_after); at one
    instant, so each device series is read once. Per GCD: for one node's devices only."""
    return f"(time() - amdgpu_sample_timestamp_seconds{{{selector}}})"


def vram_used_ratio(selector: str) -> str:
    return f'amdgpu_memory_used_bytes{{{selector}, pool="vram"}} / amdgpu_memory_total_bytes{{{selector}, pool="vram"}}'


# The recorded per-GCD identity (amdgpu_device_info's pci_bus_id, package and product only): joins
# read it rather than amdgpu_device_info's dozen labels.
IDENTITY = "gpu:amdgpu_device_info:identity"


def with_identity(expr: str, selector: str) -> str:
    """Per-GCD series with the device's product and PCI address added, for tables."""
    return f"{expr} * on(instance, gpu) group_left(product, pci_bus_id) {IDENTITY}{{{selector}}}"


def package_join(per_gcd: str, selector: str, aggregate: str = "sum") -> str:
    """A per-GCD expression summed (or maxed) per physical package.

    Only die 0 of an MI250X carries power and energy (die 1 has no series), so `sum by package`
    over the identity join is the package's value; on single-die parts package = device.
    """
    joined = f"{per_gcd} * on(instance, gpu) group_left(package) {IDENTITY}{{{selector}}}"
    return f"{aggregate} by (instance, package) ({joined})"


def by_package(metric: str, selector: str, aggregate: str = "sum") -> str:
    return package_join(f"{metric}{{{selector}}}", selector, aggregate)


def packages_of_selected_gpus(expr: str) -> str:
    """Keep the packages that contain a selected GCD (die 1 selected still shows its package)."""
    return f"{expr} and on(instance, package) {IDENTITY}{{{NODE}}}"


def node_package(metric: str, aggregate: str = "sum") -> str:
    return packages_of_selected_gpus(by_package(metric, NODE_ALL_GPUS, aggregate))


# Package power and cap as the recording rules sum them (instance_package:...), for the selected GCDs.
NODE_PACKAGE_POWER = packages_of_selected_gpus(
    f"max by (instance, package) (instance_package:amdgpu_power_watts:sum{{{NODE_ALL_GPUS}}})"
)
NODE_PACKAGE_CAP = packages_of_selected_gpus(
    f"max by (instance, package) (instance_package:amdgpu_power_cap_watts:max{{{NODE_ALL_GPUS}}})"
)


# Recorded by deploy/prometheus/amdgpu-exporter.rules.yml (amdgpu-recording; docs/recording-rules.md):
# per node and per package, once per evaluation interval, so a fleet panel reads a few series a node.
NODE_POWER = f"instance:amdgpu_power_watts:sum{{{FLEET}}}"
NODE_CAP = f"instance:amdgpu_power_cap_watts:sum{{{FLEET}}}"
PACKAGE_POWER_SHARE = f"instance_package:amdgpu_power_cap:ratio{{{FLEET}}}"
NODE_UP = f"instance:amdgpu_up:sum{{{FLEET}}}"
NODE_DEVICES = f"instance:amdgpu_up:count{{{FLEET}}}"
NODE_HOTTEST_JUNCTION = f'instance_sensor:amdgpu_temperature_celsius:max{{{FLEET}, sensor="junction"}}'
# Age at scrape of each node's oldest device sample (amdgpu-recording-minutely, once a minute).
NODE_SAMPLE_AGE = f"instance:amdgpu_sample_age_seconds:max{{{FLEET}}}"


def integral_over_range(recorded: str, every: str = "") -> str:
    """A recorded rate (per second) summed over the dashboard's range: its value at each step x the step
    (Grafana's $__interval, or `every` seconds for series many per node, to bound the samples read).
    A holder present for part of the range counts only for that part."""
    if every:
        return f"sum_over_time({recorded}[$__range:{every}s]) * {every}"
    return f"sum_over_time({recorded}[$__range:$__interval]) * $__interval_ms / 1000"


def fast_cycle_quantile(quantile: float) -> str:
    buckets = per_step("rate", "amdgpu_exporter_fast_cycle_duration_seconds_bucket", NODE_ALL_GPUS)
    return f"histogram_quantile({quantile:g}, sum by (le) ({buckets}))"


def poll_duration_quantile(quantile: float) -> str:
    buckets = per_step("rate", "amdgpu_exporter_poll_duration_seconds_bucket", NODE_ALL_GPUS)
    return f"histogram_quantile({quantile:g}, sum by (le) ({buckets}))"


def only_exporter(expr: str, selector: str) -> str:
    """Keep the series of amdgpu-exporter's targets: other jobs on the node (node_exporter) export process_* too."""
    return f"({expr} and on(instance, job) amdgpu_exporter_build_info{{{selector}}})"


def exporter_process(metric: str, selector: str) -> str:
    """A process_* family of the exporter only."""
    return only_exporter(f"{metric}{{{selector}}}", selector)
