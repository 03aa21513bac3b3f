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


class _Version(ctypes.Structure):
    # rsmi_version_t (major, minor, patch, build) and, as of ROCm 6.1, amdsmi_version_t (major,
    # minor, release, build) share this layout.
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("patch", ctypes.c_uint32),
        ("build", ctypes.c_char_p),
    ]


# library kind -> the function that fills a _Version
_VERSION_FUNCTIONS = {"rocm_smi": "rsmi_version_get", "amd_smi": "amdsmi_get_lib_version"}


def probe(kind: str, path: str) -> dict[str, str]:
    library = ctypes.CDLL(path)
    function = _VERSION_FUNCTIONS.get(kind)
    if function is None:
        return {"error": f"unknown library kind {kind!r}"}
    version = _Version()
    status = getattr(library, function)(ctypes.byref(version))
    if status != 0:
        return {"error": f"{function} returned status {status}"}
    number = f"{version.major}.{version.minor}.{version.patch}"
    if kind == "amd_smi":
        return {"version": number}
    return {"version": number, "build": version.build.decode(errors="replace") if version.build else ""}


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
