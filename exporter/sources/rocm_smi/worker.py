"""The rocm_smi worker: librocm_smi64 (loaded by pyrsmi) in the worker harness.

The Debian build of the library calls abort() on several inputs and blocks forever on a hung file
(tests/integration/test_rocm_smi_*.py show both on a simulated tree); the harness (harness.py)
makes that cost this process. Values are returned raw, in the library's units; convert.py turns
them into a Sample.

Run as: python -m exporter.sources.rocm_smi.worker REQUEST_FD REPLY_FD BREADCRUMB_FD CRASH_LOG_FD
"""

from __future__ import annotations

import ctypes
import io
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from ctypes import byref, c_float, c_int, c_uint32, c_uint64
from typing import Any

from exporter.sources.rocm_smi import library as rc
from exporter.sources.rocm_smi.harness import Breadcrumbs, Calls, Opened, serve

SYS = "/sys"  # librocm_smi64 hard-codes it: the daemon binds a tree over /sys in a namespace

# Calls that make the library read gpu_metrics (and so abort on content >= 4).
GPU_METRICS_CALLS = frozenset({"gpu_metrics", "energy"})


def load_library() -> tuple[ctypes.CDLL, tuple[int, int, int], rc.LibraryAbi]:
    """Load librocm_smi64 through pyrsmi (from $ROCM_PATH/lib, which the supervisor sets), check its
    version, initialise it.

    The version is checked before rsmi_init and before any call that fills a struct: a library
    whose layouts we do not know is never handed a buffer.
    """
    # pyrsmi.rocml runs `rocminfo` at import (for UUIDs we never use: a second or more of HSA
    # start-up on a ROCm host) and checks the driver with a shell, whose "No such file" would reach
    # the terminal on a host without amdgpu: both are replaced before they run.
    import pyrsmi.util

    pyrsmi.util.get_device_uuids = list
    from pyrsmi import rocml

    rocml._driver_initialized = _driver_initialized
    rocml._load_rocm_library()
    lib = rocml.rocm_lib
    try:
        version = rc.library_version(lib)
        abi = rc.abi_for(version)
    except (AttributeError, ValueError) as error:
        raise RuntimeError(str(error)) from None
    rc.declare(lib, abi)
    # pyrsmi logs the rsmi_init status instead of raising it: kept for the error, never printed.
    pyrsmi_log = io.StringIO()
    logging.basicConfig(stream=pyrsmi_log, format=" (%(message)s)")
    try:
        rocml.smi_initialize()
    except RuntimeError as error:
        raise RuntimeError(f"{error}{pyrsmi_log.getvalue().rstrip()}{init_failure_hint(SYS)}") from None
    return lib, version, abi


def _driver_initialized() -> bool:
    """True when the amdgpu module has finished loading (what pyrsmi's shell check asks)."""
    try:
        with open(os.path.join(SYS, "module", "amdgpu", "initstate"), encoding="ascii", errors="replace") as f:
            return "live" in f.read()
    except OSError:
        return False


def init_failure_hint(sys_dir: str) -> str:
    """Name the known cause of an rsmi_init failure, if the tree shows it.

    5.2.x requires in0_label (vddgfx) in every amdgpu hwmon folder and reads every temp label as
    edge/junction/mem; MI300X kernels have no in0 at all, so one MI300X fails init for the node.
    """
    for card, folder in sorted(device_folders_by_bdf(sys_dir).values()):
        hwmon_root = os.path.join(folder, "hwmon")
        try:
            hwmons = os.listdir(hwmon_root)
        except OSError:
            continue
        if any(not os.path.exists(os.path.join(hwmon_root, hwmon, "in0_label")) for hwmon in hwmons):
            return (
                f"; {card}'s hwmon has no in0_label: librocm_smi64 5.2.x needs a vddgfx sensor on every GPU "
                "(MI300X has none)"
            )
    return ""


def _bdf_text(bdfid: int) -> str:
    """rsmi_dev_pci_id_get's BDFID -> "dddd:bb:dd.f"."""
    return f"{bdfid >> 32 & 0xFFFF:04x}:{bdfid >> 8 & 0xFF:02x}:{bdfid >> 3 & 0x1F:02x}.{bdfid & 0x7}"


def enumerate_devices(lib: ctypes.CDLL, crumbs: Breadcrumbs) -> list[dict[str, Any]]:
    """index -> PCI BDF and device folder. The library enumerates once, in rsmi_init."""
    count = c_uint32()
    if not RsmiCalls(crumbs, -1).fill("num_monitor_devices", lib.rsmi_num_monitor_devices, byref(count)):
        return []
    folders = device_folders_by_bdf(SYS)
    devices = []
    for index in range(count.value):
        bdfid = RsmiCalls(crumbs, index).get("pci_id", lib.rsmi_dev_pci_id_get, index)
        bdf = _bdf_text(bdfid) if bdfid is not None else ""
        # 6.x: a compute partition's BDFID carries its index in bits 28..31 (0 in 5.2.x)
        partition = (bdfid >> 28) & 0xF if bdfid is not None else 0
        card, folder = folders.get(bdf, ("", "")) if partition == 0 else ("", "")
        devices.append({"index": index, "pci_bus_id": bdf, "partition": partition, "card": card, "device_dir": folder})
    return devices


def device_folders_by_bdf(sys_dir: str) -> dict[str, tuple[str, str]]:
    """BDF -> (card name, resolved device folder)."""
    drm = os.path.join(sys_dir, "class", "drm")
    try:
        names = [name for name in os.listdir(drm) if name.startswith("card") and name[4:].isdigit()]
    except OSError:
        return {}
    folders = {}
    for name in names:
        folder = os.path.realpath(os.path.join(drm, name, "device"))
        folders[os.path.basename(folder).lower()] = (name, folder)
    return folders


def gpu_metrics_header(device_dir: str) -> tuple[int, int, int] | None:
    """(structure_size, format_revision, content_revision) read by us, before the library does."""
    try:
        with open(os.path.join(device_dir, "gpu_metrics"), "rb", buffering=0) as handle:
            head = handle.read(4096)
    except OSError:
        return None
    if len(head) < 4:
        return None
    return int.from_bytes(head[0:2], "little"), head[2], head[3]


def gpu_metrics_unsafe_reason(header: tuple[int, int, int] | None) -> str:
    """Why the library must not be asked for gpu_metrics on this device; "" when it is safe."""
    if header is None:
        return ""  # no table: the library returns an error status, it does not abort
    _size, format_revision, content_revision = header
    if format_revision == 1 and content_revision not in rc.GPU_METRICS_SAFE_CONTENT:
        return (
            f"gpu_metrics v{format_revision}.{content_revision}: librocm_smi64 5.2.x accepts content 0-3 "
            "and aborts on later ones; 6.x's conversion of MI300 tables is not one this exporter reads"
        )
    return ""


class DeviceReader:
    """Everything the worker knows about one device, and the calls that read it."""

    def __init__(
        self, lib: ctypes.CDLL, abi: rc.LibraryAbi, crumbs: Breadcrumbs, index: int, device_dir: str, peers: list[int]
    ) -> None:
        self.lib = lib
        self.abi = abi  # the struct layouts of this library version (library.KNOWN_VERSIONS)
        self.crumbs = crumbs
        self.index = index
        self.device_dir = device_dir
        self.peers = peers
        self.pcie_reader: threading.Thread | None = None
        self.pcie_throughput: dict[str, int] | None = None
        self.metrics_header: tuple[int, int, int] | None = None
        self.metrics_checked = False

    def _check_metrics(self) -> str:
        """Why gpu_metrics must not be asked for ("" when safe). Once per worker: the library
        caches the header for its lifetime too."""
        if not self.metrics_checked and self.device_dir:
            self.metrics_header = self.crumbs.call(
                self.index, "gpu_metrics_header", gpu_metrics_header, self.device_dir
            )
        self.metrics_checked = True
        return gpu_metrics_unsafe_reason(self.metrics_header)

    def identify(self, skip: frozenset[str]) -> dict[str, Any]:
        calls = RsmiCalls(self.crumbs, self.index, skip)
        f, dev = self.lib, self.index
        unique = calls.get("unique_id", f.rsmi_dev_unique_id_get, dev)
        device_id = calls.get("device_id", f.rsmi_dev_id_get, dev)
        hive = calls.get("xgmi_hive_id", f.rsmi_dev_xgmi_hive_id_get, dev)
        ident: dict[str, Any] = {
            "unique_id": f"{unique:016x}" if unique else "",  # 0: no id (an SR-IOV VF's), as in sysfs
            "product": calls.text("name", f.rsmi_dev_name_get, dev),
            "serial": calls.text("serial", f.rsmi_dev_serial_number_get, dev),
            "vbios": calls.text("vbios", f.rsmi_dev_vbios_version_get, dev),
            "device_id": f"0x{device_id:04x}" if device_id is not None else "",
            "xgmi_hive_id": str(hive) if hive else "",
            "numa_node": calls.get("numa_affinity", f.rsmi_topo_numa_affinity_get, dev),
            "firmware": calls.each("firmware", self.abi.firmware_blocks, f.rsmi_dev_firmware_version_get),
        }
        if self.abi.partitions:
            ident["compute_partition"] = calls.text("compute_partition", f.rsmi_dev_compute_partition_get, dev)
            ident["memory_partition"] = calls.text("memory_partition", f.rsmi_dev_memory_partition_get, dev)
        links = []
        for peer in self.peers:
            hops, kind = c_uint64(), c_int()
            if calls.fill(f"link_type:{peer}", f.rsmi_topo_get_link_type, dev, peer, byref(hops), byref(kind)):
                weight = calls.get(f"link_weight:{peer}", f.rsmi_topo_get_link_weight, dev, peer)
                links.append({"peer": peer, "type": kind.value, "hops": hops.value, "weight": weight})
        ident["links"] = links
        ident["gpu_metrics_unsafe"] = self._check_metrics()
        header = self.metrics_header
        ident["gpu_metrics_version"] = f"{header[1]}.{header[2]}" if header is not None else ""
        return ident

    def read(self, skip: frozenset[str], request: Mapping[str, Any]) -> dict[str, Any]:
        unsafe = self._check_metrics()
        guarded = unsafe and request.get("guard_gpu_metrics", True)
        calls = RsmiCalls(self.crumbs, self.index, skip | GPU_METRICS_CALLS if guarded else skip)
        f, dev = self.lib, self.index
        out: dict[str, Any] = {}
        metrics = {"current": rc.TEMP_CURRENT, **(rc.TEMPERATURE_THRESHOLDS if request.get("slow") else {})}
        temperatures: dict[str, dict[str, int]] = {}
        for sensor, sensor_type in rc.TEMPERATURE_TYPES.items():
            for metric, metric_value in metrics.items():
                name = f"temperature:{sensor}:{metric}"
                value = calls.get(name, f.rsmi_dev_temp_metric_get, dev, sensor_type, metric_value)
                if value is not None:
                    temperatures.setdefault(sensor, {})[metric] = value
        out["temperatures"] = temperatures
        buffer = ctypes.create_string_buffer(rc.GPU_METRICS_BUFFER_SIZE)
        if calls.fill("gpu_metrics", f.rsmi_dev_gpu_metrics_info_get, dev, buffer):
            out["gpu_metrics"] = buffer.raw[: rc.GPU_METRICS_STRUCT_SIZE].hex()
        ticks, resolution, stamp = c_uint64(), c_float(), c_uint64()
        if calls.fill("energy", f.rsmi_dev_energy_count_get, dev, byref(ticks), byref(resolution), byref(stamp)):
            out["energy"] = {"ticks": ticks.value, "resolution_uj": resolution.value, "timestamp_ns": stamp.value}
        out["power_average"] = calls.get("power_average", f.rsmi_dev_power_ave_get, dev, 0)
        out["busy_percent"] = calls.get("busy_percent", f.rsmi_dev_busy_percent_get, dev)
        out["memory_busy_percent"] = calls.get("memory_busy_percent", f.rsmi_dev_memory_busy_percent_get, dev)
        out["memory_used"] = calls.each("memory_used", rc.MEMORY_TYPES, f.rsmi_dev_memory_usage_get)
        vddgfx = (rc.RSMI_VOLT_TYPE_VDDGFX, rc.RSMI_VOLT_CURRENT)
        out["vddgfx_mv"] = calls.get("voltage:vddgfx", f.rsmi_dev_volt_metric_get, dev, *vddgfx)
        if request.get("slow"):
            out.update(self._read_slow(calls))
        period = float(request.get("pcie_throughput_period") or 0)
        if period and self.pcie_reader is None:
            self.pcie_reader = threading.Thread(
                target=self._read_pcie_throughput, args=(period,), name=f"pcie_bw:{dev}", daemon=True
            )
            self.pcie_reader.start()
        out["pcie_throughput"] = self.pcie_throughput
        out["failed"] = calls.failed
        out["gpu_metrics_unsafe"] = unsafe or None
        return {key: value for key, value in out.items() if value is not None}

    def _read_slow(self, calls: RsmiCalls) -> dict[str, Any]:
        """Values that change rarely or cost a firmware round trip each: read on the slow schedule."""
        f, dev, abi = self.lib, self.index, self.abi
        out: dict[str, Any] = {}
        out["power_cap"] = calls.get("power_cap", f.rsmi_dev_power_cap_get, dev, 0)
        high, low = c_uint64(), c_uint64()
        if calls.fill("power_cap_range", f.rsmi_dev_power_cap_range_get, dev, 0, byref(high), byref(low)):
            out["power_cap_max"] = high.value
        out["memory_total"] = calls.each("memory_total", rc.MEMORY_TYPES, f.rsmi_dev_memory_total_get)
        clocks: dict[str, dict[str, Any]] = {}
        for domain, clock_type in rc.CLOCK_TYPES.items():
            table: Any = abi.frequencies()
            if calls.fill(f"clock:{domain}", f.rsmi_dev_gpu_clk_freq_get, dev, clock_type, byref(table)):
                count = min(table.num_supported, abi.max_frequencies)
                clocks[domain] = {"current": table.current, "hertz": list(table.frequency[:count])}
        out["clocks"] = clocks
        bandwidth: Any = abi.pcie_bandwidth()
        if calls.fill("pcie_bandwidth", f.rsmi_dev_pci_bandwidth_get, dev, byref(bandwidth)):
            count = min(bandwidth.transfer_rate.num_supported, abi.max_frequencies)
            out["pcie_levels"] = {
                "current": bandwidth.transfer_rate.current,
                "transfers": list(bandwidth.transfer_rate.frequency[:count]),
                "lanes": list(bandwidth.lanes[:count]),
            }
        out["pcie_replays"] = calls.get("pcie_replays", f.rsmi_dev_pci_replay_counter_get, dev)
        ecc: dict[str, list[int]] = {}
        for block, block_value in rc.ECC_BLOCKS.items():
            counts = rc.RsmiErrorCount()
            if calls.fill(f"ecc:{block}", f.rsmi_dev_ecc_count_get, dev, block_value, byref(counts)):
                ecc[block] = [counts.correctable_err, counts.uncorrectable_err]
        out["ecc"] = ecc
        out["retired_pages"] = self._retired_pages(calls)
        out["xgmi_error"] = calls.get("xgmi_error", f.rsmi_dev_xgmi_error_status, dev)
        return out

    def _retired_pages(self, calls: RsmiCalls) -> dict[str, int] | None:
        """Number of pages per rsmi_memory_page_status_t (0 reserved, 1 pending, 2 unreservable)."""
        f, dev = self.lib, self.index
        count = c_uint32(0)
        if not calls.fill("retired_pages", f.rsmi_dev_memory_reserved_pages_get, dev, byref(count), None):
            return None
        records = (rc.RetiredPage * max(count.value, 1))()
        if count.value and not calls.fill(
            "retired_pages", f.rsmi_dev_memory_reserved_pages_get, dev, byref(count), records
        ):
            return None
        return dict(Counter(str(record.status) for record in records[: count.value]))

    def _read_pcie_throughput(self, period: float) -> None:
        """rsmi_dev_pci_throughput_get, off the request path: the kernel sleeps 1 s per read."""
        while True:
            started = time.monotonic()
            sent, received, payload = c_uint64(), c_uint64(), c_uint64()
            status = self.crumbs.call(
                self.index, "pcie_throughput", self.lib.rsmi_dev_pci_throughput_get, self.index, byref(sent),
                byref(received), byref(payload),
            )  # fmt: skip
            self.pcie_throughput = (
                {"sent": sent.value, "received": received.value, "max_payload": payload.value} if status == 0 else None
            )
            time.sleep(max(period - (time.monotonic() - started), 0.1))


class RsmiCalls(Calls):
    """Calls that return an rsmi_status_t; their values come back through out-parameters."""

    def fill(self, name: str, function: Callable[..., int], *args: Any) -> bool:
        """Call with caller-provided out-parameters; True on success."""
        status = self.call(name, function, *args)
        if status:
            self.failed[name] = int(status)
        return status == rc.RSMI_STATUS_SUCCESS

    def get(self, name: str, function: Any, *args: Any) -> int | None:
        """Call with one trailing out-parameter, of the type its declaration points to; its value,
        or None on failure."""
        holder = function.argtypes[-1]._type_()
        return int(holder.value) if self.fill(name, function, *args, byref(holder)) else None

    def text(self, name: str, function: Callable[..., int], *args: Any, size: int = 256) -> str:
        """Call with a trailing (char *, length) buffer; the string, or "" on failure."""
        buffer = ctypes.create_string_buffer(size)
        if not self.fill(name, function, *args, buffer, size):
            return ""
        return buffer.value.decode(errors="replace").strip()

    def each(self, prefix: str, variants: Mapping[str, int], function: Callable[..., int]) -> dict[str, int]:
        """function(device, variant, uint64*) per variant (memory pool ...), keyed by our name for it."""
        values = {}
        for key, variant in variants.items():
            value = self.get(f"{prefix}:{key}", function, self.device, variant)
            if value is not None:
                values[key] = value
        return values


def open_library(crumbs: Breadcrumbs) -> Opened:
    lib, version, abi = load_library()
    devices = enumerate_devices(lib, crumbs)
    indexes = [d["index"] for d in devices]
    readers = {
        i: DeviceReader(lib, abi, crumbs, i, d["device_dir"], [peer for peer in indexes if peer != i])
        for i, d in zip(indexes, devices, strict=True)
    }
    driver = RsmiCalls(crumbs, -1).text("driver_version", lib.rsmi_version_str_get, rc.RSMI_SW_COMP_DRIVER)
    return Opened(devices, readers, driver, ".".join(map(str, version)))


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:], open_library))
