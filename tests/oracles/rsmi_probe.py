"""Runs INSIDE a chroot (its python3 and librocm_smi64), not in the test process.

Measures, with ctypes, what a binding must know about the installed librocm_smi64: the version
rsmi_version_get reports, and how many bytes rsmi_dev_gpu_metrics_info_get writes into the
caller's rsmi_gpu_metrics_t buffer (the struct size the library was built with). The buffer is
much larger than any known layout and filled with a sentinel, twice with different sentinels, so
the highest byte either run changed is the size of what the library wrote. Prints one JSON line.
"""

import ctypes
import json
import sys

BUFFER = 8192


class Version(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("patch", ctypes.c_uint32),
        ("build", ctypes.c_char_p),
    ]


def written_extent(lib, index):
    extent, status, header = 0, None, None
    for sentinel in (0xA5, 0x5A):
        buffer = (ctypes.c_uint8 * BUFFER)(*([sentinel] * BUFFER))
        status = lib.rsmi_dev_gpu_metrics_info_get(ctypes.c_uint32(index), ctypes.byref(buffer))
        changed = [offset for offset in range(BUFFER) if buffer[offset] != sentinel]
        if changed:
            extent = max(extent, changed[-1] + 1)
        header = {
            "structure_size": buffer[0] | buffer[1] << 8,
            "format_revision": buffer[2],
            "content_revision": buffer[3],
        }
    return {"status": status, "bytes_written": extent, "header_in_buffer": header}


def calls(lib, index):
    """Status and value of the per-device getters a binding would use (None where absent)."""
    u32, u64, i64 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
    dv = u32(index)
    out = {}

    def record(name, *args, value=None):
        function = getattr(lib, name, None)
        if function is None:
            out[name] = None
            return
        status = function(dv, *args)
        out[name] = [status, value() if status == 0 and value else None]

    for name in ("rsmi_dev_unique_id_get", "rsmi_dev_pci_id_get", "rsmi_dev_current_socket_power_get"):
        number = u64()
        record(name, ctypes.byref(number), value=lambda n=number: n.value)
    busy = u32()
    record("rsmi_dev_busy_percent_get", ctypes.byref(busy), value=lambda: busy.value)
    power = u64()
    record("rsmi_dev_power_ave_get", u32(0), ctypes.byref(power), value=lambda: power.value)
    power_type = ctypes.c_int()
    record(
        "rsmi_dev_power_get",
        ctypes.byref(power),
        ctypes.byref(power_type),
        value=lambda: [power.value, power_type.value],
    )
    cap = u64()
    record("rsmi_dev_power_cap_get", u32(0), ctypes.byref(cap), value=lambda: cap.value)
    energy, resolution, stamp = u64(), ctypes.c_float(), u64()
    record(
        "rsmi_dev_energy_count_get",
        ctypes.byref(energy),
        ctypes.byref(resolution),
        ctypes.byref(stamp),
        value=lambda: [energy.value, round(resolution.value, 4)],
    )
    for sensor, label in ((0, "edge"), (1, "junction"), (2, "memory"), (3, "hbm0")):
        temp = i64()
        record(
            "rsmi_dev_temp_metric_get", u32(sensor), ctypes.c_int(0), ctypes.byref(temp), value=lambda t=temp: t.value
        )
        out[f"rsmi_dev_temp_metric_get({label})"] = out.pop("rsmi_dev_temp_metric_get")
    frequencies = (ctypes.c_uint8 * 512)()
    record(
        "rsmi_dev_gpu_clk_freq_get",
        ctypes.c_int(0),
        ctypes.byref(frequencies),
        value=lambda: [int.from_bytes(bytes(frequencies[o : o + 4]), "little") for o in (0, 4, 8)],
    )
    for name in ("rsmi_dev_compute_partition_get", "rsmi_dev_memory_partition_get"):
        text = ctypes.create_string_buffer(64)
        record(name, text, u32(64), value=lambda t=text: t.value.decode())
    partition = u32()
    record("rsmi_dev_partition_id_get", ctypes.byref(partition), value=lambda: partition.value)
    header = (ctypes.c_uint8 * 64)()
    record("rsmi_dev_metrics_header_info_get", ctypes.byref(header), value=lambda: list(header[:4]))
    return out


def main():
    paths = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    lib = ctypes.CDLL(paths[0] if paths else "librocm_smi64.so.1")
    version = Version()
    report = {"rsmi_version_get": lib.rsmi_version_get(ctypes.byref(version))}
    report["version"] = {
        "major": version.major,
        "minor": version.minor,
        "patch": version.patch,
        "build": (version.build or b"").decode(errors="replace"),
    }
    string = ctypes.create_string_buffer(256)
    if hasattr(lib, "rsmi_version_str_get"):
        # component 0 = RSMI_SW_COMP_DRIVER: the amdgpu driver version string
        report["rsmi_version_str_get(driver)"] = lib.rsmi_version_str_get(0, string, 256)
        report["driver_version_string"] = string.value.decode(errors="replace")
    report["rsmi_init"] = lib.rsmi_init(ctypes.c_uint64(0))
    count = ctypes.c_uint32()
    report["rsmi_num_monitor_devices"] = lib.rsmi_num_monitor_devices(ctypes.byref(count))
    sys.stdout.flush()
    report["gpu_metrics"] = [written_extent(lib, index) for index in range(count.value)]
    if "--calls" in sys.argv:
        report["calls"] = [calls(lib, index) for index in range(count.value)]
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
