"""Unit tests of a node's life: stable identity, counters across wraps and resets, errors as data,
plausible ranges, clean labels, limited YAML, readiness and liveness, daemon-thread pools."""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import boundedfile, safeyaml
from exporter.config import ConfigError, read_config_values
from exporter.model import DeviceIdentity, Published, Sample, Snapshot, TopologyLink, frozen_map
from exporter.pipeline.counters import CounterState, continue_counters
from exporter.pipeline.known_devices import KnownDevices
from exporter.pipeline.readiness import Readiness
from exporter.sources.errors import FileErrors, collecting
from exporter.sources.identity import assign_packages, is_secondary_die
from exporter.sources.labels import MAX_LABEL_CHARS, clean_label
from exporter.sources.plausible import plausible
from exporter.sources.sysfs import files
from exporter.threads import DaemonPool


def ident(bdf: str, card: str, uid: str = "", **kw: object) -> DeviceIdentity:
    return DeviceIdentity(pci_bus_id=bdf, card=card, device_dir=f"/sys/devices/{bdf}", unique_id=uid, **kw)  # type: ignore[arg-type]


def gpus(known: KnownDevices) -> dict[str, int]:
    return {t.identity.pci_bus_id: t.gpu for t in known}


# --- identity ----------------------------------------------------------------------------------


def test_cold_start_follows_card_order_then_late_devices_take_the_next_index() -> None:
    known = KnownDevices()
    # card order differs from PCI order: rocm-smi's GPU[N] is card order
    known.merge(
        [ident("0000:01:00.0", "card2", "a"), ident("0000:41:00.0", "card0", "b"), ident("0000:81:00.0", "card1", "c")]
    )
    assert gpus(known) == {"0000:41:00.0": 0, "0000:81:00.0": 1, "0000:01:00.0": 2}
    # a late GCD with the lowest BDF renumbers nobody
    known.merge([ident("0000:00:00.0", "card3", "z"), ident("0000:01:00.0", "card2", "a"),
                 ident("0000:41:00.0", "card0", "b"), ident("0000:81:00.0", "card1", "c")])  # fmt: skip
    assert gpus(known) == {"0000:41:00.0": 0, "0000:81:00.0": 1, "0000:01:00.0": 2, "0000:00:00.0": 3}


def test_a_vanished_device_keeps_its_index_and_gets_it_back() -> None:
    known = KnownDevices()
    a, b, c = (
        ident("0000:01:00.0", "card0", "a"),
        ident("0000:02:00.0", "card1", "b"),
        ident("0000:03:00.0", "card2", "c"),
    )
    known.merge([a, b, c])
    known.merge([a, c])
    gone = next(t for t in known if t.identity.unique_id == "b")
    assert (gone.gpu, gone.present, gone.up, gone.down_reason) == (1, False, False, "gone")
    assert sum(t.present for t in known) == 2
    known.merge([a, b, c])
    assert gone.present and gone.gpu == 1 and gone.down_reason == "not_read_yet"
    assert gpus(known) == {"0000:01:00.0": 0, "0000:02:00.0": 1, "0000:03:00.0": 2}


def test_an_empty_unique_id_read_is_not_a_phantom_device() -> None:
    known = KnownDevices()
    known.merge([ident("0000:01:00.0", "card0", "a"), ident("0000:02:00.0", "card1", "b")])
    for _ in range(3):
        known.merge([ident("0000:01:00.0", "card0", ""), ident("0000:02:00.0", "card1", "b")])
    assert len(known) == 2 and {t.identity.unique_id for t in known} == {"a", "b"}
    # first seen without one (its read hung), later read: same index, the key gains the unique_id
    later = KnownDevices()
    later.merge([ident("0000:01:00.0", "card0", "", complete=False), ident("0000:02:00.0", "card1", "b")])
    later.merge([ident("0000:01:00.0", "card0", "a"), ident("0000:02:00.0", "card1", "b")])
    assert len(later) == 2 and gpus(later) == {"0000:01:00.0": 0, "0000:02:00.0": 1}
    assert ("0000:01:00.0", "a", 0) in {t.identity.key for t in later}


def test_an_incomplete_card_is_neither_refreshed_nor_gone() -> None:
    known = KnownDevices()
    a = ident("0000:01:00.0", "card0", "a", product="P")
    known.merge([a])
    known.merge([], incomplete=frozenset({"0000:01:00.0"}))
    (tracked,) = list(known)
    assert tracked.present and tracked.identity.product == "P"


def test_a_different_device_at_the_same_bdf_is_a_new_device() -> None:
    known = KnownDevices()
    known.merge([ident("0000:01:00.0", "card0", "a")])
    known.merge([ident("0000:01:00.0", "card0", "b")])
    assert sorted((t.identity.unique_id, t.gpu, t.present) for t in known) == [("a", 0, False), ("b", 1, True)]


# --- dies and packages ---------------------------------------------------------------------------


def mi250x(bdf: str, serial: str, uid: str, *, secondary: bool, links: tuple[TopologyLink, ...] = ()) -> DeviceIdentity:
    return ident(bdf, "card0", uid, device_id="0x740c", serial=serial, secondary_die=secondary, topology=links)


def test_secondary_die_signals() -> None:
    assert is_secondary_die("0x740c", 0, 0) and is_secondary_die("0x7408", 0, 0)
    assert not is_secondary_die("0x740c", 500_000_000, 560_000_000)
    assert not is_secondary_die("0x740c", 0, None)  # an unreadable default is no evidence
    assert not is_secondary_die("0x74a1", 0, 0)  # MI300X is one die per device


def test_dies_pair_by_serial_and_by_topology_when_serials_differ() -> None:
    shared = assign_packages(
        [mi250x("0000:01:00.0", "PCB1", "u1", secondary=False), mi250x("0000:03:00.0", "PCB1", "u2", secondary=True),
         mi250x("0000:05:00.0", "PCB2", "u3", secondary=False), mi250x("0000:07:00.0", "PCB2", "u4", secondary=True)]
    )  # fmt: skip
    assert [(d.package, d.die) for d in shared] == [("PCB1", 0), ("PCB1", 1), ("PCB2", 0), ("PCB2", 1)]

    def xgmi(peer: str, weight: int) -> TopologyLink:
        return TopologyLink(peer, "xgmi", 1, weight)

    # No FRU: every die's serial is its own unique_id. The in-package link is the light one (15).
    own = assign_packages(
        [mi250x("0000:01:00.0", "a1", "a1", secondary=False),
         mi250x("0000:03:00.0", "b2", "b2", secondary=True, links=(xgmi("0000:01:00.0", 30), xgmi("0000:05:00.0", 15))),
         mi250x("0000:05:00.0", "c3", "c3", secondary=False),
         mi250x("0000:07:00.0", "d4", "d4", secondary=True, links=(xgmi("0000:01:00.0", 15), xgmi("0000:05:00.0", 30)))]
    )  # fmt: skip
    assert [(d.package, d.die) for d in own] == [("a1", 0), ("c3", 1), ("c3", 0), ("a1", 1)]
    # Without XGMI links, the nearest primary before it in BDF order.
    flat = assign_packages([mi250x(f"0000:0{b}:00.0", f"s{b}", f"s{b}", secondary=b in (3, 7)) for b in (1, 3, 5, 7)])
    assert [(d.package, d.die) for d in flat] == [("s1", 0), ("s1", 1), ("s5", 0), ("s5", 1)]


# --- counters ------------------------------------------------------------------------------------


def test_u32_energy_wraps_and_a_reset_restarts_cleanly() -> None:
    v1_0 = ident("0000:01:00.0", "card0", "a", gpu_metrics_version="1.0")
    state = CounterState()
    width = 2**32 * 2**-16  # 65536 J
    out = []
    for t, raw in ((0, width - 300), (1, width - 10), (2, 290), (3, 590), (4, 3), (5, 303)):
        out.append(continue_counters(state, v1_0, Sample(timestamp=t, energy_joules=raw), read_at=t).energy_joules)
    # wrap between t=1 and t=2 (+300 J): monotonic; at t=4 a drop of ~66 kJ in 1 s at most 5 kW: a reset
    assert out[:4] == [width - 300, width - 10, width + 290, width + 590]
    assert out[4:] == [3, 303]


def test_u64_counters_treat_a_drop_as_a_reset_and_mappings_per_key() -> None:
    device = ident("0000:01:00.0", "card0", "a", gpu_metrics_version="1.3")
    state = CounterState()
    first = Sample(timestamp=0, pcie_replays=100, ecc_errors=frozen_map({("umc", "correctable"): 7}))
    second = Sample(timestamp=1, pcie_replays=5, ecc_errors=frozen_map({("umc", "correctable"): 9}))
    continue_counters(state, device, first, read_at=0)
    after = continue_counters(state, device, second, read_at=1)
    assert after.pcie_replays == 5 and isinstance(after.pcie_replays, int)
    assert dict(after.ecc_errors) == {("umc", "correctable"): 9}
    # a u64 near its top that wraps to a small value is a wrap
    top = Sample(timestamp=2, pcie_replays=2**64 - 5)
    continue_counters(state, device, top, read_at=2)
    assert continue_counters(state, device, Sample(timestamp=3, pcie_replays=3), read_at=3).pcie_replays == 2**64 + 3


# --- errors as data, bounded reads -----------------------------------------------------------------


def test_file_errors_are_counted_by_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "gpu_busy_percent").write_text("abc\n")
    (dev / "big").write_bytes(b"1" * (files.MAX_FILE_BYTES + 1))
    (dev / "adir").mkdir()
    os.symlink(dev / "loop", dev / "loop")
    (dev / "eio").write_text("1\n")
    from exporter.sources import textfiles as tf

    errors = FileErrors(str(dev))
    real_read = os.read

    def failing_read(fd: int, n: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/eio"):
            raise OSError(errno.EIO, "Input/output error")
        return real_read(fd, n)

    monkeypatch.setattr(files.os, "read", failing_read)
    with collecting(errors):
        assert files.read_parsed(str(dev / "gpu_busy_percent"), tf.parse_percent_ratio) is None
        assert files.read_file_bytes(str(dev / "big")) is None
        assert files.read_file_bytes(str(dev / "adir")) is None
        assert files.read_file_bytes(str(dev / "loop")) is None
        assert files.read_file_bytes(str(dev / "eio")) is None
        assert files.read_file_bytes(str(dev / "absent")) is None  # absent is not an error
    assert errors.counts == {
        ("gpu_busy_percent", "parse"): 1,
        ("big", "too_large"): 1,
        ("adir", "eisdir"): 1,
        ("loop", "eloop"): 1,
        ("eio", "eio"): 1,
    }


def test_plausible_ranges() -> None:
    assert plausible("temperatures", 45.0) and not plausible("temperatures", 65534.0)
    assert not plausible("temperatures", 1e6) and not plausible("temperatures", -1.0)
    assert not plausible("temperatures", 0.0)
    assert not plausible("power_watts", 65534.0) and not plausible("power_watts", 29179.0)
    assert not plausible("power_cap_watts", -1e-6) and plausible("power_cap_watts", 560.0)
    assert not plausible("busy", 1.01) and plausible("busy", 1.0)
    assert not plausible("memory_used_bytes", float(2**64 - 1))
    assert not plausible("voltages_volts", (2**64 - 1) / 1000)
    assert not plausible("pcie_bandwidth_bytes_per_second", 1.5e23)
    assert not plausible("energy_joules", float("inf")) and not plausible("power_watts", float("nan"))
    assert plausible("throttle", True)


def test_labels_are_capped_and_clean() -> None:
    assert clean_label("AMD Instinct MI250X\n") == ("AMD Instinct MI250X", False)
    assert clean_label("PCB\x0012\x1b[31m") == ("PCB12[31m", True)
    text, changed = clean_label("x" * 10_000)
    assert changed and len(text) == MAX_LABEL_CHARS


# --- limited YAML ------------------------------------------------------------------------------------


# 9 levels of 9 aliases each: about 387 million values once expanded, in a few hundred bytes
BILLION_LAUGHS = (
    "a: &a ["
    + ",".join(["x"] * 9)
    + "]\n"
    + "".join(f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000, "nested deeper than 64"),
        ("{a: " * 3000 + "1" + "}" * 3000, "nested deeper than 64"),
        (BILLION_LAUGHS, "alias bomb"),
        ("a: [1, 2", "not valid YAML"),
    ],
)  # fmt: skip
def test_yaml_limits_fail_fast_in_one_line(text: str, message: str) -> None:
    # Fast by construction: a loader that expanded the bombs first would not finish at all.
    with pytest.raises(safeyaml.YamlLimitError) as caught:
        safeyaml.safe_load(text, "config file x.yaml")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_yaml_files_are_bounded_and_utf8(tmp_path: Path) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_config_values(str(binary))
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (boundedfile.DEFAULT_LIMIT + 1))
    with pytest.raises(ConfigError, match="larger than"):
        read_config_values(str(big))
    assert safeyaml.safe_load("a: &x 1\nb: *x\n", "ok") == {"a": 1, "b": 1}


# --- readiness, liveness, pools --------------------------------------------------------------------------


def test_readiness_and_liveness() -> None:
    health = Readiness(interval=1.0, read_timeout=2.0)
    assert health.readiness(None)[0] is False
    fresh = Published(snapshot=Snapshot(taken_at=1.7e9, monotonic_at=1000.0))
    assert health.readiness(fresh, now=1002.9) == (True, "ready")
    assert health.readiness(fresh, now=1003.1)[0] is False  # older than max(3 intervals, 1 + 2 s)
    assert health.failed("rules", "boom") and not health.failed("rules", "boom")
    assert health.readiness(fresh, now=1001)[1].startswith("stage rules is failing")
    assert health.ok("rules") and health.readiness(fresh, now=1001)[0]
    assert health.failures == {"rules": 2}
    assert health.liveness(now=health.last_progress + 4)[0]
    assert not health.liveness(now=health.last_progress + 6)[0]


def test_daemon_pool_threads_are_daemons_bounded_and_reused() -> None:
    pool = DaemonPool(2, "t")
    release = threading.Event()
    stuck = pool.submit(release.wait)
    results = [pool.submit(lambda i=i: i * 2).result(timeout=5) for i in range(50)]
    assert results == [i * 2 for i in range(50)] and not stuck.done()
    assert pool.threads <= 2
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("t-"))
    release.set()
    assert stuck.result(timeout=5) is True
    pool.close()


def test_unused_helpers_keep_their_shape() -> None:
    assert replace(ident("0000:01:00.0", "card0"), partition=1).key == ("0000:01:00.0", "", 1)


def test_permission_denied_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a non-root user `chmod 000` gives EACCES at open (root is never denied, so it is simulated)."""
    (tmp_path / "gpu_metrics").write_bytes(b"x")
    real_open = os.open

    def denying_open(path: str, flags: int, *args: int) -> int:
        if str(path).endswith("gpu_metrics"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(files.os, "open", denying_open)
    errors = FileErrors(str(tmp_path))
    with collecting(errors):
        assert files.read_file_bytes(str(tmp_path / "gpu_metrics")) is None
    assert errors.counts == {("gpu_metrics", "eperm"): 1}


def test_a_hung_pcie_bw_reader_expires_its_value(tmp_path: Path) -> None:
    from exporter.sources.sysfs.slow import PcieBandwidthReader

    path = tmp_path / "pcie_bw"
    path.write_text("1000 2000 256\n")
    stop = threading.Event()
    reader = PcieBandwidthReader(str(path), period=0.1, stop=stop)
    reader.start()
    try:
        deadline = time.monotonic() + 5
        while reader.bytes_per_second is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert reader.bytes_per_second == (1000 + 2000) * 256
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        os.replace(fifo, path)  # the next read blocks, as on a hung SMU
        errors = FileErrors(str(tmp_path))
        deadline = time.monotonic() + 5
        with collecting(errors):
            while reader.bytes_per_second is not None:
                assert time.monotonic() < deadline, "the last figure was served forever"
                time.sleep(0.05)
            # The hang is counted once the read itself has run max_age; the figure can expire a little
            # before that (the next read starts a period after the figure, later on a loaded machine).
            while not errors.counts:
                assert reader.bytes_per_second is None
                assert time.monotonic() < deadline, "the hang was never counted"
                time.sleep(0.05)
            for _ in range(3):  # asked again while still hung: still one
                time.sleep(0.05)
                assert reader.bytes_per_second is None
        assert errors.counts == {("pcie_bw", "timeout"): 1}, "counted once per hang"
    finally:
        stop.set()
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_files_are_named_from_their_own_folder() -> None:
    errors = FileErrors("/sys/devices/x/0000:01:00.0", "/sys/devices/x/0000:01:00.0/hwmon/hwmon7")
    errors.add("/sys/devices/x/0000:01:00.0/hwmon/hwmon7/temp2_input", "eperm")
    errors.add("/sys/devices/x/0000:01:00.0/ras/umc_err_count", "parse")
    errors.add("ras/umc_err_count", "implausible")
    errors.add("/elsewhere/\udcff_fw_version", "eio")  # a name that is not UTF-8
    assert set(errors.counts) == {
        ("temp2_input", "eperm"),
        ("ras/umc_err_count", "parse"),
        ("ras/umc_err_count", "implausible"),
        ("__fw_version", "eio"),
    }


def test_the_poller_drops_implausible_values_from_any_source() -> None:
    from exporter.sources.plausible import without_implausible

    sample = Sample(
        timestamp=1.0,
        power_watts=65534.0,
        temperatures=frozen_map({"edge": 40.0, "junction": 65534.0}),
        busy=frozen_map({"gfx": 0.5}),
    )
    cleaned, rejected = without_implausible(sample)
    assert cleaned.power_watts is None and dict(cleaned.temperatures) == {"edge": 40.0}
    assert dict(cleaned.busy) == {"gfx": 0.5}
    assert rejected == {"power_watts": 1, "temperatures": 1}
    assert without_implausible(cleaned)[0] is cleaned


def test_simulator_serial_styles(tmp_path: Path) -> None:
    from exporter.simulator import Simulator, parse_fleet

    assert str(parse_fleet("2xMI250X:serial=unique_id")) == "2xMI250X:serial=unique_id"
    assert str(parse_fleet("2xMI250X:serial=fru")) == "2xMI250X"
    with pytest.raises(ValueError, match="expected fru or unique_id"):
        parse_fleet("MI250X:serial=eeprom")
    for style in ("fru", "unique_id"):
        simulator = Simulator(tmp_path / style, fleet=f"1xMI250X:serial={style}", seed=1)
        simulator.write_tree()
        dies = [t.identity for t in simulator.truth()]
        serials = [(Path(d.device_dir) / "serial_number").read_text().strip() for d in dies]
        unique_ids = [int((Path(d.device_dir) / "unique_id").read_text(), 16) for d in dies]
        if style == "fru":
            assert serials[0] == serials[1] and dies[0].package == dies[1].package == serials[0]
        else:
            assert serials == [f"{u:x}" for u in unique_ids] and serials[0] != serials[1]
            assert dies[0].package == dies[1].package == serials[0], "the package is die 0's"
        assert [d.secondary_die for d in dies] == [False, True]


def test_alert_state_follows_the_device_key_not_the_gpu_index() -> None:
    from exporter.alerting.rulefile import default_rule_file
    from exporter.alerting.state import evaluate
    from exporter.model import DeviceState

    rules = [r for r in default_rule_file().rules if r.key == "junction" and r.for_seconds > 0][:1]
    assert rules, "the shipped rules watch the junction temperature with a for-duration"
    hot = Sample(timestamp=1.0, temperatures=frozen_map({"junction": 150.0}))
    a, b = ident("0000:01:00.0", "card0", "a"), ident("0000:02:00.0", "card1", "b")
    first, _ = evaluate(
        rules, (), Snapshot(taken_at=1000.0, monotonic_at=1000.0, devices=(DeviceState(a, 0, hot, True),))
    )
    (state,) = first
    assert state.device_key == a.key and state.pending_since is not None
    # were a device ever renumbered, its alert would move with it, and another device at its old index
    # would start afresh
    moved = (DeviceState(b, 0, hot, True), DeviceState(a, 1, hot, True))
    second, _ = evaluate(rules, first, Snapshot(taken_at=1001.0, monotonic_at=1001.0, devices=moved))
    by_key = {s.device_key: s for s in second}
    assert by_key[a.key].pending_since == state.pending_since and by_key[a.key].gpu == 1
    assert by_key[b.key].pending_since == 1001.0 and by_key[b.key].gpu == 0


def test_ranges_and_counter_rules_name_sample_fields_and_cover_every_counter() -> None:
    import dataclasses

    from exporter.exposition.metrics import METRICS
    from exporter.pipeline.counters import COUNTERS
    from exporter.sources.plausible import RANGES

    fields = {f.name for f in dataclasses.fields(Sample)}
    assert set(RANGES) <= fields and set(COUNTERS) <= fields
    # not numbers (bools, a DPM table, the error counts themselves, records, an instant)
    not_ranged = {"timestamp", "throttle", "xgmi_link_up", "file_errors", "gfx_dpm_levels_hertz"}
    not_ranged |= {"node_power_management_enabled"}
    assert fields - set(RANGES) == not_ranged | {"cper_records", "last_reset_at"}
    # every per-device counter family is fed by a field the counter rules make continuous
    counters = {spec.name for spec in METRICS if spec.kind == "counter" and spec.sample_getter is not None}
    fed = {name: Sample(timestamp=0.0, **{name: _one(name)}) for name in COUNTERS}
    for spec in METRICS:
        if spec.name in counters:
            assert any(list(spec.sample_getter(sample)) for sample in fed.values()), spec.name  # type: ignore[misc]


def _one(name: str) -> object:
    import dataclasses

    field = next(f for f in dataclasses.fields(Sample) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:  # a mapping field
        key: object = ("umc", "correctable") if name == "ecc_errors" else (0 if "xgmi" in name else "ppt")
        return frozen_map({key: 1})
    return 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["a", "b"]),
            st.sampled_from([0, 5, 9, 2**64 * 1024 - 7, 2**64 * 1024 - 1, 3, 2**70]),
            min_size=1,
        ),
        min_size=1,
        max_size=12,
    ).map(lambda steps: [steps[i // 2] for i in range(2 * len(steps))])  # each value twice: repeats are common
)
def test_an_unchanged_mapping_skips_its_steps_and_changes_nothing(steps: list[dict[str, int]]) -> None:
    """The settled-mapping shortcut against the same stepping with the shortcut defeated every time."""
    device = ident("0000:01:00.0", "card0", "a", gpu_metrics_version="1.3")
    fast, reference = CounterState(), CounterState()
    for t, values in enumerate(steps):
        sample = Sample(timestamp=float(t), xgmi_read_bytes=frozen_map(values))
        reference.settled.clear()
        expected = continue_counters(reference, device, sample, read_at=float(t))
        assert continue_counters(fast, device, sample, read_at=float(t)) == expected
    assert fast.tracks == reference.tracks
