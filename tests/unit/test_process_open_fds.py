"""process_open_fds counts the descriptors the process has open: one stat of /proc/self/fd on Linux
6.2+ (its size is the count), the listing without its own descriptor before that."""

from __future__ import annotations

import os
from unittest import mock

from exporter.pipeline import process


def listed() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # without the listing's own descriptor


def test_the_count_is_the_listing_without_its_own_descriptor() -> None:
    before = process._open_fds()
    assert before == listed()
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        assert process._open_fds() == before + 1
    finally:
        os.close(fd)
    assert process.read_process_stats().values["process_open_fds"] == float(before)


def test_a_kernel_without_the_count_is_listed() -> None:
    real_stat = os.stat

    def old_kernel(path: str) -> os.stat_result:
        status = real_stat(path)
        return os.stat_result((*status[:6], 0, *status[7:])) if path == "/proc/self/fd" else status

    with mock.patch.object(process.os, "stat", old_kernel):
        assert process._open_fds() == listed()
