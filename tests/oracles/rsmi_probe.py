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


def main():
    lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "librocm_smi64.so.1")
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
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
