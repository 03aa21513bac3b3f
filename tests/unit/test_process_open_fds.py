"""process_open_fds counts the descriptors the process has open: one stat of /proc/self/fd on Linux
6.2+ (its size is the count), the listing without its own descriptor before that.

Compared in a fresh interpreter: the kernel's count also holds a descriptor another thread is
still opening (a thread stuck opening a pipe, as some tests leave behind), which no listing shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    code = (
        "import json, os\n"
        "from exporter.pipeline import process\n"
        "listed = lambda: len(os.listdir('/proc/self/fd')) - 1\n"
        "counts = [(process._open_fds(), listed())]\n"
        "fd = os.open('/dev/null', os.O_RDONLY)\n"
        "counts.append((process._open_fds(), listed()))\n"
        "os.close(fd)\n"
        "counts.append((int(process.read_process_stats().values['process_open_fds']), listed()))\n"
        "print(json.dumps(counts))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    first, opened, stats = json.loads(out.stdout)
    assert first[0] == first[1] and opened[0] == opened[1] == first[0] + 1 and stats[0] == stats[1] == first[0]


def test_a_kernel_without_the_count_is_listed() -> None:
    real_stat = os.stat

    def old_kernel(path: str) -> os.stat_result:
        status = real_stat(path)
        return os.stat_result((*status[:6], 0, *status[7:])) if path == "/proc/self/fd" else status

    with mock.patch.object(process.os, "stat", old_kernel):
        expected, counted = while_still(process._open_fds)
    assert counted == expected
