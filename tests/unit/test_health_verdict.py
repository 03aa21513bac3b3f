"""The health verdict over constructed devices: each check fails with its evidence and its age, and
clears by its rule (the clock is the snapshot's: taken_at and monotonic_at are set by each test)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from exporter.alerting.rulefile import RulesConfigError, default_health, default_rule_file, parse_rule_file
from exporter.alerting.verdict import CHECKS, HealthThresholds, evaluate_health
from exporter.model import CperRecord, DeviceIdentity, DeviceState, HealthVerdict, Published, Sample, Snapshot
from exporter.pipeline.readiness import Readiness

T0 = 1_800_000_000.0  # unix seconds of the first cycle
IDENTITY = DeviceIdentity(
    pci_bus_id="0000:c1:00.0", card="card0", device_dir="/sys/x", unique_id="u0", asic="aldebaran"
)
SHIPPED = default_health()


def device(sample: Sample | None = None, *, up: bool = True, reason: str = "", asic: str = "aldebaran") -> DeviceState:
    identity = dataclasses.replace(IDENTITY, asic=asic)
    return DeviceState(identity=identity, gpu=0, sample=sample, up=up, down_reason=reason)


class Clock:
    """Cycles of one GPU at chosen instants: each step() is one poll cycle, `at` seconds after the first."""

    def __init__(self, thresholds: HealthThresholds = SHIPPED, node: str = "gpu-node-1") -> None:
        self.thresholds = thresholds
        self.node = node
        self.verdict: HealthVerdict | None = None

    def step(self, at: float, state: DeviceState, *others: DeviceState, wall_step: float = 0.0) -> HealthVerdict:
        snapshot = Snapshot(taken_at=T0 + at + wall_step, monotonic_at=1000.0 + at, devices=(state, *others))
        self.verdict = evaluate_health(self.verdict, snapshot, self.thresholds, self.node)
        return self.verdict


def failing(verdict: HealthVerdict) -> dict[str, Any]:
    return {c.check: c for c in verdict.gpus[0].checks}


def sample(**values: Any) -> Sample:
    return Sample(timestamp=T0, **values)


def test_a_healthy_gpu_is_fit_with_no_advice() -> None:
    verdict = Clock().step(0, device(sample(ecc_errors={("umc", "correctable"): 3})))
    assert verdict.fit and verdict.gpus[0].fit and not verdict.gpus[0].checks
    assert verdict.suggestion == verdict.drain_command == verdict.taint_command == ""


def test_the_shipped_file_names_every_check_with_every_key() -> None:
    assert set(SHIPPED.checks) == set(CHECKS)
    text = default_rule_file().rules  # the rules of the same file still load
    assert text


def ecc(uncorrectable: int = 0, correctable: int = 0, deferred: int = 0) -> Sample:
    return sample(
        ecc_errors={
            ("umc", "uncorrectable"): uncorrectable,
            ("umc", "correctable"): correctable,
            ("gfx", "deferred"): deferred,
        }
    )


def test_uncorrectable_ecc_fails_while_it_grows_and_clears_a_window_after_it_stopped() -> None:
    clock = Clock()
    assert clock.step(0, device(ecc(uncorrectable=2))).fit  # counted before we looked: not today's error
    verdict = clock.step(10, device(ecc(uncorrectable=3)))
    check = failing(verdict)["ecc_uncorrectable"]
    assert check.severity == "critical" and check.since == T0 + 10
    assert "1 uncorrectable ECC errors since the exporter started reading it (3 in all: umc 3)" in check.reason
    assert not verdict.fit and verdict.drain_command.startswith("scontrol update nodename=gpu-node-1 state=drain")
    assert 'reason="amdgpu-exporter: gpu 0: ecc_uncorrectable"' in verdict.drain_command
    assert verdict.resume_command == "scontrol update nodename=gpu-node-1 state=resume"
    assert verdict.taint_command == "kubectl taint node gpu-node-1 amd.com/gpu-unhealthy=gpu0:NoSchedule --overwrite"
    assert verdict.untaint_command == "kubectl taint node gpu-node-1 amd.com/gpu-unhealthy:NoSchedule-"
    # still failing, same since, while the window still holds the growth
    assert failing(clock.step(1800, device(ecc(uncorrectable=3))))["ecc_uncorrectable"].since == T0 + 10
    assert "ecc_uncorrectable" in failing(clock.step(3600, device(ecc(uncorrectable=3))))
    # a window (plus at most 1/16 of one) after the last growth: clear, with the undo advice kept
    verdict = clock.step(3600 + 10 + 3600 / 16 + 1, device(ecc(uncorrectable=3)))
    assert verdict.fit and not verdict.drain_command and verdict.resume_command and "fit again" in verdict.suggestion
    # and after advice_for (1 h) the advice goes too: nothing latches
    assert clock.step(3 * 3600, device(ecc(uncorrectable=3))).suggestion == ""


def test_the_correctable_rate_needs_its_threshold_within_the_window() -> None:
    clock = Clock()
    clock.step(0, device(ecc(correctable=0)))
    assert clock.step(600, device(ecc(correctable=99))).fit
    check = failing(clock.step(1200, device(ecc(correctable=100))))["ecc_correctable_rate"]
    assert check.severity == "warning" and "the threshold is 100 within 1h" in check.reason
    # no more errors: the growth leaves the window and the check clears
    assert clock.step(1200 + 3600 + 300, device(ecc(correctable=100))).fit


def test_a_counter_that_resets_starts_a_new_history() -> None:
    clock = Clock()
    clock.step(0, device(ecc(uncorrectable=5)))
    assert clock.step(10, device(ecc(uncorrectable=0))).fit  # driver reloaded: counts from 0 again
    assert "ecc_uncorrectable" in failing(clock.step(20, device(ecc(uncorrectable=1))))


def test_deferred_ecc_and_the_aer_and_xgmi_counters_fail_and_clear() -> None:
    cases: Mapping[str, tuple[str, Any]] = {
        "ecc_deferred": ("deferred ECC errors", lambda n: ecc(deferred=n)),
        "pcie_aer_fatal": ("fatal PCIe AER errors", lambda n: sample(pcie_aer_errors={("upstream", "fatal"): n})),
        "pcie_aer_nonfatal": ("non-fatal PCIe AER", lambda n: sample(pcie_aer_errors={("device", "nonfatal"): n})),
        "pcie_aer_correctable_rate": (
            "correctable PCIe AER",
            lambda n: sample(pcie_aer_errors={("device", "correctable"): 100 * n}),
        ),
        "xgmi_errors": ("XGMI error events", lambda n: sample(xgmi_error_events=n)),
    }
    for check, (words, make) in cases.items():
        clock = Clock()
        clock.step(0, device(make(0)))
        found = failing(clock.step(5, device(make(1))))
        assert list(found) == [check] and words in found[check].reason, check
        assert found[check].severity == SHIPPED.checks[check].severity
        assert clock.step(5 + 3600 + 300, device(make(1))).fit, check


def test_bad_pages_at_the_threshold_and_pending_pages_until_retired() -> None:
    clock = Clock()
    near = sample(ras_retired_pages=461, ras_bad_page_threshold=512, ras_pending_pages=2)
    found = failing(clock.step(0, device(near)))
    assert "461 retired VRAM pages of the driver's bad-page threshold 512" in found["bad_pages_threshold"].reason
    assert "2 VRAM pages found bad and not yet retired" in found["bad_pages_pending"].reason
    # the pending pages retired at a reset, the count still below 90 %
    assert clock.step(60, device(sample(ras_retired_pages=300, ras_bad_page_threshold=512, ras_pending_pages=0))).fit
    # an unknown or disabled threshold (None) judges nothing
    assert clock.step(120, device(sample(ras_retired_pages=10_000, ras_bad_page_threshold=None))).fit


def cper(age: float, severity: str = "fatal") -> CperRecord:
    return CperRecord(timestamp=T0 - age, severity=severity, afids=(29, 30), record_id="4:1")


def test_a_fatal_cper_fails_while_it_is_younger_than_its_window_then_clears() -> None:
    clock = Clock()
    record = cper(age=60)
    found = failing(clock.step(0, device(sample(cper_records=(record,)))))["cper_fatal"]
    assert found.since == record.timestamp  # the record's own time
    assert found.reason == "1 fatal CPER record within 1h, the newest 1m old (AFID 29, 30), record 4:1"
    # the same record, still in the ring, an hour later: cleared (DME's stale GPU_HEALTH 0)
    assert clock.step(3600 - 60, device(sample(cper_records=(record,)))).fit
    # an old record is no evidence from the start either
    assert Clock().step(0, device(sample(cper_records=(cper(age=7200),)))).fit


def test_nonfatal_and_corrected_cper_counts() -> None:
    corrected = tuple(cper(age=i, severity="corrected") for i in range(10))
    found = failing(Clock().step(0, device(sample(cper_records=(cper(5, "nonfatal"), *corrected[:9])))))
    assert list(found) == ["cper_nonfatal"]
    found = failing(Clock().step(0, device(sample(cper_records=corrected))))
    assert list(found) == ["cper_corrected"] and found["cper_corrected"].severity == "warning"


def test_a_reset_fails_for_its_window() -> None:
    clock = Clock()
    found = failing(clock.step(0, device(sample(last_reset_at=T0 - 30))))["gpu_reset"]
    assert found.since == T0 - 30 and "reset 30s ago" in found.reason
    assert clock.step(900 - 30, device(sample(last_reset_at=T0 - 30))).fit


def test_held_conditions_fail_after_their_for_and_clear_at_once() -> None:
    clock = Clock()
    down = sample(xgmi_link_up={0: True, 3: False, 7: False})
    peer = dataclasses.replace(device(sample(xgmi_link_up={0: True, 3: True, 7: False})), gpu=1,
                               identity=dataclasses.replace(IDENTITY, pci_bus_id="0000:c2:00.0"))  # fmt: skip
    assert clock.step(0, device(down), peer).fit  # for: 10s
    found = failing(clock.step(10, device(down), peer))["xgmi_link_down"]
    # link 7 is down on every GPU of the node: a slot with no peer, never counted
    assert found.since == T0 and found.reason == "XGMI link 3 down for 10s (fails after 10s)"
    assert clock.step(11, device(sample(xgmi_link_up={0: True, 3: True})), peer).fit
    assert Clock().step(0, device(down)).fit and Clock().step(10, device(down)).fit  # one GPU: nothing to compare

    clock = Clock()
    slow = sample(
        pcie_link_transfers_per_second=8e9, pcie_max_link_transfers_per_second=16e9, pcie_link_width=16,
        pcie_max_link_width=16,
    )  # fmt: skip
    clock.step(0, device(slow))
    found = failing(clock.step(300, device(slow)))["pcie_link_degraded"]
    assert "PCIe link trained at 8 GT/s x16 of 16 GT/s x16 for 5m" in found.reason
    retrained = dataclasses.replace(slow, pcie_link_transfers_per_second=16e9)
    assert clock.step(301, device(retrained)).fit


def test_throttling_counts_thermal_reasons_not_power_capping() -> None:
    clock = Clock()
    hot = sample(throttle={"temp_gpu": True, "ppt0": True})
    capped = sample(throttle={"ppt0": True})
    clock.step(0, device(hot))
    assert "throttling_persistent" in failing(clock.step(600, device(hot)))
    assert clock.step(601, device(capped)).fit
    # MI300: no throttle bits, the residency counters; growth in every cycle is "held"
    clock = Clock()
    for at in range(0, 800, 100):
        verdict = clock.step(
            at, device(sample(throttle_residency_seconds={"socket_thermal": at / 2.0}), asic="aqua_vanjaram")
        )
    assert "clocks held back by socket_thermal" in failing(verdict)["throttling_persistent"].reason
    still = device(sample(throttle_residency_seconds={"socket_thermal": 300.0}), asic="aqua_vanjaram")
    assert clock.step(800, still).fit  # the residency stopped growing


def test_an_unreadable_gpu_is_never_fit_and_readyz_names_it() -> None:
    clock = Clock()
    clock.step(0, device(ecc(uncorrectable=0)))
    clock.step(10, device(ecc(uncorrectable=1)))
    verdict = clock.step(20, device(ecc(uncorrectable=1), up=False, reason="timeout"))
    found = failing(verdict)
    assert set(found) == {"device_down", "ecc_uncorrectable"}  # the other evidence stays while unread
    assert found["device_down"].since == T0 + 20 and "cannot be read (timeout)" in found["device_down"].reason
    published = Published(snapshot=Snapshot(taken_at=T0 + 20), health=verdict)
    ready, why = Readiness(interval=1e9).readiness(published, now=T0 + 20)
    assert ready and why.startswith("ready; not fit, cannot be read: gpu 0: the device cannot be read (timeout)")
    # never read at all: still not fit
    assert not Clock().step(0, device(None, up=False, reason="identify_timeout")).fit
    # readable again: device_down clears at once; the counter resumes its history
    assert set(failing(clock.step(30, device(ecc(uncorrectable=1))))) == {"ecc_uncorrectable"}


def test_a_wall_clock_step_does_not_move_a_counter_window() -> None:
    clock = Clock()
    clock.step(0, device(ecc(uncorrectable=0)))
    clock.step(10, device(ecc(uncorrectable=1)))
    # the wall clock jumps a day ahead; the monotonic clock has moved 20 s
    assert "ecc_uncorrectable" in failing(clock.step(30, device(ecc(uncorrectable=1)), wall_step=86400))


def test_thresholds_from_a_rule_file_with_asic_overrides() -> None:
    text = """
rules: []
health:
  advice_for: 5m
  checks:
    ecc_correctable_rate:
      threshold: 10
      window: 10m
      asic_overrides:
        aqua_vanjaram: {threshold: 50}
    gpu_reset: {enabled: false}
"""
    health = parse_rule_file(text, "site.yaml").health
    assert health.advice_for_seconds == 300
    assert health.of("ecc_correctable_rate", "aldebaran").threshold == 10
    assert health.of("ecc_correctable_rate", "aqua_vanjaram").window_seconds == 600  # the check's own
    assert health.of("ecc_correctable_rate", "aqua_vanjaram").threshold == 50
    assert health.of("ecc_uncorrectable", "aldebaran") == SHIPPED.checks["ecc_uncorrectable"]  # not named: shipped
    assert health.of("throttling_persistent", "aqua_vanjaram").reasons[0] == "socket_thermal"  # shipped override kept
    clock = Clock(health)
    assert clock.step(0, device(sample(last_reset_at=T0))).fit  # turned off
    clock.step(0, device(ecc(correctable=0)))
    assert "ecc_correctable_rate" in failing(clock.step(10, device(ecc(correctable=10))))


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("rules: []\nhealth:\n  checks:\n    ecc_nope: {}\n", 4, "unknown key 'ecc_nope'"),
        ("rules: []\nhealth:\n  checks:\n    device_down: {enabled: false}\n", 4, "unknown key 'enabled'"),
        ("rules: []\nhealth:\n  checks:\n    gpu_reset: {threshold: 3}\n", 4, "unknown key 'threshold'"),
        ("rules: []\nhealth:\n  checks:\n    cper_fatal:\n      severity: info\n", 5, "'severity' must be one of"),
        ("rules: []\nhealth:\n  checks:\n    bad_pages_threshold: {threshold: 2}\n", 4, "a ratio"),
        ("rules: []\nhealth:\n  checks:\n    xgmi_errors:\n      window: soon\n", 5, "'window' must be a duration"),
        (
            "rules: []\nhealth:\n  checks:\n    xgmi_errors:\n      asic_overrides:\n        navi: {}\n",
            6,
            "unknown ASIC 'navi'",
        ),
    ],
)
def test_a_bad_health_section_names_its_line(text: str, line: int, words: str) -> None:
    with pytest.raises(RulesConfigError) as error:
        parse_rule_file(text, "site.yaml")
    assert f"site.yaml line {line}:" in str(error.value) and words in str(error.value)


def test_a_partition_fails_its_sockets_checks_but_not_its_device_down() -> None:
    clock = Clock()
    part1 = dataclasses.replace(
        device(sample(busy={"gfx": 0.5})), gpu=1, identity=dataclasses.replace(IDENTITY, partition=1)
    )
    clock.step(0, device(ecc(uncorrectable=0)), part1)
    verdict = clock.step(10, device(ecc(uncorrectable=1)), part1)
    (shared,) = verdict.gpus[1].checks
    assert shared.check == "ecc_uncorrectable" and shared.since == T0 + 10
    assert shared.reason.startswith("on its socket (partition 0, gpu 0): 1 uncorrectable ECC errors")
    assert "gpu0.gpu1" in verdict.taint_command
    # partition 0 unreadable: partition 1 still answers, so it is not device_down; the kept evidence is shared
    verdict = clock.step(20, device(ecc(uncorrectable=1), up=False, reason="timeout"), part1)
    assert [c.check for c in verdict.gpus[1].checks] == ["ecc_uncorrectable"]
    # cleared on the socket: cleared on the partition
    clock.step(30, device(ecc(uncorrectable=1)), part1)
    assert clock.step(10 + 3600 + 300, device(ecc(uncorrectable=1)), part1).fit
