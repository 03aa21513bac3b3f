"""Evaluating rules: one pure step per poll cycle, a small state machine per (device, rule).

    evaluate(rules, previous alert states, snapshot) -> (new alert states, transitions)

Nothing here does I/O and nothing ever writes to a GPU: the clock-down action only produces a
suggestion (a ceiling in Hz, its ratio to the gfx clock max, the command an operator could run and
the one command that undoes it), which exposition, the JSON API, the log and the pusher publish.

Semantics of one rule on one device:
- inactive -> pending when a sample breaches the threshold (straight to firing when `for` is 0).
- pending lasts until the value clears (hysteresis), so a sensor hovering around the threshold
  still fires; it fires at the first breaching sample once `for` has passed since it went pending.
- firing lasts until the value clears: 84..86 °C around an 85/80 rule never flaps the alert.
- clock_down: firing suggests a ceiling one step (step_ratio) below what the device does now (its
  current gfx clock); a further step comes only once that ceiling was applied (the device's gfx clock
  maximum reads at or below it), step_interval after the last one and with the value still
  breaching: one step below the lower of the clock and the ceiling, never below floor_ratio of the
  gfx clock max at firing (alerting/clockdown.py has the rules of the ceiling). A suggestion nobody
  applied is not stepped down again: it stays as it is until the alert clears.
- when a clock-down alert resolves, the suggestion becomes the restore advice (the undo command);
  it stays until the value has been on the cool side of clear_threshold for restore_after.
- a rule's asic_overrides give a device of that ASIC other thresholds and durations.
- a device that is down, gone, or does not supply the metric keeps its state unchanged: missing
  data neither resolves nor fires an alert. A device that left the snapshot (forgotten 10 minutes
  after it went, or a partition dropped by a mode change) takes its alerts with it, resolved.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from exporter.alerting.clockdown import Ceiling, next_ceiling, set_ceiling_command, undo_command
from exporter.alerting.rules import ClockDown, Rule
from exporter.alerting.texts import advice_fields, clock_down_text, render_template, restore_text
from exporter.model import AlertState, DeviceState, Snapshot

TransitionKind = Literal["pending", "firing", "resolved", "clock_down_step", "restore_advice_expired"]


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
    undo_command: str = ""  # the one command that undoes a suggested ceiling
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
            fields.update(advice_fields(self.suggestion, self.suggested_command, self.undo_command))
        return fields


def evaluate(
    rules: Sequence[Rule], previous: Iterable[AlertState], snapshot: Snapshot, tool: str = "rocm-smi"
) -> tuple[tuple[AlertState, ...], tuple[Transition, ...]]:
    """One pure step: (rules, the states after the last cycle, this cycle's snapshot) -> new states.

    Returns one AlertState per (device, rule) once the device has supplied the rule's metric —
    inactive states included, so `amdgpu_alert_firing` has a 0 series — sorted by (gpu, alert),
    and the transitions this cycle caused, in the same order. `snapshot.taken_at` is "now" for what is
    shown (`since`); every duration (`for`, clock-down steps, restore_after) is measured on
    `snapshot.monotonic_at`, so a step of the wall clock neither fires a rule early nor delays it.
    `tool` is what the clock-down commands are written for (clockdown.find_tool).
    """
    now, clock = snapshot.taken_at, snapshot.monotonic_at
    by_key = {(state.device_key, state.alert): state for state in previous}
    configured = {rule.alert for rule in rules}
    smi_indices = rocm_smi_indices(snapshot.devices)
    windows = {w.gpu: w for w in snapshot.windows.devices} if snapshot.windows is not None else {}
    states: dict[tuple[tuple[str, str, int], str], AlertState] = {}
    transitions: list[Transition] = []
    for device in snapshot.devices:
        sample = device.sample if device.up else None
        # Rules watching the same value read it once per device.
        values: dict[tuple[str, str | None, str], float | None] = {}
        for configured_rule in rules:
            rule = configured_rule.for_asic(device.identity.asic)
            key = (device.identity.key, rule.alert)  # an alert follows its device, not its index
            old = by_key.get(key)
            watched = (rule.metric, rule.key, rule.window)
            if watched not in values:
                values[watched] = rule.read(sample, windows.get(device.gpu)) if sample is not None else None
            value = values[watched]
            if value is None or (old is not None and _quiet(old, rule, value)):
                # No value (no change on missing data), or inactive and staying so: nothing to do (cost
                # in proportion to what fires).
                if old is not None:
                    states[key] = old
                continue
            context = _Context(rule, device, smi_indices.get(device.gpu, device.gpu), value, now, clock, tool)
            state, transition = _step(context, old)
            states[key] = state
            if transition is not None:
                transitions.append(transition)
    # A device in the snapshot without a value keeps its alerts as they were (no resolving on missing
    # data: a gone device stays in the snapshot, device_down, for known_devices.FORGET_GONE_AFTER_SECONDS).
    # A device no longer in the snapshot was forgotten, or dropped by a partition mode change: its
    # alerts end (a firing one resolves, and the pusher posts it resolved), as does every alert of a
    # rule no longer configured.
    present = {device.identity.key for device in snapshot.devices}
    for key, state in by_key.items():
        if key in states or state.alert not in configured:
            continue
        if key[0] in present:
            states[key] = state
        elif state.firing:
            transitions.append(_left(state, now))
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


def _quiet(old: AlertState, rule: Rule, value: float) -> bool:
    """Whether `old` is inactive, carries no advice, and `value` does not breach: the common case, kept
    as it is without building a new state (its `value` stays the one of its last change)."""
    if old.firing or old.pending_since is not None or old.cool_since is not None or rule.breaches(value):
        return False
    return old.severity == rule.severity


@dataclass(frozen=True, slots=True)
class _Context:
    rule: Rule
    device: DeviceState
    smi_index: int
    value: float
    now: float  # wall clock, unix seconds: what `since` shows
    clock: float  # monotonic seconds: what durations are measured on
    tool: str = "rocm-smi"

    @property
    def gfx_clock(self) -> float | None:
        return _gfx(self.device.sample.clocks_hertz if self.device.sample is not None else {})

    @property
    def gfx_levels(self) -> tuple[float, ...]:
        sample = self.device.sample
        return (sample.gfx_dpm_levels_hertz or ()) if sample is not None else ()

    @property
    def gfx_clock_max(self) -> float | None:
        return _gfx(self.device.sample.clocks_max_hertz if self.device.sample is not None else {})


def _gfx(clocks: Mapping[str, float]) -> float | None:
    """The gfx clock of a sample's clocks, when it is a real one."""
    hertz = clocks.get("gfx")
    return float(hertz) if hertz is not None and math.isfinite(hertz) and hertz > 0 else None


def _step(ctx: _Context, old: AlertState | None) -> tuple[AlertState, Transition | None]:
    rule, now, clock, value = ctx.rule, ctx.now, ctx.clock, ctx.value
    if old is None:  # a new state: inactive since now
        old = AlertState(ctx.device.gpu, rule.alert, rule.severity, False, now, device_key=ctx.device.identity.key)
    state = dataclasses.replace(old, value=value, severity=rule.severity, gpu=ctx.device.gpu)
    if state.firing:
        if rule.clears(value):
            return _clear(ctx, state)
        return _continue_firing(ctx, state)
    if state.pending_since is None:
        if not rule.breaches(value):
            return _cooling(ctx, state) if state.cool_since is not None else (state, None)
        if rule.for_seconds <= 0:
            return _fire(ctx, state)
        pending = dataclasses.replace(state, pending_since=clock, since=now, cool_since=state.cool_since and clock)
        return pending, _transition(ctx, pending, "pending")
    if rule.clears(value):
        # Cleared before it fired: back to inactive. Not a transition anyone is paged for.
        return dataclasses.replace(state, pending_since=None, since=now, cool_since=state.cool_since and clock), None
    if rule.breaches(value) and clock - state.pending_since >= rule.for_seconds:
        return _fire(ctx, state)
    return state, None


def _fire(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition]:
    fired = dataclasses.replace(state, firing=True, since=ctx.now, pending_since=None, cool_since=None)
    action = ctx.rule.clock_down
    if action is not None:
        reference = ctx.gfx_clock_max
        ceiling = _next_ceiling(ctx, action, previous=None, reference=reference)
        fired = _with_clock_down(ctx, fired, ceiling, reference, stepped_at=ctx.clock)
    else:
        fired = dataclasses.replace(fired, suggestion=_rule_suggestion(ctx), suggested_command="", undo_command="")
    return fired, _transition(ctx, fired, "firing")


def _continue_firing(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition | None]:
    action = ctx.rule.clock_down
    if action is None:
        return state, None
    previous, reference = state.suggested_gfx_clock_max_hertz, state.reference_gfx_clock_max_hertz
    if previous is None:
        # No ceiling could be given when it fired (no clock known yet); try again now.
        reference = reference if reference is not None else ctx.gfx_clock_max
    else:
        last_step = state.clock_down_stepped_at if state.clock_down_stepped_at is not None else ctx.clock
        if not ctx.rule.breaches(ctx.value) or ctx.clock - last_step < action.step_interval_seconds:
            return state, None
        if not _ceiling_applied(ctx, previous):
            # Nobody set the ceiling advised: a lower one would only be another unapplied suggestion.
            return state, None
    ceiling = _next_ceiling(ctx, action, previous=previous, reference=reference)
    if ceiling is None or (previous is not None and ceiling.mhz * 1e6 >= previous):
        return state, None  # at the floor: nothing lower to suggest
    stepped = _with_clock_down(ctx, state, ceiling, reference, ctx.clock)
    return stepped, _transition(ctx, stepped, "clock_down_step")


# How far above a suggested ceiling the device's gfx clock maximum may read and still count as set
# to it: the tools take whole MHz, the kernel prints whole MHz.
APPLIED_TOLERANCE_HERTZ = 1e6


def _ceiling_applied(ctx: _Context, suggested: float) -> bool:
    """Whether the device's gfx clock ceiling (its observed maximum, the top of pp_dpm_sclk) is at or
    below the ceiling suggested: the only sign that someone applied it."""
    observed = ctx.gfx_clock_max
    return observed is not None and observed <= suggested + APPLIED_TOLERANCE_HERTZ


def _clear(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition]:
    restore = undo = ""
    if ctx.rule.clock_down is not None and state.undo_command:
        undo = state.undo_command
        restore = restore_text(ctx.rule.alert, ctx.device.gpu, ctx.device.identity.pci_bus_id, undo)
    resolved = dataclasses.replace(
        state,
        firing=False,
        since=ctx.now,
        pending_since=None,
        clock_down_ratio=0.0,
        suggested_gfx_clock_max_hertz=None,
        # The restore advice stays (API, push) until the device has been cool for restore_after.
        suggestion=restore,
        suggested_command=undo,
        undo_command=undo,
        cool_since=ctx.clock if undo else None,
        reference_gfx_clock_max_hertz=None,
        clock_down_stepped_at=None,
    )
    return resolved, _transition(ctx, resolved, "resolved")


def _cooling(ctx: _Context, state: AlertState) -> tuple[AlertState, Transition | None]:
    """After a clock-down alert resolved: keep the restore advice until the device has stayed on the
    cool side of the clear threshold for restore_after; any warmer sample restarts that time."""
    action = ctx.rule.clock_down
    assert state.cool_since is not None
    if not ctx.rule.clears(ctx.value):
        return dataclasses.replace(state, cool_since=ctx.clock), None
    hold = action.restore_after_seconds if action is not None else 0.0
    if ctx.clock - state.cool_since < hold:
        return state, None
    expired = dataclasses.replace(state, suggestion="", suggested_command="", undo_command="", cool_since=None)
    return expired, _transition(ctx, expired, "restore_advice_expired", suggestion=state.suggestion)


def _next_ceiling(ctx: _Context, action: ClockDown, previous: float | None, reference: float | None) -> Ceiling | None:
    # What the device does now: its gfx clock, never above the ceiling it holds (one set lower than
    # the suggestion is where the next step starts).
    held = [h for h in (ctx.gfx_clock, ctx.gfx_clock_max if previous is not None else None) if h is not None]
    return next_ceiling(
        current_hertz=min(held) if held else None,
        previous_ceiling_hertz=previous,
        max_hertz=reference,
        levels_hertz=ctx.gfx_levels,
        step_ratio=action.step_ratio,
        floor_ratio=action.floor_ratio,
    )


def _with_clock_down(
    ctx: _Context, state: AlertState, ceiling: Ceiling | None, reference: float | None, stepped_at: float | None
) -> AlertState:
    action = ctx.rule.clock_down
    assert action is not None
    device = ctx.device
    identity = device.identity
    subject = f"the gfx clock ceiling of GPU {device.gpu} ({identity.pci_bus_id})"
    command = undo = ""
    suggested: float | None = None
    ratio = 0.0
    if ceiling is not None:
        suggested = ceiling.mhz * 1e6
        ratio = max(0.0, 1.0 - suggested / reference) if reference else 0.0
        min_mhz = min(int(action.range_min_hertz // 1e6), ceiling.mhz)
        command = set_ceiling_command(ctx.tool, ctx.smi_index, identity.pci_bus_id, min_mhz, ceiling.mhz)
        undo = undo_command(ctx.tool, ctx.smi_index, identity.pci_bus_id)
    text = clock_down_text(
        subject,
        current_mhz=ctx.gfx_clock / 1e6 if ctx.gfx_clock is not None else None,
        max_mhz=reference / 1e6 if reference is not None else None,
        ceiling=ceiling,
        command=command,
        undo=undo,
    )
    extra = _rule_suggestion(ctx)
    text = f"{text}\n{extra}" if extra else text
    return dataclasses.replace(
        state,
        clock_down_ratio=round(ratio, 9),
        suggested_gfx_clock_max_hertz=suggested,
        suggestion=text,
        suggested_command=command,
        undo_command=undo,
        reference_gfx_clock_max_hertz=reference,
        clock_down_stepped_at=stepped_at,
    )


def _rule_suggestion(ctx: _Context) -> str:
    if not ctx.rule.suggestion:
        return ""
    return render_template(ctx.rule.suggestion, ctx.rule, ctx.device, ctx.value, ctx.smi_index)


def _left(state: AlertState, now: float) -> Transition:
    """The alert of a device that left the snapshot, resolved."""
    return Transition(gpu=state.gpu, alert=state.alert, severity=state.severity, kind="resolved", value=None, at=now)


def _transition(ctx: _Context, state: AlertState, kind: TransitionKind, suggestion: str | None = None) -> Transition:
    return Transition(
        gpu=state.gpu,
        alert=state.alert,
        severity=state.severity,
        kind=kind,
        value=ctx.value,
        at=ctx.now,
        suggestion=state.suggestion if suggestion is None else suggestion,
        suggested_command=state.suggested_command,
        undo_command=state.undo_command,
        clock_down_ratio=state.clock_down_ratio,
        suggested_gfx_clock_max_hertz=state.suggested_gfx_clock_max_hertz,
    )
