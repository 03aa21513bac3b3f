"""Which series /metrics carries, and so which values are read: collectors, the families off by
default, the window series at defaults, and the include / exclude lists.

A collector is a named group of families about one thing (temperature, pcie, xgmi, windows,
firmware, attribution, the exporter's own process, ...), declared with each family in the metric
table (exposition/metrics.py): `--collector.NAME` / `--no-collector.NAME` and the config file's
`collectors:` / `families:` lists choose families, and a family nobody shows is not read either:
read_fields tells the source the Sample fields the shown families are made of.

Why some families are off by default (docs/design.md, "The series budget"): the budget is 120
series per device at defaults, and these are static or per-link detail that no shipped rule reads.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.config import Settings
from exporter.exposition.metrics import BY_NAME, METRICS, MetricSpec

COLLECTOR_NAMES = tuple(sorted({spec.collector for spec in METRICS}))
# Families shown only when asked for (the table's off_by_default entries).
OFF_BY_DEFAULT = frozenset(spec.name for spec in METRICS if not spec.shown_by_default)

# The window series at defaults (labels after `gpu`), those the shipped dashboards and rules read;
# `window.all-series` renders every sensor, engine, domain and stat. A family not named here is whole.
DEFAULT_WINDOW_SERIES: dict[str, frozenset[tuple[str, ...]]] = {
    "amdgpu_temperature_window_celsius": frozenset({("junction", "min"), ("junction", "max")}),
    "amdgpu_busy_window_ratio": frozenset({("gfx", "min"), ("gfx", "max"), ("gfx", "mean")}),
    "amdgpu_clock_window_hertz": frozenset({("gfx", "min"), ("gfx", "max")}),
}


def collector_of(name: str) -> str:
    """The collector of a family name."""
    return BY_NAME[name].collector


def _matches(spec: MetricSpec, pattern: str) -> bool:
    return fnmatch.fnmatchcase(spec.name, pattern) or fnmatch.fnmatchcase(spec.exposed_name, pattern)


MAX_PROBLEMS_SHOWN = 10  # names that match nothing, each with a did-you-mean; further ones are counted
# Names or globs one list may hold: far more than there are families, and what bounds the work of
# choosing them (every glob is matched against every family: 30,000 took 18 s of CPU on a reload).
MAX_PATTERNS = 4096


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
            collector = spec.collector
            on = spec.shown_by_default
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
        """One sentence for each name or glob that matches nothing, with the nearest known name; for a
        list longer than MAX_PATTERNS, only that (nothing else is worked out)."""
        lists = {
            "collectors.include": self.collectors_include,
            "collectors.exclude": self.collectors_exclude,
            "families.include": self.families_include,
            "families.exclude": self.families_exclude,
        }
        too_long = [
            f"{option}: lists {len(patterns)} names or globs; at most {MAX_PATTERNS} (there are {len(specs)} families)"
            for option, patterns in lists.items()
            if len(patterns) > MAX_PATTERNS
        ]
        if too_long:
            return too_long
        found: list[str] = []
        unshown = 0
        names = [name for spec in specs for name in dict.fromkeys((spec.name, spec.exposed_name))]
        for option, patterns, known in (
            ("collectors.include", self.collectors_include, list(COLLECTOR_NAMES)),
            ("collectors.exclude", self.collectors_exclude, list(COLLECTOR_NAMES)),
            ("families.include", self.families_include, names),
            ("families.exclude", self.families_exclude, names),
        ):
            for pattern in dict.fromkeys(patterns):  # a glob listed twice is checked once
                if any(fnmatch.fnmatchcase(name, pattern) for name in known):
                    continue
                if len(found) >= MAX_PROBLEMS_SHOWN:  # the rest counted: a did-you-mean each would take seconds
                    unshown += 1
                    continue
                near = difflib.get_close_matches(pattern, known, n=1, cutoff=0.6)
                what = "collector" if option.startswith("collectors") else "family"
                hint = f"; did you mean {near[0]}?" if near else ""
                listing = f" (collectors: {', '.join(COLLECTOR_NAMES)})" if what == "collector" else ""
                found.append(f"{option}: {pattern!r} matches no {what}{hint}{listing}")
        if unshown:
            found.append(f"and {unshown} more name(s) or glob(s) that match nothing")
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


def read_fields(families: Iterable[str]) -> frozenset[str]:
    """The Sample fields the named families are made of: what the source is asked to read. It leaves
    out only the optional fields (sources/sysfs/table.py) outside them: whatever a rule, the health
    verdict or a page reads is read, shown or not."""
    return frozenset(field for name in families for field in BY_NAME[name].reads)


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
