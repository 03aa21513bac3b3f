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


def dpm_table(levels_hertz: tuple[float, ...]) -> tuple[float, ...]:
    """A DPM table as Sample.gfx_dpm_levels_hertz holds it: lowest first; a fine-grained table (at most
    three lines: min, the current clock when between, max) as its range (min, max), since its middle
    line is the clock of the moment, not a level."""
    levels = sorted(levels_hertz)
    return (levels[0], levels[-1]) if len(levels) <= 3 else tuple(levels)


def read_slow_layer(device: DeviceIdentity, previous: SampleValues | None) -> SampleValues:
    """SLOW_FILES plus the readers a single row cannot express (one file -> two fields, a directory, a sum)."""
    dev = device.device_dir
    values = SampleValues()
    read_rows(SLOW_FILES, device, values)
    for domain, name in DPM_FILES.items():
        levels = read_parsed(f"{dev}/{name}", tf.parse_pp_dpm)
        if levels is not None and levels.levels_hertz:
            values.set("clocks_max_hertz", domain, levels.max_hertz)
            if domain == "gfx":
                values.set("gfx_dpm_levels_hertz", None, dpm_table(levels.levels_hertz))
            if levels.current_hertz is not None:
                values.set("clocks_hertz", domain, levels.current_hertz)
    ras_dir = f"{dev}/ras"
    for entry in listdir(ras_dir):
        if entry.endswith("_err_count"):
            counts = read_parsed(f"{ras_dir}/{entry}", tf.parse_ras_err_count)
            if counts is None:
                continue
            block = entry.removesuffix("_err_count")
            values.set("ecc_errors", (block, "correctable"), counts.correctable)
            values.set("ecc_errors", (block, "uncorrectable"), counts.uncorrectable)
            if counts.deferred is not None:
                values.set("ecc_errors", (block, "deferred"), counts.deferred)
    # xgmi_error clears on read: add what it says now to what we have seen before.
    new_errors = read_parsed(f"{dev}/xgmi_error", tf.parse_unsigned)
    before = previous.scalars.get("xgmi_error_events") if previous is not None else None
    before = before if isinstance(before, int | float) else None
    values.set("xgmi_error_events", None, (int(before or 0) + new_errors) if new_errors is not None else before)
    return values


class PcieBandwidthReader(threading.Thread):
    """Reads pcie_bw in the background: each read blocks ~1 s in the kernel and resets counters."""

    def __init__(self, path: str, period: float, stop: threading.Event) -> None:
        super().__init__(name=f"pcie_bw:{path}", daemon=True)
        self.path = path
        self.period = period
        self.stop_event = stop
        self.bytes_per_second: float | None = None

    def run(self) -> None:
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                bw = read_parsed(self.path, tf.parse_pcie_bw)
            except SourceError:
                bw = None
            # The kernel sleeps 1 s while counting; a simulated tree returns at once, where the
            # counts are still per-second figures.
            self.bytes_per_second = bw.estimate_bytes_per_second() if bw is not None else None
            self.stop_event.wait(max(self.period - (time.monotonic() - started), 0.1))
