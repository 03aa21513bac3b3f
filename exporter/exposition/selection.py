"""Which series /metrics carries: collectors, the families off by default, the window series at
defaults, and the include / exclude lists of the config file.

A collector is a named group of families about one thing (temperature, pcie, xgmi, windows,
firmware, attribution, the exporter's own process, ...): every family is in exactly one, found by
the first group whose globs match its name. Selecting is choosing what is rendered: an excluded
family is simply not rendered; nothing is read less.

Why some families are off by default (docs/design.md, "The series budget"): the budget is 120
series per device at defaults, and these are static or per-link detail that no shipped rule reads.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.config import Settings
from exporter.exposition.metrics import METRICS, MetricSpec

# (collector, globs on family names), first match wins: a family is in the first group that matches it.
COLLECTORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("windows", ("amdgpu_*_window_*", "amdgpu_exporter_window_seconds", "amdgpu_exporter_fast_*")),
    ("temperature", ("amdgpu_temperature_*",)),
    ("power", ("amdgpu_power_*", "amdgpu_energy_joules")),
    ("busy", ("amdgpu_busy_ratio",)),
    ("xcc", ("amdgpu_xcc_*", "amdgpu_media_engine_*")),
    ("board", ("amdgpu_board_*", "amdgpu_baseboard_*", "amdgpu_node_power_*")),
    ("memory", ("amdgpu_memory_*",)),
    ("clock", ("amdgpu_clock_hertz", "amdgpu_clock_max_hertz", "amdgpu_clock_min_hertz", "amdgpu_voltage_volts")),
    ("throttle", ("amdgpu_throttle_*",)),
    ("pcie", ("amdgpu_pcie_*",)),
    ("xgmi", ("amdgpu_xgmi_*",)),
    ("ecc", ("amdgpu_ecc_*", "amdgpu_ras_*")),
    ("health", ("amdgpu_health_*", "amdgpu_cper_*", "amdgpu_last_reset_*")),
    ("firmware", ("amdgpu_firmware_info",)),
    ("topology", ("amdgpu_topology_*",)),
    ("alerts", ("amdgpu_alert_*", "amdgpu_clock_down_suggested_ratio", "amdgpu_suggested_*")),
    ("host", ("amdgpu_driver_info", "amdgpu_rocm_info", "amdgpu_smi_library_info")),
    (
        "attribution",
        (
            "amdgpu_allocation_info",
            "amdgpu_job_info",
            "amdgpu_job_energy_joules",
            "amdgpu_job_gpu_seconds",
            "amdgpu_exporter_attribution_up",
        ),
    ),
    ("processes", ("amdgpu_process_*",)),
    ("device", ("amdgpu_up", "amdgpu_device_*", "amdgpu_sample_timestamp_seconds")),
    ("process", ("process_*",)),
    ("exporter", ("amdgpu_exporter_*",)),
)
COLLECTOR_NAMES = tuple(name for name, _globs in COLLECTORS)

# Static or per-link detail no shipped rule reads; `collectors.include` / `families.include` turn them on.
OFF_BY_DEFAULT = frozenset(
    {
        "amdgpu_topology_link_info",  # N x N links a node, never changing
        "amdgpu_firmware_info",  # 9-14 a device, never changing (amdgpu_device_info has the vbios)
        "amdgpu_xgmi_read_bytes",  # per link: 8 a MI300X socket each
        "amdgpu_xgmi_write_bytes",
        "amdgpu_throttle_residency_seconds",  # amdgpu_throttle_active is derived from the same counters
        "amdgpu_clock_max_hertz",  # DPM ceilings; the suggestion is amdgpu_suggested_gfx_clock_max_hertz
        "amdgpu_clock_min_hertz",  # DPM floors, as static as the ceilings
        "amdgpu_baseboard_temperature_celsius",  # MI350-class: 23 sensors a node; node power stays on
    }
)

# The window series at defaults (labels after `gpu`), those the shipped dashboards and rules read;
# `window.all-series` renders every sensor, engine, domain and stat. A family not named here is whole.
DEFAULT_WINDOW_SERIES: dict[str, frozenset[tuple[str, ...]]] = {
    "amdgpu_temperature_window_celsius": frozenset({("junction", "min"), ("junction", "max")}),
    "amdgpu_busy_window_ratio": frozenset({("gfx", "min"), ("gfx", "max"), ("gfx", "mean")}),
    "amdgpu_clock_window_hertz": frozenset({("gfx", "min"), ("gfx", "max")}),
}


def collector_of(name: str) -> str:
    """The collector of a family name ("" for none: tests/unit/test_series_budget.py forbids that)."""
    for collector, globs in COLLECTORS:
        if any(fnmatch.fnmatchcase(name, glob) for glob in globs):
            return collector
    return ""


def _matches(spec: MetricSpec, pattern: str) -> bool:
    return fnmatch.fnmatchcase(spec.name, pattern) or fnmatch.fnmatchcase(spec.exposed_name, pattern)


@dataclass(frozen=True, slots=True)
class Selection:
    """The include / exclude lists: globs on collector names and on family names (with or without _total)."""

    collectors_include: tuple[str, ...] = ()
    collectors_exclude: tuple[str, ...] = ()
    families_include: tuple[str, ...] = ()
    families_exclude: tuple[str, ...] = ()

    def families(self, specs: Iterable[MetricSpec] = METRICS) -> frozenset[str]:
        """The family names rendered. The family lists beat the collector lists; at one level exclude
        beats include; a family no list names is on unless it is in OFF_BY_DEFAULT."""
        chosen = set()
        for spec in specs:
            collector = collector_of(spec.name)
            on = spec.name not in OFF_BY_DEFAULT
            if any(fnmatch.fnmatchcase(collector, p) for p in self.collectors_include):
                on = True
            if any(fnmatch.fnmatchcase(collector, p) for p in self.collectors_exclude):
                on = False
            if any(_matches(spec, p) for p in self.families_include):
                on = True
            if any(_matches(spec, p) for p in self.families_exclude):
                on = False
            if on:
                chosen.add(spec.name)
        return frozenset(chosen)

    def problems(self, specs: Sequence[MetricSpec] = METRICS) -> list[str]:
        """One sentence for each name or glob that matches nothing, with the nearest known name."""
        found = []
        names = [name for spec in specs for name in dict.fromkeys((spec.name, spec.exposed_name))]
        for option, patterns, known in (
            ("collectors.include", self.collectors_include, list(COLLECTOR_NAMES)),
            ("collectors.exclude", self.collectors_exclude, list(COLLECTOR_NAMES)),
            ("families.include", self.families_include, names),
            ("families.exclude", self.families_exclude, names),
        ):
            for pattern in patterns:
                if any(fnmatch.fnmatchcase(name, pattern) for name in known):
                    continue
                near = difflib.get_close_matches(pattern, known, n=1, cutoff=0.6)
                what = "collector" if option.startswith("collectors") else "family"
                hint = f"; did you mean {near[0]}?" if near else ""
                listing = f" (collectors: {', '.join(COLLECTOR_NAMES)})" if what == "collector" else ""
                found.append(f"{option}: {pattern!r} matches no {what}{hint}{listing}")
        return found


@dataclass(frozen=True, slots=True)
class ExpositionOptions:
    """What the render stage renders beyond the data: chosen families, window detail, extra labels."""

    families: frozenset[str] = Selection().families()
    all_window_series: bool = False  # every window sensor, engine, domain and stat (window.all-series)
    identity_labels: tuple[str, ...] = ()  # labels of amdgpu_device_info copied onto per-GPU series
    attribution_labels: bool = False  # the attribution labels on every per-GPU series (attribution.series-labels)


DEFAULTS = ExpositionOptions()
# Every family and every window series: what the dashboards' and the reference's tests render.
EVERYTHING = ExpositionOptions(families=frozenset(spec.name for spec in METRICS), all_window_series=True)


def selection_of(settings: Settings) -> Selection:
    return Selection(
        settings.collectors_include, settings.collectors_exclude, settings.families_include, settings.families_exclude
    )


def exposition_options(settings: Settings) -> ExpositionOptions:
    """The settings' exposition options; ValueError (one line each problem) for a name that matches nothing."""
    selection = selection_of(settings)
    problems = selection.problems()
    if problems:
        raise ValueError("; ".join(problems))
    return ExpositionOptions(
        families=selection.families(),
        all_window_series=settings.window_all_series,
        identity_labels=settings.metrics_identity_labels,
        attribution_labels=settings.attribution_series_labels,
    )
