"""Values read off the poll path: the slow layer (caps, thresholds, DPM tables, RAS counts, the
health signals) and pcie_bw.

The slow layer is re-read every --slow-interval and merged into every sample until the next
refresh. pcie_bw sleeps ~1 s in the kernel and resets its counters on read, so one background
thread per device reads it and the poll path only picks up its latest figure.

The health signals (docs/health-signals.md) are slow too: a RAS count read asks the firmware and
clears hardware status, the bad-page list can be tens of KB, the CPER ring up to 1 MiB. Two of them
live in debugfs (<root>/kernel/debug, root only): the CPER ring and the driver's bad-page threshold;
without them the threshold is worked out from the module parameter as the driver does.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable

from exporter.model import DeviceIdentity
from exporter.sources import textfiles as tf
from exporter.sources.base import SourceError
from exporter.sources.cper import RING_BYTES, RING_POINTERS_BYTES, scan_cper_ring
from exporter.sources.errors import FileErrors, collecting, failures_recorded, record
from exporter.sources.labels import clean_name
from exporter.sources.plausible import MAX_XGMI_ERRORS_PER_READ, plausible
from exporter.sources.sysfs.board import read_board
from exporter.sources.sysfs.files import read_file_bytes, read_file_chunks, read_file_head, read_parsed
from exporter.sources.sysfs.present import PresentFiles, debugfs_dir, module_parameters, probe
from exporter.sources.sysfs.table import SLOW_FILES, SampleValues, read_rows

# clock domain -> its DPM table: the highest level is the domain's max, the starred one its current clock
DPM_FILES = {
    "gfx": "pp_dpm_sclk",
    "memory": "pp_dpm_mclk",
    "fabric": "pp_dpm_fclk",
    "soc": "pp_dpm_socclk",
    "video": "pp_dpm_vclk",
    "decode": "pp_dpm_dclk",
}


AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
CPER_RING_MAX_BYTES = RING_POINTERS_BYTES + RING_BYTES  # the ring's pointers and its 1 MiB (CPER_MAX_RING_SIZE)
COREDUMP_HEAD_BYTES = 4096
RING_LIMIT_BYTES = 64 << 20  # no kernel sizes a CPER ring near this
FUTURE_SLACK_SECONDS = 60.0  # evidence dated further ahead is counted `future` (the verdict ages it from first sight)
BAD_PAGE_COVER_BYTES = 100 * 1024 * 1024  # the driver's formula: one retired page per 100 MiB of VRAM


def read_slow_layer(
    device: DeviceIdentity,
    previous: SampleValues | None,
    root: str = "/sys",
    *,
    present: PresentFiles | None = None,
    skip: frozenset[str] = frozenset(),
    static: SampleValues | None = None,
) -> SampleValues:
    """SLOW_FILES plus the readers a single row cannot express (one file -> two fields, a directory, a
    sum, a binary ring); `root` is the sysfs root (debugfs and the module parameters are under it).

    Only the files of `present` (what discovery found: probed now when not given) are opened, and
    none that fill only the Sample fields of `skip` (those no family shown reads). `static`: the
    values of the static rows read earlier (read_static_layer), which are then not read again."""
    dev = device.device_dir
    present = probe(device, root) if present is None else present
    read = present.read
    if static is None:
        static, _ = read_static_layer(device, present, skip)
    values = SampleValues.copy_of(static)
    read_rows([row for row in SLOW_FILES if not row.static and row.field not in skip], device, values, read)
    _read_health_signals(device, values, root, present)
    for domain, name in DPM_FILES.items():
        levels = read_parsed(f"{dev}/{name}", tf.parse_pp_dpm, read)
        if levels is not None and levels.levels_hertz:
            values.set("clocks_max_hertz", domain, levels.max_hertz, name)
            if "clocks_min_hertz" not in skip:
                values.set("clocks_min_hertz", domain, min(levels.levels_hertz), name)
            if domain == "gfx":
                # Lowest first; a fine-grained table (at most three lines: min, the current clock when
                # between, max) as its range (min, max): its middle line is the clock of the moment, not a level.
                table = sorted(levels.levels_hertz)
                values.set("gfx_dpm_levels_hertz", None, (table[0], table[-1]) if len(table) <= 3 else tuple(table))
            if levels.current_hertz is not None:
                values.set("clocks_hertz", domain, levels.current_hertz, name)
    ras_dir = f"{dev}/ras"
    for entry in present.entries(ras_dir):
        if entry.endswith("_err_count"):
            counts = read_parsed(f"{ras_dir}/{entry}", tf.parse_ras_err_count, read)
            if counts is None:
                continue
            block = clean_name(entry.removesuffix("_err_count"))
            for kind in ("correctable", "uncorrectable", "deferred"):
                if (count := getattr(counts, kind)) is not None:  # deferred: only on newer kernels
                    values.set("ecc_errors", (block, kind), count, f"ras/{entry}")
    # xgmi_error clears on read: add what it says now to what we have seen before. One absurd read
    # (2^64-1) is rejected, or it would poison the accumulated counter for good.
    new_errors = read_parsed(f"{dev}/xgmi_error", tf.parse_unsigned, read)
    if new_errors is not None and new_errors > MAX_XGMI_ERRORS_PER_READ:
        record(f"{dev}/xgmi_error", "implausible", f"{new_errors} events in one read")
        new_errors = None
    before = previous.scalars.get("xgmi_error_events") if previous is not None else None
    before = before if isinstance(before, int | float) else None
    total = (int(before or 0) + new_errors) if new_errors is not None else before
    values.set("xgmi_error_events", None, total, "xgmi_error")
    read_board(dev, values, read, skip)
    return values


def read_static_layer(
    device: DeviceIdentity, present: PresentFiles, skip: frozenset[str] = frozenset()
) -> tuple[SampleValues, bool]:
    """The static rows of SLOW_FILES (values that cannot change while the device stays what discovery
    found), and whether every read went through: a failed one (counted as any) is read again at
    the next refresh rather than missing until the next discovery."""
    values = SampleValues()
    failures = failures_recorded()
    read_rows([row for row in SLOW_FILES if row.static and row.field not in skip], device, values, present.read)
    return values, failures_recorded() == failures


def _read_health_signals(device: DeviceIdentity, values: SampleValues, root: str, present: PresentFiles) -> None:
    dev = device.device_dir
    read = present.read
    bad_pages = f"{dev}/ras/gpu_vram_bad_pages"
    if present.has(bad_pages):
        _read_bad_pages(bad_pages, values)
    debugfs = debugfs_dir(device, root)
    threshold = bad_page_threshold(device, values, root, debugfs, read)
    values.set("ras_bad_page_threshold", None, threshold, "bad_page_threshold")
    # the device's own AER counters, then those of the port above it (a switch or root port: the
    # folder the device's folder is in, when that is a PCI device with AER)
    for port, folder in (("device", dev), ("upstream", os.path.dirname(dev))):
        for severity, name in AER_FILES.items():
            path = f"{folder}/{name}"
            count = read_parsed(path, functools.partial(tf.parse_aer_total, severity=severity), read)
            if count is not None:
                values.set("pcie_aer_errors", (port, severity), count, name)
    ring_path = f"{debugfs}/amdgpu_ring_cper"
    if present.has(ring_path):
        ring = read_file_bytes(ring_path, _ring_bytes(ring_path))
        if ring is not None:
            scan = scan_cper_ring(ring)
            for error in scan.errors:  # each record skipped; the others still count
                record(ring_path, "bad_record", error)
            now = time.time()
            for future in (r for r in scan.records if r.timestamp > now + FUTURE_SLACK_SECONDS):
                record(ring_path, "future", f"record {future.record_id!r} dated {future.timestamp - now:.0f} s ahead")
            values.set("cper_records", None, scan.records, "amdgpu_ring_cper")
    values.set("last_reset_at", None, _last_reset_at(dev), "devcoredump/data")


def _ring_bytes(path: str) -> int:
    """How much a read of a ring may give: its debugfs file's size, which the kernel sets to the ring's
    size plus the pointers (debugfs_create_file_size), else the 1 MiB ring; never over RING_LIMIT_BYTES."""
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    return min(max(size, CPER_RING_MAX_BYTES), RING_LIMIT_BYTES)


def _read_bad_pages(path: str, values: SampleValues) -> None:
    """Retired and pending pages, counted while the file streams in and bounded by what the EEPROM can
    hold (textfiles.BadPageCount): a bad line is counted and skipped, the records around it count."""
    count = tf.BadPageCount()
    if not read_file_chunks(path, count.feed, tf.BAD_PAGES_MAX_BYTES):
        return
    pages = count.finish()
    if count.bad_lines:
        record(path, "bad_record", f"{count.bad_lines} lines not a bad page record, the first {count.first_bad!r}")
    if count.too_many:
        record(path, "too_large", f"{count.records} records, more than the EEPROM holds")
        return
    values.set("ras_retired_pages", None, pages.retired, "ras/gpu_vram_bad_pages")
    values.set("ras_pending_pages", None, pages.pending, "ras/gpu_vram_bad_pages")


def bad_page_threshold(
    device: DeviceIdentity,
    values: SampleValues,
    root: str,
    debugfs: str,
    read: Callable[[str], bytes | None] = read_file_bytes,
) -> int | None:
    """The retired-page count at which the driver calls the board's VRAM bad. Debugfs has the driver's
    own figure (ras/bad_page_cnt_threshold); else it follows from the module parameter bad_page_threshold
    as the driver works it out: below 0 (the default -1, or -2) one page per 100 MiB of VRAM, 0 (bad
    page retirement off) none, above 0 that count. The driver also caps it at its EEPROM table's ~10900
    records, more than any Instinct's VRAM gives."""
    if debugfs:
        exact = read_parsed(f"{debugfs}/ras/bad_page_cnt_threshold", tf.parse_unsigned, read)
        if exact is not None:
            return exact
    parameter = read_parsed(os.path.join(module_parameters(root), "bad_page_threshold"), tf.parse_signed, read)
    if parameter is None or parameter == 0:
        return None
    if parameter > 0:
        return parameter
    vram = values.mappings.get("memory_total_bytes", {}).get("vram")
    return int(vram) // BAD_PAGE_COVER_BYTES if vram else None


def _last_reset_at(dev: str) -> float | None:
    """Unix seconds of the reset whose device coredump the driver left on this device (the kernel drops
    it 5 minutes on, or when someone writes to it). Its time is CLOCK_MONOTONIC, put on the wall clock
    with this host's offset between the two."""
    if not os.path.isdir(f"{dev}/devcoredump"):  # there only for 5 minutes after a reset: a stat, not an open
        return None
    path = f"{dev}/devcoredump/data"
    head = read_file_head(path, COREDUMP_HEAD_BYTES)
    if head is None:
        return None
    try:
        monotonic = tf.parse_devcoredump_time(head)  # any bytes: the comm line is the user's
    except tf.TextParseError as error:
        record(path, "parse", str(error))
        return None
    now = time.monotonic()
    if monotonic > now + FUTURE_SLACK_SECONDS:
        record(path, "future", f"a reset {monotonic - now:.0f} s after now on the monotonic clock")
    return time.time() - now + monotonic


class PcieBandwidthReader(threading.Thread):
    """Reads pcie_bw in the background: each read blocks ~1 s in the kernel and resets counters.

    Its figure expires: when the reader hangs (a stuck SMU), the last value is not served forever.
    """

    def __init__(self, path: str, period: float, stop: threading.Event) -> None:
        super().__init__(name=f"pcie_bw:{path}", daemon=True)
        self.path = path
        self.period = period
        self.stop_event = stop
        self._value: tuple[float, float] | None = None  # (bytes per second, monotonic time read)
        self._errors: list[tuple[str, str]] = []  # (reason, detail) since the poll path last took them
        self._read_started: float | None = None
        self._lock = threading.Lock()
        self._timeout_counted = False
        self.max_age = 3 * period + 1.0  # a figure older than this is gone (three periods, plus the kernel's 1 s)

    @property
    def bytes_per_second(self) -> float | None:
        now = time.monotonic()
        with self._lock:
            value = self._value
            stuck_since = self._read_started
        if stuck_since is not None and now - stuck_since > self.max_age and not self._timeout_counted:
            self._timeout_counted = True
            record(self.path, "timeout", f"pcie_bw read running for {now - stuck_since:.0f} s")
        if value is None or now - value[1] > self.max_age:
            return None
        return value[0]

    def take_errors(self) -> None:
        """Count the reader's own failures (parse, EIO ...) for the device being read now."""
        with self._lock:
            errors, self._errors = self._errors, []
        for reason, detail in errors:
            record(self.path, reason, detail)

    def run(self) -> None:
        while not self.stop_event.is_set():
            started = time.monotonic()
            errors = FileErrors()
            with self._lock:
                self._read_started = started
            try:
                with collecting(errors):
                    bw = read_parsed(self.path, tf.parse_pcie_bw)
            except SourceError:
                bw = None
            figure = bw.estimate_bytes_per_second() if bw is not None else None
            if figure is not None and not plausible("pcie_bandwidth_bytes_per_second", figure):
                errors.add("pcie_bw", "implausible", f"{figure:g} B/s")
                figure = None
            with self._lock:
                self._read_started = None
                self._timeout_counted = False
                self._errors.extend((reason, errors.details.get((f, reason), "")) for f, reason in errors.counts)
                # The kernel sleeps 1 s while counting; a simulated tree returns at once, where the
                # counts are still per-second figures.
                self._value = (figure, time.monotonic()) if figure is not None else None
            self.stop_event.wait(max(self.period - (time.monotonic() - started), 0.1))
