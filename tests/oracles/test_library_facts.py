"""Facts about the real libraries in the chroots that a ctypes binding depends on, measured.

- what rsmi_version_get reports for Debian's librocm_smi64 5.2.3 (host), 6.1.2 and 6.4.1;
- how many bytes rsmi_dev_gpu_metrics_info_get writes into the caller's rsmi_gpu_metrics_t
  (a 5.2.3-sized 96-byte buffer would be overrun by 6.x);
- what the libdrm_amdgpu stand-in answers, against the tree it answers from;
- tool quirks the cross-check relies on, checked against the tree (so a fixed tool shows up).
See docs/notes-rocm-smi-6.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.simulator import Simulator
from tests.oracles.runner import Chroot, run_json
from tests.oracles.test_crosscheck_modern_tools import ROCM_SMI_FLAGS
from tests.realtools import require_file, run_in_sysfs_namespace

pytestmark = pytest.mark.integration

RSMI_PROBE = Path(__file__).with_name("rsmi_probe.py")
# library (Debian package) -> (rsmi_version_get, bytes of rsmi_gpu_metrics_t it writes)
EXPECTED = {"5.2.3": ((1, 0, 0), 96), "6.1.2": ((7, 2, 0), 424), "6.4.1": ((7, 6, 0), 2368)}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {}
    for fleet in ("1xMI210", "1xMI300X:gpu_metrics=1.5", "1xMI300X:gpu_metrics=1.7", "1xMI300X"):
        root = tmp_path_factory.mktemp("facts") / "sys"
        simulator = Simulator(root, fleet=fleet, scenario="training", seed=3)
        simulator.write_tree()
        simulator.tick(5.0)
        made[fleet] = root
    return made


def _probe(library: str, chroots: dict[str, Chroot], tree: Path) -> dict[str, Any]:
    if library == "5.2.3":
        host_library = require_file("/usr/lib/librocm_smi64.so.1", "Debian bookworm's librocm-smi64-1")
        result = run_in_sysfs_namespace(tree, ["/usr/bin/python3", str(RSMI_PROBE), host_library], timeout=60)
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))
    chroot = chroots["trixie" if library == "6.1.2" else "sid"]
    return dict(run_json(chroot, tree, ["python3", "-c", RSMI_PROBE.read_text()]))


@pytest.mark.parametrize("library", list(EXPECTED))
def test_rsmi_version_and_gpu_metrics_struct_size(
    library: str, chroots: dict[str, Chroot], trees: dict[str, Path]
) -> None:
    version, size = EXPECTED[library]
    report = _probe(library, chroots, trees["1xMI210"])
    assert report["rsmi_version_get"] == 0 and report["rsmi_init"] == 0, report
    got = report["version"]
    assert (got["major"], got["minor"], got["patch"]) == version, got
    metrics = report["gpu_metrics"][0]
    assert metrics["status"] == 0, metrics
    assert metrics["header_in_buffer"] == {"structure_size": 120, "format_revision": 1, "content_revision": 3}
    assert metrics["bytes_written"] == size, f"librocm_smi64 {library} wrote {metrics['bytes_written']} bytes"


@pytest.mark.parametrize(
    ("library", "fleet", "status", "written"),
    [
        ("6.1.2", "1xMI300X:gpu_metrics=1.5", 0, 424),  # v1_5 read
        ("6.1.2", "1xMI300X:gpu_metrics=1.7", 15, 0),  # RSMI_STATUS_UNEXPECTED_DATA, nothing written
        ("6.4.1", "1xMI300X:gpu_metrics=1.5", 0, 2368),
        ("6.4.1", "1xMI300X:gpu_metrics=1.7", 0, 2368),
        # a current kernel's v1.9: neither library reads it (RSMI_STATUS_UNEXPECTED_DATA)
        ("6.1.2", "1xMI300X", 15, 0),
        ("6.4.1", "1xMI300X", 15, 0),
    ],
)
def test_rsmi_6_on_mi300x_tables(
    library: str, fleet: str, status: int, written: int, chroots: dict[str, Chroot], trees: dict[str, Path]
) -> None:
    metrics = _probe(library, chroots, trees[fleet])["gpu_metrics"][0]
    assert (metrics["status"], metrics["bytes_written"]) == (status, written), metrics


_STAND_IN_CHECK = r"""
import ctypes, json, os
lib = ctypes.CDLL("libdrm_amdgpu.so.1")
class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("name_len", ctypes.c_int), ("name", ctypes.c_char_p), ("date_len", ctypes.c_int),
                ("date", ctypes.c_char_p), ("desc_len", ctypes.c_int), ("desc", ctypes.c_char_p)]
class Bus(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_uint16), ("bus", ctypes.c_uint8), ("dev", ctypes.c_uint8), ("func", ctypes.c_uint8)]
class Info(ctypes.Structure):
    _fields_ = [("vendor", ctypes.c_uint16), ("device", ctypes.c_uint16), ("subvendor", ctypes.c_uint16),
                ("subdevice", ctypes.c_uint16), ("revision", ctypes.c_uint8)]
class Device(ctypes.Structure):
    _fields_ = [("nodes", ctypes.c_void_p), ("available", ctypes.c_int), ("bustype", ctypes.c_int),
                ("bus", ctypes.POINTER(Bus)), ("info", ctypes.POINTER(Info))]
class Request(ctypes.Structure):
    _fields_ = [("return_pointer", ctypes.c_uint64), ("return_size", ctypes.c_uint32), ("query", ctypes.c_uint32),
                ("union", ctypes.c_uint32 * 4)]
lib.drmGetVersion.restype = ctypes.POINTER(Version)
lib.amdgpu_get_marketing_name.restype = ctypes.c_char_p
out = {}
fd = os.open("/dev/dri/renderD128", os.O_RDWR)
version = lib.drmGetVersion(fd).contents
out["name"] = version.name.decode()
device = ctypes.POINTER(Device)()
out["drmGetDevice"] = lib.drmGetDevice(fd, ctypes.byref(device))
bus, info = device.contents.bus.contents, device.contents.info.contents
out["bdf"] = "%04x:%02x:%02x.%x" % (bus.domain, bus.bus, bus.dev, bus.func)
out["ids"] = [info.vendor, info.device, info.subvendor, info.subdevice, info.revision]
vram_gtt = (ctypes.c_uint64 * 3)()
request = Request(ctypes.addressof(vram_gtt), ctypes.sizeof(vram_gtt), 0x14)
out["vram_gtt_rc"] = lib.drmCommandWrite(fd, 0x05, ctypes.byref(request), ctypes.sizeof(request))
out["vram_gtt"] = list(vram_gtt)
request = Request(ctypes.addressof(vram_gtt), 8, 0x7F)
out["unknown_query_rc"] = lib.drmCommandWrite(fd, 0x05, ctypes.byref(request), ctypes.sizeof(request))
handle = ctypes.c_void_p()
major, minor = ctypes.c_uint32(), ctypes.c_uint32()
out["init"] = lib.amdgpu_device_initialize(fd, ctypes.byref(major), ctypes.byref(minor), ctypes.byref(handle))
out["marketing_name"] = lib.amdgpu_get_marketing_name(handle).decode()
print(json.dumps(out))
"""


def test_libdrm_stand_in_answers_from_the_tree(chroots: dict[str, Chroot], trees: dict[str, Path]) -> None:
    tree = trees["1xMI210"]
    device = (tree / "class/drm/renderD128/device").resolve()

    def attr(name: str) -> str:
        return (device / name).read_text().strip()

    got = run_json(chroots["sid"], tree, ["python3", "-c", _STAND_IN_CHECK])
    assert got["name"] == "amdgpu" and got["drmGetDevice"] == 0
    assert got["bdf"] == device.name
    ids = [int(attr(name), 16) for name in ("vendor", "device", "subsystem_vendor", "subsystem_device", "revision")]
    assert got["ids"] == ids
    assert got["vram_gtt_rc"] == 0
    assert got["vram_gtt"] == [
        int(attr(f)) for f in ("mem_info_vram_total", "mem_info_vis_vram_total", "mem_info_gtt_total")
    ]
    assert got["unknown_query_rc"] == -22  # -EINVAL, as a kernel without that query answers
    assert got["init"] == 0 and got["marketing_name"] == "AMD Instinct MI210"  # libdrm's amdgpu.ids entry


def test_rocm_smi_quirks_still_hold(chroots: dict[str, Chroot], trees: dict[str, Path]) -> None:
    """rocm-smi 6.1.2 prints the subsystem VENDOR id as "Subsystem ID" and gfx90a as "gfx9010";
    6.4.1 prints the subsystem device id and gfx90a. The cross-check does not compare these."""
    tree = trees["1xMI210"]
    device = (tree / "class/drm/card0/device").resolve()
    old = run_json(chroots["trixie"], tree, ["rocm-smi", "--json", *ROCM_SMI_FLAGS])["card0"]
    new = run_json(chroots["sid"], tree, ["rocm-smi", "--json", *ROCM_SMI_FLAGS])["card0"]
    assert int(old["Subsystem ID"], 16) == int((device / "subsystem_vendor").read_text(), 16)
    assert int(new["Subsystem ID"], 16) == int((device / "subsystem_device").read_text(), 16)
    assert (old["GFX Version"], new["GFX Version"]) == ("gfx9010", "gfx90a")
