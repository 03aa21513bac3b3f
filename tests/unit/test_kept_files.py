"""Kept descriptors (files.KeptFiles): fresh values on every read, on the real kernel's sysfs and on a tree."""

from __future__ import annotations

import errno
import os
import socket
import threading
from pathlib import Path
from unittest import mock

import pytest

from exporter.sources.base import SourceError
from exporter.sources.errors import FileErrors, collecting
from exporter.sources.sysfs import files
from exporter.sources.sysfs.files import KeptFiles
from exporter.sources.sysfs.source import SysfsSource


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_kept_sysfs_attribute_reads_the_kernels_current_value() -> None:
    """The premise, on this machine's kernel: pread from offset 0 makes kernfs show() the attribute afresh."""
    path = "/sys/class/net/lo/statistics/tx_packets"
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: this test needs the host's sysfs with a loopback device")
    kept = KeptFiles()
    try:
        before = int(kept.read(path) or b"")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for _ in range(5):
                sender.sendto(b"x", ("127.0.0.1", 9))
        after = int(kept.read(path) or b"")
        assert path in kept._fds  # the same descriptor both times
        assert after >= before + 5
    finally:
        kept.close()


def test_in_place_writes_and_replacements_are_both_seen(tmp_path: Path) -> None:
    path = tmp_path / "mem_info_vram_used"
    path.write_text("100\n")
    kept = KeptFiles()
    assert kept.read(str(path)) == b"100\n"
    path.write_text("200\n")  # written in place: the kept descriptor reads it
    assert kept.read(str(path)) == b"200\n"
    temp = tmp_path / ".new"
    temp.write_text("300\n")
    os.replace(temp, path)  # replaced, as the simulator writes: fstat sees no links, the path is reopened
    assert kept.read(str(path)) == b"300\n"
    path.unlink()
    assert kept.read(str(path)) is None  # gone: absent, not an error
    kept.close()


def test_a_failed_read_is_counted_once_and_the_path_opened_again_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpu_busy_percent"
    path.write_text("42\n")
    kept = KeptFiles()
    assert kept.read(str(path)) == b"42\n"
    real_pread = os.pread
    calls = []

    def failing_pread(fd: int, size: int, offset: int) -> bytes:
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(files.os, "pread", failing_pread)
    errors = FileErrors(str(tmp_path))
    with collecting(errors):
        assert kept.read(str(path)) is None
    assert errors.counts == {("gpu_busy_percent", "eio"): 1}
    assert len(calls) == 1  # no second try within the same read
    assert str(path) not in kept._fds
    monkeypatch.setattr(files.os, "pread", real_pread)
    assert kept.read(str(path)) == b"42\n"
    monkeypatch.setattr(files.os, "pread", lambda fd, size, offset: (_ for _ in ()).throw(OSError(errno.ENODEV, "x")))
    with pytest.raises(SourceError) as gone:
        kept.read(str(path))
    assert gone.value.reason == "gone"
    kept.close()


def test_long_files_and_fifos_are_read_the_ordinary_way(tmp_path: Path) -> None:
    long = tmp_path / "long"
    long.write_bytes(b"7" * 5000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # with a writer there, a reader's open does not block
    os.write(writer, b"5\n")
    threading.Timer(0.2, os.close, (writer,)).start()  # then EOF for the reader
    kept = KeptFiles()
    assert kept.read(str(fifo)) == b"5\n"  # not seekable: read once the ordinary way...
    assert str(fifo) not in kept._fds  # ...and not kept
    assert kept.read(str(long)) == b"7" * 5000  # past one page: read to its end
    huge = tmp_path / "huge"
    huge.write_bytes(b"1" * (files.MAX_FILE_BYTES + 1))
    errors = FileErrors(str(tmp_path))
    with collecting(errors):
        assert kept.read(str(huge)) is None
    assert errors.counts == {("huge", "too_large"): 1}
    kept.close()


def test_the_source_closes_what_it_kept(tmp_path: Path) -> None:
    from exporter.simulator import Simulator

    simulator = Simulator(tmp_path / "sys", fleet="2xMI250X", seed=1)
    simulator.write_tree()
    before = open_fds()
    source = SysfsSource(tmp_path / "sys")
    devices = list(source.discover())
    for _ in range(3):
        for device in devices:
            source.read(device)
    held = open_fds() - before
    assert 4 <= held <= 16 * len(devices)  # gpu_metrics and the every-cycle text files of each GCD
    source.close()
    assert open_fds() - before <= 1  # (a pcie_bw reader thread may still be finishing its read)


def test_a_set_is_never_shared_by_two_reads_of_one_device(tmp_path: Path) -> None:
    from exporter.simulator import Simulator

    Simulator(tmp_path / "sys", fleet="1xMI250X", seed=2).write_tree()
    source = SysfsSource(tmp_path / "sys")
    device = next(iter(source.discover()))
    state = source._devices[device.pci_bus_id]
    source.read(device)
    kept = dict(state.kept._fds)
    assert kept
    state.in_use = True  # as if another thread's read of this device were running
    assert source.read(device).temperatures  # the second read goes the ordinary way and still reads everything
    assert state.kept._fds == kept and state.in_use  # ...without touching the held set
    state.in_use = False
    source.close()  # no read holds the set: closed at once
    assert not state.kept._fds


def test_a_set_closed_under_a_read_is_closed_when_that_read_is_done(tmp_path: Path) -> None:
    from exporter.simulator import Simulator

    Simulator(tmp_path / "sys", fleet="1xMI250X", seed=2).write_tree()
    source = SysfsSource(tmp_path / "sys")
    device = next(iter(source.discover()))
    state = source._devices[device.pci_bus_id]
    closed_during_read = []

    read = state.kept.read

    def read_then_close(path: str) -> bytes | None:
        data = read(path)
        if not closed_during_read:
            source.close()  # e.g. shutdown while this read runs
            closed_during_read.append(dict(state.kept._fds))
        return data

    state.kept.read = read_then_close  # type: ignore[method-assign]
    source.read(device)
    assert closed_during_read == [{os.path.join(device.device_dir, "gpu_metrics"): mock.ANY}], "left to the read"
    assert not state.kept._fds and not state.in_use
