"""Reading rule files: YAML text -> validated rules, every error naming the file and the line.

The YAML is composed into nodes (not loaded into dicts) so each message can point at its line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from exporter import boundedfile, safeyaml
from exporter.alerting.rules import ASICS, COMPARISON_ALIASES, COMPARISONS, SEVERITIES, ClockDown, Rule
from exporter.alerting.texts import MAX_TEMPLATE_OUTPUT, TEMPLATE_FIELDS
from exporter.alerting.verdict import CHECKS, CheckThresholds, HealthThresholds
from exporter.alerting.verdict import SEVERITIES as HEALTH_SEVERITIES
from exporter.alerting.watch import WATCHABLE, Watchable
from exporter.config import ConfigError, Settings, parse_duration
from exporter.model import frozen_map

DEFAULT_RULES_RESOURCE = "default_rules.yaml"
# What the shipped file's health section is read over: it names every key of every check itself.
_GENERIC = HealthThresholds(checks=frozen_map({check: CheckThresholds() for check in CHECKS}))
# Bounds, so a rule file cannot cost the daemon its memory or its poll loop: every rule is checked on
# every device every cycle, and a rule file of 100,000 rules took 94 s and 1.2 GB to load.
MAX_RULES = 1000
MAX_FILE_BYTES = 1 << 20
MAX_FORMAT_NUMBER = 100  # the largest width or precision a template's {field:spec} may ask for


class RulesConfigError(ConfigError):
    """A rule file that cannot be used; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class RuleFile:
    """What one rule file says: the alert rules, and the health verdict's thresholds (`health:`)."""

    rules: tuple[Rule, ...]
    health: HealthThresholds


def _shipped_text() -> str:
    return resources.files("exporter.alerting").joinpath(DEFAULT_RULES_RESOURCE).read_text(encoding="utf-8")


@functools.cache
def default_rule_file() -> RuleFile:
    """The shipped file (exporter/alerting/default_rules.yaml, packaged with the module). Its `health:`
    section names every check with every key, and is what a check another file leaves out takes."""
    return parse_rule_file(_shipped_text(), DEFAULT_RULES_RESOURCE, base=_GENERIC)


def default_health() -> HealthThresholds:
    """The shipped health thresholds."""
    return default_rule_file().health


def rule_file_of(settings: Settings) -> RuleFile:
    """The rule file the settings name (the shipped one without --rules.file); RulesConfigError when bad."""
    return load_rule_file(Path(settings.rules_file)) if settings.rules_file else default_rule_file()


def rules_of(settings: Settings) -> tuple[Rule, ...]:
    """The rules the settings name (the shipped ones without --rules.file); RulesConfigError when bad."""
    return rule_file_of(settings).rules


def load_rule_file(path: Path) -> RuleFile:
    """Read and validate a rule file; any problem is a RulesConfigError naming the file and line."""
    try:
        text = boundedfile.read_text(path, "rule file", MAX_FILE_BYTES)
    except boundedfile.FileReadError as exc:
        raise RulesConfigError(str(exc)) from None
    return parse_rule_file(text, str(path))


def load_rules(path: Path) -> tuple[Rule, ...]:
    return load_rule_file(path).rules


def parse_rule_file(text: str, source: str = "rules.yaml", base: HealthThresholds | None = None) -> RuleFile:
    """Pure: YAML text -> rules and health thresholds; the checks the text leaves out keep `base`'s
    values (the shipped ones by default)."""
    if len(text) > MAX_FILE_BYTES:
        raise RulesConfigError(f"{source}: the rule file is larger than {MAX_FILE_BYTES // 1024} KiB")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it: 10x faster
    try:
        # Depth and alias limits first: a RecursionError or an alias bomb is no error message.
        safeyaml.check_limits(text, source)
        _check_rule_count(text, source, loader)
        root = yaml.compose(text, Loader=loader)
    except safeyaml.YamlLimitError as exc:
        raise RulesConfigError(str(exc)) from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise RulesConfigError(f"{source}{line}: not valid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise RulesConfigError(f"{source}: not valid YAML: {exc}") from exc
    return _RuleFileParser(source).parse(root, base if base is not None else default_health())


def _check_rule_count(text: str, source: str, loader: Any) -> None:
    """Refuse a file with more than MAX_RULES rules from its event stream, before building its nodes
    (which costs ten times as much): the items of the top-level `rules` list are counted."""
    depth = 0
    expect_key = True  # at depth 1 (the top mapping) node events alternate: key, value
    key = None
    in_rules = False
    count = 0
    for event in yaml.parse(text, Loader=loader):
        starts = isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent)
        is_node = starts or isinstance(event, yaml.ScalarEvent | yaml.AliasEvent)
        if is_node and depth == 1:
            if expect_key:
                key = event.value if isinstance(event, yaml.ScalarEvent) else None
            else:
                in_rules = key == "rules" and isinstance(event, yaml.SequenceStartEvent)
            expect_key = not expect_key
        elif is_node and depth == 2 and in_rules:
            count += 1
            if count > MAX_RULES:
                line = f" line {event.start_mark.line + 1}" if event.start_mark is not None else ""
                raise RulesConfigError(
                    f"{source}{line}: more than {MAX_RULES} rules: at most {MAX_RULES} "
                    "are accepted (each is evaluated on every device every poll cycle)"
                )
        if starts:
            depth += 1
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1
            if depth == 1:
                in_rules = False


_ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_KEY_LABELS = ("sensor", "engine", "pool", "domain")  # the labels that select what a metric is read for
_TEMPLATES = ("summary", "description", "suggestion")
_RULE_KEYS = (
    "alert",
    "metric",
    *_KEY_LABELS,
    "comparison",
    "threshold",
    "for",
    "clear_threshold",
    "severity",
    *_TEMPLATES,
    "action",
    "window",
    "asic_overrides",
)
_WINDOW_STATS = ("max", "min", "mean")
_CLOCK_DOWN_KEYS = ("type", "step_ratio", "step_interval", "floor_ratio", "range_min_mhz", "restore_after")
_OVERRIDE_KEYS = ("threshold", "clear_threshold", "for", "severity")


def _where(fields: dict[str, tuple[Node, Node]], names: tuple[str, ...], fallback: Node) -> Node:
    """The value node of the first of `names` present, else `fallback` (for the line of an error)."""
    return next((fields[name][1] for name in names if name in fields), fallback)


class _RuleFileParser:
    """Walks the composed YAML node tree, so every error can name the line it comes from."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._constructor = SafeConstructor()

    def fail(self, node: Node, message: str) -> NoReturn:
        raise RulesConfigError(f"{self.source} line {node.start_mark.line + 1}: {message}")

    def parse(self, root: Node | None, base: HealthThresholds) -> RuleFile:
        if root is None:
            raise RulesConfigError(f"{self.source}: the file is empty; expected a mapping with a 'rules' list")
        for key_node, _ in root.value if isinstance(root, MappingNode) else ():
            if isinstance(key_node, ScalarNode) and key_node.value == "groups":
                self.fail(
                    key_node,
                    "this is a Prometheus rule file (top-level 'groups'): check it with `promtool check rules "
                    f"{self.source}`; the exporter reads in-daemon rule files (a 'rules' list: default_rules.yaml)",
                )
        top = self.mapping(root, "the file", allowed=("rules", "health"))
        if "rules" not in top:
            self.fail(root, "missing 'rules' (a list of rules)")
        rules_node = top["rules"][1]
        if not isinstance(rules_node, SequenceNode):
            self.fail(rules_node, "'rules' must be a list of rules")
        # (more than MAX_RULES items were refused from the event stream, before composing)
        rules: list[Rule] = []
        first_line: dict[str, int] = {}
        for item in rules_node.value:
            rule = self.rule(item)
            if rule.alert in first_line:
                self.fail(item, f"alert {rule.alert!r} is defined twice (first on line {first_line[rule.alert]})")
            first_line[rule.alert] = item.start_mark.line + 1
            rules.append(rule)
        health = self.health(top["health"][1], base) if "health" in top else base
        return RuleFile(tuple(rules), health)

    # -- the health verdict's thresholds --

    def health(self, node: Node, base: HealthThresholds) -> HealthThresholds:
        """`health: {advice_for: 1h, checks: {ecc_uncorrectable: {threshold: 1, window: 1h}, ...}}`."""
        fields = self.mapping(node, "'health'", allowed=("checks", "advice_for"))
        advice_for = self.duration(fields, "advice_for", default=base.advice_for_seconds)
        checks = dict(base.checks)
        overrides = dict(base.asic_overrides)
        if "checks" in fields:
            checks_node = fields["checks"][1]
            for key_node, value_node in self.mapping(checks_node, "'checks'", allowed=tuple(CHECKS)).values():
                check = str(key_node.value)
                allowed = (*self.check_keys(check), "asic_overrides")
                one = self.mapping(value_node, f"check {check}", allowed=allowed)
                values = self.check_values(check, one, base.of(check, ""))
                checks[check] = values
                # The shipped per-ASIC values of a check the file names are replaced by the file's own.
                overrides = {key: value for key, value in overrides.items() if key[1] != check}
                if "asic_overrides" in one:
                    overrides.update(self.check_overrides(check, one["asic_overrides"][1], values))
        return HealthThresholds(
            checks=frozen_map(checks), asic_overrides=frozen_map(overrides), advice_for_seconds=advice_for
        )

    @staticmethod
    def check_keys(check: str) -> tuple[str, ...]:
        # device_down cannot be turned off: an unreadable GPU is never fit (/readyz names it too).
        return ("severity", *(() if check == "device_down" else ("enabled",)), *CHECKS[check])

    def check_values(self, check: str, fields: dict[str, tuple[Node, Node]], base: CheckThresholds) -> CheckThresholds:
        severity = self.string(fields, "severity", default=base.severity)
        if severity not in HEALTH_SEVERITIES:
            self.fail(
                fields["severity"][1], f"'severity' must be one of {', '.join(HEALTH_SEVERITIES)}, not {severity!r}"
            )
        enabled = base.enabled
        if "enabled" in fields:
            value = self.scalar(fields["enabled"][1])
            if not isinstance(value, bool):
                self.fail(fields["enabled"][1], "'enabled' must be true or false")
            enabled = value
        threshold = self.number(fields, "threshold", default=base.threshold)
        if "threshold" in fields:
            if check == "bad_pages_threshold" and not 0.0 < threshold <= 1.0:
                self.fail(
                    fields["threshold"][1],
                    "'threshold' of bad_pages_threshold is a ratio of the driver's threshold, above 0 and at most 1",
                )
            if check != "bad_pages_threshold" and threshold < 1:
                self.fail(fields["threshold"][1], "'threshold' must be at least 1 (a count)")
        window = self.duration(fields, "window", default=base.window_seconds)
        if "for" in fields:
            value = self.scalar(fields["for"][1])
            # `for: 0` fails at the first cycle the condition holds (a link down).
            for_seconds = (
                0.0 if value == 0 and not isinstance(value, bool) else self.duration(fields, "for", default=0.0)
            )
        else:
            for_seconds = base.for_seconds
        reasons = base.reasons
        if "reasons" in fields:
            node = fields["reasons"][1]
            if not isinstance(node, SequenceNode) or not node.value:
                self.fail(node, "'reasons' must be a list of throttle reasons (ppt0, temp_gpu, socket_thermal, ...)")
            names = [self.scalar(item) for item in node.value]
            for item, name in zip(node.value, names, strict=True):
                if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]+", name):
                    self.fail(item, f"a throttle reason is a lower-case name such as temp_gpu, not {name!r}")
            reasons = tuple(str(name) for name in names)
        return CheckThresholds(severity, enabled, threshold, window, for_seconds, reasons)

    def check_overrides(
        self, check: str, node: Node, values: CheckThresholds
    ) -> dict[tuple[str, str], CheckThresholds]:
        if not isinstance(node, MappingNode):
            self.fail(node, f"'asic_overrides' must map ASIC names to the keys of {check}")
        found: dict[tuple[str, str], CheckThresholds] = {}
        for key_node, value_node in node.value:
            asic = self.scalar(key_node)
            if not isinstance(asic, str) or asic not in ASICS:
                self.fail(key_node, f"unknown ASIC {asic!r} in 'asic_overrides'; known: {', '.join(ASICS)}")
            if (asic, check) in found:
                self.fail(key_node, f"ASIC {asic!r} appears twice in 'asic_overrides'")
            fields = self.mapping(value_node, f"the override of {check} for {asic}", allowed=self.check_keys(check))
            found[asic, check] = self.check_values(check, fields, values)
        return found

    # -- one rule --

    def rule(self, node: Node) -> Rule:
        fields = self.mapping(node, "a rule", allowed=_RULE_KEYS)
        alert = self.required_string(node, fields, "alert")
        if not _ALERT_NAME.match(alert):
            self.fail(
                fields["alert"][1], f"'alert' must be letters, digits and _ (not starting with a digit): {alert!r}"
            )
        metric = self.required_string(node, fields, "metric")
        if metric not in WATCHABLE:
            self.fail(fields["metric"][1], f"unknown metric {metric!r}; known: {', '.join(WATCHABLE)}")
        spec = WATCHABLE[metric]
        key = self.metric_key(node, fields, metric, spec)
        comparison = self.comparison(node, fields)
        threshold = self.required_number(node, fields, "threshold")
        for_seconds = self.duration(fields, "for", default=0.0)
        clear = self.number(fields, "clear_threshold", default=threshold)
        self.check_clear(_where(fields, ("clear_threshold", "threshold"), node), comparison, threshold, clear)
        severity = self.severity(fields, default="warning")
        templates = {name: self.template(fields, name) for name in _TEMPLATES}
        clock_down = self.action(fields, metric, for_seconds)
        window = self.string(fields, "window", default="")
        if window and window not in _WINDOW_STATS:
            self.fail(fields["window"][1], f"'window' must be one of {', '.join(_WINDOW_STATS)}, not {window!r}")
        if window and not spec.window_family:
            self.fail(fields["window"][1], f"metric {metric!r} has no sliding window to read")
        rule = Rule(
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
            window=window,
        )
        if "asic_overrides" in fields:
            rule = dataclasses.replace(rule, asic_overrides=self.asic_overrides(fields["asic_overrides"][1], rule))
        return rule

    def check_clear(self, node: Node, comparison: str, threshold: float, clear: float, where: str = "") -> None:
        if comparison in (">", ">=") and clear > threshold:
            self.fail(node, f"'clear_threshold'{where} must not be above 'threshold' for {comparison!r}")
        if comparison in ("<", "<=") and clear < threshold:
            self.fail(node, f"'clear_threshold'{where} must not be below 'threshold' for {comparison!r}")

    def severity(self, fields: dict[str, tuple[Node, Node]], default: str) -> str:
        severity = self.string(fields, "severity", default=default)
        if severity not in SEVERITIES:
            self.fail(fields["severity"][1], f"'severity' must be one of {', '.join(SEVERITIES)}, not {severity!r}")
        return severity

    def asic_overrides(self, node: Node, rule: Rule) -> tuple[tuple[str, Rule], ...]:
        """`asic_overrides: {aldebaran: {threshold: 90, clear_threshold: 85}}`: the rule's values for one ASIC."""
        if not isinstance(node, MappingNode):
            self.fail(node, "'asic_overrides' must map ASIC names to {threshold, clear_threshold, for, severity}")
        overrides: list[tuple[str, Rule]] = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            asic = self.scalar(key_node)
            if not isinstance(asic, str) or asic not in ASICS:
                self.fail(key_node, f"unknown ASIC {asic!r} in 'asic_overrides'; known: {', '.join(ASICS)}")
            if asic in seen:
                self.fail(key_node, f"ASIC {asic!r} appears twice in 'asic_overrides'")
            seen.add(asic)
            fields = self.mapping(value_node, f"the override for {asic}", allowed=_OVERRIDE_KEYS)
            threshold = self.number(fields, "threshold", default=rule.threshold)
            # A new threshold without a new clear_threshold keeps the rule's hysteresis width.
            clear = self.number(fields, "clear_threshold", default=threshold - (rule.threshold - rule.clear_threshold))
            where = _where(fields, ("clear_threshold", "threshold"), key_node)
            self.check_clear(where, rule.comparison, threshold, clear, where=f" of {asic}")
            for_seconds = self.duration(fields, "for", default=rule.for_seconds)
            clock_down = rule.clock_down
            if clock_down is not None and "for" in fields:
                # step_interval and restore_after default to the rule's `for`, as they do for the rule.
                step, restore = (
                    for_seconds if seconds == rule.for_seconds else seconds
                    for seconds in (clock_down.step_interval_seconds, clock_down.restore_after_seconds)
                )
                clock_down = dataclasses.replace(clock_down, step_interval_seconds=step, restore_after_seconds=restore)
            severity = self.severity(fields, default=rule.severity)
            override = dataclasses.replace(rule, threshold=threshold, clear_threshold=clear, severity=severity)
            overrides.append((asic, dataclasses.replace(override, for_seconds=for_seconds, clock_down=clock_down)))
        return tuple(overrides)

    def metric_key(self, node: Node, fields: dict[str, tuple[Node, Node]], metric: str, spec: Watchable) -> str | None:
        for label in _KEY_LABELS:
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
        text = COMPARISON_ALIASES.get(raw.strip(), raw.strip()) if isinstance(raw, str) else raw
        if not isinstance(text, str) or text not in COMPARISONS:
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
        # The restore advice after the alert clears stays until the device has been cool this long.
        restore_after = self.duration(action, "restore_after", default=for_seconds)
        return ClockDown(
            step_ratio=step,
            step_interval_seconds=interval,
            floor_ratio=floor,
            range_min_hertz=range_min_mhz * 1e6,
            restore_after_seconds=restore_after,
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
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ValueError(f"{value!r} is not a duration")
            # The one duration syntax of the exporter (flags, config file, rules): see config.parse_duration.
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(node, f"{name!r} must be a duration longer than zero such as 90s, 5m or 1.5h: {exc}")

    def template(self, fields: dict[str, tuple[Node, Node]], name: str) -> str:
        if name not in fields:
            return ""
        node = fields[name][1]
        text = self.string(fields, name, default="")
        try:
            placeholders = [(f, spec or "") for _, f, spec, _ in string.Formatter().parse(text) if f is not None]
        except ValueError as exc:
            self.fail(node, f"{name!r} is not a valid template: {exc}")
        for field_name, spec in placeholders:
            if "{" in spec:
                self.fail(node, f"{name!r}: a format spec may not hold another {{field}}: {{{field_name}:{spec}}}")
            for number in re.findall(r"\d+", spec):
                if int(number) > MAX_FORMAT_NUMBER:
                    self.fail(
                        node,
                        f"{name!r}: width or precision {int(number)} in {{{field_name}:{spec}}} is more than "
                        f"{MAX_FORMAT_NUMBER}",
                    )
        try:
            filled = text.format(**TEMPLATE_FIELDS)
        except KeyError as exc:
            self.fail(node, f"{name!r} uses unknown placeholder {{{exc.args[0]}}}; known: {', '.join(TEMPLATE_FIELDS)}")
        except (IndexError, ValueError, AttributeError, TypeError) as exc:
            self.fail(node, f"{name!r} is not a valid template: {exc}")
        if len(filled) > MAX_TEMPLATE_OUTPUT:
            self.fail(node, f"{name!r} fills to {len(filled)} characters: at most {MAX_TEMPLATE_OUTPUT} are accepted")
        return text
