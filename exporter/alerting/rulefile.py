"""Reading rule files: YAML text -> validated rules, every error naming the file and the line.

The YAML is composed into nodes (not loaded into dicts) so each message can point at its line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from exporter import safeyaml
from exporter.alerting.rules import COMPARISON_ALIASES, COMPARISONS, SEVERITIES, ClockDown, Rule
from exporter.alerting.texts import TEMPLATE_FIELDS
from exporter.alerting.watch import WATCHABLE, Watchable
from exporter.config import parse_duration

DEFAULT_RULES_RESOURCE = "default_rules.yaml"


class RulesConfigError(ValueError):
    """A rule file that cannot be used; the message names the file and the line."""


def default_rules() -> tuple[Rule, ...]:
    """The shipped rule set (exporter/alerting/default_rules.yaml, packaged with the module)."""
    text = resources.files("exporter.alerting").joinpath(DEFAULT_RULES_RESOURCE).read_text(encoding="utf-8")
    return parse_rules(text, DEFAULT_RULES_RESOURCE)


def load_rules(path: Path) -> tuple[Rule, ...]:
    """Read and validate a rule file; any problem is a RulesConfigError naming the file and line."""
    try:
        text = safeyaml.read_text(path, "rule file", "{path}: cannot read rule file: {error}")
    except safeyaml.YamlLimitError as exc:
        raise RulesConfigError(str(exc)) from exc
    return parse_rules(text, str(path))


def parse_rules(text: str, source: str = "rules.yaml") -> tuple[Rule, ...]:
    """Pure: YAML text -> rules. `source` is the file name used in error messages."""
    try:
        # Size, depth and alias limits first (a RecursionError or an alias bomb is no error message).
        safeyaml.check_limits(text, source)
    except safeyaml.YamlLimitError as exc:
        raise RulesConfigError(str(exc)) from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise RulesConfigError(f"{source}{line}: not valid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise RulesConfigError(f"{source}: not valid YAML: {exc}") from exc
    return _RuleFileParser(source).parse(root)


_ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
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
        if metric not in WATCHABLE:
            self.fail(fields["metric"][1], f"unknown metric {metric!r}; known: {', '.join(WATCHABLE)}")
        spec = WATCHABLE[metric]
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

    def metric_key(self, node: Node, fields: dict[str, tuple[Node, Node]], metric: str, spec: Watchable) -> str | None:
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
        text = COMPARISON_ALIASES.get(text, text) if isinstance(text, str) else text
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
            text.format(**TEMPLATE_FIELDS)
        except KeyError as exc:
            self.fail(
                node,
                f"{name!r} uses unknown placeholder {{{exc.args[0]}}}; known: {', '.join(TEMPLATE_FIELDS)}",
            )
        except (IndexError, ValueError, AttributeError, TypeError) as exc:
            self.fail(node, f"{name!r} is not a valid template: {exc}")
        return text
