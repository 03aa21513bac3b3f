"""The rule model: what one in-daemon alert rule says (rulefile.py reads them, state.py evaluates them)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from exporter.alerting.watch import WATCHABLE
from exporter.model import DeviceWindow, Sample

SEVERITIES = ("info", "warning", "critical")
# The ASICs a rule file may override values for (DeviceIdentity.asic; a unit test holds this to the
# known device table of sources/identity.py): MI210 / MI250X, and the MI300 family.
ASICS = ("aldebaran", "aqua_vanjaram", "gfx950")

COMPARISONS: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
COMPARISON_ALIASES = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


@dataclass(frozen=True, slots=True)
class ClockDown:
    """Suggest lowering the gfx clock ceiling in steps while the alert fires and the value breaches."""

    step_ratio: float = 0.05
    step_interval_seconds: float = 60.0
    floor_ratio: float = 0.75  # never suggest a ceiling below this fraction of the reference max
    range_min_hertz: float = 500e6  # SCLKMIN in the suggested `rocm-smi --setsrange MIN MAX`
    restore_after_seconds: float = 60.0  # the restore advice stays until the device has been cool this long


@dataclass(frozen=True, slots=True)
class Rule:
    alert: str
    metric: str
    key: str | None  # the sensor / engine / pool / domain the metric is read for
    comparison: str  # ">" | ">=" | "<" | "<="
    threshold: float
    for_seconds: float
    clear_threshold: float
    severity: str
    summary: str = ""  # str.format templates, see TEMPLATE_FIELDS
    description: str = ""
    suggestion: str = ""
    clock_down: ClockDown | None = None
    # "max" | "min" | "mean": read the value's sliding window (the fast sampler's, --window) instead
    # of the latest poll sample, so a spike between two polls counts; "" = the latest sample. Where a
    # device has no window (fast sampler off, a value it does not sample) the latest sample is read.
    window: str = ""
    # asic (DeviceIdentity.asic, e.g. "aldebaran", "aqua_vanjaram") -> this rule with that ASIC's values
    asic_overrides: tuple[tuple[str, Rule], ...] = ()

    def for_asic(self, asic: str) -> Rule:
        """The rule as it applies to a device of this ASIC (itself unless the rule file overrides it)."""
        return next((rule for name, rule in self.asic_overrides if name == asic), self)

    def read(self, sample: Sample, window: DeviceWindow | None = None) -> float | None:
        spec = WATCHABLE[self.metric]
        value: float | None = None
        if self.window and window is not None and spec.window_family:
            stat = window.stats.get((spec.window_family, spec.window_key(self.key or "")))
            if stat is not None:
                value = {"max": stat.maximum, "min": stat.minimum, "mean": stat.mean}[self.window]
        if value is None:
            value = spec.read(sample, self.key or "")
        if value is None or not math.isfinite(value):
            return None
        return float(value)

    def breaches(self, value: float) -> bool:
        return COMPARISONS[self.comparison](value, self.threshold)

    def clears(self, value: float) -> bool:
        # The clear side is strict: with ">" 85 / clear 80, 80.0 itself does not clear.
        if self.comparison in (">", ">="):
            return value < self.clear_threshold
        return value > self.clear_threshold
