"""The pure parts of the rocm_smi source: ctypes layouts, library search, breadcrumbs and blame,
mutex state parsing, the gpu_metrics guard and the rsmi_init failure hint."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from exporter.abi.gpu_metrics import V1_1
from exporter.sources.host import library_candidates
from exporter.sources.rocm_smi import library as rc
from exporter.sources.rocm_smi import protocol as proto
from exporter.sources.rocm_smi.mutex import FUTEX_OWNER_DIED, owned_by, parse_mutex
from exporter.sources.rocm_smi.worker import gpu_metrics_header, gpu_metrics_unsafe_reason, init_failure_hint
from tests.realtools import ROCM_SMI_LIBRARY, require_file


def test_5_2_3_layouts_match_its_header() -> None:
    # rsmi_gpu_metrics_t of 5.2.3 is the kernel's gpu_metrics_v1_1, which convert.py reads it as
    assert rc.GPU_METRICS_STRUCT_SIZE == V1_1.size == 96
    assert ctypes.sizeof(rc.ABI_5_2.frequencies) == 8 + 8 * 32
    assert ctypes.sizeof(rc.ABI_5_2.pcie_bandwidth) == ctypes.sizeof(rc.ABI_5_2.frequencies) + 4 * 32
    assert ctypes.sizeof(rc.RsmiErrorCount) == 16
    assert ctypes.sizeof(rc.RetiredPage) == 24


def test_every_declared_signature_exists_in_the_installed_library() -> None:
    lib = ctypes.CDLL(require_file(ROCM_SMI_LIBRARY, "librocm_smi64"))
    rc.declare(lib)
    for name in rc.SIGNATURES:
        assert getattr(lib, name).restype is ctypes.c_uint32


def test_status_names_follow_rsmi_status_t() -> None:
    assert (rc.status_name(0), rc.status_name(8), rc.status_name(17)) == ("success", "init_error", "refcount_overflow")
    assert rc.status_name(0xFFFFFFFF) == "status 4294967295"


def test_library_search_tries_rocm_path_first_and_the_debian_name(tmp_path: Path) -> None:
    (tmp_path / "rocm").mkdir()
    candidates = library_candidates("librocm_smi64", str(tmp_path), {"ROCM_PATH": "/opt/rocm-6.0"})
    assert candidates[0] == "/opt/rocm-6.0/lib/librocm_smi64.so"
    assert "/usr/lib/librocm_smi64.so.1" in candidates
    assert candidates.index(f"{tmp_path}/rocm/lib/librocm_smi64.so") < candidates.index("/usr/lib/librocm_smi64.so.1")
    assert len(candidates) == len(set(candidates))


def test_find_library_returns_the_first_existing_candidate(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    real = lib / "librocm_smi64.so.1.0"
    real.write_bytes(b"")
    (lib / "librocm_smi64.so.1").symlink_to(real.name)
    assert rc.find_library({"ROCM_PATH": str(tmp_path)}) == str(lib / "librocm_smi64.so.1")
    (lib / "librocm_smi64.so").symlink_to(real.name)
    assert rc.find_library({"ROCM_PATH": str(tmp_path)}) == str(lib / "librocm_smi64.so")


def test_breadcrumbs_round_trip_and_blame_the_aborting_thread() -> None:
    area = bytearray(proto.BREADCRUMB_BYTES)
    area[0 : proto.SLOT_SIZE] = proto.pack_slot(0x7F00AA, 101, 0, "temperature:edge:current")
    area[proto.SLOT_SIZE : 2 * proto.SLOT_SIZE] = proto.pack_slot(0x7F00BB, 102, 1, "gpu_metrics")
    area[2 * proto.SLOT_SIZE : 3 * proto.SLOT_SIZE] = proto.pack_slot(0x7F00CC, 103, 2, proto.IDLE)
    crumbs = proto.unpack_slots(bytes(area))
    assert [(c.tid, c.device, c.call) for c in crumbs] == [
        (101, 0, "temperature:edge:current"),
        (102, 1, "gpu_metrics"),
        (103, 2, ""),
    ]
    log = b"Fatal Python error: Aborted\n\nThread 0x00000000007f00aa (most recent call first):\n  ...\n"
    log += b"Current thread 0x00000000007f00bb (most recent call first):\n  File ...\n"
    assert proto.crashed_thread(log) == 0x7F00BB
    assert [(c.device, c.call) for c in proto.blamed_calls(crumbs, log)] == [(1, "gpu_metrics")]
    # without faulthandler's word every call in flight is blamed (each is only re-routed)
    assert [(c.device, c.call) for c in proto.blamed_calls(crumbs, b"")] == [
        (0, "temperature:edge:current"),
        (1, "gpu_metrics"),
    ]


@given(st.binary(max_size=proto.SLOT_SIZE * 4))
def test_any_breadcrumb_bytes_unpack_without_error(raw: bytes) -> None:
    for crumb in proto.unpack_slots(raw):
        assert crumb.ident != 0


def test_messages_are_json_lines() -> None:
    line = proto.encode({"id": 3, "op": "read", "skip": ["energy"]})
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    assert proto.decode(line) == {"id": 3, "op": "read", "skip": ["energy"]}


def _mutex(lock: int, count: int, owner: int) -> bytes:
    return struct.pack("<IIiIi", lock, count, owner, 1, 0x91) + bytes(20)


def test_mutex_abandoned_by_a_dead_worker_thread_is_ours_to_repair() -> None:
    # after the holder was SIGKILLed the kernel leaves OWNER_DIED and clears the tid bits
    state = parse_mutex(_mutex(FUTEX_OWNER_DIED, 1, 28146))
    assert state is not None and state.owner_died and state.lock_tid == 0 and state.owner == 28146
    assert owned_by(state, {28146, 28139})
    assert not owned_by(state, {5000})


def test_mutex_held_by_a_live_thread_or_free_is_not_touched() -> None:
    held = parse_mutex(_mutex(0x80000000 | 28139, 1, 28139))  # waiters bit + a live owner
    assert held is not None and held.lock_tid == 28139 and not owned_by(held, {1, 2})
    free = parse_mutex(_mutex(0, 0, 0))
    assert free is not None and not owned_by(free, {0, 28146})
    assert parse_mutex(b"\0" * 8) is None


@given(st.binary(max_size=64), st.sets(st.integers(1, 2**30), max_size=4), st.booleans())
def test_any_mutex_bytes_parse_to_their_fields_and_ownership_follows_them(
    raw: bytes, tids: set[int], include_holder: bool
) -> None:
    state = parse_mutex(raw)
    if len(raw) < 16:
        assert state is None
        return
    assert state is not None
    word = int.from_bytes(raw[0:4], "little")
    assert state.lock_tid == word & 0x3FFFFFFF
    assert state.owner_died == bool(word & FUTEX_OWNER_DIED)
    assert state.count == int.from_bytes(raw[4:8], "little")
    assert state.owner == int.from_bytes(raw[8:12], "little", signed=True)
    if include_holder:
        tids = tids | {state.lock_tid or state.owner}
    owned = owned_by(state, tids)
    assert not owned_by(state, set()), "no dead thread: nothing is ours"
    if state.lock_tid:
        # held: ours exactly when its holder is one of the dead threads
        assert owned == (state.lock_tid in tids)
    elif state.owner_died:
        # abandoned (kernel cleared the tid): ours when the last owner is one of the dead threads
        assert owned == (state.owner in tids)
    else:
        assert not owned, "a free mutex is never repaired"
    assert owned_by(state, tids | {12345678}) or not owned, "more dead threads never make it less ours"


def _metrics_file(tmp_path: Path, header: bytes) -> str:
    (tmp_path / "gpu_metrics").write_bytes(header + bytes(200))
    return str(tmp_path)


def test_gpu_metrics_guard_refuses_content_4_and_later(tmp_path: Path) -> None:
    folder = _metrics_file(tmp_path, struct.pack("<HBB", 360, 1, 5))
    assert gpu_metrics_header(folder) == (360, 1, 5)
    assert "v1.5" in gpu_metrics_unsafe_reason(gpu_metrics_header(folder))
    for content in (0, 1, 2, 3):
        assert gpu_metrics_unsafe_reason((120, 1, content)) == ""
    assert gpu_metrics_unsafe_reason((4, 2, 0)) == ""  # format 2: the library says NOT_SUPPORTED
    assert gpu_metrics_unsafe_reason(None) == ""  # no table: an error status, not an abort
    assert gpu_metrics_header(str(tmp_path / "absent")) is None


def test_init_failure_hint_names_a_card_without_vddgfx(tmp_path: Path) -> None:
    drm = tmp_path / "class" / "drm"
    for card, has_in0 in (("card0", True), ("card1", False)):
        hwmon = tmp_path / "devices" / card / "hwmon" / "hwmon0"
        hwmon.mkdir(parents=True)
        if has_in0:
            (hwmon / "in0_label").write_text("vddgfx\n")
        (drm / card).mkdir(parents=True)
        os.symlink(tmp_path / "devices" / card, drm / card / "device")
    assert "card1" in init_failure_hint(str(tmp_path)) and "in0_label" in init_failure_hint(str(tmp_path))
    (tmp_path / "devices" / "card1" / "hwmon" / "hwmon0" / "in0_label").write_text("vddgfx\n")
    assert init_failure_hint(str(tmp_path)) == ""


def test_6x_layouts_match_the_6x_headers() -> None:
    """Sizes and offsets from docs/notes-rocm-smi-6.md (computed from the 6.1.2 / 6.4.1 headers)."""
    frequencies, bandwidth = rc.ABI_6.frequencies, rc.ABI_6.pcie_bandwidth
    assert ctypes.sizeof(frequencies) == 280
    assert frequencies.num_supported.offset == 4 and frequencies.current.offset == 8  # type: ignore[attr-defined]
    assert frequencies.frequency.offset == 16  # type: ignore[attr-defined]
    assert ctypes.sizeof(bandwidth) == 416 and bandwidth.lanes.offset == 280  # type: ignore[attr-defined]
    assert ctypes.sizeof(rc.RsmiVersion) == 24
    # 6.x renumbered the firmware blocks: MES, MES_KIQ after MEC2, the rest up by two
    expected = {"asd": 0, "mec": 5, "mec2": 6, "mes": 7, "mes_kiq": 8, "pfp": 9, "smc": 16, "sos": 17, "vcn": 22}
    assert {k: rc.FIRMWARE_BLOCKS_6[k] for k in expected} == expected
    assert len(set(rc.FIRMWARE_BLOCKS_6.values())) == len(rc.FIRMWARE_BLOCKS_6) == len(rc.FIRMWARE_BLOCKS) + 2
    # every layout a library is known to write fits the buffer we hand it
    assert rc.GPU_METRICS_BUFFER_SIZE > 4544


def test_only_measured_library_versions_have_an_abi() -> None:
    assert rc.abi_for((1, 0, 0)) is rc.ABI_5_2
    assert rc.abi_for((7, 2, 0)) is rc.abi_for((7, 6, 0)) is rc.ABI_6
    for unknown in ((7, 4, 0), (7, 7, 0), (1, 0, 1), (8, 0, 0)):
        try:
            rc.abi_for(unknown)
        except ValueError as error:
            assert "struct layouts this exporter does not know" in str(error)
            assert "1.0.0 (ROCm 5.2)" in str(error)
        else:
            raise AssertionError(f"{unknown} accepted")


def test_the_installed_5_2_3_library_reports_version_1_0_0() -> None:
    lib = ctypes.CDLL(require_file(ROCM_SMI_LIBRARY, "librocm_smi64"))
    assert rc.library_version(lib) == (1, 0, 0)
    rc.declare(lib, rc.ABI_5_2)
    assert not hasattr(lib, "rsmi_dev_compute_partition_get")  # 6.x-only calls are not declared for 5.2
