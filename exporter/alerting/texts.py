"""Text for people: rule templates, alert annotations, and the clock-down suggestions and their commands.

A suggestion is always only a suggestion: the exporter never changes a GPU setting. The command of
a suggestion is built here once and travels as its own field (AlertState.suggested_command), never
parsed back out of the sentence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from exporter.alerting.clockdown import Ceiling
from exporter.alerting.rules import Rule
from exporter.alerting.watch import WATCHABLE
from exporter.config import format_duration
from exporter.model import AlertState, DeviceState

SUGGESTION_PREFIX = "Suggestion only (the exporter never changes the GPU): "
COMMAND_MARKER = "Command: "
UNDO_MARKER = "Undo: "
ADVICE = ("suggestion", "suggested_command", "undo_command")  # the advice fields of an alert, in order
# The most characters a filled summary / description / suggestion template may have (rule files are
# rejected at load when one can be longer: a `{value:>200000000}` would cost 200 MB every cycle).
MAX_TEMPLATE_OUTPUT = 2000

# Every placeholder a summary / description / suggestion template may use, with a sample value of
# the right type so templates are checked at load time rather than when an alert first fires.
TEMPLATE_FIELDS: Mapping[str, Any] = {
    "gpu": 0,
    "node": "gpu-node-1",
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


def advice_fields(suggestion: str, command: str, undo: str) -> dict[str, str]:
    """An alert's advice as annotations or log fields, each only when there is one."""
    return {name: text for name, text in zip(ADVICE, (suggestion, command, undo), strict=True) if text}


def clock_down_text(
    subject: str, *, current_mhz: float | None, max_mhz: float | None, ceiling: Ceiling | None, command: str, undo: str
) -> str:
    """The sentence of a clock-down suggestion; without a ceiling it says why none is given."""
    doing = f"it runs at {current_mhz:.0f} MHz" if current_mhz is not None else "its current clock is not known"
    of_max = f" of {max_mhz:.0f} MHz maximum" if max_mhz is not None else ""
    if ceiling is None or not command:
        return (
            f"{SUGGESTION_PREFIX}{subject}: {doing}{of_max}; no lower ceiling can be suggested "
            "(at the rule's floor, or the clock is not known yet). Look at the cooling."
        )
    floor_note = " This is the floor: no lower ceiling will be suggested." if ceiling.at_floor else ""
    return (
        f"{SUGGESTION_PREFIX}lower {subject} to {ceiling.mhz} MHz ({doing}{of_max}).{floor_note} "
        f"{COMMAND_MARKER}{command} {UNDO_MARKER}{undo}"
    )


def restore_text(alert: str, gpu: int, pci_bus_id: str, undo: str) -> str:
    """The sentence suggesting to restore the gfx clock when a clock-down alert clears."""
    return (
        f"{SUGGESTION_PREFIX}{alert} cleared on GPU {gpu} ({pci_bus_id}); "
        f"if you lowered its gfx clock ceiling, restore the default clocks. {COMMAND_MARKER}{undo}"
    )


def render_template(
    template: str,
    rule: Rule,
    device: DeviceState | None,
    value: float | None,
    smi_index: int | None = None,
    node: str = "",
) -> str:
    """Fill a summary / description / suggestion template (validated at load time)."""
    spec = WATCHABLE[rule.metric]
    gpu = device.gpu if device is not None else -1
    fields: dict[str, Any] = dict(TEMPLATE_FIELDS)
    fields.update(
        gpu=gpu,
        node=node,
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
        text = template.format(**fields)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError):
        # Validated at load; a value of an unexpected type must still never break a cycle.
        return template[:MAX_TEMPLATE_OUTPUT]
    # Widths are bounded at load (rulefile.py); a long value is cut rather than sent whole.
    return text[:MAX_TEMPLATE_OUTPUT]


def alert_annotations(
    rule: Rule | None, state: AlertState, device: DeviceState | None, node: str = ""
) -> dict[str, str]:
    """summary / description / suggestion / suggested_command / undo_command for an alert (Alertmanager
    annotations); the default texts name the node (when given) and the device."""
    on_node = " on {node}" if node else ""
    if rule is None:
        where = f" on {node}" if node else ""
        summary = f"{state.alert} on GPU {state.gpu}{where}"
        description = f"{state.alert} ({state.severity}) on GPU {state.gpu}{where}; last value {state.value}."
    else:
        key = f"{{{WATCHABLE[rule.metric].key_label}={rule.key}}}" if rule.key else ""
        default_summary = (
            "GPU {gpu}" + on_node + ": {alert} ({metric}" + key + " {value:.4g}{unit} {comparison} {threshold:g}{unit})"
        )
        default_description = (
            "{metric}" + key + " of GPU {gpu} ({pci_bus_id})" + on_node + " is {value:.4g}{unit}: "
            "{comparison} {threshold:g}{unit} for {for} or more; it clears past {clear_threshold:g}{unit}."
        )
        summary = render_template(rule.summary or default_summary, rule, device, state.value, node=node)
        description = render_template(rule.description or default_description, rule, device, state.value, node=node)
    advice = advice_fields(state.suggestion, state.suggested_command, state.undo_command)
    return {"summary": summary, "description": description, **advice}
