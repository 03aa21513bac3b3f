"""The rocm_smi worker: a child process that owns librocm_smi64 so the daemon never has to.

The Debian build of the library calls abort() on several inputs and blocks forever on a hung file
(tests/integration/test_rocm_smi_*.py show both on a simulated tree). Here that costs this
process, which the daemon (supervisor.py) restarts, instead of the daemon itself.

Shape:
- startup: load the library through pyrsmi, rsmi_init, enumerate devices, send a "ready" event;
- one thread per device serves that device's requests in order, so a call that blocks on a hung
  GPU holds up that device alone (the library serialises each card behind its own mutex anyway);
- replies go up the reply pipe as they finish; the daemon matches them by request id;
- before each library call the thread writes a breadcrumb (see protocol.py), and
  faulthandler writes the fatal thread's id to the crash log, so an abort can be blamed on one call.

Values are returned raw, in the library's units; convert.py turns them into a Sample.

Run as: python -m exporter.sources.rocm_smi.worker REQUEST_FD REPLY_FD BREADCRUMB_FD CRASH_LOG_FD
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import mmap
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from ctypes import byref, c_float, c_int, c_int64, c_uint16, c_uint32, c_uint64
from typing import Any

from exporter.sources.rocm_smi import library as rc
from exporter.sources.rocm_smi import protocol as proto

SYS = "/sys"  # librocm_smi64 hard-codes it: the daemon binds a tree over /sys in a namespace

# Calls that make the library read gpu_metrics (and so abort on content >= 4).
GPU_METRICS_CALLS = frozenset({"gpu_metrics", "energy"})


class Breadcrumbs:
    """This process's view of the shared breadcrumb area: one slot per thread."""

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, proto.BREADCRUMB_BYTES)
        self._lock = threading.Lock()
        self._next = 0
        self._local = threading.local()

    def _slot(self) -> int:
        slot = getattr(self._local, "slot", None)
        if slot is None:
            with self._lock:
                slot = self._next % proto.SLOT_COUNT
                self._next += 1
            self._local.slot = slot
        return slot

    def mark(self, device: int, call: str) -> None:
        offset = self._slot() * proto.SLOT_SIZE
        crumb = proto.pack_slot(threading.get_ident(), threading.get_native_id(), device, call)
        self._map[offset : offset + proto.SLOT_SIZE] = crumb


class Library:
    """The loaded library plus the breadcrumb bookkeeping around every call."""

    def __init__(self, lib: ctypes.CDLL, crumbs: Breadcrumbs, abi: rc.LibraryAbi = rc.ABI_5_2) -> None:
        self.lib = lib
        self.crumbs = crumbs
        self.abi = abi  # the struct layouts of this library version (library.KNOWN_VERSIONS)

    def call(self, device: int, name: str, function: Callable[..., int], *args: Any) -> int:
        self.crumbs.mark(device, name)
        try:
            return int(function(*args))
        finally:
            self.crumbs.mark(device, proto.IDLE)


def load_library() -> tuple[ctypes.CDLL, tuple[int, int, int], rc.LibraryAbi]:
    """Load librocm_smi64 through pyrsmi, check its version, initialise it. ROCM_PATH is set by the daemon.

    The version is checked before rsmi_init and before any call that fills a struct: a library
    whose layouts we do not know is never handed a buffer.

    pyrsmi.rocml runs `rocminfo` at import (to list UUIDs we never use): on a ROCm host that is a
    second or more of HSA start-up in every worker start, so its helper is replaced first.
    """
    import pyrsmi.util

    pyrsmi.util.get_device_uuids = list
    from pyrsmi import rocml

    # pyrsmi checks the driver with a shell (`cat /sys/module/amdgpu/initstate | grep live`), whose
    # "No such file" reaches the terminal on a host without amdgpu: read the file ourselves.
    rocml._driver_initialized = _driver_initialized
    rocml._load_rocm_library()
    lib = rocml.rocm_lib
    if lib is None:
        raise RuntimeError("pyrsmi could not load librocm_smi64")
    try:
        version = rc.library_version(lib)
        abi = rc.abi_for(version)
    except (AttributeError, ValueError) as error:
        raise RuntimeError(str(error)) from None
    try:
        rocml.smi_initialize()
    except RuntimeError as error:
        raise RuntimeError(f"{error}{_PYRSMI_LOG.last()}{init_failure_hint(SYS)}") from None
    rc.declare(lib, abi)
    return lib, version, abi


def _driver_initialized() -> bool:
    """True when the amdgpu module has finished loading (what pyrsmi's shell check asks)."""
    try:
        with open(os.path.join(SYS, "module", "amdgpu", "initstate"), encoding="ascii", errors="replace") as f:
            return "live" in f.read()
    except OSError:
        return False


class _LastMessage(logging.Handler):
    """Keeps pyrsmi's last error message (it logs the rsmi_init status instead of raising it)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()

    def last(self) -> str:
        return f" ({self.message})" if self.message else ""


_PYRSMI_LOG = _LastMessage()


def init_failure_hint(sys_dir: str) -> str:
    """Name the known cause of an rsmi_init failure, if the tree shows it.

    5.2.x requires in0_label (vddgfx) in every amdgpu hwmon folder and reads every temp label as
    edge/junction/mem; MI300X kernels have no in0 at all, so one MI300X fails init for the node.
    """
    drm = os.path.join(sys_dir, "class", "drm")
    try:
        cards = sorted(name for name in os.listdir(drm) if name.startswith("card") and name[4:].isdigit())
    except OSError:
        return ""
    for card in cards:
        hwmon_root = os.path.join(drm, card, "device", "hwmon")
        try:
            folders = os.listdir(hwmon_root)
        except OSError:
            continue
        for folder in folders:
            if not os.path.exists(os.path.join(hwmon_root, folder, "in0_label")):
                return (
                    f"; {card}'s hwmon has no in0_label: librocm_smi64 5.2.x needs a vddgfx sensor on every GPU "
                    "(MI300X has none)"
                )
    return ""


def _u64(lib: Library, device: int, name: str, function: Callable[..., int], *args: Any) -> int | None:
    value = c_uint64()
    status = lib.call(device, name, function, *args, byref(value))
    return value.value if status == rc.RSMI_STATUS_SUCCESS else None


def _bdf_text(bdfid: int) -> str:
    """rsmi_dev_pci_id_get's BDFID -> "dddd:bb:dd.f"."""
    return f"{bdfid >> 32 & 0xFFFF:04x}:{bdfid >> 8 & 0xFF:02x}:{bdfid >> 3 & 0x1F:02x}.{bdfid & 0x7}"


def enumerate_devices(lib: Library) -> list[dict[str, Any]]:
    """index -> PCI BDF and device folder. The library enumerates once, in rsmi_init."""
    count = c_uint32()
    if lib.call(-1, "num_monitor_devices", lib.lib.rsmi_num_monitor_devices, byref(count)) != 0:
        return []
    folders = _device_folders_by_bdf()
    devices = []
    for index in range(count.value):
        bdfid = _u64(lib, index, "pci_id", lib.lib.rsmi_dev_pci_id_get, index)
        bdf = _bdf_text(bdfid) if bdfid is not None else ""
        # 6.x: a compute partition's BDFID carries its index in bits 28..31 (0 in 5.2.x)
        partition = (bdfid >> 28) & 0xF if bdfid is not None else 0
        card, folder = folders.get(bdf, ("", "")) if partition == 0 else ("", "")
        devices.append({"index": index, "pci_bus_id": bdf, "partition": partition, "card": card, "device_dir": folder})
    return devices


def _device_folders_by_bdf() -> dict[str, tuple[str, str]]:
    """BDF -> (card name, resolved device folder)."""
    drm = os.path.join(SYS, "class", "drm")
    folders = {}
    try:
        names = os.listdir(drm)
    except OSError:
        return {}
    for name in names:
        if name.startswith("card") and name[4:].isdigit():
            folder = os.path.realpath(os.path.join(drm, name, "device"))
            folders[os.path.basename(folder).lower()] = (name, folder)
    return folders


def gpu_metrics_header(device_dir: str) -> tuple[int, int, int] | None:
    """(structure_size, format_revision, content_revision) read by us, before the library does."""
    if not device_dir:
        return None
    try:
        fd = os.open(os.path.join(device_dir, "gpu_metrics"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
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

    def __init__(self, lib: Library, index: int, device_dir: str, peers: list[int]) -> None:
        self.lib = lib
        self.index = index
        self.device_dir = device_dir
        self.peers = peers
        self.metrics_checked = False
        self.metrics_unsafe = ""
        self.metrics_version = ""

    def _check_metrics(self) -> None:
        # Once per worker: the library caches the header for its lifetime too.
        if not self.metrics_checked:
            self.lib.crumbs.mark(self.index, "gpu_metrics_header")
            header = gpu_metrics_header(self.device_dir)
            self.metrics_unsafe = gpu_metrics_unsafe_reason(header)
            self.metrics_version = f"{header[1]}.{header[2]}" if header is not None else ""
            self.lib.crumbs.mark(self.index, proto.IDLE)
            self.metrics_checked = True

    def identify(self, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        calls = _Calls(self.lib, self.index, skip)
        f, dev = self.lib.lib, self.index
        ident: dict[str, Any] = {}
        unique = calls.get("unique_id", f.rsmi_dev_unique_id_get, dev)
        ident["unique_id"] = f"{unique:016x}" if unique is not None else ""
        ident["product"] = calls.text("name", f.rsmi_dev_name_get, dev)
        ident["serial"] = calls.text("serial", f.rsmi_dev_serial_number_get, dev)
        ident["vbios"] = calls.text("vbios", f.rsmi_dev_vbios_version_get, dev)
        device_id = calls.get("device_id", f.rsmi_dev_id_get, dev, ctype=c_uint16)
        if device_id is not None:
            ident["device_id"] = f"0x{device_id:04x}"
        hive = calls.get("xgmi_hive_id", f.rsmi_dev_xgmi_hive_id_get, dev)
        ident["xgmi_hive_id"] = str(hive) if hive else ""
        ident["numa_node"] = calls.get("numa_affinity", f.rsmi_topo_numa_affinity_get, dev, ctype=c_uint32)
        ident["firmware"] = calls.each("firmware", self.lib.abi.firmware_blocks, f.rsmi_dev_firmware_version_get)
        if self.lib.abi.partitions:
            ident["compute_partition"] = calls.text("compute_partition", f.rsmi_dev_compute_partition_get, dev)
            ident["memory_partition"] = calls.text("memory_partition", f.rsmi_dev_memory_partition_get, dev)
        links = []
        for peer in self.peers:
            hops, kind = c_uint64(), c_int()
            if calls.fill(f"link_type:{peer}", f.rsmi_topo_get_link_type, dev, peer, byref(hops), byref(kind)):
                weight = calls.get(f"link_weight:{peer}", f.rsmi_topo_get_link_weight, dev, peer)
                links.append({"peer": peer, "type": kind.value, "hops": hops.value, "weight": weight})
        ident["links"] = links
        self._check_metrics()
        ident["gpu_metrics_unsafe"] = self.metrics_unsafe
        ident["gpu_metrics_version"] = self.metrics_version
        return ident

    def read(self, skip: frozenset[str], slow: bool, guard: bool = True) -> dict[str, Any]:
        """One read. `guard=False` lets the library see a table it aborts on (tests of crash handling)."""
        self._check_metrics()
        calls = _Calls(self.lib, self.index, skip | GPU_METRICS_CALLS if self.metrics_unsafe and guard else skip)
        f, dev = self.lib.lib, self.index
        out: dict[str, Any] = {}
        metrics = {"current": rc.TEMP_CURRENT, **(rc.TEMPERATURE_THRESHOLDS if slow else {})}
        temperatures: dict[str, dict[str, int]] = {}
        for sensor, sensor_type in rc.TEMPERATURE_TYPES.items():
            for metric, metric_value in metrics.items():
                value = calls.get(
                    f"temperature:{sensor}:{metric}",
                    f.rsmi_dev_temp_metric_get,
                    dev,
                    sensor_type,
                    metric_value,
                    ctype=c_int64,
                )
                if value is not None:
                    temperatures.setdefault(sensor, {})[metric] = value
        out["temperatures"] = temperatures
        buffer = ctypes.create_string_buffer(rc.GPU_METRICS_BUFFER_SIZE)
        if calls.fill("gpu_metrics", f.rsmi_dev_gpu_metrics_info_get, dev, buffer):
            table = rc.RsmiGpuMetrics.from_buffer_copy(buffer.raw[: rc.GPU_METRICS_STRUCT_SIZE])
            out["gpu_metrics"] = {
                name: list(getattr(table, name)) if name == "temperature_hbm" else getattr(table, name)
                for name, _type in rc.RsmiGpuMetrics._fields_
            }
        ticks, resolution, stamp = c_uint64(), c_float(), c_uint64()
        if calls.fill("energy", f.rsmi_dev_energy_count_get, dev, byref(ticks), byref(resolution), byref(stamp)):
            out["energy"] = {"ticks": ticks.value, "resolution_uj": resolution.value, "timestamp_ns": stamp.value}
        out["power_average"] = calls.get("power_average", f.rsmi_dev_power_ave_get, dev, 0)
        out["busy_percent"] = calls.get("busy_percent", f.rsmi_dev_busy_percent_get, dev, ctype=c_uint32)
        out["memory_busy_percent"] = calls.get(
            "memory_busy_percent", f.rsmi_dev_memory_busy_percent_get, dev, ctype=c_uint32
        )
        out["memory_used"] = calls.each("memory_used", rc.MEMORY_TYPES, f.rsmi_dev_memory_usage_get)
        out["vddgfx_mv"] = calls.get(
            "voltage:vddgfx", f.rsmi_dev_volt_metric_get, dev, rc.RSMI_VOLT_TYPE_VDDGFX, rc.RSMI_VOLT_CURRENT,
            ctype=c_int64,
        )  # fmt: skip
        if slow:
            out.update(self._read_slow(calls))
        out["failed"] = calls.failed
        out["gpu_metrics_unsafe"] = self.metrics_unsafe or None
        return {key: value for key, value in out.items() if value is not None}

    def _read_slow(self, calls: _Calls) -> dict[str, Any]:
        """Values that change rarely or cost a firmware round trip each: read on the slow schedule."""
        f, dev = self.lib.lib, self.index
        out: dict[str, Any] = {}
        out["power_cap"] = calls.get("power_cap", f.rsmi_dev_power_cap_get, dev, 0)
        high, low = c_uint64(), c_uint64()
        if calls.fill("power_cap_range", f.rsmi_dev_power_cap_range_get, dev, 0, byref(high), byref(low)):
            out["power_cap_max"] = high.value
        out["memory_total"] = calls.each("memory_total", rc.MEMORY_TYPES, f.rsmi_dev_memory_total_get)
        clocks: dict[str, dict[str, Any]] = {}
        abi = self.lib.abi
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
        out["xgmi_error"] = calls.get("xgmi_error", f.rsmi_dev_xgmi_error_status, dev, ctype=c_int)
        return out

    def _retired_pages(self, calls: _Calls) -> dict[str, int] | None:
        """Number of pages per rsmi_memory_page_status_t (0 reserved, 1 pending, 2 unreservable)."""
        f, dev = self.lib.lib, self.index
        count = c_uint32(0)
        if not calls.fill("retired_pages", f.rsmi_dev_memory_reserved_pages_get, dev, byref(count), None):
            return None
        records = (RetiredPage * max(count.value, 1))()
        if count.value and not calls.fill(
            "retired_pages", f.rsmi_dev_memory_reserved_pages_get, dev, byref(count), records
        ):
            return None
        by_status: dict[str, int] = {}
        for record in records[: count.value]:
            by_status[str(record.status)] = by_status.get(str(record.status), 0) + 1
        return by_status


class _Calls:
    """One request's library calls on one device: skips what the daemon asked to skip, notes failures."""

    def __init__(self, lib: Library, device: int, skip: frozenset[str]) -> None:
        self.lib = lib
        self.device = device
        self.skip = skip
        self.failed: dict[str, int] = {}

    def fill(self, name: str, function: Callable[..., int], *args: Any) -> bool:
        """Call with caller-provided out-parameters; True on success."""
        if name in self.skip:
            return False
        status = self.lib.call(self.device, name, function, *args)
        if status != rc.RSMI_STATUS_SUCCESS:
            self.failed[name] = status
        return status == rc.RSMI_STATUS_SUCCESS

    def get(self, name: str, function: Callable[..., int], *args: Any, ctype: type = c_uint64) -> int | None:
        """Call with one trailing out-parameter of `ctype`; its value, or None on failure."""
        holder = ctype()
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


class RetiredPage(ctypes.Structure):
    """rsmi_retired_page_record_t."""

    _fields_ = (("page_address", c_uint64), ("page_size", c_uint64), ("status", c_int))


class PcieThroughputReader(threading.Thread):
    """Reads rsmi_dev_pci_throughput_get off the request path: the kernel sleeps 1 s per read."""

    def __init__(self, lib: Library, index: int, period: float) -> None:
        super().__init__(name=f"pcie_bw:{index}", daemon=True)
        self.lib, self.index, self.period = lib, index, period
        self.latest: dict[str, int] | None = None

    def run(self) -> None:
        f = self.lib.lib
        while True:
            started = time.monotonic()
            sent, received, payload = c_uint64(), c_uint64(), c_uint64()
            status = self.lib.call(
                self.index, "pcie_throughput", f.rsmi_dev_pci_throughput_get, self.index, byref(sent),
                byref(received), byref(payload),
            )  # fmt: skip
            self.latest = (
                {"sent": sent.value, "received": received.value, "max_payload": payload.value} if status == 0 else None
            )
            time.sleep(max(self.period - (time.monotonic() - started), 0.1))


class Worker:
    """Request dispatch: one thread and one queue per device; replies written under a lock."""

    def __init__(self, lib: Library, devices: list[dict[str, Any]], reply_fd: int) -> None:
        self.lib = lib
        self.reply_fd = reply_fd
        self.reply_lock = threading.Lock()
        indexes = [d["index"] for d in devices]
        self.readers = {
            d["index"]: DeviceReader(lib, d["index"], d["device_dir"], [i for i in indexes if i != d["index"]])
            for d in devices
        }
        self.queues: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}
        self.pcie_readers: dict[int, PcieThroughputReader] = {}

    def send(self, message: dict[str, Any]) -> None:
        data = proto.encode(message)
        with self.reply_lock:
            view = memoryview(data)
            while view:
                written = os.write(self.reply_fd, view)
                view = view[written:]

    def dispatch(self, request: dict[str, Any]) -> None:
        device = request.get("device")
        if not isinstance(device, int) or device not in self.readers:
            self.send({"id": request.get("id"), "ok": False, "reason": "no_such_device", "message": str(device)})
            return
        q = self.queues.get(device)
        if q is None:
            q = self.queues[device] = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(device, q), name=f"device:{device}", daemon=True).start()
        q.put(request)

    def _serve(self, device: int, q: queue.SimpleQueue[dict[str, Any]]) -> None:
        reader = self.readers[device]
        while True:
            request = q.get()
            try:
                result = self._handle(reader, request)
            except Exception as error:  # a bug here must cost one reply, not the worker
                self.send({"id": request.get("id"), "ok": False, "reason": "worker_error", "message": repr(error)})
                continue
            self.send({"id": request.get("id"), "ok": True, "result": result})

    def _handle(self, reader: DeviceReader, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "identify":
            return reader.identify(frozenset(request.get("skip", ())))
        if op == "read":
            result = reader.read(
                frozenset(request.get("skip", ())),
                bool(request.get("slow")),
                bool(request.get("guard_gpu_metrics", True)),
            )
            period = request.get("pcie_throughput_period")
            if period:
                result["pcie_throughput"] = self._pcie_throughput(reader.index, float(period))
            return result
        raise ValueError(f"unknown op {op!r}")

    def _pcie_throughput(self, index: int, period: float) -> dict[str, int] | None:
        reader = self.pcie_readers.get(index)
        if reader is None:
            reader = self.pcie_readers[index] = PcieThroughputReader(self.lib, index, period)
            reader.start()
        return reader.latest


def _read_lines(fd: int) -> Any:
    buffer = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from (line for line in lines if line)


def main(argv: list[str]) -> int:
    request_fd, reply_fd, crumbs_fd, crash_fd = (int(a) for a in argv[:4])
    faulthandler.enable(file=crash_fd, all_threads=True)
    # pyrsmi reports every failed call through the root logger; the statuses reach the daemon in
    # replies, so keep only its last message (for an rsmi_init failure) and print nothing.
    logging.getLogger().addHandler(_PYRSMI_LOG)
    logging.getLogger().setLevel(logging.ERROR)
    crumbs = Breadcrumbs(crumbs_fd)
    worker: Worker | None = None
    reply = _Replier(reply_fd)
    try:
        started = time.monotonic()
        handle, library_version, abi = load_library()
        lib = Library(handle, crumbs, abi)
        devices = enumerate_devices(lib)
        version = ctypes.create_string_buffer(256)
        driver = ""
        if lib.call(-1, "driver_version", lib.lib.rsmi_version_str_get, rc.RSMI_SW_COMP_DRIVER, version, 256) == 0:
            driver = version.value.decode(errors="replace").strip()
        worker = Worker(lib, devices, reply_fd)
    except Exception as error:
        reply.send({"event": "failed", "reason": "init_failed", "message": f"{type(error).__name__}: {error}"})
        return 3
    reply.send(
        {
            "event": "ready",
            "pid": os.getpid(),
            "devices": devices,
            "driver_version": driver,
            "library_version": ".".join(map(str, library_version)),
            "init_seconds": time.monotonic() - started,
        }
    )
    for line in _read_lines(request_fd):
        try:
            request = proto.decode(line)
        except ValueError:
            continue
        if request.get("op") == "exit":
            break
        worker.dispatch(request)
    # A device thread may be stuck in the kernel for good: leave without joining anything.
    os._exit(0)


class _Replier:
    """Writes to the reply pipe before the Worker exists (the ready/failed event)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, message: dict[str, Any]) -> None:
        os.write(self.fd, proto.encode(message))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
