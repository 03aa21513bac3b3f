"""Our own ctypes declarations for librocm_smi64, per library version, and where to find the library.

pyrsmi 0.2.0 loads the library and wraps part of it; everything it lacks or gets wrong is declared
here, in one place, each with the reason. A library writes its own struct layouts into the buffers
a caller passes, so a declaration is used only with the library version it was written for: the
worker asks rsmi_version_get first and refuses a version without a known ABI (LibraryAbi below).
Known: 1.0.0 (ROCm 5.2, Debian bookworm 5.2.3), 7.2.0 (ROCm 6.1, trixie 6.1.2) and 7.6.0 (ROCm 6.4,
sid 6.4.1), measured in the test chroots (docs/notes-rocm-smi-6.md).

Imported by the worker process only at run time, and by tests; importing it loads nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping
from ctypes import POINTER, Structure, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint16, c_uint32, c_uint64
from dataclasses import dataclass

# -- where the library lives ------------------------------------------------------------------
# pyrsmi 0.2.0 only tries $ROCM_PATH/lib/librocm_smi64.so (default /opt/rocm). Debian and Ubuntu
# ship only the versioned name /usr/lib/librocm_smi64.so.1 (no -dev symlink at run time), so we
# search the usual places ourselves and then point ROCM_PATH at a folder whose lib/ links to it.
LIBRARY_NAMES = ("librocm_smi64.so", "librocm_smi64.so.1", "librocm_smi64.so.5", "librocm_smi64.so.6")
SEARCH_DIRS = (
    "/opt/rocm/lib",
    "/opt/rocm/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


def library_candidates(environ: Mapping[str, str]) -> list[str]:
    """Paths to try, best first: $ROCM_PATH, then /opt/rocm*, then the distribution's folders."""
    dirs: list[str] = []
    rocm_path = environ.get("ROCM_PATH", "")
    if rocm_path:
        dirs += [os.path.join(rocm_path, "lib"), os.path.join(rocm_path, "lib64")]
    dirs += list(SEARCH_DIRS)
    found_by_ldconfig = ctypes.util.find_library("rocm_smi64")
    candidates = [os.path.join(folder, name) for folder in dirs for name in LIBRARY_NAMES]
    if found_by_ldconfig:
        candidates.append(found_by_ldconfig if os.path.isabs(found_by_ldconfig) else f"/usr/lib/{found_by_ldconfig}")
    seen: set[str] = set()
    unique = []
    for path in candidates:
        if path not in seen:
            seen.add(path)
            unique.append(path)
    return unique


def find_library(environ: Mapping[str, str] | None = None) -> str | None:
    """The first librocm_smi64 that exists (as found, not resolved); None when it is not installed."""
    for path in library_candidates(os.environ if environ is None else environ):
        if os.path.isfile(path):
            return path
    return None


# -- status codes -----------------------------------------------------------------------------
RSMI_STATUS_SUCCESS = 0
RSMI_STATUS_NOT_SUPPORTED = 2
RSMI_STATUS_FILE_ERROR = 3
RSMI_STATUS_INIT_ERROR = 8
RSMI_STATUS_BUSY = 16
STATUS_NAMES = {
    0: "success",
    1: "invalid_args",
    2: "not_supported",
    3: "file_error",
    4: "permission",
    5: "out_of_resources",
    6: "internal_exception",
    7: "input_out_of_bounds",
    8: "init_error",
    9: "not_yet_implemented",
    10: "not_found",
    11: "insufficient_size",
    12: "interrupt",
    13: "unexpected_size",
    14: "no_data",
    15: "unexpected_data",
    16: "busy",
    17: "refcount_overflow",
    0xFFFFFFFF: "unknown_error",
}

# -- enums (5.2.3 numbering) ------------------------------------------------------------------
# rsmi_temperature_type_t: pyrsmi has no temperature wrapper at all.
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
ECC_BLOCKS = {
    "umc": 0x1,
    "sdma": 0x2,
    "gfx": 0x4,
    "mmhub": 0x8,
    "pcie_bif": 0x20,
    "hdp": 0x40,
    "xgmi_wafl": 0x80,
}
# rsmi_fw_block_t -> the fw_version/<name>_fw_version file it reads (our `block` label).
FIRMWARE_BLOCKS = {
    "asd": 0,
    "ce": 1,
    "dmcu": 2,
    "mc": 3,
    "me": 4,
    "mec": 5,
    "mec2": 6,
    "pfp": 7,
    "rlc": 8,
    "rlc_srlc": 9,
    "rlc_srlg": 10,
    "rlc_srls": 11,
    "sdma": 12,
    "sdma2": 13,
    "smc": 14,
    "sos": 15,
    "ta_ras": 16,
    "ta_xgmi": 17,
    "uvd": 18,
    "vce": 19,
    "vcn": 20,
}
# RSMI_IO_LINK_TYPE in 5.2.3 is 1 = PCIe, 2 = XGMI. pyrsmi 0.2.0 copies the KFD numbering
# (2 = PCIe, 11 = XGMI) from a later header, which would turn every XGMI link into "pcie".
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
LIBRARY_ENERGY_RESOLUTION_UJ = 15.3
ENERGY_TICK_JOULES = 2.0**-16


# -- structures -------------------------------------------------------------------------------
class RsmiFrequencies(Structure):
    """rsmi_frequencies_t. pyrsmi declares it too, but we need it for our own argtypes."""

    _fields_ = (
        ("num_supported", c_uint32),
        ("current", c_uint32),
        ("frequency", c_uint64 * RSMI_MAX_NUM_FREQUENCIES),
    )


class RsmiPcieBandwidth(Structure):
    """rsmi_pcie_bandwidth_t: pp_dpm_pcie levels (transfer rate in T/s) and lanes per level."""

    _fields_ = (
        ("transfer_rate", RsmiFrequencies),
        ("lanes", c_uint32 * RSMI_MAX_NUM_FREQUENCIES),
    )


RSMI6_MAX_NUM_FREQUENCIES = 33  # 6.x: RSMI_MAX_NUM_FREQUENCIES grew by one


class RsmiFrequencies6(Structure):
    """rsmi_frequencies_t of 6.x (7.2.0, 7.6.0): a deep-sleep flag first, 33 levels (280 bytes)."""

    _fields_ = (
        ("has_deep_sleep", ctypes.c_bool),
        ("num_supported", c_uint32),
        ("current", c_uint32),
        ("frequency", c_uint64 * RSMI6_MAX_NUM_FREQUENCIES),
    )


class RsmiPcieBandwidth6(Structure):
    """rsmi_pcie_bandwidth_t of 6.x (416 bytes, lanes at 280)."""

    _fields_ = (
        ("transfer_rate", RsmiFrequencies6),
        ("lanes", c_uint32 * RSMI6_MAX_NUM_FREQUENCIES),
    )


class RsmiGpuMetrics(Structure):
    """rsmi_gpu_metrics_t of 5.2.3 (the v1_1 layout): pyrsmi has no gpu_metrics wrapper.

    The library converts v1_0, v1_2 and v1_3 tables into this one; v1_3's voltages and
    ASIC-independent throttle bits are dropped on the way.
    """

    _fields_ = (
        ("structure_size", c_uint16),
        ("format_revision", ctypes.c_uint8),
        ("content_revision", ctypes.c_uint8),
        ("temperature_edge", c_uint16),
        ("temperature_hotspot", c_uint16),
        ("temperature_mem", c_uint16),
        ("temperature_vrgfx", c_uint16),
        ("temperature_vrsoc", c_uint16),
        ("temperature_vrmem", c_uint16),
        ("average_gfx_activity", c_uint16),
        ("average_umc_activity", c_uint16),
        ("average_mm_activity", c_uint16),
        ("average_socket_power", c_uint16),
        ("energy_accumulator", c_uint64),
        ("system_clock_counter", c_uint64),
        ("average_gfxclk_frequency", c_uint16),
        ("average_socclk_frequency", c_uint16),
        ("average_uclk_frequency", c_uint16),
        ("average_vclk0_frequency", c_uint16),
        ("average_dclk0_frequency", c_uint16),
        ("average_vclk1_frequency", c_uint16),
        ("average_dclk1_frequency", c_uint16),
        ("current_gfxclk", c_uint16),
        ("current_socclk", c_uint16),
        ("current_uclk", c_uint16),
        ("current_vclk0", c_uint16),
        ("current_dclk0", c_uint16),
        ("current_vclk1", c_uint16),
        ("current_dclk1", c_uint16),
        ("throttle_status", c_uint32),
        ("current_fan_speed", c_uint16),
        ("pcie_link_width", c_uint16),
        ("pcie_link_speed", c_uint16),
        ("padding", c_uint16),
        ("gfx_activity_acc", c_uint32),
        ("mem_actvity_acc", c_uint32),
        ("temperature_hbm", c_uint16 * 4),
    )


GPU_METRICS_STRUCT_SIZE = 96  # checked against ctypes.sizeof in the unit tests
# What we hand rsmi_dev_gpu_metrics_info_get: larger than every layout a library is known to write
# (5.2.3: 96 bytes, 6.1.2: 424, 6.4.1: 2368, 7.6.0 builds after 2025-03-20: 4544). Only the first
# 96 bytes are read: every later layout starts with 5.2.3's, field for field.
GPU_METRICS_BUFFER_SIZE = 8192


class RsmiVersion(Structure):
    """rsmi_version_t (the same 24 bytes in every known version)."""

    _fields_ = (("major", c_uint32), ("minor", c_uint32), ("patch", c_uint32), ("build", c_char_p))


# rsmi_fw_block_t of 6.x: MES and MES_KIQ inserted after MEC2, every later block up by two.
FIRMWARE_BLOCKS_6 = {
    **{name: value for name, value in FIRMWARE_BLOCKS.items() if value <= 6},
    "mes": 7,
    "mes_kiq": 8,
    **{name: value + 2 for name, value in FIRMWARE_BLOCKS.items() if value > 6},
}


@dataclass(frozen=True)
class LibraryAbi:
    """The struct layouts and enum numbering of one librocm_smi64 version."""

    name: str  # the ROCm release it ships with
    frequencies: type[Structure]
    pcie_bandwidth: type[Structure]
    max_frequencies: int
    firmware_blocks: Mapping[str, int]
    partitions: bool = False  # rsmi_dev_{compute,memory}_partition_get exist (6.x)


ABI_5_2 = LibraryAbi("5.2", RsmiFrequencies, RsmiPcieBandwidth, RSMI_MAX_NUM_FREQUENCIES, FIRMWARE_BLOCKS)
ABI_6 = LibraryAbi("6.x", RsmiFrequencies6, RsmiPcieBandwidth6, RSMI6_MAX_NUM_FREQUENCIES, FIRMWARE_BLOCKS_6, True)
# rsmi_version_get (major, minor, patch) -> ABI. Only versions measured against a real library:
# a version in between may have changed a layout we would then misread (or overrun).
KNOWN_VERSIONS: Mapping[tuple[int, int, int], LibraryAbi] = {
    (1, 0, 0): ABI_5_2,
    (7, 2, 0): ABI_6,
    (7, 6, 0): ABI_6,
}


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
        raise ValueError(f"rsmi_version_get failed with status {STATUS_NAMES.get(status, status)}")
    return (version.major, version.minor, version.patch)


class RsmiErrorCount(Structure):
    """rsmi_error_count_t: pyrsmi has no ECC wrapper."""

    _fields_ = (("correctable_err", c_uint64), ("uncorrectable_err", c_uint64))


# -- function signatures ----------------------------------------------------------------------
# name -> (argtypes, why we declare it ourselves instead of calling pyrsmi's wrapper)
_U32 = c_uint32
_P64 = POINTER(c_uint64)
SIGNATURES: dict[str, tuple[tuple[object, ...], str]] = {
    "rsmi_dev_temp_metric_get": ((_U32, _U32, c_int, POINTER(c_int64)), "pyrsmi has no temperature wrapper"),
    "rsmi_dev_gpu_metrics_info_get": (
        (_U32, ctypes.c_void_p),
        "pyrsmi has no gpu_metrics wrapper; a buffer of GPU_METRICS_BUFFER_SIZE, whatever the version writes",
    ),
    "rsmi_dev_power_ave_get": (
        (_U32, _U32, _P64),
        "pyrsmi passes a 32-bit buffer for this uint64_t* (the library writes 8 bytes into 4)",
    ),
    "rsmi_dev_power_cap_get": ((_U32, _U32, _P64), "pyrsmi has no power cap wrapper"),
    "rsmi_dev_power_cap_range_get": ((_U32, _U32, _P64, _P64), "pyrsmi has no power cap wrapper"),
    "rsmi_dev_energy_count_get": (
        (_U32, _P64, POINTER(c_float), _P64),
        "pyrsmi has no energy wrapper; we also need the raw count to undo the 15.3 uJ tick",
    ),
    "rsmi_dev_gpu_clk_freq_get": ((_U32, c_int, ctypes.c_void_p), "pyrsmi has no clock wrapper (ABI struct)"),
    "rsmi_dev_pci_bandwidth_get": (
        (_U32, ctypes.c_void_p),
        "pyrsmi's wrapper returns the raw struct or -1 and hides the status (ABI struct)",
    ),
    "rsmi_dev_pci_throughput_get": (
        (_U32, _P64, _P64, _P64),
        "pyrsmi multiplies inside and returns -1 on error; we need the three raw fields",
    ),
    "rsmi_dev_pci_replay_counter_get": ((_U32, _P64), "keep the status code (pyrsmi maps errors to -1)"),
    "rsmi_dev_ecc_count_get": ((_U32, c_int, POINTER(RsmiErrorCount)), "pyrsmi has no ECC wrapper"),
    "rsmi_dev_xgmi_error_status": ((_U32, POINTER(c_int)), "keep the status code (pyrsmi maps errors to -1)"),
    "rsmi_dev_memory_reserved_pages_get": (
        (_U32, POINTER(c_uint32), ctypes.c_void_p),
        "pyrsmi passes one record for any number of pages (overflow); we ask only for the count",
    ),
    "rsmi_dev_volt_metric_get": ((_U32, c_int, c_int, POINTER(c_int64)), "pyrsmi has no voltage wrapper"),
    "rsmi_dev_vbios_version_get": ((_U32, c_char_p, _U32), "pyrsmi has no VBIOS wrapper"),
    "rsmi_dev_firmware_version_get": ((_U32, c_int, _P64), "pyrsmi has no firmware wrapper"),
    "rsmi_dev_serial_number_get": ((_U32, c_char_p, _U32), "pyrsmi has no serial number wrapper"),
    "rsmi_dev_id_get": ((_U32, POINTER(c_uint16)), "pyrsmi passes a uint64 for this uint16_t* (harmless, but wrong)"),
    "rsmi_dev_name_get": ((_U32, c_char_p, c_size_t), "keep the status code"),
    "rsmi_topo_numa_affinity_get": (
        (_U32, POINTER(c_uint32)),
        "pyrsmi's smi_get_device_topo_numa_affinity raises NameError (typo 'reocm_lib')",
    ),
    "rsmi_topo_get_link_type": (
        (_U32, _U32, _P64, POINTER(c_int)),
        "pyrsmi decodes the type with the wrong (post-5.2) enum",
    ),
    "rsmi_topo_get_link_weight": ((_U32, _U32, _P64), "keep the status code"),
    "rsmi_dev_xgmi_hive_id_get": ((_U32, _P64), "keep the status code"),
    "rsmi_dev_unique_id_get": ((_U32, _P64), "keep the status code"),
    "rsmi_dev_pci_id_get": ((_U32, _P64), "keep the status code"),
    "rsmi_dev_busy_percent_get": ((_U32, POINTER(c_uint32)), "keep the status code"),
    "rsmi_dev_memory_busy_percent_get": ((_U32, POINTER(c_uint32)), "keep the status code"),
    "rsmi_dev_memory_total_get": ((_U32, c_int, _P64), "keep the status code"),
    "rsmi_dev_memory_usage_get": ((_U32, c_int, _P64), "keep the status code"),
    "rsmi_num_monitor_devices": ((POINTER(c_uint32),), "keep the status code"),
    "rsmi_version_str_get": ((c_int, c_char_p, _U32), "keep the status code"),
}


# Calls that only 6.x libraries export (declared only for an ABI that has them).
PARTITION_SIGNATURES: dict[str, tuple[tuple[object, ...], str]] = {
    "rsmi_dev_compute_partition_get": ((_U32, c_char_p, _U32), "6.x: SPX / DPX / QPX / CPX"),
    "rsmi_dev_memory_partition_get": ((_U32, c_char_p, _U32), "6.x: NPS1 / NPS4"),
}


def declare(lib: ctypes.CDLL, abi: LibraryAbi | None = None) -> None:
    """Set argtypes/restype on the library handle pyrsmi loaded (shared by pyrsmi's wrappers).

    restype is c_uint32 because rsmi_status_t's RSMI_STATUS_UNKNOWN_ERROR is 0xFFFFFFFF.
    """
    signatures = {**SIGNATURES, **(PARTITION_SIGNATURES if abi is not None and abi.partitions else {})}
    for name, (argtypes, _why) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = list(argtypes)
        function.restype = c_uint32
