"""Values read off the poll path: the slow layer (caps, thresholds, DPM tables, RAS counts) and pcie_bw.

The slow layer is re-read every --slow-interval and merged into every sample until the next
refresh. pcie_bw sleeps ~1 s in the kernel and resets its counters on read, so one background
thread per device reads it and the poll path only picks up its latest figure.
"""

from __future__ import annotations

import threading
import time

from exporter.model import DeviceIdentity
from exporter.sources import textfiles as tf
from exporter.sources.base import SourceError
from exporter.sources.errors import FileErrors, collecting, record
from exporter.sources.labels import clean_name
from exporter.sources.plausible import MAX_XGMI_ERRORS_PER_READ, plausible
from exporter.sources.sysfs.files import listdir, read_parsed
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


def read_slow_layer(device: DeviceIdentity, previous: SampleValues | None) -> SampleValues:
    """SLOW_FILES plus the readers a single row cannot express (one file -> two fields, a directory, a sum)."""
    dev = device.device_dir
    values = SampleValues()
    read_rows(SLOW_FILES, device, values)
    for domain, name in DPM_FILES.items():
        levels = read_parsed(f"{dev}/{name}", tf.parse_pp_dpm)
        if levels is not None and levels.levels_hertz:
            values.set("clocks_max_hertz", domain, levels.max_hertz, name)
            values.set("clocks_min_hertz", domain, min(levels.levels_hertz), name)
            if domain == "gfx":
                # Lowest first; a fine-grained table (at most three lines: min, the current clock when
                # between, max) as its range (min, max): its middle line is the clock of the moment, not a level.
                table = sorted(levels.levels_hertz)
                values.set("gfx_dpm_levels_hertz", None, (table[0], table[-1]) if len(table) <= 3 else tuple(table))
            if levels.current_hertz is not None:
                values.set("clocks_hertz", domain, levels.current_hertz, name)
    ras_dir = f"{dev}/ras"
    for entry in listdir(ras_dir):
        if entry.endswith("_err_count"):
            counts = read_parsed(f"{ras_dir}/{entry}", tf.parse_ras_err_count)
            if counts is None:
                continue
            block = clean_name(entry.removesuffix("_err_count"))
            for kind in ("correctable", "uncorrectable", "deferred"):
                if (count := getattr(counts, kind)) is not None:  # deferred: only on newer kernels
                    values.set("ecc_errors", (block, kind), count, f"ras/{entry}")
    # xgmi_error clears on read: add what it says now to what we have seen before. One absurd read
    # (2^64-1) is rejected, or it would poison the accumulated counter for good.
    new_errors = read_parsed(f"{dev}/xgmi_error", tf.parse_unsigned)
    if new_errors is not None and new_errors > MAX_XGMI_ERRORS_PER_READ:
        record(f"{dev}/xgmi_error", "implausible", f"{new_errors} events in one read")
        new_errors = None
    before = previous.scalars.get("xgmi_error_events") if previous is not None else None
    before = before if isinstance(before, int | float) else None
    total = (int(before or 0) + new_errors) if new_errors is not None else before
    values.set("xgmi_error_events", None, total, "xgmi_error")
    return values


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
