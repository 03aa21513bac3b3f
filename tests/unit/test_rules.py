"""In-daemon alert rules: loading/validation and the pure evaluation step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.alerting.rulefile import (
    MAX_FILE_BYTES,
    MAX_RULES,
    RulesConfigError,
    default_rule_file,
    load_rules,
    parse_rule_file,
)
from exporter.alerting.rules import ASICS, ClockDown, Rule
from exporter.alerting.state import Transition, evaluate, rocm_smi_indices
from exporter.alerting.texts import alert_annotations
from exporter.config import format_duration
from exporter.model import (
    AlertState,
    DeviceIdentity,
    DeviceState,
    DeviceWindow,
    Sample,
    Snapshot,
    WindowSnapshot,
    WindowStat,
    frozen_map,
)

MHZ = 1e6
GFX_MAX = 1700 * MHZ  # MI250X


def device(
    gpu: int = 0,
    junction: float | None = 60.0,
    up: bool = True,
    card: str | None = None,
    gfx_max: float | None = GFX_MAX,
    **sample_fields: object,
) -> DeviceState:
    identity = DeviceIdentity(
        pci_bus_id=f"0000:{0xC1 + gpu:02x}:00.0",
        card=card if card is not None else f"card{gpu}",
        device_dir=f"/sys/devices/pci0000:00/0000:{0xC1 + gpu:02x}:00.0",
        serial=f"SN{gpu}",
        product="AMD Instinct MI250X",
    )
    temperatures = {"edge": 50.0}
    if junction is not None:
        temperatures["junction"] = junction
    sample = Sample(
        timestamp=0.0,
        temperatures=frozen_map(temperatures),
        clocks_max_hertz=frozen_map({"gfx": gfx_max} if gfx_max is not None else {}),
        **sample_fields,  # type: ignore[arg-type]
    )
    return DeviceState(identity=identity, gpu=gpu, sample=sample, up=up)


def snap(at: float, *devices: DeviceState) -> Snapshot:
    return Snapshot(taken_at=at, monotonic_at=at, devices=tuple(devices))


class Run:
    """Feeds snapshots through evaluate() the way the poller does, keeping the states."""

    def __init__(self, rules: tuple[Rule, ...] | None = None) -> None:
        self.rules = rules if rules is not None else default_rule_file().rules
        self.states: tuple[AlertState, ...] = ()
        self.transitions: list[Transition] = []

    def feed(self, snapshot: Snapshot) -> tuple[Transition, ...]:
        self.states, transitions = evaluate(self.rules, self.states, snapshot)
        self.transitions.extend(transitions)
        return transitions

    def junction(self, at: float, celsius: float | None, **kwargs: object) -> tuple[Transition, ...]:
        return self.feed(snap(at, device(junction=celsius, **kwargs)))  # type: ignore[arg-type]

    def applied(self, at: float, celsius: float | None, **kwargs: object) -> tuple[Transition, ...]:
        """A sample from a device whose operator applied every ceiling suggested so far: its gfx clock
        maximum reads as the last suggested ceiling."""
        suggested = [s.suggested_gfx_clock_max_hertz for s in self.states if s.gpu == 0]
        kwargs.setdefault("gfx_max", suggested[0] if suggested and suggested[0] is not None else GFX_MAX)
        return self.junction(at, celsius, **kwargs)

    def state(self, gpu: int = 0) -> AlertState:
        (found,) = [s for s in self.states if s.gpu == gpu]
        return found

    def kinds(self) -> list[str]:
        return [t.kind for t in self.transitions]


# --- the shipped default ------------------------------------------------------------------------


def test_default_rule_is_the_thermal_clock_down_rule() -> None:
    (rule,) = default_rule_file().rules
    assert (rule.metric, rule.key, rule.comparison) == ("temperature_celsius", "junction", ">")
    assert (rule.threshold, rule.clear_threshold) == (85.0, 80.0)
    assert rule.for_seconds == 60.0
    assert rule.clock_down == ClockDown(
        step_ratio=0.05, step_interval_seconds=60.0, floor_ratio=0.75, range_min_hertz=500 * MHZ
    )


# --- for-duration -----------------------------------------------------------------------------


def test_cool_device_gets_an_inactive_state_and_no_transition() -> None:
    run = Run()
    assert run.junction(0, 60.0) == ()
    state = run.state()
    assert (state.firing, state.pending_since, state.value, state.clock_down_ratio) == (False, None, 60.0, 0.0)
    assert state.suggested_gfx_clock_max_hertz is None and state.suggestion == ""


@pytest.mark.parametrize("wall_step", [3600.0, -7200.0])
def test_a_wall_clock_step_neither_fires_early_nor_delays(wall_step: float) -> None:
    run = Run()
    hot = device(junction=90.0)
    run.feed(Snapshot(taken_at=1000.0, monotonic_at=50.0, devices=(hot,)))  # pending
    # The wall clock steps by an hour (or back by two) two seconds later; the monotonic clock does not.
    assert run.feed(Snapshot(taken_at=1002.0 + wall_step, monotonic_at=52.0, devices=(hot,))) == ()
    assert not run.state().firing
    assert run.feed(Snapshot(taken_at=1059.0 + wall_step, monotonic_at=109.0, devices=(hot,))) == ()
    (firing,) = run.feed(Snapshot(taken_at=1060.0 + wall_step, monotonic_at=110.0, devices=(hot,)))
    assert firing.kind == "firing" and firing.at == 1060.0 + wall_step  # shown on the wall clock


def test_fires_only_after_the_for_duration() -> None:
    run = Run()
    run.junction(0, 70.0)
    (pending,) = run.junction(10, 86.0)
    assert (pending.kind, pending.at, pending.value) == ("pending", 10, 86.0)
    assert run.state().pending_since == 10 and not run.state().firing
    for t in range(11, 70):
        assert run.junction(t, 86.0) == ()
        assert not run.state().firing
    (firing,) = run.junction(70, 87.0)
    assert firing.kind == "firing" and firing.value == 87.0
    state = run.state()
    assert state.firing and state.since == 70 and state.pending_since is None
    assert state.clock_down_ratio == pytest.approx(0.05)
    assert state.suggested_gfx_clock_max_hertz == pytest.approx(1615 * MHZ)
    assert state.suggested_command == "rocm-smi -d 0 --autorespond yes --setsrange 500 1615"
    assert state.undo_command == "rocm-smi -d 0 --resetclocks"
    assert state.suggestion.startswith("Suggestion only")
    assert firing.suggestion == state.suggestion


def test_pending_fires_at_first_breaching_sample_after_for_not_in_the_band() -> None:
    run = Run()
    run.junction(0, 86.0)
    run.junction(30, 83.0)  # in the hysteresis band: still pending, not cleared
    assert run.state().pending_since == 0
    assert run.junction(61, 84.0) == ()  # for has passed, but 84 does not breach
    assert not run.state().firing
    (firing,) = run.junction(62, 85.5)
    assert firing.kind == "firing"


def test_pending_that_clears_goes_back_to_inactive_silently() -> None:
    run = Run()
    run.junction(0, 86.0)
    assert run.junction(20, 79.0) == ()
    assert run.state().pending_since is None and not run.state().firing
    run.junction(30, 86.0)  # pending again, from 30
    assert run.junction(80, 86.0) == ()
    assert run.junction(90, 86.0)[0].kind == "firing"
    assert run.kinds() == ["pending", "pending", "firing"]


def test_zero_for_fires_on_the_first_breach() -> None:
    rules = parse_rule_file(
        'rules:\n  - {alert: Hot, metric: temperature_celsius, sensor: junction, comparison: ">", threshold: 85}\n'
    ).rules
    run = Run(rules)
    run.junction(0, 80.0)
    (firing,) = run.junction(1, 90.0)
    assert firing.kind == "firing" and run.state().suggestion == ""
    # No hysteresis configured: clear_threshold = threshold, so 84 clears.
    assert run.junction(2, 84.0)[0].kind == "resolved"


# --- hysteresis, steps, floor, clear -------------------------------------------------------------


def fire(run: Run, at: float = 0.0, celsius: float = 90.0) -> None:
    run.junction(at, celsius)
    run.junction(at + 60, celsius)
    assert run.state().firing


def test_flapping_between_84_and_86_does_not_flap_the_alert() -> None:
    run = Run()
    fire(run)
    run.transitions.clear()
    for i in range(1, 600):
        run.applied(60 + i, 86.0 if i % 2 else 84.0)
        assert run.state().firing
    assert set(run.kinds()) == {"clock_down_step"}


def test_steps_five_percent_each_period_while_hot_up_to_the_floor() -> None:
    run = Run()
    fire(run)  # fired at 60 with the first 5 % step
    ratios = [run.state().clock_down_ratio]
    ceilings = [run.state().suggested_gfx_clock_max_hertz]
    for t in range(61, 60 + 60 * 10):
        for transition in run.applied(t, 90.0):
            assert transition.kind == "clock_down_step"
            assert (t - 60) % 60 == 0, "a step comes one step_interval after the last one"
            ratios.append(run.state().clock_down_ratio)
            ceilings.append(run.state().suggested_gfx_clock_max_hertz)
    # Each step takes 5 % off the ceiling advised before (the clock is not known here), whole MHz,
    # until the floor (75 % of 1700 MHz = 1275 MHz) stops it.
    assert ceilings == [1615 * MHZ, 1534 * MHZ, 1457 * MHZ, 1384 * MHZ, 1314 * MHZ, 1275 * MHZ]
    assert ratios == pytest.approx([1 - c / GFX_MAX for c in ceilings])
    assert run.state().suggested_command == "rocm-smi -d 0 --autorespond yes --setsrange 500 1275"
    assert "floor" in run.state().suggestion


def test_no_step_while_in_the_hysteresis_band() -> None:
    run = Run()
    fire(run)
    for t in range(61, 400):
        assert run.applied(t, 82.0) == ()
    assert run.state().clock_down_ratio == pytest.approx(0.05)
    # Hot again: the step is overdue, so it comes at once, and then one interval later.
    assert [t.kind for t in run.applied(400, 86.0)] == ["clock_down_step"]
    assert run.applied(459, 86.0) == ()
    assert [t.kind for t in run.applied(460, 86.0)] == ["clock_down_step"]


def test_steps_start_from_what_the_device_does_now_never_above_it() -> None:
    run = Run()
    # The hot GPU already holds 1630 MHz by itself (the firmware throttles): 5 % off that, not off 1700.
    run.junction(0, 90.0, clocks_hertz=frozen_map({"gfx": 1630 * MHZ}))
    run.junction(60, 90.0, clocks_hertz=frozen_map({"gfx": 1630 * MHZ}))
    state = run.state()
    assert state.suggested_gfx_clock_max_hertz == 1548 * MHZ
    assert state.clock_down_ratio == pytest.approx(1 - 1548 / 1700)
    # Applied, and it has throttled further to 1400 MHz by the next step: the step starts there.
    run.applied(120, 90.0, clocks_hertz=frozen_map({"gfx": 1400 * MHZ}))
    assert run.state().suggested_gfx_clock_max_hertz == 1330 * MHZ
    # Applied, the clock reads 1600 MHz: never above the ceiling advised before.
    run.applied(180, 90.0, clocks_hertz=frozen_map({"gfx": 1600 * MHZ}))
    assert run.state().suggested_gfx_clock_max_hertz == 1275 * MHZ  # 1263 is below the 75 % floor
    assert run.state().reference_gfx_clock_max_hertz == GFX_MAX


def test_a_suggestion_nobody_applied_is_not_stepped_down_again() -> None:
    run = Run()
    hot = frozen_map({"gfx": 1643 * MHZ})
    run.junction(0, 90.0, clocks_hertz=hot)
    run.junction(60, 90.0, clocks_hertz=hot)
    assert run.state().suggested_gfx_clock_max_hertz == 1560 * MHZ
    # Ten minutes hot with the ceiling still at 1700 MHz: the same suggestion, no step.
    for t in range(61, 660):
        assert run.junction(t, 90.0, clocks_hertz=hot) == ()
    assert run.state().suggested_gfx_clock_max_hertz == 1560 * MHZ
    assert run.state().suggested_command.endswith("--setsrange 500 1560")
    # A ceiling lowered only part of the way (1600 MHz) is not the suggestion applied either.
    assert run.junction(660, 90.0, clocks_hertz=hot, gfx_max=1600 * MHZ) == ()
    # Applied (the maximum reads 1560 MHz; the clock follows): the next step at once, from there.
    (step,) = run.junction(661, 90.0, clocks_hertz=frozen_map({"gfx": 1560 * MHZ}), gfx_max=1560 * MHZ)
    assert step.kind == "clock_down_step" and step.suggested_gfx_clock_max_hertz == 1482 * MHZ
    # The ratio is still against the maximum at firing, not against the applied ceiling.
    assert run.state().clock_down_ratio == pytest.approx(1 - 1482 / 1700)
    # An operator who set a lower ceiling than suggested (1400 MHz): the next step starts there.
    (step,) = run.junction(721, 90.0, clocks_hertz=frozen_map({"gfx": 1400 * MHZ}), gfx_max=1400 * MHZ)
    assert step.suggested_gfx_clock_max_hertz == 1330 * MHZ


def test_a_device_already_below_the_floor_gets_no_lower_ceiling() -> None:
    run = Run()
    run.junction(0, 90.0, clocks_hertz=frozen_map({"gfx": 1100 * MHZ}))
    run.junction(60, 90.0, clocks_hertz=frozen_map({"gfx": 1100 * MHZ}))
    state = run.state()
    assert state.firing and state.suggested_gfx_clock_max_hertz is None and state.suggested_command == ""
    assert "no lower ceiling" in state.suggestion


def test_a_discrete_dpm_table_snaps_to_a_real_level() -> None:
    levels = tuple(mhz * MHZ for mhz in (500, 800, 1100, 1300, 1450, 1550, 1700))
    run = Run()
    run.junction(0, 90.0, gfx_dpm_levels_hertz=levels)
    run.junction(60, 90.0, gfx_dpm_levels_hertz=levels)
    assert run.state().suggested_gfx_clock_max_hertz == 1550 * MHZ  # 1615 is no level: the one below
    run.applied(120, 90.0, gfx_dpm_levels_hertz=levels)
    assert run.state().suggested_gfx_clock_max_hertz == 1450 * MHZ
    run.applied(180, 90.0, gfx_dpm_levels_hertz=levels)
    # 1377 is below 1450; 1300 is above the 1275 floor
    assert run.state().suggested_gfx_clock_max_hertz == 1300 * MHZ
    assert "floor" in run.state().suggestion
    assert run.applied(240, 90.0, gfx_dpm_levels_hertz=levels) == ()  # no real level left above the floor


def test_unknown_clock_max_gives_a_ratio_without_command_until_it_is_known() -> None:
    run = Run()
    run.junction(0, 90.0, gfx_max=None)
    run.junction(60, 90.0, gfx_max=None)
    state = run.state()
    assert state.firing and state.clock_down_ratio == 0.0
    assert state.suggested_gfx_clock_max_hertz is None
    assert state.suggested_command == ""
    (step,) = run.junction(61, 90.0)
    assert step.kind == "clock_down_step"
    assert run.state().suggested_gfx_clock_max_hertz == pytest.approx(1615 * MHZ)
    assert run.state().clock_down_ratio == pytest.approx(0.05)
    assert run.state().suggested_command == "rocm-smi -d 0 --autorespond yes --setsrange 500 1615"


def test_clears_only_below_80_and_suggests_restoring() -> None:
    run = Run()
    fire(run)
    run.applied(120, 90.0)  # second step
    assert run.junction(121, 80.0) == ()
    assert run.state().firing
    (resolved,) = run.junction(122, 79.9)
    assert resolved.kind == "resolved" and resolved.value == 79.9 and resolved.at == 122
    # The one undo command, the same the firing suggestion named.
    assert resolved.suggested_command == "rocm-smi -d 0 --resetclocks"
    state = run.state()
    assert not state.firing and state.since == 122
    assert state.clock_down_ratio == 0.0 and state.suggested_gfx_clock_max_hertz is None
    assert state.reference_gfx_clock_max_hertz is None
    # The restore advice stays until the device has been cool (below 80 °C) for restore_after (the
    # rule's `for`, 60 s); a warmer sample restarts that time.
    assert state.undo_command == "rocm-smi -d 0 --resetclocks" and "restore" in state.suggestion
    assert run.junction(150, 79.0) == ()
    assert run.junction(160, 82.0) == ()  # not cool: the 60 s start again
    assert run.junction(200, 70.0) == () and run.state().undo_command
    (expired,) = run.junction(221, 70.0)
    assert expired.kind == "restore_advice_expired"
    assert run.state().suggestion == "" and run.state().undo_command == "" and run.state().cool_since is None
    # It can fire again later, starting from one step.
    fire(run, at=300)
    assert run.state().clock_down_ratio == pytest.approx(0.05)
    assert run.kinds() == [
        "pending", "firing", "clock_down_step", "resolved", "restore_advice_expired", "pending", "firing"
    ]  # fmt: skip


# --- missing data ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(lambda at: snap(at, device(junction=95.0, up=False)), id="device-down"),
        pytest.param(lambda at: snap(at, device(junction=None)), id="no-junction-sensor"),
        pytest.param(lambda at: snap(at, dataclasses.replace(device(up=False), present=False)), id="device-gone"),
        pytest.param(lambda at: snap(at, dataclasses.replace(device(), sample=None)), id="no-sample"),
    ],
)
def test_missing_data_neither_resolves_nor_fires(missing: Callable[[float], Snapshot]) -> None:
    firing = Run()
    fire(firing)
    before = firing.state()
    for at in range(61, 500):
        assert firing.feed(missing(at)) == ()
    assert firing.state() == before

    pending = Run()
    pending.junction(0, 90.0)
    before = pending.state()
    for at in range(1, 500):
        assert pending.feed(missing(at)) == ()
    assert pending.state() == before

    never_seen = Run()
    assert never_seen.feed(missing(0)) == () and never_seen.states == ()


def test_devices_are_independent_and_states_sorted() -> None:
    run = Run()
    run.feed(snap(0, device(2, 90.0), device(0, 60.0), device(1, 90.0)))
    transitions = run.feed(snap(60, device(2, 90.0), device(0, 60.0), device(1, 90.0)))
    assert [(t.gpu, t.kind) for t in transitions] == [(1, "firing"), (2, "firing")]
    assert [s.gpu for s in run.states] == [0, 1, 2]
    assert [s.firing for s in run.states] == [False, True, True]


def test_rule_removed_from_config_drops_its_states() -> None:
    run = Run()
    fire(run)
    states, transitions = evaluate((), run.states, snap(100, device(junction=90.0)))
    assert states == () and transitions == ()


def test_command_uses_rocm_smi_card_order_not_pci_order() -> None:
    devices = [device(0, card="card3"), device(1, card="card1"), device(2, card="card2")]
    assert rocm_smi_indices(devices) == {0: 2, 1: 0, 2: 1}
    run = Run()
    run.feed(snap(0, *[dataclasses.replace(d, sample=device(d.gpu, 90.0).sample) for d in devices]))
    run.feed(snap(60, *[dataclasses.replace(d, sample=device(d.gpu, 90.0).sample) for d in devices]))
    commands = {s.gpu: s.suggested_command for s in run.states}
    assert commands[0] == "rocm-smi -d 2 --autorespond yes --setsrange 500 1615"
    assert commands[1] == "rocm-smi -d 0 --autorespond yes --setsrange 500 1615"


def test_below_comparison_and_other_metrics() -> None:
    rules = parse_rule_file(
        """
rules:
  - alert: GpuIdle
    metric: busy_ratio
    engine: gfx
    comparison: "<"
    threshold: 0.05
    clear_threshold: 0.2
    for: 2m
    severity: info
    suggestion: "Check the job on GPU {gpu} (rocm-smi index {smi_index})."
  - alert: VramNearlyFull
    metric: memory_used_ratio
    pool: vram
    comparison: ">="
    threshold: 0.95
    severity: critical
"""
    ).rules
    run = Run(rules)

    def dev(busy: float, used: float) -> DeviceState:
        return device(
            busy=frozen_map({"gfx": busy}),
            memory_used_bytes=frozen_map({"vram": used}),
            memory_total_bytes=frozen_map({"vram": 100.0}),
        )

    run.feed(snap(0, dev(0.01, 95.0)))
    run.feed(snap(60, dev(0.1, 50.0)))  # idle still pending (band); VRAM cleared (no hysteresis)
    run.feed(snap(120, dev(0.01, 50.0)))
    by_alert = {s.alert: s for s in run.states}
    assert by_alert["GpuIdle"].firing and by_alert["GpuIdle"].severity == "info"
    assert by_alert["GpuIdle"].suggestion == "Check the job on GPU 0 (rocm-smi index 0)."
    assert not by_alert["VramNearlyFull"].firing
    assert [(t.alert, t.kind) for t in run.transitions] == [
        ("GpuIdle", "pending"),
        ("VramNearlyFull", "firing"),
        ("VramNearlyFull", "resolved"),
        ("GpuIdle", "firing"),
    ]
    run.feed(snap(121, dev(0.21, 50.0)))
    assert not {s.alert: s for s in run.states}["GpuIdle"].firing


def test_log_fields_and_annotations() -> None:
    run = Run()
    fire(run)
    (transition,) = [t for t in run.transitions if t.kind == "firing"]
    fields = transition.log_fields()
    assert fields["transition"] == "firing" and fields["gpu"] == 0
    assert fields["suggested_command"] == "rocm-smi -d 0 --autorespond yes --setsrange 500 1615"
    assert fields["clock_down_ratio"] == pytest.approx(0.05)
    (rule,) = run.rules
    annotations = alert_annotations(rule, run.state(), device(), node="gpu-node-7")
    assert annotations["summary"] == "GPU 0 (0000:c1:00.0) on gpu-node-7: junction temperature 90.0 °C is above 85 °C"
    assert "gpu-node-7" in annotations["description"]
    assert annotations["undo_command"] == "rocm-smi -d 0 --resetclocks"
    assert "0000:c1:00.0" in annotations["description"] and "1m" in annotations["description"]
    assert annotations["suggestion"] == run.state().suggestion


# --- property: the suggestion is always bounded --------------------------------------------------

readings = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=300.0),  # seconds since the previous cycle
        st.one_of(st.none(), st.floats(min_value=-40.0, max_value=130.0)),  # junction, None = missing
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(readings=readings, floor=st.floats(min_value=0.05, max_value=0.95), step=st.floats(0.001, 0.5))
def test_any_temperature_sequence_keeps_the_ratio_within_the_floor(
    readings: list[tuple[float, float | None]], floor: float, step: float
) -> None:
    (default,) = default_rule_file().rules
    assert default.clock_down is not None
    action = dataclasses.replace(default.clock_down, floor_ratio=floor, step_ratio=step)
    rule = dataclasses.replace(default, clock_down=action)
    run = Run((rule,))
    now = 0.0
    for dt, junction in readings:
        now += dt
        before = run.states[0] if run.states else None
        transitions = run.junction(now, junction)
        if not run.states:
            continue
        state = run.state()
        assert 0.0 <= state.clock_down_ratio <= 1.0 - floor + 1e-9
        if state.suggested_gfx_clock_max_hertz is not None:
            assert GFX_MAX * floor - 1e6 <= state.suggested_gfx_clock_max_hertz <= GFX_MAX
        if not state.firing:
            assert state.clock_down_ratio == 0.0 and state.suggested_gfx_clock_max_hertz is None
        for transition in transitions:
            assert junction is not None
            if transition.kind in ("resolved", "restore_advice_expired"):
                assert junction < rule.clear_threshold
            else:
                assert junction > rule.threshold
        if junction is None:
            assert state == before


# --- loading and validation ------------------------------------------------------------------


def test_load_rules_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - alert: EdgeHot\n"
        "    metric: temperature_celsius\n"
        "    sensor: edge\n"
        "    comparison: gt\n"
        "    threshold: 70\n"
        "    for: 90s\n"
        "    action: {type: clock_down, step_ratio: 0.1, floor_ratio: 0.5, range_min_mhz: 800}\n"
    )
    (rule,) = load_rules(path)
    assert rule.comparison == ">" and rule.clear_threshold == 70.0 and rule.severity == "warning"
    assert rule.for_seconds == 90.0
    assert rule.clock_down == ClockDown(
        step_ratio=0.1,
        step_interval_seconds=90.0,
        floor_ratio=0.5,
        range_min_hertz=800 * MHZ,
        restore_after_seconds=90.0,
    )


GOOD_RULE = [
    "rules:",
    "  - alert: Hot",
    "    metric: temperature_celsius",
    "    sensor: junction",
    '    comparison: ">"',
    "    threshold: 85",
    "    for: 60s",
    "    clear_threshold: 80",
    "    severity: warning",
]


def with_line(number: int, text: str | None) -> str:
    """GOOD_RULE with line `number` (1-based) replaced, or removed when text is None."""
    lines = list(GOOD_RULE)
    if text is None:
        del lines[number - 1]
    else:
        lines[number - 1] = text
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (with_line(6, "    threshold: hot"), 6, "'threshold' must be a number"),
        (with_line(6, "    threshold: yes"), 6, "'threshold' must be a number"),
        (with_line(6, "    threshold: .nan"), 6, "'threshold' must be a number"),
        (with_line(6, "    threshold: [85]"), 6, "expected a single value"),
        (with_line(6, None), 2, "missing 'threshold'"),
        (with_line(3, "    metric: temprature_celsius"), 3, "unknown metric 'temprature_celsius'"),
        (with_line(4, "    sensor: junktion"), 4, "unknown sensor 'junktion'"),
        (with_line(4, "    engine: gfx"), 4, "takes no 'engine'"),
        (with_line(4, None), 2, "missing 'sensor'"),
        (with_line(5, "    comparison: >"), 5, "quote it"),
        (with_line(5, '    comparison: "=="'), 5, "'comparison' must be one of"),
        (with_line(7, "    for: soon"), 7, "'for' must be a duration"),
        (with_line(7, "    for: -5"), 7, "'for' must be a duration"),
        (with_line(8, "    clear_threshold: 90"), 8, "must not be above 'threshold'"),
        (with_line(9, "    severity: page"), 9, "'severity' must be one of"),
        (with_line(9, "    severty: warning"), 9, "unknown key 'severty'"),
        (with_line(9, "    threshold: 86"), 9, "'threshold' appears twice"),
        (with_line(2, "  - alert: 9lives"), 2, "'alert' must be letters"),
        (with_line(1, "rulez:"), 1, "unknown key 'rulez'"),
        (with_line(9, "    summary: 'GPU {gpu} at {temperature}'"), 9, "unknown placeholder {temperature}"),
        (with_line(9, "    summary: 'GPU {gpu:d} at {value:.1q}'"), 9, "not a valid template"),
        (with_line(6, "    threshold: [85"), 7, "not valid YAML"),
        (with_line(9, "    action: {type: power_down}"), 9, "unknown action type 'power_down'"),
        (with_line(9, "    action: {type: clock_down, step_ratio: 5}"), 9, "'step_ratio' must be between 0 and 1"),
        (with_line(9, "    action: {type: clock_down, floor_ratio: 1.5}"), 9, "'floor_ratio' must be between 0 and 1"),
        (with_line(9, "    action: {type: clock_down, range_min_mhz: -1}"), 9, "'range_min_mhz'"),
        (with_line(7, None) + "    action: {type: clock_down}\n", 9, "'step_interval' must be more than 0"),
        (with_line(9, "    action: {type: clock_down, steps: 3}"), 9, "unknown key 'steps'"),
        ("\n".join([*GOOD_RULE, *GOOD_RULE[1:]]) + "\n", 10, "alert 'Hot' is defined twice (first on line 2)"),
        ("rules: {alert: Hot}\n", 1, "'rules' must be a list"),
        ("- alert: Hot\n", 1, "the file must be a mapping"),
        ("other: 1\n", 1, "unknown key 'other'"),
        ("{}\n", 1, "missing 'rules'"),
        ("rules:\n  - just text\n", 2, "a rule must be a mapping"),
    ],
)
def test_bad_rule_files_name_the_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RulesConfigError) as error:
        load_rules(path)
    message = str(error.value)
    assert message.startswith(f"{path} line {line}: "), message
    assert fragment in message, message


def test_empty_or_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(RulesConfigError, match=r"empty\.yaml: the file is empty"):
        load_rules(empty)
    with pytest.raises(RulesConfigError, match=r"rule file .*missing\.yaml: cannot read it"):
        load_rules(tmp_path / "missing.yaml")


def test_an_empty_rule_list_is_allowed() -> None:
    assert parse_rule_file("rules: []\n").rules == ()


def _for(value: str) -> float:
    text = f"rules:\n  - alert: A\n    metric: power_watts\n    comparison: '>'\n    threshold: 1\n    for: {value}\n"
    (rule,) = parse_rule_file(text).rules
    return rule.for_seconds


# One duration syntax for flags, config file and rules (config.parse_duration): a number and one unit.
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("0.5", 0.5), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), ("250ms", 0.25)],
)
def test_durations(text: str, seconds: float) -> None:
    assert _for(text) == seconds


@pytest.mark.parametrize("text", ["''", "m", "5x", "1m30s", "1h30m", "1d", "-1s", "0", "0s", "true", ".inf"])
def test_not_durations(text: str) -> None:
    with pytest.raises(RulesConfigError, match="line 6: 'for' must be a duration longer than zero"):
        _for(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.25, 1, 60, 90, 3600, 3725)] == ["250ms", "1s", "1m", "1m30s", "1h", "1h2m5s"]


def test_a_floor_of_70_percent_stops_the_steps_at_1190_mhz() -> None:
    (default,) = default_rule_file().rules
    assert default.clock_down is not None
    rule = dataclasses.replace(default, clock_down=dataclasses.replace(default.clock_down, floor_ratio=0.7))
    run = Run((rule,))
    fire(run)
    for t in range(61, 60 + 60 * 12):
        run.applied(t, 95.0)
    # 1615, 1534, 1457, 1384, 1314, 1248, then the floor 1190
    assert run.kinds().count("clock_down_step") == 6
    assert run.state().clock_down_ratio == pytest.approx(0.30)
    assert run.state().suggested_command == "rocm-smi -d 0 --autorespond yes --setsrange 500 1190"


# --- bounds ----------------------------------------------------------------------------------------


def many_rules(count: int) -> str:
    rule = "  - {{alert: R{n}, metric: power_watts, comparison: '>', threshold: {n}}}\n"
    return "rules:\n" + "".join(rule.format(n=n) for n in range(count))


def test_the_rule_count_is_capped_with_the_line_of_the_first_rule_too_many() -> None:
    assert len(parse_rule_file(many_rules(MAX_RULES)).rules) == MAX_RULES
    with pytest.raises(RulesConfigError) as error:
        parse_rule_file(many_rules(MAX_RULES + 1), "big.yaml")
    assert str(error.value).startswith(
        f"big.yaml line {MAX_RULES + 2}: more than {MAX_RULES} rules: at most {MAX_RULES}"
    )
    # Counted as rules: the items of the top-level list, whatever they hold (block style, nested actions).
    block = GOOD + "    action: {type: clock_down}\n    asic_overrides: {aldebaran: {threshold: 90}}\n"
    items = [block.removeprefix("rules:\n").replace("alert: Hot", f"alert: Hot{n}") for n in range(MAX_RULES)]
    assert len(parse_rule_file("rules:\n" + "".join(items)).rules) == MAX_RULES


def test_a_file_over_the_size_cap_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("rules: []\n" + "#" * MAX_FILE_BYTES)
    with pytest.raises(RulesConfigError, match="larger than 1024 KiB"):
        load_rules(path)


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{value:>200000000}", "width or precision 200000000 in {value:>200000000} is more than 100"),
        ("{value:.5000f}", "width or precision 5000"),
        ("{value:>{threshold}}", "may not hold another {field}"),
        ("{alert:>90}" * 30, "fills to 2700 characters: at most 2000"),
    ],
)
def test_templates_that_could_fill_megabytes_are_refused(template: str, fragment: str) -> None:
    text = f"{GOOD}    summary: '{template}'\n"
    with pytest.raises(RulesConfigError) as error:
        parse_rule_file(text, "t.yaml")
    assert str(error.value).startswith("t.yaml line 10: 'summary'") and fragment in str(error.value)


def test_evaluation_skips_quiet_states_and_reads_each_watched_value_once() -> None:
    # Junction above n °C for n = 0..999: at 60 °C the first 60 rules fire at once, the rest stay quiet.
    rules = parse_rule_file(many_rules(MAX_RULES).replace("power_watts", "temperature_celsius, sensor: junction")).rules
    devices = [device(gpu, junction=60.0) for gpu in range(8)]
    states, _ = evaluate(rules, (), snap(0, *devices))
    quiet = [s for s in states if not s.firing]
    assert len(quiet) == 8 * (MAX_RULES - 60)
    # The next cycle keeps every quiet state object as it was (nothing is rebuilt for them).
    again, _ = evaluate(rules, states, snap(1, *devices))
    kept = {id(s) for s in again}
    assert all(id(s) in kept for s in quiet)


GOOD = "\n".join(GOOD_RULE) + "\n"


# --- per-ASIC overrides ----------------------------------------------------------------------------


def test_asic_overrides_change_the_values_for_that_asic_only() -> None:
    (rule,) = parse_rule_file(
        GOOD + "    action: {type: clock_down}\n    asic_overrides:\n      aqua_vanjaram: {threshold: 90}\n"
    ).rules
    mi300 = rule.for_asic("aqua_vanjaram")
    assert (mi300.threshold, mi300.clear_threshold, mi300.for_seconds) == (90.0, 85.0, 60.0)  # width kept
    assert rule.for_asic("aldebaran") is rule and rule.for_asic("") is rule
    run = Run((rule,))
    hot = dataclasses.replace(
        device(0, junction=88.0), identity=dataclasses.replace(device(0).identity, asic="aqua_vanjaram")
    )
    run.feed(snap(0, hot, device(1, junction=88.0)))
    run.feed(snap(60, hot, device(1, junction=88.0)))
    assert not run.state(0).firing and run.state(1).firing  # 88 °C pages an MI250X, not this MI300X


def test_an_asic_override_of_for_or_severity_alone_keeps_the_thresholds() -> None:
    (rule,) = parse_rule_file(GOOD + "    asic_overrides:\n      aldebaran: {for: 5m, severity: critical}\n").rules
    mi250 = rule.for_asic("aldebaran")
    assert (mi250.threshold, mi250.clear_threshold) == (rule.threshold, rule.clear_threshold)
    assert (mi250.for_seconds, mi250.severity) == (300.0, "critical")


@pytest.mark.parametrize(
    ("overrides", "line", "fragment"),
    [
        (
            "      mi300: {threshold: 90}\n",
            11,
            "unknown ASIC 'mi300' in 'asic_overrides'; known: aldebaran, aqua_vanjaram, gfx950",
        ),
        ("      aldebaran: {threshold: 90, clear_threshold: 95}\n", 11, "'clear_threshold' of aldebaran must not be"),
        ("      aldebaran: {window: 5}\n", 11, "unknown key 'window'"),
        ("      aldebaran: {threshold: 90}\n      aldebaran: {threshold: 91}\n", 12, "appears twice"),
    ],
)
def test_bad_asic_overrides_name_their_line(overrides: str, line: int, fragment: str) -> None:
    with pytest.raises(RulesConfigError) as error:
        parse_rule_file(GOOD + "    asic_overrides:\n" + overrides, "o.yaml")
    assert str(error.value).startswith(f"o.yaml line {line}: ") and fragment in str(error.value)


def test_the_asics_a_rule_file_may_name_are_the_known_devices_asics() -> None:
    from exporter.sources.identity import KNOWN_DEVICES

    assert set(ASICS) == {asic for asic, _ in KNOWN_DEVICES.values()}


# --- the sliding window (issue 13) -------------------------------------------------------------


def windowed(at: float, latest: float, window_max: float | None, gpu: int = 0) -> Snapshot:
    """A poll that read `latest`, with the fast sampler's junction window peaking at `window_max`."""
    stats = {}
    if window_max is not None:
        stats[("temperature", "junction")] = WindowStat(min(latest, window_max), window_max, latest)
    windows = WindowSnapshot(at, 15.0, 0.1, (DeviceWindow(gpu, 150, frozen_map(stats)),))
    return dataclasses.replace(snap(at, device(gpu=gpu, junction=latest)), windows=windows)


def test_the_default_rule_reads_the_window_max() -> None:
    (rule,) = default_rule_file().rules
    assert rule.window == "max"


def test_a_spike_between_two_polls_is_not_missed() -> None:
    # Every poll happens to read 84 °C, but the 100 ms samples between them peaked at 90 °C.
    run = Run()
    for at in range(0, 61, 1):
        run.feed(windowed(float(at), latest=84.0, window_max=90.0))
    state = run.state()
    assert state.firing and state.value == 90.0
    assert state.clock_down_ratio == pytest.approx(0.05)
    # The same polls without a window (fast sampler off) never see it.
    blind = Run()
    for at in range(0, 61, 1):
        blind.feed(windowed(float(at), latest=84.0, window_max=None))
    assert not blind.state().firing and blind.state().pending_since is None


def test_the_window_clears_only_once_a_whole_window_stays_below_80() -> None:
    run = Run()
    for at in range(0, 62):
        run.feed(windowed(float(at), latest=90.0, window_max=92.0))
    assert run.state().firing
    run.feed(windowed(62.0, latest=75.0, window_max=83.0))  # cool now, but the window still held 83 °C
    assert run.state().firing
    run.feed(windowed(77.0, latest=75.0, window_max=79.0))
    assert not run.state().firing


def test_a_rule_without_window_reads_the_latest_sample() -> None:
    (rule,) = default_rule_file().rules
    latest_only = (dataclasses.replace(rule, window=""),)
    run = Run(latest_only)
    for at in range(0, 61):
        run.feed(windowed(float(at), latest=84.0, window_max=95.0))
    assert not run.state().firing and run.state().value == 84.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    window: peak\n", "'window' must be one of max, min, mean, not 'peak'"),
        ("    window: max\n", "metric 'memory_used_ratio' has no sliding window to read"),
    ],
)
def test_window_key_errors_name_the_line(extra: str, message: str) -> None:
    metric = "temperature_celsius\n    sensor: junction" if "peak" in extra else "memory_used_ratio\n    pool: vram"
    text = f"rules:\n  - alert: A\n    metric: {metric}\n    comparison: '>'\n    threshold: 1\n{extra}"
    with pytest.raises(RulesConfigError, match=message):
        parse_rule_file(text, "rules.yaml")
