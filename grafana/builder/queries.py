"""PromQL fragments both dashboards use: selectors, the MI250X package join, per-step rates and ages.

Template variables: $instance (a regex on the fleet dashboard, one node on the node dashboard) and
$gpu (a regex of GCD indices on the node dashboard).
"""

from __future__ import annotations

FLEET = 'instance=~"$instance"'
NODE = 'instance="$instance", gpu=~"$gpu"'
NODE_ALL_GPUS = 'instance="$instance"'
HBM_SENSORS = 'sensor=~"memory|hbm[0-9]+"'
CORE_SENSORS = 'sensor!~"memory|hbm[0-9]+"'
PER_GPU = "gpu {{gpu}}"  # the legend of a series per GCD
JOULES_PER_KWH = "3.6e6"


def junction(selector: str) -> str:
    return f'amdgpu_temperature_celsius{{{selector}, sensor="junction"}}'


def per_step(function: str, metric: str, selector: str) -> str:
    """rate() or increase() of a counter over Grafana's step ($__rate_interval)."""
    return f"{function}({metric}{{{selector}}}[$__rate_interval])"


def age_at_scrape(metric: str, selector: str) -> str:
    """How old a timestamp was when it was scraped: independent of the scrape interval, unlike time() - x."""
    return f"timestamp({metric}{{{selector}}}) - {metric}{{{selector}}}"


SAMPLE_AGE_FLEET = f"({age_at_scrape('amdgpu_sample_timestamp_seconds', FLEET)})"


def vram_used_ratio(selector: str) -> str:
    return f'amdgpu_memory_used_bytes{{{selector}, pool="vram"}} / amdgpu_memory_total_bytes{{{selector}, pool="vram"}}'


def with_identity(expr: str, selector: str) -> str:
    """Per-GCD series with the device's product and PCI address added, for tables."""
    return f"{expr} * on(instance, gpu) group_left(product, pci_bus_id) amdgpu_device_info{{{selector}}}"


def package_join(per_gcd: str, selector: str, aggregate: str = "sum") -> str:
    """A per-GCD expression summed (or maxed) per physical package.

    Only die 0 of an MI250X carries power and energy (die 1 has no series), so `sum by package`
    over the amdgpu_device_info join is the package's value; on single-die parts package = device.
    """
    return (
        f"{aggregate} by (instance, package) ({per_gcd}"
        f" * on(instance, gpu) group_left(package) amdgpu_device_info{{{selector}}})"
    )


def by_package(metric: str, selector: str, aggregate: str = "sum") -> str:
    return package_join(f"{metric}{{{selector}}}", selector, aggregate)


def packages_of_selected_gpus(expr: str) -> str:
    """Keep the packages that contain a selected GCD (die 1 selected still shows its package)."""
    return f"{expr} and on(instance, package) amdgpu_device_info{{{NODE}}}"


def node_package(metric: str, aggregate: str = "sum") -> str:
    return packages_of_selected_gpus(by_package(metric, NODE_ALL_GPUS, aggregate))


# The cap is a package setting: MI250X die 1 has none (or reads 0), so take the max over the dies.
FLEET_PACKAGE_POWER = by_package("amdgpu_power_watts", FLEET)
FLEET_PACKAGE_CAP = by_package("amdgpu_power_cap_watts", FLEET, "max")


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
