"""Runs INSIDE the sid chroot (its python3 and Debian's `amdsmi` module), not in the test process.

Calls the amdsmi module's per-GPU getters and prints one JSON document: for every processor
handle, each call's result (made JSON-safe) or the error it raised. Standard library only.
"""

import enum
import json
import sys

import amdsmi as smi


def plain(value):
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def call(results, name, function, *args):
    try:
        results[name] = {"ok": plain(function(*args))}
    except Exception as error:  # the probe records every failure; the test decides what matters
        results[name] = {"error": f"{type(error).__name__}: {error}"}


def probe_device(handle):
    out = {}
    call(out, "bdf", smi.amdsmi_get_gpu_device_bdf, handle)
    call(out, "uuid", smi.amdsmi_get_gpu_device_uuid, handle)
    call(out, "asic_info", smi.amdsmi_get_gpu_asic_info, handle)
    call(out, "board_info", smi.amdsmi_get_gpu_board_info, handle)
    call(out, "kfd_info", smi.amdsmi_get_gpu_kfd_info, handle)
    call(out, "driver_info", smi.amdsmi_get_gpu_driver_info, handle)
    call(out, "vbios_info", smi.amdsmi_get_gpu_vbios_info, handle)
    call(out, "fw_info", smi.amdsmi_get_fw_info, handle)
    call(out, "power_info", smi.amdsmi_get_power_info, handle)
    call(out, "power_cap_info", smi.amdsmi_get_power_cap_info, handle)
    call(out, "energy_count", smi.amdsmi_get_energy_count, handle)
    call(out, "activity", smi.amdsmi_get_gpu_activity, handle)
    call(out, "busy_percent", smi.amdsmi_get_gpu_busy_percent, handle)
    call(out, "vram_usage", smi.amdsmi_get_gpu_vram_usage, handle)
    call(out, "vram_info", smi.amdsmi_get_gpu_vram_info, handle)
    for memory in ("VRAM", "VIS_VRAM", "GTT"):
        kind = smi.AmdSmiMemoryType[memory]
        call(out, f"memory_total.{memory}", smi.amdsmi_get_gpu_memory_total, handle, kind)
        call(out, f"memory_usage.{memory}", smi.amdsmi_get_gpu_memory_usage, handle, kind)
    for sensor in ("EDGE", "HOTSPOT", "VRAM", "HBM_0", "HBM_1", "HBM_2", "HBM_3"):
        for metric in ("CURRENT", "CRITICAL", "EMERGENCY"):
            call(
                out,
                f"temp.{sensor}.{metric}",
                smi.amdsmi_get_temp_metric,
                handle,
                smi.AmdSmiTemperatureType[sensor],
                smi.AmdSmiTemperatureMetric[metric],
            )
    call(
        out,
        "volt.VDDGFX.CURRENT",
        smi.amdsmi_get_gpu_volt_metric,
        handle,
        smi.AmdSmiVoltageType.VDDGFX,
        smi.AmdSmiVoltageMetric.CURRENT,
    )
    for clock in ("GFX", "MEM", "DF", "SOC", "VCLK0", "DCLK0"):
        call(out, f"clock_info.{clock}", smi.amdsmi_get_clock_info, handle, smi.AmdSmiClkType[clock])
    call(out, "pcie_info", smi.amdsmi_get_pcie_info, handle)
    call(out, "pci_replay_counter", smi.amdsmi_get_gpu_pci_replay_counter, handle)
    call(out, "pci_throughput", smi.amdsmi_get_gpu_pci_throughput, handle)
    call(out, "total_ecc_count", smi.amdsmi_get_gpu_total_ecc_count, handle)
    for block in ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL"):
        call(out, f"ecc_count.{block}", smi.amdsmi_get_gpu_ecc_count, handle, smi.AmdSmiGpuBlock[block])
    call(out, "gpu_metrics", smi.amdsmi_get_gpu_metrics_info, handle)
    call(out, "compute_partition", smi.amdsmi_get_gpu_compute_partition, handle)
    call(out, "memory_partition", smi.amdsmi_get_gpu_memory_partition, handle)
    call(out, "numa_node", smi.amdsmi_topo_get_numa_node_number, handle)
    call(out, "xgmi_error", smi.amdsmi_gpu_xgmi_error_status, handle)
    call(out, "perf_level", smi.amdsmi_get_gpu_perf_level, handle)
    return out


def main():
    report = {}
    try:
        smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except Exception as error:
        print(json.dumps({"init_error": f"{type(error).__name__}: {error}"}))
        return 1
    try:
        call(report, "lib_version", smi.amdsmi_get_lib_version)
        report["devices"] = [probe_device(handle) for handle in smi.amdsmi_get_processor_handles()]
    finally:
        smi.amdsmi_shut_down()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
