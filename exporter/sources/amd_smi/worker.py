"""The amd-smi worker process: the `amdsmi` Python module (libamd_smi), supervised like the rocm-smi worker.

Started by the rocm_smi Supervisor as `python -m exporter.sources.amd_smi.worker <fds>`; it runs in
the same worker harness (exporter/sources/rocm_smi/harness.py) as the rocm-smi worker: the daemon
cannot tell them apart except by their answers. The module is AMD's own binding
(it declares every struct for the library it ships with), so no ctypes layout of ours meets the
library. It answers in the library's own units; exporter/sources/amd_smi/convert.py turns them
into the data model. A value the library does not provide ("N/A", or an AmdSmiLibraryException)
is left out, and the daemon's sysfs fallback serves it.

Compute partitions: amdsmi lists every partition as a processor handle (kfd_info's
current_partition_id); partition 0 is read, the others are left to the fallback (the library reads
their nearly empty platform device and answers N/A for nearly everything).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from exporter.sources.rocm_smi import harness
from exporter.sources.rocm_smi.harness import Breadcrumbs, DeviceReader, Opened
from exporter.sources.rocm_smi.library import ECC_BLOCKS as ECC_BLOCK_NAMES

# our name -> amdsmi enum member names
TEMPERATURES = {"edge": "EDGE", "junction": "HOTSPOT", "memory": "VRAM"}
THRESHOLDS = {"critical": "CRITICAL", "emergency": "EMERGENCY"}
MEMORY_POOLS = {"vram": "VRAM", "visible_vram": "VIS_VRAM", "gtt": "GTT"}
CLOCKS = {"gfx": "GFX", "memory": "MEM", "fabric": "DF", "soc": "SOC", "video": "VCLK0", "decode": "DCLK0"}
# the RAS blocks librocm_smi64 reads, by the same names (AmdSmiGpuBlock spells them in capitals)
ECC_BLOCKS = {block: block.upper() for block in ECC_BLOCK_NAMES}
# amdsmi firmware ids whose version the library reports as the kernel's plain number -> our block.
# (Dotted versions such as VCN's "01.11.00.1D" or PM's "00.85.107.00" mix hex and decimal bytes:
# those blocks are left to the sysfs fallback rather than guessed.)
FIRMWARE_IDS = {
    "AMDSMI_FW_ID_CP_MEC1": "mec",
    "AMDSMI_FW_ID_CP_MEC2": "mec2",
    "AMDSMI_FW_ID_CP_ME": "me",
    "AMDSMI_FW_ID_CP_PFP": "pfp",
    "AMDSMI_FW_ID_CP_CE": "ce",
    "AMDSMI_FW_ID_RLC": "rlc",
    "AMDSMI_FW_ID_SDMA0": "sdma",
    "AMDSMI_FW_ID_SDMA1": "sdma2",
    "AMDSMI_FW_ID_ASD": "asd",
}
# the decoded gpu_metrics fields the converter reads
GPU_METRICS_FIELDS = (
    "common_header.format_revision",
    "common_header.content_revision",
    "temperature_vrgfx",
    "temperature_vrsoc",
    "temperature_vrmem",
    "temperature_hbm",
    "current_gfxclk",
    "current_socclk",
    "current_uclk",
    "current_vclk0",
    "current_dclk0",
    "pcie_link_width",
    "pcie_link_speed",
    "pcie_bandwidth_inst",
    "pcie_l0_to_recov_count_acc",
    "pcie_nak_sent_count_acc",
    "pcie_nak_rcvd_count_acc",
    "pcie_replay_rover_count_acc",
    "pcie_lc_perf_other_end_recovery",
    "xgmi_link_width",
    "xgmi_link_speed",
    "xgmi_link_status",
    "xgmi_read_data_acc",
    "xgmi_write_data_acc",
    "prochot_residency_acc",
    "ppt_residency_acc",
    "socket_thm_residency_acc",
    "vr_thm_residency_acc",
    "hbm_thm_residency_acc",
)


def _plain(value: Any) -> Any:
    """The module's answer made JSON-safe; "N/A" (not supplied) becomes None."""
    if isinstance(value, str) and value.strip().upper() == "N/A":
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "name") and hasattr(value, "value"):  # an enum
        return value.name
    return value


class Calls(harness.Calls):
    """A failed call raises AmdSmiLibraryException (not supported, DRM error ...): not supplied."""

    def get(self, name: str, function: Callable[..., Any], *args: Any) -> Any:
        return _plain(self.call(name, function, *args))

    def each(self, prefix: str, names: Mapping[str, str], function: Callable[..., Any], h: Any, enum: Any) -> Any:
        """function(h, enum[theirs]) for each (ours, theirs) of `names`, keyed by our name."""
        return {ours: self.get(f"{prefix}:{ours}", function, h, enum[theirs]) for ours, theirs in names.items()}


class AmdSmiDeviceReader:
    """The calls that read one processor handle."""

    def __init__(self, smi: Any, crumbs: Breadcrumbs, index: int, handle: Any) -> None:
        self.smi, self.crumbs, self.index, self.handle = smi, crumbs, index, handle

    def identify(self, skip: frozenset[str]) -> dict[str, Any]:
        smi, h = self.smi, self.handle
        calls = Calls(self.crumbs, self.index, skip)
        asic = calls.get("asic_info", smi.amdsmi_get_gpu_asic_info, h) or {}
        board = calls.get("board_info", smi.amdsmi_get_gpu_board_info, h) or {}
        vbios = calls.get("vbios_info", smi.amdsmi_get_gpu_vbios_info, h) or {}
        serial = asic.get("asic_serial")
        firmware = {}
        for entry in (calls.get("fw_info", smi.amdsmi_get_fw_info, h) or {}).get("fw_list", ()):
            block = FIRMWARE_IDS.get(str(entry.get("fw_name")))
            version = str(entry.get("fw_version", ""))
            if block and version.isdigit() and int(version):
                firmware[block] = int(version)
        metrics = calls.get("gpu_metrics", smi.amdsmi_get_gpu_metrics_info, h) or {}
        fmt, content = metrics.get("common_header.format_revision"), metrics.get("common_header.content_revision")
        return {
            # 0 is no id (an SR-IOV VF's): "" as the sysfs source gives it
            "unique_id": f"{int(serial, 16):016x}".replace("0" * 16, "")
            if isinstance(serial, str) and serial.startswith("0x")
            else "",
            "product": str(board.get("product_name") or asic.get("market_name") or ""),
            "serial": str(board.get("product_serial") or ""),
            "vbios": str(vbios.get("part_number") or ""),
            "device_id": str(asic.get("device_id") or ""),
            "numa_node": calls.get("numa_node", smi.amdsmi_topo_get_numa_node_number, h),
            "firmware": firmware,
            "links": [],  # KFD io_links come from the fallback's topology
            "gpu_metrics_unsafe": "",
            "gpu_metrics_version": f"{fmt}.{content}" if fmt is not None and content is not None else "",
            "compute_partition": str(calls.get("compute_partition", smi.amdsmi_get_gpu_compute_partition, h) or ""),
            "memory_partition": str(calls.get("memory_partition", smi.amdsmi_get_gpu_memory_partition, h) or ""),
            "failed": calls.failed,
        }

    def read(self, skip: frozenset[str], request: Mapping[str, Any]) -> dict[str, Any]:
        # Nothing to guard: libamd_smi reads every gpu_metrics version. pcie_bw is the fallback's.
        smi, h = self.smi, self.handle
        calls = Calls(self.crumbs, self.index, skip)
        kinds = smi.AmdSmiTemperatureType
        current = smi.AmdSmiTemperatureMetric.CURRENT
        out: dict[str, Any] = {
            "temperatures": {
                sensor: calls.get(f"temperature:{sensor}", smi.amdsmi_get_temp_metric, h, kinds[kind], current)
                for sensor, kind in TEMPERATURES.items()
            },
            "power": calls.get("power_info", smi.amdsmi_get_power_info, h),
            "energy": calls.get("energy", smi.amdsmi_get_energy_count, h),
            "activity": calls.get("activity", smi.amdsmi_get_gpu_activity, h),
            "memory_used": calls.each(
                "memory_used", MEMORY_POOLS, smi.amdsmi_get_gpu_memory_usage, h, smi.AmdSmiMemoryType
            ),
            "vddgfx_mv": calls.get(
                "voltage:vddgfx",
                smi.amdsmi_get_gpu_volt_metric,
                h,
                smi.AmdSmiVoltageType.VDDGFX,
                smi.AmdSmiVoltageMetric.CURRENT,
            ),
        }
        metrics = calls.get("gpu_metrics", smi.amdsmi_get_gpu_metrics_info, h) or {}
        out["gpu_metrics"] = {name: metrics.get(name) for name in GPU_METRICS_FIELDS}
        if request.get("slow"):
            out.update(self._read_slow(calls))
        out["failed"] = calls.failed
        return out

    def _read_slow(self, calls: Calls) -> dict[str, Any]:
        smi, h = self.smi, self.handle
        kinds = smi.AmdSmiTemperatureType
        return {
            "thresholds": {
                sensor: {
                    threshold: calls.get(
                        f"temperature:{sensor}:{threshold}",
                        smi.amdsmi_get_temp_metric,
                        h,
                        kinds[kind],
                        smi.AmdSmiTemperatureMetric[metric],
                    )
                    for threshold, metric in THRESHOLDS.items()
                }
                for sensor, kind in TEMPERATURES.items()
            },
            "power_cap": calls.get("power_cap", smi.amdsmi_get_power_cap_info, h),
            "memory_total": calls.each(
                "memory_total", MEMORY_POOLS, smi.amdsmi_get_gpu_memory_total, h, smi.AmdSmiMemoryType
            ),
            "clocks": calls.each("clock", CLOCKS, smi.amdsmi_get_clock_info, h, smi.AmdSmiClkType),
            "pcie": calls.get("pcie_info", smi.amdsmi_get_pcie_info, h),
            "pcie_replays": calls.get("pcie_replays", smi.amdsmi_get_gpu_pci_replay_counter, h),
            "ecc": calls.each("ecc", ECC_BLOCKS, smi.amdsmi_get_gpu_ecc_count, h, smi.AmdSmiGpuBlock),
            "bad_pages": calls.get("bad_pages", smi.amdsmi_get_gpu_bad_page_info, h),
            # debugfs's ras/bad_page_cnt_threshold: "N/A" (None) unless root
            "bad_page_threshold": calls.get("bad_page_threshold", smi.amdsmi_get_gpu_bad_page_threshold, h),
        }


def open_library(crumbs: Breadcrumbs) -> Opened:
    import amdsmi as smi

    smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    version = smi.amdsmi_get_lib_version()
    devices: list[dict[str, Any]] = []
    readers: dict[int, DeviceReader] = {}
    handles = smi.amdsmi_get_processor_handles()
    for index, handle in enumerate(handles):
        calls = Calls(crumbs, index)
        partition = (calls.get("kfd_info", smi.amdsmi_get_gpu_kfd_info, handle) or {}).get("current_partition_id")
        bdf = str(calls.get("bdf", smi.amdsmi_get_gpu_device_bdf, handle) or "").strip().lower()
        devices.append(
            {"index": index, "pci_bus_id": bdf, "partition": int(partition or 0), "card": "", "device_dir": ""}
        )
        readers[index] = AmdSmiDeviceReader(smi, crumbs, index, handle)
    driver = ""
    if handles:
        info = Calls(crumbs, 0).get("driver_info", smi.amdsmi_get_gpu_driver_info, handles[0])
        driver = str((info or {}).get("driver_version") or "")
    return Opened(devices, readers, driver, f"{version.get('major')}.{version.get('minor')}.{version.get('release')}")


if __name__ == "__main__":
    sys.exit(harness.serve(sys.argv[1:], open_library))
