"""Issue 31 below the daemon: the health signals parsed record by record, counters judged per key,
untimed and future evidence aged from first sight, devices that leave dropped or forgotten with their
alerts resolved, packages kept apart, and a run-time cap on a device's series."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from exporter.alerting.alertmanager import AlertmanagerPusher
from exporter.alerting.rulefile import default_health, default_rule_file
from exporter.alerting.state import evaluate
from exporter.alerting.verdict import evaluate_health
from exporter.model import CperRecord, DeviceIdentity, DeviceState, HealthVerdict, Sample, Snapshot
from exporter.pipeline.known_devices import FORGET_GONE_AFTER_SECONDS, KnownDevices
from exporter.simulator import cper_writer
from exporter.sources import textfiles as tf
from exporter.sources.cper import scan_cper_ring
from exporter.sources.identity import assign_packages
from exporter.sources.plausible import MAX_KEYS, within_series_cap
from tests.unit.test_rules import Run, device, fire, snap

T0 = 1_800_000_000.0
IDENTITY = DeviceIdentity(pci_bus_id="0000:c1:00.0", card="card0", device_dir="/sys/x", unique_id="u0", asic="x")

# --- bad pages, counted as they stream ------------------------------------------------------------


def lines(retired: int, pending: int = 0) -> bytes:
    return "".join(
        f"0x{p:08x} : 0x00001000 : {'R' if p < retired else 'P'}\n" for p in range(retired + pending)
    ).encode()


def test_bad_pages_beyond_the_general_file_limit_count_in_any_chunks() -> None:
    data = lines(2400, 3)
    assert len(data) > 65536
    count = tf.BadPageCount()
    for start in range(0, len(data), 4096):
        count.feed(data[start : start + 4096])
    assert count.finish() == tf.BadPages(retired=2400, pending=3) and not count.too_many and count.bad_lines == 0


def test_a_bad_line_is_counted_and_the_records_around_it_still_count() -> None:
    count = tf.BadPageCount()
    count.feed(lines(2000) + b"0xZZ : what : R\n" + b"0x00099999 : 0x00001000 : R\n")
    assert count.finish().retired == 2001 and count.bad_lines == 1 and count.first_bad == "0xZZ : what : R"


def test_more_records_than_the_eeprom_holds_is_too_many() -> None:
    count = tf.BadPageCount()
    count.feed(b"0x1 : 0x1000 : R\n" * (tf.BAD_PAGE_RECORDS_MAX + 1))
    count.finish()
    assert count.too_many


# --- the CPER ring, record by record ---------------------------------------------------------------


def rec(at: float, severity: str = "fatal", rid: str = "0:1") -> bytes:
    return cper_writer.record(int(at), severity, rid, 0x74A1, 0)


def test_a_bad_record_is_skipped_and_the_others_count() -> None:
    bad = bytearray(rec(T0, "corrected", "0:2"))
    bad[0:4] = b"XPER"
    scan = scan_cper_ring(cper_writer.ring([rec(T0, "fatal", "0:1"), bytes(bad), rec(T0, "nonfatal", "0:3")]))
    assert [r.record_id for r in scan.records] == ["0:1", "0:3"] and len(scan.errors) == 1


def test_a_length_of_1_gib_is_an_error_not_a_silent_stop() -> None:
    huge = bytearray(rec(T0, "fatal", "0:1"))
    huge[20:24] = struct.pack("<I", 1 << 30)
    scan = scan_cper_ring(cper_writer.ring([bytes(huge)]))
    assert scan.records == () and "1073741824 bytes long" in scan.errors[0]
    scan = scan_cper_ring(cper_writer.ring([bytes(huge), rec(T0, "fatal", "0:2")]))
    assert [r.record_id for r in scan.records] == ["0:2"] and len(scan.errors) == 1


def test_a_record_cut_short_at_the_end_is_no_error() -> None:
    scan = scan_cper_ring(cper_writer.ring([rec(T0, "fatal", "0:1")]) + rec(T0, "fatal", "0:2")[:300])
    assert [r.record_id for r in scan.records] == ["0:1"] and scan.errors == ()


def test_a_record_without_a_valid_time_is_kept_untimed() -> None:
    untimed = bytearray(rec(T0))
    untimed[16:20] = struct.pack("<I", 1)
    assert scan_cper_ring(cper_writer.ring([bytes(untimed)])).records == (CperRecord(0.0, "fatal", (), "0:1"),)


def test_a_record_id_with_an_escape_sequence_is_printable() -> None:
    (record,) = scan_cper_ring(cper_writer.ring([rec(T0, "fatal", "\x1b]0;PWN\x07")])).records
    assert record.record_id == "?]0;PWN?"


def test_the_coredump_comm_may_be_any_bytes() -> None:
    for comm in ("训练.py".encode(), "训练训练训".encode()[:14], b"\xff\xfe\x80"):
        head = b"**** AMDGPU Device Coredump ****\nversion: 1\ntime: 29.725011811\nprocess_name: " + comm + b"\n\n"
        assert tf.parse_devcoredump_time(head) == 29.725011811


# --- the verdict: counters per key, untimed and future evidence --------------------------------------


class Clock:
    def __init__(self) -> None:
        self.verdict: HealthVerdict | None = None

    def step(self, at: float, *states: DeviceState) -> HealthVerdict:
        snapshot = Snapshot(taken_at=T0 + at, monotonic_at=1000.0 + at, devices=states)
        self.verdict = evaluate_health(self.verdict, snapshot, default_health())
        return self.verdict


def gpu(**values: Any) -> DeviceState:
    return DeviceState(identity=IDENTITY, gpu=0, sample=Sample(timestamp=T0, **values), up=True)


def ue(umc: int | None, gfx: int = 0) -> DeviceState:
    counts = {("gfx", "uncorrectable"): gfx, ("gfx", "correctable"): 0}
    if umc is not None:
        counts[("umc", "uncorrectable")] = umc
    return gpu(ecc_errors=counts)


def checks(verdict: HealthVerdict) -> dict[str, str]:
    return {c.check: c.reason for c in verdict.gpus[0].checks}


def test_an_unreadable_block_keeps_its_count_and_its_return_is_no_growth() -> None:
    clock = Clock()
    for at, umc in ((0, 3), (10, None), (20, 3), (30, 3)):
        assert clock.step(at, ue(umc)).fit, at


def test_a_failing_check_holds_through_unreadable_reads_and_a_flap_and_clears_a_window_on() -> None:
    clock = Clock()
    clock.step(0, ue(0))
    assert "ecc_uncorrectable" in checks(clock.step(10, ue(1)))
    reason = checks(clock.step(11, ue(None)))["ecc_uncorrectable"]
    assert "unreadable now, its last count kept: umc" in reason
    for at, umc in ((13, None), (14, 1), (20, 0), (25, 1), (30, 1)):
        assert "ecc_uncorrectable" in checks(clock.step(at, ue(umc))), at
    # 1 -> 0 -> 1 counts one more error (a reset, then one since), at 25: clears an hour after that
    assert "ecc_uncorrectable" in checks(clock.step(25 + 3500, ue(1)))
    assert clock.step(25 + 3600 + 300, ue(1)).fit


def test_an_untimed_fatal_record_fails_from_first_sight_for_its_window() -> None:
    clock = Clock()
    state = gpu(cper_records=(CperRecord(0.0, "fatal", (), "0:1"),))
    assert "aged from when first seen" in checks(clock.step(0, state))["cper_fatal"]
    assert "cper_fatal" in checks(clock.step(3000, state))
    assert clock.step(3601, state).fit


def test_evidence_from_the_future_has_no_negative_age_and_clears_a_window_after_first_sight() -> None:
    clock = Clock()
    state = gpu(cper_records=(CperRecord(4_083_000_000.0, "fatal", (), "0:1"),), last_reset_at=T0 + 1e9)
    reasons = checks(clock.step(0, state))
    assert "the newest 0s old" in reasons["cper_fatal"] and "reset 0s ago" in reasons["gpu_reset"]
    assert "gpu_reset" not in checks(clock.step(901, state))
    assert clock.step(3601, state).fit


# --- devices that leave -----------------------------------------------------------------------------


def ident(partition: int, mode: str, uid: str = "u0") -> DeviceIdentity:
    return dataclasses.replace(IDENTITY, unique_id=uid, partition=partition, compute_partition=mode)


def test_partitions_that_leave_with_a_mode_change_are_dropped_and_get_their_index_back() -> None:
    known = KnownDevices()
    known.merge([ident(p, "CPX") for p in range(8)])
    known.merge([ident(0, "SPX")])
    assert [(s.identity.partition, s.gpu, s.present) for s in known.states()] == [(0, 0, True)]
    known.merge([ident(p, "CPX") for p in range(8)])
    assert [s.gpu for s in known.states()] == list(range(8))


def test_a_gone_device_is_down_for_ten_minutes_then_forgotten_and_its_index_kept() -> None:
    known = KnownDevices()
    known.merge([ident(0, "", "a"), ident(0, "", "b")])
    known.merge([ident(0, "", "a")])
    (gone,) = [t for t in known if not t.present]
    assert gone.gone_since is not None
    known.forget_gone(gone.gone_since + FORGET_GONE_AFTER_SECONDS - 1)
    assert len(known) == 2
    known.forget_gone(gone.gone_since + FORGET_GONE_AFTER_SECONDS)
    assert [t.identity.unique_id for t in known] == ["a"]
    known.merge([ident(0, "", "a"), ident(0, "", "c")])
    assert {t.identity.unique_id: t.gpu for t in known} == {"a": 0, "c": 2}


def test_the_alerts_of_a_forgotten_device_resolve_and_are_posted_resolved() -> None:
    run = Run()
    fire(run)
    firing = [s for s in run.states if s.firing]
    assert len(firing) == 1
    pusher = AlertmanagerPusher(["http://127.0.0.1:9/"], node="n", instance="i", rules=default_rule_file().rules)
    pusher.update(snap(61, device(junction=90.0)), run.states)
    # a gone device (still in the snapshot, down) keeps its alert; one no longer in it resolves
    states, transitions = evaluate(
        default_rule_file().rules, run.states, snap(62, dataclasses.replace(device(up=False), present=False))
    )
    assert states == run.states and transitions == ()
    states, transitions = evaluate(default_rule_file().rules, run.states, snap(62))
    assert states == () and [t.kind for t in transitions] == ["resolved"]
    pusher.update(snap(62), states)
    (posted,) = pusher.pending_payload(62)
    assert posted["endsAt"].startswith("1970-01-01T00:01:02")
    pusher.update(snap(62 + 901), states)
    assert pusher.pending_payload(62 + 901) == []  # no longer pushed once its retention passed


# --- identity and the series cap ---------------------------------------------------------------------


def test_a_serial_on_two_devices_does_not_merge_them() -> None:
    devices = [
        dataclasses.replace(IDENTITY, pci_bus_id=f"0000:0{b}:00.0", device_id="0x74a1", serial="S1", unique_id=f"u{b}")
        for b in (1, 3)
    ]
    assert [d.package for d in assign_packages(devices)] == ["S1@0000:01:00.0", "S1@0000:03:00.0"]


def test_a_device_with_1023_links_is_cut_to_its_cap_and_counted() -> None:
    capped, dropped = within_series_cap(Sample(timestamp=T0, xgmi_link_up={i: True for i in range(1023)}))
    assert sorted(capped.xgmi_link_up) == list(range(MAX_KEYS["xgmi_link_up"]))
    assert dropped == {"xgmi_link_up": 1023 - MAX_KEYS["xgmi_link_up"]}
    plain = Sample(timestamp=T0, xgmi_link_up={i: True for i in range(8)})
    assert within_series_cap(plain) == (plain, {})
