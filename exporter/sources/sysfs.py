"""The sysfs source: the amdgpu kernel ABI read directly, under a configurable root.

One gpu_metrics read per device per cycle supplies most values (one SMU round trip instead of a
dozen hwmon reads); a handful of text files fill the rest. Files that rarely change or cost a
firmware round trip (caps, thresholds, DPM tables, RAS counts) are read on a slow schedule and
merged into every sample; pcie_bw (sleeps 1 s in the kernel and resets its counters) is read by
one background thread per device, never on the poll path.

All parsing is delegated to the pure modules gpu_metrics.py and textfiles.py; this module only
finds files, reads them, and assembles a Sample.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from exporter.logging import get_logger
from exporter.model import DeviceIdentity, Sample, TopologyLink, frozen_map
from exporter.sources import textfiles as tf
from exporter.sources.base import SourceError
from exporter.sources.gpu_metrics import GpuMetrics, GpuMetricsError, decode_gpu_metrics

log = get_logger("exporter.sources.sysfs")

T = TypeVar("T")

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_CARD = re.compile(r"^card(\d+)$")

# PCI device id -> (asic, product name used when the board has no FRU EEPROM)
KNOWN_DEVICES: dict[str, tuple[str, str]] = {
    "0x740c": ("aldebaran", "AMD Instinct MI250X / MI250"),
    "0x740f": ("aldebaran", "AMD Instinct MI210"),
    "0x7408": ("aldebaran", "AMD Instinct MI250X"),
    "0x74a1": ("aqua_vanjaram", "AMD Instinct MI300X"),
    "0x74a0": ("aqua_vanjaram", "AMD Instinct MI300A"),
    "0x74a5": ("aqua_vanjaram", "AMD Instinct MI325X"),
    "0x74a9": ("aqua_vanjaram", "AMD Instinct MI300X HF"),
}
# Dual-die packages: each die is its own PCI function; only die 0 measures package power.
_DUAL_DIE_DEVICE_IDS = {"0x740c", "0x7408"}

_KFD_LINK_TYPES = {2: "pcie", 11: "xgmi"}
_HWMON_TEMPS = {"edge": 1, "junction": 2, "memory": 3}
_DPM_DOMAINS = {
    "gfx": "pp_dpm_sclk",
    "memory": "pp_dpm_mclk",
    "fabric": "pp_dpm_fclk",
    "soc": "pp_dpm_socclk",
    "video": "pp_dpm_vclk",
    "decode": "pp_dpm_dclk",
}
_MEMORY_POOLS = {"vram": "mem_info_vram", "visible_vram": "mem_info_vis_vram", "gtt": "mem_info_gtt"}


def read_file_bytes(path: str) -> bytes | None:
    """Read a whole sysfs file; None when it is absent or the driver refuses it right now.

    os.open/os.read: a sysfs attribute is one read, and this is several times cheaper than
    the buffered file object on the hot path.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as error:
        if error.errno in (errno.ENODEV, errno.ENXIO):
            raise SourceError("gone", f"{path}: {error.strerror}") from error
        return None
    finally:
        os.close(fd)


def read_parsed(path: str, parse: Callable[[str], T]) -> T | None:
    """Read and parse a text file; absent, refused or unparsable all mean 'not supplied now'."""
    raw = read_file_bytes(path)
    if raw is None:
        return None
    try:
        return parse(raw.decode("ascii", errors="strict"))
    except (UnicodeDecodeError, tf.TextParseError):
        return None


def _bdf_from_path(path: str) -> str | None:
    name = os.path.basename(path.rstrip("/")).lower()
    return name if _BDF.match(name) else None


@dataclass(slots=True)
class _SlowFields:
    """Values read on the slow schedule and merged into every sample until the next refresh."""

    due: float = 0.0
    thresholds: dict[tuple[str, str], float] = field(default_factory=dict)
    power_cap: float | None = None
    power_cap_max: float | None = None
    memory_total: dict[str, float] = field(default_factory=dict)
    clocks_max: dict[str, float] = field(default_factory=dict)
    clocks_current: dict[str, float] = field(default_factory=dict)
    pcie_max_speed: float | None = None
    pcie_max_width: int | None = None
    pcie_speed: float | None = None
    pcie_width: int | None = None
    pcie_replays: int | None = None
    ecc: dict[tuple[str, str], int] = field(default_factory=dict)
    retired_pages: int | None = None
    xgmi_errors: int | None = None  # accumulated: the file clears on read


class _PcieBandwidthReader(threading.Thread):
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


class SysfsSource:
    """Source over a sysfs root (default "/sys"; a simulator's folder in tests and the demo)."""

    name = "sysfs"

    def __init__(self, sysfs_root: str | Path = "/sys", *, slow_interval: float = 10.0, pcie_bw_interval: float = 30.0):
        self.root = str(sysfs_root)
        self.slow_interval = slow_interval
        self.pcie_bw_interval = pcie_bw_interval
        self._slow: dict[str, _SlowFields] = {}
        self._slow_lock = threading.Lock()
        self._pcie_readers: dict[str, _PcieBandwidthReader] = {}
        self._stop = threading.Event()
        self._warned: set[tuple[str, str]] = set()

    # -- discovery -------------------------------------------------------------------------
    def discover(self) -> Sequence[DeviceIdentity]:
        drm = os.path.join(self.root, "class", "drm")
        try:
            names = os.listdir(drm)
        except OSError:
            return []
        kfd = self._read_kfd_topology()
        driver_version = read_parsed(os.path.join(self.root, "module", "amdgpu", "version"), tf.parse_word) or ""
        found: list[DeviceIdentity] = []
        for name in names:
            if not _CARD.match(name):
                continue
            device_dir = os.path.realpath(os.path.join(drm, name, "device"))
            bdf = _bdf_from_path(device_dir)
            if bdf is None:  # MI300 partition platform devices (amdgpu_xcp_N) and other non-PCI cards
                continue
            uevent = read_parsed(os.path.join(device_dir, "uevent"), tf.parse_uevent) or {}
            vendor = read_parsed(os.path.join(device_dir, "vendor"), tf.parse_hex_id)
            if uevent.get("DRIVER") != "amdgpu" or vendor != "0x1002":
                continue
            found.append(self._identity(name, device_dir, bdf, driver_version, kfd))
        return assign_packages(sorted(found, key=lambda d: d.pci_bus_id))

    def _identity(
        self,
        card: str,
        device_dir: str,
        bdf: str,
        driver_version: str,
        kfd: dict[str, tuple[TopologyLink, ...]],
    ) -> DeviceIdentity:
        def text(name: str) -> str:
            return read_parsed(os.path.join(device_dir, name), str.strip) or ""

        device_id = read_parsed(os.path.join(device_dir, "device"), tf.parse_hex_id) or ""
        asic, default_product = KNOWN_DEVICES.get(device_id, ("", ""))
        firmware: dict[str, str] = {}
        fw_dir = os.path.join(device_dir, "fw_version")
        for entry in _listdir(fw_dir):
            if entry.endswith("_fw_version"):
                version = read_parsed(os.path.join(fw_dir, entry), tf.parse_fw_version)
                if version is not None:
                    firmware[entry.removesuffix("_fw_version")] = version
        hwmon_dir = ""
        for entry in sorted(_listdir(os.path.join(device_dir, "hwmon"))):
            candidate = os.path.join(device_dir, "hwmon", entry)
            if read_parsed(os.path.join(candidate, "name"), str.strip) == "amdgpu":
                hwmon_dir = os.path.realpath(candidate)
                break
        blob = read_file_bytes(os.path.join(device_dir, "gpu_metrics"))
        metrics_version = f"{blob[2]}.{blob[3]}" if blob is not None and len(blob) >= 4 else ""
        numa = read_parsed(os.path.join(device_dir, "numa_node"), tf.parse_signed)
        physical = read_parsed(os.path.join(device_dir, "xgmi_physical_id"), tf.parse_unsigned)
        return DeviceIdentity(
            pci_bus_id=bdf,
            card=card,
            device_dir=device_dir,
            unique_id=read_parsed(os.path.join(device_dir, "unique_id"), tf.parse_unique_id) or "",
            hwmon_dir=hwmon_dir,
            vendor_id="0x1002",
            device_id=device_id,
            product=text("product_name") or default_product,
            asic=asic,
            serial=text("serial_number"),
            vbios=text("vbios_version"),
            driver_version=driver_version,
            compute_partition=text("current_compute_partition"),
            memory_partition=text("current_memory_partition"),
            xgmi_hive_id=text("xgmi_hive_info/xgmi_hive_id"),
            xgmi_physical_id=physical,
            numa_node=numa if numa is not None and numa >= 0 else None,
            firmware=frozen_map(firmware),
            topology=kfd.get(bdf, ()),
            gpu_metrics_version=metrics_version,
        )

    def _read_kfd_topology(self) -> dict[str, tuple[TopologyLink, ...]]:
        """BDF -> io_links from the KFD topology (peer BDFs resolved through node numbers)."""
        nodes_dir = os.path.join(self.root, "class", "kfd", "kfd", "topology", "nodes")
        node_bdf: dict[int, str] = {}
        node_links: dict[int, list[dict[str, int]]] = {}
        for entry in _listdir(nodes_dir):
            if not entry.isdigit():
                continue
            node = int(entry)
            node_dir = os.path.join(nodes_dir, entry)
            props = read_parsed(os.path.join(node_dir, "properties"), tf.parse_key_values) or {}
            gpu_id = read_parsed(os.path.join(node_dir, "gpu_id"), tf.parse_unsigned) or 0
            if gpu_id and "location_id" in props:
                loc = props["location_id"]
                node_bdf[node] = f"{props.get('domain', 0):04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1F:02x}.{loc & 0x7}"
            links_dir = os.path.join(node_dir, "io_links")
            node_links[node] = [
                link
                for link_entry in _listdir(links_dir)
                if (link := read_parsed(os.path.join(links_dir, link_entry, "properties"), tf.parse_key_values))
            ]
        result: dict[str, tuple[TopologyLink, ...]] = {}
        for node, bdf in node_bdf.items():
            links = []
            for props in node_links.get(node, []):
                peer = node_bdf.get(props.get("node_to", -1), "")
                kind = _KFD_LINK_TYPES.get(props.get("type", -1), f"type{props.get('type', -1)}")
                # Each KFD io_link is a direct link: one hop.
                links.append(TopologyLink(peer, kind, 1, props.get("weight", 0)))
            result[bdf] = tuple(sorted(links, key=lambda link: (link.peer_pci_bus_id, link.link_type)))
        return result

    # -- reading ---------------------------------------------------------------------------
    def read(self, device: DeviceIdentity) -> Sample:
        dev = device.device_dir
        if not os.path.isdir(dev):
            raise SourceError("gone", f"{dev} no longer exists")
        metrics = self._read_gpu_metrics(device)
        slow = self._slow_fields(device)
        temperatures: dict[str, float] = {}
        busy: dict[str, float] = {}
        clocks: dict[str, float] = dict(slow.clocks_current)
        power = energy = None
        sample_kwargs: dict[str, object] = {}
        if metrics is not None:
            temperatures.update(metrics.temperatures)
            busy.update(metrics.busy)
            clocks.update(metrics.clocks_hertz)
            power, energy = metrics.power_watts, metrics.energy_joules
            sample_kwargs.update(
                throttle=frozen_map(metrics.throttle),
                pcie_bandwidth_bytes_per_second=metrics.pcie_bandwidth_bytes_per_second,
                pcie_recoveries=metrics.pcie_recoveries,
                pcie_naks_sent=metrics.pcie_naks_sent,
                pcie_naks_received=metrics.pcie_naks_received,
                xgmi_link_width=metrics.xgmi_link_width,
                xgmi_link_bits_per_second=metrics.xgmi_link_bits_per_second,
                xgmi_link_up=frozen_map(metrics.xgmi_link_up),
                xgmi_read_bytes=frozen_map(metrics.xgmi_read_bytes),
                xgmi_write_bytes=frozen_map(metrics.xgmi_write_bytes),
            )
        # Without a usable gpu_metrics table, fall back to the per-value files (more SMU trips).
        hwmon = device.hwmon_dir
        if hwmon and not temperatures:
            for sensor, index in _HWMON_TEMPS.items():
                value = read_parsed(f"{hwmon}/temp{index}_input", _milli)
                if value is not None:
                    temperatures[sensor] = value
        if not busy:
            for engine, name in (("gfx", "gpu_busy_percent"), ("memory", "mem_busy_percent")):
                ratio = read_parsed(f"{dev}/{name}", tf.parse_percent_ratio)
                if ratio is not None:
                    busy[engine] = ratio
        if power is None and hwmon:
            power = read_parsed(f"{hwmon}/power1_average", _micro)
            if power is None:
                power = read_parsed(f"{hwmon}/power1_input", _micro)
        voltages = dict(metrics.voltages_volts) if metrics is not None else {}
        if hwmon and "gfx" not in voltages:
            # MI2xx leaves the gpu_metrics voltages unset; hwmon in0 (vddgfx) has the gfx rail.
            vddgfx = read_parsed(f"{hwmon}/in0_input", _milli)
            if vddgfx is not None:
                voltages["gfx"] = vddgfx
        sample_kwargs["voltages_volts"] = frozen_map(voltages)
        if hwmon and "gfx" not in clocks:
            gfx = read_parsed(f"{hwmon}/freq1_input", tf.parse_unsigned)
            if gfx is not None:
                clocks["gfx"] = float(gfx)
        if device.die > 0 and device.device_id in _DUAL_DIE_DEVICE_IDS:
            # The second die of an MI250X reads 0 W and 0 J: the package is measured on die 0.
            power = energy = None
        memory_used: dict[str, float] = {}
        for pool, prefix in _MEMORY_POOLS.items():
            used = read_parsed(f"{dev}/{prefix}_used", tf.parse_unsigned)
            if used is not None:
                memory_used[pool] = float(used)
        pcie_speed = metrics.pcie_link_transfers_per_second if metrics is not None else None
        pcie_width = metrics.pcie_link_width if metrics is not None else None
        replays = metrics.pcie_replays if metrics is not None else None
        pcie_bw = sample_kwargs.get("pcie_bandwidth_bytes_per_second")
        if pcie_bw is None:
            sample_kwargs["pcie_bandwidth_bytes_per_second"] = self._background_pcie_bandwidth(device)
        if not temperatures and not busy and not memory_used and power is None:
            raise SourceError("read_error", f"{device.card}: no value could be read from {dev}")
        return Sample(
            timestamp=time.time(),
            temperatures=frozen_map(temperatures),
            temperature_thresholds=frozen_map(slow.thresholds),
            power_watts=power,
            power_cap_watts=slow.power_cap,
            power_cap_max_watts=slow.power_cap_max,
            energy_joules=energy,
            busy=frozen_map(busy),
            memory_used_bytes=frozen_map(memory_used),
            memory_total_bytes=frozen_map(slow.memory_total),
            clocks_hertz=frozen_map(clocks),
            clocks_max_hertz=frozen_map(slow.clocks_max),
            pcie_link_transfers_per_second=pcie_speed if pcie_speed is not None else slow.pcie_speed,
            pcie_max_link_transfers_per_second=slow.pcie_max_speed,
            pcie_link_width=pcie_width if pcie_width is not None else slow.pcie_width,
            pcie_max_link_width=slow.pcie_max_width,
            pcie_replays=replays if replays is not None else slow.pcie_replays,
            xgmi_error_events=slow.xgmi_errors,
            ecc_errors=frozen_map(slow.ecc),
            ras_retired_pages=slow.retired_pages,
            **sample_kwargs,  # type: ignore[arg-type]
        )

    def _read_gpu_metrics(self, device: DeviceIdentity) -> GpuMetrics | None:
        blob = read_file_bytes(os.path.join(device.device_dir, "gpu_metrics"))
        if blob is None:
            return None
        try:
            return decode_gpu_metrics(blob)
        except GpuMetricsError as error:
            self._warn_once(device, "gpu_metrics", str(error))
            return None

    def _warn_once(self, device: DeviceIdentity, what: str, message: str) -> None:
        key = (device.pci_bus_id, what)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("unreadable_file", pci_bus_id=device.pci_bus_id, file=what, error=message)

    # -- slow schedule ---------------------------------------------------------------------
    def _slow_fields(self, device: DeviceIdentity) -> _SlowFields:
        now = time.monotonic()
        with self._slow_lock:
            current = self._slow.get(device.pci_bus_id)
        if current is not None and now < current.due:
            return current
        fresh = self._read_slow_fields(device, current)
        fresh.due = now + self.slow_interval
        log.debug(
            "slow_fields_read",
            pci_bus_id=device.pci_bus_id,
            seconds=round(time.monotonic() - now, 6),
            ecc_blocks=len({block for block, _ in fresh.ecc}),
            next_in=self.slow_interval,
        )
        with self._slow_lock:
            self._slow[device.pci_bus_id] = fresh
        return fresh

    def _read_slow_fields(self, device: DeviceIdentity, previous: _SlowFields | None) -> _SlowFields:
        dev, hwmon = device.device_dir, device.hwmon_dir
        slow = _SlowFields()
        if hwmon:
            for sensor, index in _HWMON_TEMPS.items():
                for threshold, suffix in (("critical", "crit"), ("emergency", "emergency")):
                    value = read_parsed(f"{hwmon}/temp{index}_{suffix}", _milli)
                    if value is not None:
                        slow.thresholds[(sensor, threshold)] = value
            cap = read_parsed(f"{hwmon}/power1_cap", _micro)
            # MI250X die 1 reports a cap of 0: there is no cap to show, not a cap of zero.
            slow.power_cap = cap if cap else None
            cap_max = read_parsed(f"{hwmon}/power1_cap_max", _micro)
            slow.power_cap_max = cap_max if cap_max else None
        for pool, prefix in _MEMORY_POOLS.items():
            total = read_parsed(f"{dev}/{prefix}_total", tf.parse_unsigned)
            if total is not None:
                slow.memory_total[pool] = float(total)
        for domain, name in _DPM_DOMAINS.items():
            levels = read_parsed(f"{dev}/{name}", tf.parse_pp_dpm)
            if levels is not None and levels.levels_hertz:
                slow.clocks_max[domain] = levels.max_hertz
                if levels.current_hertz is not None:
                    slow.clocks_current[domain] = levels.current_hertz
        slow.pcie_max_speed = read_parsed(f"{dev}/max_link_speed", tf.parse_link_speed)
        slow.pcie_max_width = read_parsed(f"{dev}/max_link_width", tf.parse_link_width)
        slow.pcie_speed = read_parsed(f"{dev}/current_link_speed", tf.parse_link_speed)
        slow.pcie_width = read_parsed(f"{dev}/current_link_width", tf.parse_link_width)
        slow.pcie_replays = read_parsed(f"{dev}/pcie_replay_count", tf.parse_unsigned)
        ras_dir = f"{dev}/ras"
        for entry in _listdir(ras_dir):
            if entry.endswith("_err_count"):
                counts = read_parsed(f"{ras_dir}/{entry}", tf.parse_ras_err_count)
                if counts is None:
                    continue
                block = entry.removesuffix("_err_count")
                slow.ecc[(block, "correctable")] = counts.correctable
                slow.ecc[(block, "uncorrectable")] = counts.uncorrectable
                if counts.deferred is not None:
                    slow.ecc[(block, "deferred")] = counts.deferred
        slow.retired_pages = read_parsed(f"{ras_dir}/gpu_vram_bad_pages", tf.count_bad_pages)
        # xgmi_error clears on read: add what it says now to what we have seen before.
        new_errors = read_parsed(f"{dev}/xgmi_error", tf.parse_unsigned)
        before = previous.xgmi_errors if previous is not None else None
        if new_errors is not None:
            slow.xgmi_errors = (before or 0) + new_errors
        else:
            slow.xgmi_errors = before
        return slow

    def _background_pcie_bandwidth(self, device: DeviceIdentity) -> float | None:
        reader = self._pcie_readers.get(device.pci_bus_id)
        if reader is None:
            path = os.path.join(device.device_dir, "pcie_bw")
            if not os.path.exists(path) or self._stop.is_set():
                return None
            reader = _PcieBandwidthReader(path, self.pcie_bw_interval, self._stop)
            self._pcie_readers[device.pci_bus_id] = reader
            reader.start()
        return reader.bytes_per_second

    def close(self) -> None:
        self._stop.set()


def _milli(text: str) -> float:
    return tf.parse_scaled(text, 1e-3)


def _micro(text: str) -> float:
    return tf.parse_scaled(text, 1e-6)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def assign_packages(devices: list[DeviceIdentity]) -> list[DeviceIdentity]:
    """Group the dies of dual-die packages (MI250X) by their shared serial; die index in BDF order."""
    by_serial: dict[str, list[int]] = {}
    for index, device in enumerate(devices):
        if device.device_id in _DUAL_DIE_DEVICE_IDS and device.serial:
            by_serial.setdefault(device.serial, []).append(index)
    result = list(devices)
    for index, device in enumerate(devices):
        siblings = by_serial.get(device.serial) if device.device_id in _DUAL_DIE_DEVICE_IDS else None
        if siblings and len(siblings) > 1:
            result[index] = replace(device, package=device.serial, die=siblings.index(index))
        else:
            result[index] = replace(device, package=device.serial or device.unique_id or device.pci_bus_id, die=0)
    return result
