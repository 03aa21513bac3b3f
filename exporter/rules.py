"""In-daemon alert rules: a validated YAML rule set, and one pure evaluation step per poll cycle.

    evaluate(rules, previous alert states, snapshot) -> (new alert states, transitions)

Nothing here does I/O (load_rules reads its one file) and nothing ever writes to a GPU: the
clock-down action only produces a suggestion (a ratio, a ceiling in Hz and the rocm-smi command
an operator could run), which exposition, the JSON API, the log and the Alertmanager pusher publish.

Semantics of one rule on one device:
- inactive -> pending when a sample breaches the threshold (straight to firing when `for` is 0).
- pending lasts until the value clears (hysteresis), so a sensor hovering around the threshold
  still fires; it fires at the first breaching sample once `for` has passed since it went pending.
- firing lasts until the value clears: 84..86 °C around an 85/80 rule never flaps the alert.
- clock_down: firing suggests one step (step_ratio of the gfx clock max seen when it fired); each
  further step_interval with the value still breaching suggests another, never past floor_ratio.
- a device that is down, absent, or does not supply the metric keeps its state unchanged: missing
  data neither resolves nor fires an alert.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from exporter.model import AlertState, DeviceState, Sample, Snapshot

DEFAULT_RULES_RESOURCE = "default_rules.yaml"
SEVERITIES = ("info", "warning", "critical")
SUGGESTION_PREFIX = "Suggestion only (the exporter never changes the GPU): "
COMMAND_MARKER = "Command: "

TransitionKind = Literal["pending", "firing", "resolved", "clock_down_step"]


class RulesConfigError(ValueError):
    """A rule file that cannot be used; the message names the file and the line."""


# --- what a rule can watch ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A Sample value a rule can compare: which label selects it, its unit, how to read it."""

    key_label: str | None  # "sensor" | "engine" | "pool" | "domain" | None
    keys: tuple[str, ...]  # the values the key label may take (typos would silently never fire)
    unit: str
    read: Callable[[Sample, str], float | None]


def _memory_used_ratio(sample: Sample, pool: str) -> float | None:
    used = sample.memory_used_bytes.get(pool)
    total = sample.memory_total_bytes.get(pool)
    if used is None or not total:
        return None
    return used / total


_TEMPERATURE_SENSORS = (
    "edge",
    "junction",
    "memory",
    "hbm0",
    "hbm1",
    "hbm2",
    "hbm3",
    "vr_gfx",
    "vr_soc",
    "vr_mem",
)
_MEMORY_POOLS = ("vram", "visible_vram", "gtt")

METRICS: Mapping[str, MetricSpec] = {
    "temperature_celsius": MetricSpec("sensor", _TEMPERATURE_SENSORS, " °C", lambda s, k: s.temperatures.get(k)),
    "power_watts": MetricSpec(None, (), " W", lambda s, _k: s.power_watts),
    "busy_ratio": MetricSpec("engine", ("gfx", "memory", "media"), "", lambda s, k: s.busy.get(k)),
    "memory_used_ratio": MetricSpec("pool", _MEMORY_POOLS, "", _memory_used_ratio),
    "memory_used_bytes": MetricSpec("pool", _MEMORY_POOLS, " B", lambda s, k: s.memory_used_bytes.get(k)),
    "clock_hertz": MetricSpec(
        "domain",
        ("gfx", "memory", "fabric", "soc", "video", "decode"),
        " Hz",
        lambda s, k: s.clocks_hertz.get(k),
    ),
}

_COMPARISONS: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_COMPARISON_ALIASES = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


# --- the rule model ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClockDown:
    """Suggest lowering the gfx clock ceiling in steps while the alert fires and the value breaches."""

    step_ratio: float = 0.05
    step_interval_seconds: float = 60.0
    floor_ratio: float = 0.75  # never suggest a ceiling below this fraction of the reference max
    range_min_hertz: float = 500e6  # SCLKMIN in the suggested `rocm-smi --setsrange MIN MAX`

    @property
    def max_ratio(self) -> float:
        return 1.0 - self.floor_ratio

    def at_floor(self, ratio: float) -> bool:
        # With a tolerance: 1 - 0.7 is 0.30000000000000004, and 0.3 must count as there.
        return ratio >= self.max_ratio - 1e-9


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

    def read(self, sample: Sample) -> float | None:
        value = METRICS[self.metric].read(sample, self.key or "")
        if value is None or not math.isfinite(value):
            return None
        return float(value)

    def breaches(self, value: float) -> bool:
        return _COMPARISONS[self.comparison](value, self.threshold)

    def clears(self, value: float) -> bool:
        # The clear side is strict: with ">" 85 / clear 80, 80.0 itself does not clear.
        if self.comparison in (">", ">="):
            return value < self.clear_threshold
        return value > self.clear_threshold


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of one alert on one device: what the log event and pushes are made of."""

    gpu: int
    alert: str
    severity: str
    kind: TransitionKind
    value: float | None
    at: float
    suggestion: str = ""
    clock_down_ratio: float = 0.0
    suggested_gfx_clock_max_hertz: float | None = None

    def log_fields(self) -> dict[str, Any]:
        """Key/value pairs for one structured log event (`log.warning("alert_transition", **fields)`)."""
        fields: dict[str, Any] = {
            "gpu": self.gpu,
            "alert": self.alert,
            "severity": self.severity,
            "transition": self.kind,
            "value": self.value,
            "at": self.at,
        }
        if self.kind in ("firing", "clock_down_step") or self.clock_down_ratio:
            fields["clock_down_ratio"] = self.clock_down_ratio
            fields["suggested_gfx_clock_max_hertz"] = self.suggested_gfx_clock_max_hertz
        if self.suggestion:
            fields["suggestion"] = self.suggestion
            command = suggested_command(self.suggestion)
            if command:
                fields["suggested_command"] = command
        return fields


# --- loading -----------------------------------------------------------------------------------


def default_rules() -> tuple[Rule, ...]:
    """The shipped rule set (exporter/default_rules.yaml, packaged with the module)."""
    text = resources.files("exporter").joinpath(DEFAULT_RULES_RESOURCE).read_text(encoding="utf-8")
    return parse_rules(text, DEFAULT_RULES_RESOURCE)


def load_rules(path: Path) -> tuple[Rule, ...]:
    """Read and validate a rule file; any problem is a RulesConfigError naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RulesConfigError(f"{path}: cannot read rule file: {exc}") from exc
    return parse_rules(text, str(path))


def parse_rules(text: str, source: str = "rules.yaml") -> tuple[Rule, ...]:
    """Pure: YAML text -> rules. `source` is the file name used in error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise RulesConfigError(f"{source}{line}: not valid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise RulesConfigError(f"{source}: not valid YAML: {exc}") from exc
    return _RuleFileParser(source).parse(root)


# Every placeholder a summary / description / suggestion template may use, with a sample value of
# the right type so templates are checked at load time rather than when an alert first fires.
TEMPLATE_FIELDS: Mapping[str, Any] = {
    "gpu": 0,
    "smi_index": 0,
    "pci_bus_id": "0000:c1:00.0",
    "alert": "Alert",
    "severity": "warning",
    "metric": "temperature_celsius",
    "value": 86.0,
    "threshold": 85.0,
    "clear_threshold": 80.0,
    "comparison": ">",
    "for": "1m",
    "unit": " °C",
    "sensor": "junction",
    "engine": "gfx",
    "pool": "vram",
    "domain": "gfx",
}

_ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RULE_KEYS = (
    "alert",
    "metric",
    "sensor",
    "engine",
    "pool",
    "domain",
    "comparison",
    "threshold",
    "for",
    "clear_threshold",
    "severity",
    "summary",
    "description",
    "suggestion",
    "action",
)
_CLOCK_DOWN_KEYS = ("type", "step_ratio", "step_interval", "floor_ratio", "range_min_mhz")


class _RuleFileParser:
    """Walks the composed YAML node tree, so every error can name the line it comes from."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._constructor = SafeConstructor()

    def fail(self, node: Node, message: str) -> NoReturn:
        raise RulesConfigError(f"{self.source} line {node.start_mark.line + 1}: {message}")

    def parse(self, root: Node | None) -> tuple[Rule, ...]:
        if root is None:
            raise RulesConfigError(f"{self.source}: the file is empty; expected a mapping with a 'rules' list")
        top = self.mapping(root, "the file", allowed=("rules",))
        if "rules" not in top:
            self.fail(root, "missing 'rules' (a list of rules)")
        rules_node = top["rules"][1]
        if not isinstance(rules_node, SequenceNode):
            self.fail(rules_node, "'rules' must be a list of rules")
        rules: list[Rule] = []
        first_line: dict[str, int] = {}
        for item in rules_node.value:
            rule = self.rule(item)
            if rule.alert in first_line:
                self.fail(item, f"alert {rule.alert!r} is defined twice (first on line {first_line[rule.alert]})")
            first_line[rule.alert] = item.start_mark.line + 1
            rules.append(rule)
        return tuple(rules)

    # -- one rule --

    def rule(self, node: Node) -> Rule:
        fields = self.mapping(node, "a rule", allowed=_RULE_KEYS)
        alert = self.required_string(node, fields, "alert")
        if not _ALERT_NAME.match(alert):
            self.fail(
                fields["alert"][1],
                f"'alert' must be letters, digits and _ (not starting with a digit): {alert!r}",
            )
        metric = self.required_string(node, fields, "metric")
        if metric not in METRICS:
            self.fail(fields["metric"][1], f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        spec = METRICS[metric]
        key = self.metric_key(node, fields, metric, spec)
        comparison = self.comparison(node, fields)
        threshold = self.required_number(node, fields, "threshold")
        for_seconds = self.duration(fields, "for", default=0.0)
        clear = self.number(fields, "clear_threshold", default=threshold)
        if comparison in (">", ">=") and clear > threshold:
            self.fail(
                fields["clear_threshold"][1],
                f"'clear_threshold' must not be above 'threshold' for {comparison!r}",
            )
        if comparison in ("<", "<=") and clear < threshold:
            self.fail(
                fields["clear_threshold"][1],
                f"'clear_threshold' must not be below 'threshold' for {comparison!r}",
            )
        severity = self.string(fields, "severity", default="warning")
        if severity not in SEVERITIES:
            self.fail(fields["severity"][1], f"'severity' must be one of {', '.join(SEVERITIES)}, not {severity!r}")
        templates = {name: self.template(fields, name) for name in ("summary", "description", "suggestion")}
        clock_down = self.action(fields, metric, for_seconds)
        return Rule(
            alert=alert,
            metric=metric,
            key=key,
            comparison=comparison,
            threshold=threshold,
            for_seconds=for_seconds,
            clear_threshold=clear,
            severity=severity,
            summary=templates["summary"],
            description=templates["description"],
            suggestion=templates["suggestion"],
            clock_down=clock_down,
        )

    def metric_key(self, node: Node, fields: dict[str, tuple[Node, Node]], metric: str, spec: MetricSpec) -> str | None:
        for label in ("sensor", "engine", "pool", "domain"):
            if label in fields and label != spec.key_label:
                self.fail(fields[label][0], f"metric {metric!r} takes no {label!r}")
        if spec.key_label is None:
            return None
        key = self.required_string(node, fields, spec.key_label, why=f" (metric {metric!r} needs one)")
        if key not in spec.keys:
            self.fail(fields[spec.key_label][1], f"unknown {spec.key_label} {key!r}; known: {', '.join(spec.keys)}")
        return key

    def comparison(self, node: Node, fields: dict[str, tuple[Node, Node]]) -> str:
        if "comparison" not in fields:
            self.fail(node, "missing 'comparison'")
        value_node = fields["comparison"][1]
        raw = self.scalar(value_node)
        text = raw.strip() if isinstance(raw, str) else raw
        text = _COMPARISON_ALIASES.get(text, text) if isinstance(text, str) else text
        if not isinstance(text, str) or text not in _COMPARISONS:
            self.fail(
                value_node,
                "'comparison' must be one of '>', '>=', '<', '<=' (quote it: a bare > starts a YAML block scalar)",
            )
        return text

    def action(self, fields: dict[str, tuple[Node, Node]], metric: str, for_seconds: float) -> ClockDown | None:
        if "action" not in fields:
            return None
        node = fields["action"][1]
        action = self.mapping(node, "'action'", allowed=_CLOCK_DOWN_KEYS)
        kind = self.required_string(node, action, "type")
        if kind != "clock_down":
            self.fail(action["type"][1], f"unknown action type {kind!r}; known: clock_down")
        step = self.number(action, "step_ratio", default=0.05)
        if not 0.0 < step < 1.0:
            self.fail(action["step_ratio"][1], "'step_ratio' must be between 0 and 1 (0.05 = 5 %)")
        interval = self.duration(action, "step_interval", default=for_seconds)
        if interval <= 0:
            where = action["step_interval"][1] if "step_interval" in action else node
            self.fail(where, "'step_interval' must be more than 0 (it defaults to the rule's 'for')")
        floor = self.number(action, "floor_ratio", default=0.75)
        if not 0.0 < floor < 1.0:
            self.fail(action["floor_ratio"][1], "'floor_ratio' must be between 0 and 1 (0.75 = never below 75 %)")
        range_min_mhz = self.number(action, "range_min_mhz", default=500.0)
        if range_min_mhz < 0:
            self.fail(action["range_min_mhz"][1], "'range_min_mhz' must not be negative")
        return ClockDown(
            step_ratio=step,
            step_interval_seconds=interval,
            floor_ratio=floor,
            range_min_hertz=range_min_mhz * 1e6,
        )

    # -- typed values --

    def mapping(self, node: Node, what: str, allowed: Sequence[str]) -> dict[str, tuple[Node, Node]]:
        if not isinstance(node, MappingNode):
            self.fail(node, f"{what} must be a mapping of key: value")
        out: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node)
            if not isinstance(key, str):
                self.fail(key_node, f"keys of {what} must be names, not {key!r}")
            if key in out:
                self.fail(key_node, f"{key!r} appears twice in {what}")
            if key not in allowed:
                self.fail(key_node, f"unknown key {key!r} in {what}; known: {', '.join(allowed)}")
            out[key] = (key_node, value_node)
        return out

    def scalar(self, node: Node) -> Any:
        if not isinstance(node, ScalarNode):
            self.fail(node, "expected a single value, not a list or mapping")
        try:
            return self._constructor.construct_object(node, deep=True)
        except (ConstructorError, ValueError) as exc:
            self.fail(node, f"cannot read value: {exc}")

    def string(self, fields: dict[str, tuple[Node, Node]], name: str, default: str) -> str:
        if name not in fields:
            return default
        node = fields[name][1]
        value = self.scalar(node)
        if not isinstance(value, str) or not value.strip():
            self.fail(node, f"{name!r} must be a non-empty string")
        return value.strip()

    def required_string(self, node: Node, fields: dict[str, tuple[Node, Node]], name: str, why: str = "") -> str:
        if name not in fields:
            self.fail(node, f"missing {name!r}{why}")
        return self.string(fields, name, default="")

    def number(self, fields: dict[str, tuple[Node, Node]], name: str, default: float) -> float:
        if name not in fields:
            return default
        node = fields[name][1]
        value = self.scalar(node)
        # bool is an int in Python, and YAML 1.1 reads yes/no/on/off as booleans.
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self.fail(node, f"{name!r} must be a number")
        return float(value)

    def required_number(self, node: Node, fields: dict[str, tuple[Node, Node]], name: str) -> float:
        if name not in fields:
            self.fail(node, f"missing {name!r}")
        return self.number(fields, name, default=math.nan)

    def duration(self, fields: dict[str, tuple[Node, Node]], name: str, default: float) -> float:
        if name not in fields:
            return default
        node = fields[name][1]
        value = self.scalar(node)
        seconds = parse_duration(value)
        if seconds is None:
            self.fail(node, f"{name!r} must be a duration such as 90s, 5m, 1h30m or a number of seconds")
        return seconds

    def template(self, fields: dict[str, tuple[Node, Node]], name: str) -> str:
        if name not in fields:
            return ""
        node = fields[name][1]
        text = self.string(fields, name, default="")
        try:
            text.format(**TEMPLATE_FIELDS)
        except KeyError as exc:
            self.fail(
                node,
                f"{name!r} uses unknown placeholder {{{exc.args[0]}}}; known: {', '.join(TEMPLATE_FIELDS)}",
            )
        except (IndexError, ValueError, AttributeError, TypeError) as exc:
            self.fail(node, f"{name!r} is not a valid template: {exc}")
        return text


def parse_duration(value: Any) -> float | None:
    """90 / 90.0 / "90s" / "1m30s" / "500ms" -> seconds; None when it is not a duration >= 0."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text:
        return None
    position = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    return total if position == len(text) else None


def format_duration(seconds: float) -> str:
    """Seconds -> "1h2m3s" style text for messages."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    parts = []
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    rest = seconds - int(seconds) + whole
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return "".join(parts)


# --- evaluation --------------------------------------------------------------------------------


def evaluate(
    rules: Sequence[Rule], previous: Iterable[AlertState], snapshot: Snapshot
) -> tuple[tuple[AlertState, ...], tuple[Transition, ...]]:
    """One pure step: (rules, the states after the last cycle, this cycle's snapshot) -> new states.

    Returns one AlertState per (device, rule) once the device has supplied the rule's metric —
    inactive states included, so `amdgpu_alert_firing` has a 0 series — sorted by (gpu, alert),
    and the transitions this cycle caused, in the same order. `snapshot.taken_at` is "now".
    """
    now = snapshot.taken_at
    by_key = {(state.gpu, state.alert): state for state in previous}
    configured = {rule.alert for rule in rules}
    smi_indices = rocm_smi_indices(snapshot.devices)
    states: dict[tuple[int, str], AlertState] = {}
    transitions: list[Transition] = []
    for device in snapshot.devices:
        for rule in rules:
            key = (device.gpu, rule.alert)
            old = by_key.get(key)
            value = rule.read(device.sample) if device.up and device.sample is not None else None
            if value is None:
                if old is not None:
                    states[key] = old
                continue
            context = _Context(rule, device, smi_indices.get(device.gpu, device.gpu), value, now)
            state, transition = _step(context, old)
            states[key] = state
            if transition is not None:
                transitions.append(transition)
    # A device missing from this snapshot keeps its alerts as they were (no resolving on missing
    # data); a rule no longer configured takes its states with it.
    for key, state in by_key.items():
        if key not in states and state.alert in configured:
            states[key] = state
    ordered = tuple(states[key] for key in sorted(states))
    transitions.sort(key=lambda t: (t.gpu, t.alert))
    return ordered, tuple(transitions)


def rocm_smi_indices(devices: Iterable[DeviceState]) -> dict[int, int]:
    """gpu label -> the index `rocm-smi -d` uses for it.

    rocm_smi numbers devices in card order (card0, card1, ...), which need not be our PCI order.
    A card name that is not cardN sorts last, keeping PCI order among such devices.
    """

    def card_number(device: DeviceState) -> tuple[int, int]:
        match = re.fullmatch(r"card(\d+)", device.identity.card)
        return (int(match.group(1)) if match else 1 << 30, device.gpu)

    ordered = sorted(devices, key=card_number)
    return {device.gpu: index for index, device in enumerate(ordered)}


@dataclass(frozen=True, slots=True)
class _Context:
    rule: Rule
    device: DeviceState
    smi_index: int
    value: float
    now: float

    @property
    def gfx_clock_max(self) -> float | None:
        sample = self.device.sample
        hertz = sample.clocks_max_hertz.get("gfx") if sample is not None else None
        return float(hertz) if hertz is not None and math.isfinite(hertz) and hertz > 0 else None


def _step(ctx: _Context, old: AlertState | None) -> tuple[AlertState, Transition | None]:
    rule, now, value = ctx.rule, ctx.now, ctx.value
    if old is None:
        old = AlertState(gpu=ctx.device.gpu, alert=rule.alert, severity=rule.severity, firing=False, since=now)
    state = dataclasses.replace(old, value=value, severity=rule.severity)
    if state.firing:
        if rule.clears(value):
            return _resolve(ctx, state)
        return _continue_firing(ctx, state)
    if state.pending_since is None:
        if not rule.breaches(value):
            return state, None
        if rule.for_seconds <= 0:
            return _fire(ctx, state)
        pending = dataclasses.replace(state, pending_since=now, since=now)
        return pending, _transition(ctx, pending, "pending")
    if rule.clears(value):
        # Cleared before it fired: back to inactive. Not a transition anyone is paged for.
        return dataclasses.replace(state, pending_since=None, since=now), None
    if rule.breaches(value) and now - state.pending_since >= rule.for_seconds:
        return _fire(ctx, state)
    return state, None


def _fire(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition]:
    fired = dataclasses.replace(state, firing=True, since=ctx.now, pending_since=None)
    action = ctx.rule.clock_down
    if action is not None:
        fired = _with_clock_down(
            ctx,
            fired,
            ratio=min(action.step_ratio, action.max_ratio),
            reference=ctx.gfx_clock_max,
            stepped_at=ctx.now,
        )
    else:
        fired = dataclasses.replace(fired, suggestion=_rule_suggestion(ctx))
    return fired, _transition(ctx, fired, "firing")


def _continue_firing(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition | None]:
    action = ctx.rule.clock_down
    if action is None:
        return state, None
    reference = state.reference_gfx_clock_max_hertz
    if reference is None and ctx.gfx_clock_max is not None:
        # The device did not report its gfx clock max when the alert fired; now it does.
        reference = ctx.gfx_clock_max
        state = _with_clock_down(ctx, state, state.clock_down_ratio, reference, state.clock_down_stepped_at)
    last_step = state.clock_down_stepped_at if state.clock_down_stepped_at is not None else state.since
    step_due = ctx.now - last_step >= action.step_interval_seconds
    if ctx.rule.breaches(ctx.value) and step_due and not action.at_floor(state.clock_down_ratio):
        # round() keeps 0.05 + 0.05 + 0.05 at 0.15 rather than 0.15000000000000002.
        ratio = min(round(state.clock_down_ratio + action.step_ratio, 9), action.max_ratio)
        stepped = _with_clock_down(ctx, state, ratio, reference, ctx.now)
        return stepped, _transition(ctx, stepped, "clock_down_step")
    return state, None


def _resolve(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition]:
    restore = ""
    reference = state.reference_gfx_clock_max_hertz
    if ctx.rule.clock_down is not None and state.clock_down_ratio > 0 and reference is not None:
        min_mhz, max_mhz = _setsrange_mhz(ctx.rule.clock_down, reference)
        restore = (
            f"{SUGGESTION_PREFIX}{ctx.rule.alert} cleared on GPU {ctx.device.gpu} "
            f"({ctx.device.identity.pci_bus_id}); if you lowered its gfx clock ceiling, you may restore "
            f"{max_mhz} MHz. {COMMAND_MARKER}rocm-smi -d {ctx.smi_index} --setsrange {min_mhz} {max_mhz}"
        )
    resolved = dataclasses.replace(
        state,
        firing=False,
        since=ctx.now,
        pending_since=None,
        clock_down_ratio=0.0,
        suggested_gfx_clock_max_hertz=None,
        suggestion="",
        reference_gfx_clock_max_hertz=None,
        clock_down_stepped_at=None,
    )
    return resolved, _transition(ctx, resolved, "resolved", suggestion=restore)


def _with_clock_down(
    ctx: _Context, state: AlertState, ratio: float, reference: float | None, stepped_at: float | None
) -> AlertState:
    action = ctx.rule.clock_down
    assert action is not None
    ratio = max(0.0, min(ratio, action.max_ratio))
    suggested = reference * (1.0 - ratio) if reference is not None else None
    device = ctx.device
    percent = f"{ratio * 100:.4g} %"
    subject = f"the gfx clock ceiling of GPU {device.gpu} ({device.identity.pci_bus_id})"
    if reference is None:
        text = (
            f"{SUGGESTION_PREFIX}lower {subject} by {percent}; "
            "its current maximum is not known, so no command can be given yet."
        )
    else:
        min_mhz, max_mhz = _setsrange_mhz(action, reference * (1.0 - ratio))
        floor_note = " This is the floor: no further steps will be suggested." if action.at_floor(ratio) else ""
        text = (
            f"{SUGGESTION_PREFIX}lower {subject} by {percent} "
            f"of {reference / 1e6:.0f} MHz to {max_mhz} MHz.{floor_note} "
            f"{COMMAND_MARKER}rocm-smi -d {ctx.smi_index} --setsrange {min_mhz} {max_mhz}"
        )
    extra = _rule_suggestion(ctx)
    if extra:
        text = f"{text}\n{extra}"
    return dataclasses.replace(
        state,
        clock_down_ratio=ratio,
        suggested_gfx_clock_max_hertz=suggested,
        suggestion=text,
        reference_gfx_clock_max_hertz=reference,
        clock_down_stepped_at=stepped_at,
    )


def _setsrange_mhz(action: ClockDown, ceiling_hertz: float) -> tuple[int, int]:
    """Whole MHz for `rocm-smi --setsrange MIN MAX` (it takes integers), MIN never above MAX."""
    # Rounded to whole Hz first: 1700 MHz x 0.7 may come out as 1189.9999999 MHz.
    max_mhz = round(ceiling_hertz) // 1_000_000
    return min(int(action.range_min_hertz // 1e6), max_mhz), max_mhz


def _rule_suggestion(ctx: _Context) -> str:
    if not ctx.rule.suggestion:
        return ""
    return render_template(ctx.rule.suggestion, ctx.rule, ctx.device, ctx.value, ctx.smi_index)


def _transition(ctx: _Context, state: AlertState, kind: TransitionKind, suggestion: str | None = None) -> Transition:
    return Transition(
        gpu=state.gpu,
        alert=state.alert,
        severity=state.severity,
        kind=kind,
        value=ctx.value,
        at=ctx.now,
        suggestion=state.suggestion if suggestion is None else suggestion,
        clock_down_ratio=state.clock_down_ratio,
        suggested_gfx_clock_max_hertz=state.suggested_gfx_clock_max_hertz,
    )


# --- text for people ---------------------------------------------------------------------------


def render_template(
    template: str, rule: Rule, device: DeviceState | None, value: float | None, smi_index: int | None = None
) -> str:
    """Fill a summary / description / suggestion template (validated at load time)."""
    spec = METRICS[rule.metric]
    gpu = device.gpu if device is not None else -1
    fields: dict[str, Any] = dict(TEMPLATE_FIELDS)
    fields.update(
        gpu=gpu,
        smi_index=smi_index if smi_index is not None else gpu,
        pci_bus_id=device.identity.pci_bus_id if device is not None else "",
        alert=rule.alert,
        severity=rule.severity,
        metric=rule.metric,
        value=value if value is not None else math.nan,
        threshold=rule.threshold,
        clear_threshold=rule.clear_threshold,
        comparison=rule.comparison,
        unit=spec.unit,
    )
    fields["for"] = format_duration(rule.for_seconds)
    if spec.key_label is not None:
        fields[spec.key_label] = rule.key or ""
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError):
        # Validated at load; a value of an unexpected type must still never break a cycle.
        return template


def alert_annotations(rule: Rule | None, state: AlertState, device: DeviceState | None) -> dict[str, str]:
    """summary / description / suggestion for an alert (Alertmanager annotations, the API)."""
    if rule is None:
        summary = f"{state.alert} on GPU {state.gpu}"
        description = f"{state.alert} ({state.severity}) on GPU {state.gpu}; last value {state.value}."
    else:
        key = f"{{{METRICS[rule.metric].key_label}={rule.key}}}" if rule.key else ""
        default_summary = "GPU {gpu}: {alert} ({metric}" + key + " {value:.4g}{unit} {comparison} {threshold:g}{unit})"
        default_description = (
            "{metric}" + key + " of GPU {gpu} ({pci_bus_id}) is {value:.4g}{unit}: {comparison} {threshold:g}{unit} "
            "for {for} or more; it clears past {clear_threshold:g}{unit}."
        )
        summary = render_template(rule.summary or default_summary, rule, device, state.value)
        description = render_template(rule.description or default_description, rule, device, state.value)
    annotations = {"summary": summary, "description": description}
    if state.suggestion:
        annotations["suggestion"] = state.suggestion
    return annotations


def suggested_command(suggestion: str) -> str:
    """The shell command inside a suggestion text ("" when it has none)."""
    _, marker, rest = suggestion.partition(COMMAND_MARKER)
    return rest.splitlines()[0].strip() if marker and rest else ""
