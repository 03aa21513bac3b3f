"""The sampler keeps each device's gpu_metrics open and re-reads it from offset 0 (os.pread).

What must hold: a table rewritten in place is read anew by the same descriptor; a table replaced by
rename (as the simulator writes) is opened again; a failed read reopens at the next cycle; a device
no longer tracked, and every device at stop(), has its descriptor closed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from exporter.pipeline.sampler import Sampler
from tests.unit.test_sampler import make_devices, v1_3_table


def open_descriptors_of(path: str) -> int:
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            continue
    return count


def junction_maxima(sampler: Sampler) -> list[float]:
    return [w.stats[("temperature", "junction")].maximum for w in sampler.windows().devices]


def test_one_descriptor_per_device_reads_a_table_rewritten_in_place(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 2)
    table = os.path.join(devices[0][1].device_dir, "gpu_metrics")
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    sampler.sample_once()
    assert open_descriptors_of(table) == 1
    with open(table, "r+b") as handle:  # same inode, new content: what a sysfs show() does
        handle.write(v1_3_table(90, 300, 65536 * 1000, 10**9))
    sampler.sample_once()
    sampler.sample_once()
    assert open_descriptors_of(table) == 1  # kept, not reopened
    assert junction_maxima(sampler) == [90.0, 61.0]
    sampler.stop()
    assert open_descriptors_of(table) == 0


def test_a_table_replaced_by_rename_is_opened_again(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 1)
    table = os.path.join(devices[0][1].device_dir, "gpu_metrics")
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    sampler.sample_once()
    replacement = table + ".new"
    Path(replacement).write_bytes(v1_3_table(95, 300, 65536 * 1000, 10**9))
    os.replace(replacement, table)
    sampler.sample_once()
    assert junction_maxima(sampler) == [95.0]
    assert open_descriptors_of(table) == 1
    sampler.stop()


def test_a_failed_read_is_counted_and_the_next_cycle_reads_again(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 1)
    table = Path(devices[0][1].device_dir, "gpu_metrics")
    content = table.read_bytes()
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    sampler.sample_once()
    table.unlink()
    sampler.sample_once()  # the kept descriptor names a deleted file: the path is opened again, and is gone
    table.write_bytes(content)
    sampler.sample_once()
    stats = sampler.windows().stats
    assert dict(stats.read_errors) == {(0, "gone"): 1}
    assert dict(stats.samples) == {0: 2}
    sampler.stop()


def test_a_device_no_longer_tracked_has_its_descriptor_closed(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 2)
    gone = os.path.join(devices[1][1].device_dir, "gpu_metrics")
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    sampler.sample_once()
    assert open_descriptors_of(gone) == 1
    sampler.track(devices[:1])
    sampler.sample_once()  # closed by the loop, never under a read
    assert open_descriptors_of(gone) == 0
    sampler.stop()


def test_a_table_that_is_not_a_regular_file_is_read_the_ordinary_way_and_not_kept(tmp_path: Path) -> None:
    devices = make_devices(tmp_path, 1)
    table = os.path.join(devices[0][1].device_dir, "gpu_metrics")
    os.unlink(table)
    os.mkfifo(table)
    content = v1_3_table(70, 300, 65536 * 1000, 10**9)

    def write_once() -> None:
        with open(table, "wb") as pipe:  # blocks until the sampler opens it
            pipe.write(content)

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    sampler = Sampler(interval=0.1, window=5.0)
    sampler.track(devices)
    sampler.sample_once()
    writer.join(10)
    assert junction_maxima(sampler) == [70.0]
    assert open_descriptors_of(table) == 0  # a pipe is not kept: pread cannot read it from offset 0
    sampler.stop()
