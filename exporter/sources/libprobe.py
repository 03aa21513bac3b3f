"""`python -m exporter.sources.libprobe KIND PATH`: load one SMI library and print its version as
JSON. Run in a child process by doctor, because these libraries can abort() or hang while loading
(a missing /dev/kfd, a mismatched driver), and that must not take the doctor down with them.

KIND is rocm_smi (rsmi_version_get) or amd_smi (amdsmi_get_lib_version). Neither call needs the
library initialised, so no device is touched.
"""

from __future__ import annotations

import ctypes
import json
import sys


class _RsmiVersion(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("patch", ctypes.c_uint32),
        ("build", ctypes.c_char_p),
    ]


class _AmdsmiVersion(ctypes.Structure):
    # amdsmi_version_t as of ROCm 6.1: major, minor, release, build string.
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("release", ctypes.c_uint32),
        ("build", ctypes.c_char_p),
    ]


def probe(kind: str, path: str) -> dict[str, str]:
    library = ctypes.CDLL(path)
    if kind == "rocm_smi":
        rsmi = _RsmiVersion()
        status = library.rsmi_version_get(ctypes.byref(rsmi))
        if status != 0:
            return {"error": f"rsmi_version_get returned status {status}"}
        build = rsmi.build.decode(errors="replace") if rsmi.build else ""
        return {"version": f"{rsmi.major}.{rsmi.minor}.{rsmi.patch}", "build": build}
    if kind == "amd_smi":
        amdsmi = _AmdsmiVersion()
        status = library.amdsmi_get_lib_version(ctypes.byref(amdsmi))
        if status != 0:
            return {"error": f"amdsmi_get_lib_version returned status {status}"}
        return {"version": f"{amdsmi.major}.{amdsmi.minor}.{amdsmi.release}"}
    return {"error": f"unknown library kind {kind!r}"}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(json.dumps({"error": "usage: libprobe KIND PATH"}))
        return 2
    try:
        result = probe(argv[0], argv[1])
    except (OSError, AttributeError) as error:
        result = {"error": str(error)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
