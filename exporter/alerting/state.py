"""Evaluating rules: one pure step per poll cycle, a small state machine per (device, rule).

    evaluate(rules, previous alert states, snapshot) -> (new alert states, transitions)

Nothing here does I/O and nothing ever writes to a GPU: the clock-down action only produces a
suggestion (a ratio, a ceiling in Hz and the rocm-smi command an operator could run), which
exposition, the JSON API, the log and the Alertmanager pusher publish.

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
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from exporter.alerting.rules import ClockDown, Rule
from exporter.alerting.texts import clock_down_text, render_template, restore_text, setsrange_command
from exporter.model import AlertState, DeviceState, Snapshot

TransitionKind = Literal["pending", "firing", "resolved", "clock_down_step"]


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
    suggested_command: str = ""  # the command of `suggestion`, "" when it has none
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
            if self.suggested_command:
                fields["suggested_command"] = self.suggested_command
        return fields


def evaluate(
    rules: Sequence[Rule], previous: Iterable[AlertState], snapshot: Snapshot
) -> tuple[tuple[AlertState, ...], tuple[Transition, ...]]:
    """One pure step: (rules, the states after the last cycle, this cycle's snapshot) -> new states.

    Returns one AlertState per (device, rule) once the device has supplied the rule's metric —
    inactive states included, so `amdgpu_alert_firing` has a 0 series — sorted by (gpu, alert),
    and the transitions this cycle caused, in the same order. `snapshot.taken_at` is "now".
    """
    now = snapshot.taken_at
    by_key = {(state.device_key, state.alert): state for state in previous}
    configured = {rule.alert for rule in rules}
    smi_indices = rocm_smi_indices(snapshot.devices)
    states: dict[tuple[tuple[str, str, int], str], AlertState] = {}
    transitions: list[Transition] = []
    for device in snapshot.devices:
        for rule in rules:
            key = (device.identity.key, rule.alert)
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
    ordered = tuple(sorted(states.values(), key=lambda s: (s.gpu, s.alert, s.device_key)))
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
        old = AlertState(
            gpu=ctx.device.gpu,
            alert=rule.alert,
            severity=rule.severity,
            firing=False,
            since=now,
            device_key=ctx.device.identity.key,
        )
    state = dataclasses.replace(old, value=value, severity=rule.severity, gpu=ctx.device.gpu)
    if state.firing:
        if rule.clears(value):
            return _clear(ctx, state)
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


def _clear(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition]:
    restore = command = ""
    reference = state.reference_gfx_clock_max_hertz
    if ctx.rule.clock_down is not None and state.clock_down_ratio > 0 and reference is not None:
        min_mhz, max_mhz = _setsrange_mhz(ctx.rule.clock_down, reference)
        command = setsrange_command(ctx.smi_index, min_mhz, max_mhz)
        restore = restore_text(ctx.rule.alert, ctx.device.gpu, ctx.device.identity.pci_bus_id, max_mhz, command)
    resolved = dataclasses.replace(
        state,
        firing=False,
        since=ctx.now,
        pending_since=None,
        clock_down_ratio=0.0,
        suggested_gfx_clock_max_hertz=None,
        suggestion="",
        suggested_command="",
        reference_gfx_clock_max_hertz=None,
        clock_down_stepped_at=None,
    )
    return resolved, _transition(ctx, resolved, "resolved", suggestion=restore, command=command)


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
    command = ""
    max_mhz = 0
    floor_note = ""
    if reference is not None:
        min_mhz, max_mhz = _setsrange_mhz(action, reference * (1.0 - ratio))
        command = setsrange_command(ctx.smi_index, min_mhz, max_mhz)
        floor_note = " This is the floor: no further steps will be suggested." if action.at_floor(ratio) else ""
    reference_mhz = reference / 1e6 if reference is not None else None
    text = clock_down_text(subject, percent, reference_mhz, max_mhz, floor_note, command)
    extra = _rule_suggestion(ctx)
    if extra:
        text = f"{text}\n{extra}"
    return dataclasses.replace(
        state,
        clock_down_ratio=ratio,
        suggested_gfx_clock_max_hertz=suggested,
        suggestion=text,
        suggested_command=command,
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


def _transition(
    ctx: _Context, state: AlertState, kind: TransitionKind, suggestion: str | None = None, command: str | None = None
) -> Transition:
    return Transition(
        gpu=state.gpu,
        alert=state.alert,
        severity=state.severity,
        kind=kind,
        value=ctx.value,
        at=ctx.now,
        suggestion=state.suggestion if suggestion is None else suggestion,
        suggested_command=state.suggested_command if command is None else command,
        clock_down_ratio=state.clock_down_ratio,
        suggested_gfx_clock_max_hertz=state.suggested_gfx_clock_max_hertz,
    )
