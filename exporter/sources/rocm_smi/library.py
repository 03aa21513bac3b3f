"""Our ctypes declarations for librocm_smi64, per library version, and where to find the library.

pyrsmi 0.2.0 loads the library; every call we make is declared here, on the handle it loaded. A
library writes its own struct layouts into the buffers a caller passes, so a declaration is used
only with the library version it was written for: the worker asks rsmi_version_get first and
refuses a version without a known ABI (LibraryAbi below). Known: 1.0.0 (ROCm 5.2, Debian bookworm
5.2.3), 7.2.0 (ROCm 6.1, trixie 6.1.2) and 7.6.0 (ROCm 6.4, sid 6.4.1), measured in the test
chroots (docs/notes-rocm-smi-6.md).

Imported by the worker process only at run time, and by tests; importing it loads nothing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from ctypes import POINTER, Structure, c_bool, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint16, c_uint32, c_uint64
from dataclasses import dataclass


# -- where the library lives ------------------------------------------------------------------
# pyrsmi 0.2.0 only tries $ROCM_PATH/lib/librocm_smi64.so (default /opt/rocm). Debian and Ubuntu
# ship only the versioned name /usr/lib/librocm_smi64.so.1 (no -dev symlink at run time), so we
# search the usual places ourselves and the supervisor points ROCM_PATH at a folder linking to it.
def find_library(environ: Mapping[str, str] | None = None) -> str | None:
    """The first librocm_smi64 where doctor looks too (sources/host.py); None when it is not installed."""
    from exporter.sources.host import find_library as find  # not at import: the worker imports this module

    return find("librocm_smi64", "/opt", os.environ if environ is None else environ) or None


# -- status codes -----------------------------------------------------------------------------
RSMI_STATUS_SUCCESS = 0
# rsmi_status_t in order from 0 (RSMI_STATUS_UNKNOWN_ERROR is 0xFFFFFFFF).
STATUS_NAMES = (
    "success", "invalid_args", "not_supported", "file_error", "permission", "out_of_resources",
    "internal_exception", "input_out_of_bounds", "init_error", "not_yet_implemented", "not_found",
    "insufficient_size", "interrupt", "unexpected_size", "no_data", "unexpected_data", "busy", "refcount_overflow",
)  # fmt: skip


def status_name(status: int) -> str:
    return STATUS_NAMES[status] if status < len(STATUS_NAMES) else f"status {status}"


# -- enums (5.2.3 numbering) ------------------------------------------------------------------
# rsmi_temperature_type_t
TEMPERATURE_TYPES = {"edge": 0, "junction": 1, "memory": 2}
# rsmi_temperature_metric_t, the ones the metric contract exports as thresholds.
TEMP_CURRENT = 0
TEMPERATURE_THRESHOLDS = {"critical": 5, "emergency": 7}
# rsmi_clk_type_t -> our clock domain. 5.2.3 has no VCLK/DCLK types (pp_dpm_vclk/dclk are unread).
CLOCK_TYPES = {"gfx": 0, "fabric": 1, "soc": 3, "memory": 4}
# rsmi_memory_type_t -> our pool name.
MEMORY_TYPES = {"vram": 0, "visible_vram": 1, "gtt": 2}
# rsmi_gpu_block_t values whose counts 5.2.3 can read (others return NOT_SUPPORTED), with the
# ras/<name>_err_count file each reads: the name is the `block` label, as the sysfs source uses.
ECC_BLOCKS = {"umc": 0x1, "sdma": 0x2, "gfx": 0x4, "mmhub": 0x8, "pcie_bif": 0x20, "hdp": 0x40, "xgmi_wafl": 0x80}
# rsmi_fw_block_t in order from 0: each reads fw_version/<name>_fw_version (our `block` label).
FIRMWARE_NAMES = (
    "asd", "ce", "dmcu", "mc", "me", "mec", "mec2", "pfp", "rlc", "rlc_srlc", "rlc_srlg", "rlc_srls",
    "sdma", "sdma2", "smc", "sos", "ta_ras", "ta_xgmi", "uvd", "vce", "vcn",
)  # fmt: skip
FIRMWARE_BLOCKS = {name: value for value, name in enumerate(FIRMWARE_NAMES)}
# 6.x inserted MES and MES_KIQ after MEC2: every later block is up by two.
_MEC2 = FIRMWARE_NAMES.index("mec2") + 1
FIRMWARE_BLOCKS_6 = {
    name: value for value, name in enumerate((*FIRMWARE_NAMES[:_MEC2], "mes", "mes_kiq", *FIRMWARE_NAMES[_MEC2:]))
}
# RSMI_IO_LINK_TYPE in 5.2.3 is 1 = PCIe, 2 = XGMI (not the KFD numbering, 2 = PCIe, 11 = XGMI,
# of later headers).
IO_LINK_TYPES = {1: "pcie", 2: "xgmi"}
RSMI_VOLT_TYPE_VDDGFX = 0
RSMI_VOLT_CURRENT = 0
RSMI_MAX_NUM_FREQUENCIES = 32
RSMI_SW_COMP_DRIVER = 0

# gpu_metrics: the library accepts format 1 with content 0..3; content 4 and later (MI300) hits
# assert(metric_data != nullptr) and aborts the process. Energy and HBM temperatures go through
# the same code, so all of these are skipped for such a table (see worker.py).
GPU_METRICS_SAFE_CONTENT = (0, 1, 2, 3)
# The library's hard-coded energy tick (kEnergyCounterResolution = 15.3f). The hardware tick is
# 2^-16 J = 15.2587890625 uJ; multiplying by 15.3 reads 0.27 % high, so we correct it.
ENERGY_TICK_JOULES = 2.0**-16
# What we hand rsmi_dev_gpu_metrics_info_get: larger than every layout a library is known to write
# (5.2.3: 96 bytes, 6.1.2: 424, 6.4.1: 2368, 7.6.0 builds after 2025-03-20: 4544). Only the first
# 96 bytes are read: every later layout starts with 5.2.3's, which is the kernel's gpu_metrics_v1_1
# field for field (the library converts every table it accepts into that layout).
GPU_METRICS_BUFFER_SIZE = 8192
GPU_METRICS_STRUCT_SIZE = 96


# -- structures -------------------------------------------------------------------------------
def _dpm_tables(levels: int, deep_sleep: bool) -> tuple[type[Structure], type[Structure]]:
    """rsmi_frequencies_t and rsmi_pcie_bandwidth_t (pp_dpm_pcie levels in T/s, lanes per level)
    of a version with `levels` slots; 6.x puts a deep-sleep flag first."""

    class Frequencies(Structure):
        _fields_ = (
            *((("has_deep_sleep", c_bool),) if deep_sleep else ()),
            ("num_supported", c_uint32),
            ("current", c_uint32),
            ("frequency", c_uint64 * levels),
        )

    class PcieBandwidth(Structure):
        _fields_ = (("transfer_rate", Frequencies), ("lanes", c_uint32 * levels))

    return Frequencies, PcieBandwidth


class RsmiVersion(Structure):
    """rsmi_version_t (the same 24 bytes in every known version)."""

    _fields_ = (("major", c_uint32), ("minor", c_uint32), ("patch", c_uint32), ("build", c_char_p))


class RsmiErrorCount(Structure):
    """rsmi_error_count_t."""

    _fields_ = (("correctable_err", c_uint64), ("uncorrectable_err", c_uint64))


class RetiredPage(Structure):
    """rsmi_retired_page_record_t."""

    _fields_ = (("page_address", c_uint64), ("page_size", c_uint64), ("status", c_int))


@dataclass(frozen=True)
class LibraryAbi:
    """The struct layouts and enum numbering of one librocm_smi64 version."""

    name: str  # the ROCm release it ships with
    max_frequencies: int
    frequencies: type[Structure]
    pcie_bandwidth: type[Structure]
    firmware_blocks: Mapping[str, int]
    partitions: bool = False  # rsmi_dev_{compute,memory}_partition_get exist (6.x)


ABI_5_2 = LibraryAbi("5.2", 32, *_dpm_tables(32, deep_sleep=False), FIRMWARE_BLOCKS)
# 6.x (7.2.0, 7.6.0): RSMI_MAX_NUM_FREQUENCIES grew to 33, rsmi_frequencies_t to 280 bytes.
ABI_6 = LibraryAbi("6.x", 33, *_dpm_tables(33, deep_sleep=True), FIRMWARE_BLOCKS_6, partitions=True)
# rsmi_version_get (major, minor, patch) -> ABI. Only versions measured against a real library:
# a version in between may have changed a layout we would then misread (or overrun).
KNOWN_VERSIONS: Mapping[tuple[int, int, int], LibraryAbi] = {(1, 0, 0): ABI_5_2, (7, 2, 0): ABI_6, (7, 6, 0): ABI_6}


def abi_for(version: tuple[int, int, int]) -> LibraryAbi:
    """The ABI of a library version; ValueError (one sentence) for a version we do not know."""
    abi = KNOWN_VERSIONS.get(version)
    if abi is None:
        known = ", ".join(f"{'.'.join(map(str, v))} (ROCm {a.name})" for v, a in KNOWN_VERSIONS.items())
        raise ValueError(
            f"librocm_smi64 version {'.'.join(map(str, version))} has struct layouts this exporter does not know "
            f"(known: {known})"
        )
    return abi


def library_version(lib: ctypes.CDLL) -> tuple[int, int, int]:
    """rsmi_version_get: the library's own version (not the ROCm release). Needs no rsmi_init."""
    function = lib.rsmi_version_get
    function.argtypes = [POINTER(RsmiVersion)]
    function.restype = c_uint32
    version = RsmiVersion()
    status = function(ctypes.byref(version))
    if status != RSMI_STATUS_SUCCESS:
        raise ValueError(f"rsmi_version_get failed with status {status_name(status)}")
    return (version.major, version.minor, version.patch)


# -- function signatures ----------------------------------------------------------------------
# name -> argtypes. A call's value comes back through its last argument, so for the calls read
# with RsmiCalls.get that argument's pointer type also says what to allocate.
_U32 = c_uint32
_P32 = POINTER(c_uint32)
_P64 = POINTER(c_uint64)
_PI64 = POINTER(c_int64)
_TEXT = (_U32, c_char_p, _U32)
SIGNATURES: dict[str, tuple[object, ...]] = {
    "rsmi_init": (c_uint64,),
    "rsmi_num_monitor_devices": (_P32,),
    "rsmi_version_str_get": (c_int, c_char_p, _U32),
    "rsmi_dev_pci_id_get": (_U32, _P64),
    "rsmi_dev_unique_id_get": (_U32, _P64),
    "rsmi_dev_name_get": (_U32, c_char_p, c_size_t),
    "rsmi_dev_serial_number_get": _TEXT,
    "rsmi_dev_vbios_version_get": _TEXT,
    "rsmi_dev_id_get": (_U32, POINTER(c_uint16)),
    "rsmi_dev_xgmi_hive_id_get": (_U32, _P64),
    "rsmi_topo_numa_affinity_get": (_U32, _P32),
    "rsmi_dev_firmware_version_get": (_U32, c_int, _P64),
    "rsmi_topo_get_link_type": (_U32, _U32, _P64, POINTER(c_int)),
    "rsmi_topo_get_link_weight": (_U32, _U32, _P64),
    "rsmi_dev_temp_metric_get": (_U32, _U32, c_int, _PI64),
    # a buffer of GPU_METRICS_BUFFER_SIZE, whatever the version writes
    "rsmi_dev_gpu_metrics_info_get": (_U32, ctypes.c_void_p),
    "rsmi_dev_power_ave_get": (_U32, _U32, _P64),
    "rsmi_dev_power_cap_get": (_U32, _U32, _P64),
    "rsmi_dev_power_cap_range_get": (_U32, _U32, _P64, _P64),
    # the raw count, to undo the library's 15.3 uJ tick
    "rsmi_dev_energy_count_get": (_U32, _P64, POINTER(c_float), _P64),
    "rsmi_dev_busy_percent_get": (_U32, _P32),
    "rsmi_dev_memory_busy_percent_get": (_U32, _P32),
    "rsmi_dev_memory_total_get": (_U32, c_int, _P64),
    "rsmi_dev_memory_usage_get": (_U32, c_int, _P64),
    "rsmi_dev_volt_metric_get": (_U32, c_int, c_int, _PI64),
    # the ABI's struct types
    "rsmi_dev_gpu_clk_freq_get": (_U32, c_int, ctypes.c_void_p),
    "rsmi_dev_pci_bandwidth_get": (_U32, ctypes.c_void_p),
    "rsmi_dev_pci_throughput_get": (_U32, _P64, _P64, _P64),
    "rsmi_dev_pci_replay_counter_get": (_U32, _P64),
    "rsmi_dev_ecc_count_get": (_U32, c_int, POINTER(RsmiErrorCount)),
    "rsmi_dev_xgmi_error_status": (_U32, POINTER(c_int)),
    # asked twice: NULL for the count, then an array of that many records
    "rsmi_dev_memory_reserved_pages_get": (_U32, _P32, ctypes.c_void_p),
}
# Calls that only 6.x libraries export (declared only for an ABI that has them): SPX / DPX / QPX /
# CPX and NPS1 / NPS4.
PARTITION_SIGNATURES = {"rsmi_dev_compute_partition_get": _TEXT, "rsmi_dev_memory_partition_get": _TEXT}


def declare(lib: ctypes.CDLL, abi: LibraryAbi | None = None) -> None:
    """Set argtypes/restype on the library handle.

    restype is c_uint32 because rsmi_status_t's RSMI_STATUS_UNKNOWN_ERROR is 0xFFFFFFFF.
    """
    signatures = {**SIGNATURES, **(PARTITION_SIGNATURES if abi is not None and abi.partitions else {})}
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.argtypes = list(argtypes)
        function.restype = c_uint32
