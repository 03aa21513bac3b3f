"""process_open_fds counts the descriptors the process has open: one stat of /proc/self/fd on Linux
6.2+ (its size is the count), the listing without its own descriptor before that."""

from __future__ import annotations

import os
from collections.abc import Callable
from unittest import mock

from exporter.pipeline import process


def listed() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # without the listing's own descriptor


def while_still(count: Callable[[], int]) -> tuple[int, int]:
    """(listed, count()) at a moment no other thread of this process opened or closed a descriptor
    (a test runner's own threads may): the listing agrees before and after."""
    for _ in range(100):
        before, counted, after = listed(), count(), listed()
        if before == after:
            return before, counted
    raise AssertionError("descriptors never still for three calls")


def test_the_count_is_the_listing_without_its_own_descriptor() -> None:
    expected, counted = while_still(process._open_fds)
    assert counted == expected
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        expected, counted = while_still(process._open_fds)
        assert counted == expected
    finally:
        os.close(fd)
    expected, counted = while_still(lambda: int(process.read_process_stats().values["process_open_fds"]))
    assert counted == expected


def test_a_kernel_without_the_count_is_listed() -> None:
    real_stat = os.stat

    def old_kernel(path: str) -> os.stat_result:
        status = real_stat(path)
        return os.stat_result((*status[:6], 0, *status[7:])) if path == "/proc/self/fd" else status

    with mock.patch.object(process.os, "stat", old_kernel):
        expected, counted = while_still(process._open_fds)
    assert counted == expected
