"""The daemon with --source rocm-smi (real librocm_smi64 5.2.3 in its supervised worker), run in a
private mount namespace over the simulator's tree, scraped over HTTP like Prometheus would.

- equality: its /metrics equal a --source sysfs daemon's over the same frozen tree, metric by
  metric (only the exporter's own series and wall-clock sample times may differ);
- MI300X: the library aborts on it, the daemon stays up, every device answers, restarts count;
- hung file: a FIFO in place of one GCD's power file takes that GCD down within two cycles, the
  others keep updating, nothing leaks over 50 cycles, and it comes back once the file does.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.simulator import Simulator
from tests.harness import CYCLES, EXPORTER, Series, poll_cycles, scrape, start_listening, stop, value, wait_for_series
from tests.realtools import ROCM_SMI_LIBRARY, namespace_argv, require_file

pytestmark = pytest.mark.integration

# Series that describe the exporter process or a wall-clock instant, not the GPUs.
NOT_GPU_VALUES = ("amdgpu_exporter_", "amdgpu_sample_timestamp_seconds", "process_")  # the daemon, not a GPU


def gpu_values(series: Series) -> Series:
    return {key: value for key, value in series.items() if not key[0].startswith(NOT_GPU_VALUES)}


def frozen_tree(tmp_path: Path, fleet: str, scenario: str, elapsed: float) -> Path:
    sim = Simulator(tmp_path / "sys", fleet, scenario, seed=11)
    sim.write_tree()
    sim.tick(elapsed)
    return tmp_path / "sys"


def give_mi300x_a_vddgfx_label(sys_dir: Path) -> None:
    """Without in0_label on every GPU, librocm_smi64 5.2.3 fails rsmi_init for the whole node (see
    test_rocm_smi_source); with it, the library reaches the MI300X code paths that abort."""
    for hwmon in sys_dir.glob("class/drm/card[0-9]*/device/hwmon/hwmon*"):
        if not (hwmon / "in0_label").exists():
            (hwmon / "in0_label").write_text("vddgfx\n")


@contextmanager
def daemon(sys_dir: Path, source: str, *extra: str) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """A daemon over sys_dir: rocm-smi inside a namespace with sys_dir as /sys, sysfs outside; its
    JSON log beside the tree."""

    def argv(port: int) -> list[str]:
        common = [f"--web.listen-address=127.0.0.1:{port}", "--interval=200ms", "--log.format=json", *extra]
        if source == "rocm-smi":
            return namespace_argv(sys_dir, [EXPORTER, "--source=rocm-smi", "--path.sysfs=/sys", *common])
        return [EXPORTER, "--source=sysfs", f"--path.sysfs={sys_dir}", *common]

    if source == "rocm-smi":
        require_file(ROCM_SMI_LIBRARY, "librocm_smi64 (Debian librocm-smi64-1)")
    # unshare and sh exec the daemon: the process that listens is the one started
    process, port = start_listening(
        argv, log_for=lambda port: sys_dir.parent / f"{source}-{port}.log", stdout=subprocess.DEVNULL
    )
    try:
        yield port, process
    finally:
        stop(process)


def wait_for(port: int, ready: Callable[[Series], bool], process: subprocess.Popen[str] | None = None) -> Series:
    return wait_for_series(port, ready, "the daemon settled", process=process)


# Measured (MI300X, gpu_metrics) and the pcie_bw upper bound (MI2xx, background reader).
BANDWIDTH_FAMILIES = ("amdgpu_pcie_bandwidth_bytes_per_second", "amdgpu_pcie_bandwidth_upper_bound_bytes_per_second")


def settled(gpus: int, with_pcie_bw: int) -> Callable[[Series], bool]:
    """Every GPU up, the background pcie_bw reader's figures in, and the fast sampler's windows
    (they appear once it has sampled every GPU: under load one daemon can get there later)."""

    def ready(series: Series) -> bool:
        up = sum(1 for (name, _), value in series.items() if name == "amdgpu_up" and value == 1)
        bw = sum(1 for (name, _), _v in series.items() if name in BANDWIDTH_FAMILIES)
        windowed = {dict(labels).get("gpu") for (name, labels) in series if name == "amdgpu_temperature_window_celsius"}
        return up == gpus and bw >= with_pcie_bw and len(windowed) == gpus

    return ready


def test_rocm_smi_daemon_metrics_equal_the_sysfs_daemons(tmp_path: Path) -> None:
    sys_dir = frozen_tree(tmp_path, "1xMI210,1xMI250X", "training", 23.0)
    with daemon(sys_dir, "rocm-smi") as (rocm_port, _), daemon(sys_dir, "sysfs") as (sysfs_port, _):
        ours = wait_for(rocm_port, settled(3, 3))
        theirs = wait_for(sysfs_port, settled(3, 3))
    assert value(ours, "amdgpu_exporter_build_info", source="rocm-smi", source_reason="flag", version="0.1.0")
    assert value(ours, "amdgpu_exporter_worker_restarts_total") == 0
    ours_gpu, theirs_gpu = gpu_values(ours), gpu_values(theirs)
    assert len(ours_gpu) > 250  # every family of the contract that the tree supplies, for 3 GCDs
    only_ours = sorted(set(ours_gpu) - set(theirs_gpu))
    only_theirs = sorted(set(theirs_gpu) - set(ours_gpu))
    unequal = {
        key: (ours_gpu[key], theirs_gpu[key])
        for key in ours_gpu.keys() & theirs_gpu.keys()
        # Window means are sums over however many samples each daemon holds: equal up to rounding.
        if not math.isclose(ours_gpu[key], theirs_gpu[key], rel_tol=1e-9, abs_tol=1e-12)
    }
    assert (only_ours, only_theirs, unequal) == ([], [], {})


def test_mi300x_node_stays_up_counts_restarts_and_matches_sysfs(tmp_path: Path) -> None:
    # idle: the MI300X's clocks sleep, its pp_dpm tables gain an "S:" line, the library aborts on it
    sys_dir = frozen_tree(tmp_path, "1xMI210,1xMI250X,1xMI300X:gpu_metrics=1.5", "idle", 5.0)
    give_mi300x_a_vddgfx_label(sys_dir)
    with daemon(sys_dir, "rocm-smi") as (rocm_port, process), daemon(sys_dir, "sysfs") as (sysfs_port, _):
        # 4 bandwidth series: three from the background pcie_bw readers (MI2xx), one from gpu_metrics (MI300X)
        ours = wait_for(rocm_port, settled(4, 4))
        theirs = wait_for(sysfs_port, settled(4, 4))
        assert process.poll() is None
    for gpu in "0123":
        assert value(ours, "amdgpu_up", gpu=gpu) == 1, gpu
    restarts = value(ours, "amdgpu_exporter_worker_restarts_total")
    assert restarts is not None and restarts >= 1
    assert gpu_values(ours) == gpu_values(theirs)


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    if handle.read().rsplit(")", 1)[1].split()[1] == str(pid):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_hung_power_file_takes_one_gcd_down_and_it_comes_back(tmp_path: Path) -> None:
    sys_dir = frozen_tree(tmp_path, "1xMI210,1xMI250X", "training", 23.0)
    hung_gpu = "2"
    power_file = next(sys_dir.glob("class/drm/card2/device/hwmon/hwmon*/power1_average"))
    content = power_file.read_bytes()
    with daemon(sys_dir, "rocm-smi") as (port, process):
        # Past start-up (first slow refresh, worker warm-up) so the count below is steady-state.
        ready = settled(3, 0)
        before = wait_for(port, lambda s: ready(s) and (value(s, CYCLES) or 0) >= 10)
        power_file.unlink()
        os.mkfifo(power_file)  # reading a FIFO with no writer blocks like a hung GPU
        # Counted from the first cycle published after the FIFO exists: the one running then may
        # have read the power file already, the next one cannot have.
        cycles = value(scrape(port), CYCLES) or 0
        went_down_at: float | None = None
        up_at_two_cycles: float | None = None
        first_stamps = {gpu: value(before, "amdgpu_sample_timestamp_seconds", gpu=gpu) or 0.0 for gpu in "01"}
        threads = children = None
        seen = cycles
        while seen < cycles + 30:
            series = scrape(port)
            seen = value(series, CYCLES) or 0
            if went_down_at is None and value(series, "amdgpu_up", gpu=hung_gpu) == 0:
                went_down_at = seen
            # A scrape can miss cycles (after the long hung cycle the poller catches up at once), so
            # "down within two cycles" is checked on the first scrape that shows cycle +2 or later.
            if up_at_two_cycles is None and seen >= cycles + 2:
                up_at_two_cycles = value(series, "amdgpu_up", gpu=hung_gpu)
            for gpu in "01":
                assert value(series, "amdgpu_up", gpu=gpu) == 1, (gpu, seen)
            if threads is None and seen >= cycles + 10:
                threads, children = _threads(process.pid), len(_children(process.pid))
            time.sleep(0.2)
        assert went_down_at is not None and up_at_two_cycles == 0
        # The others kept being read all along: once another cycle is published, their samples are
        # newer than the end of the last cycle the loop saw (both times are the daemon's own).
        count = CYCLES
        after = wait_for(port, lambda s: (value(s, count) or 0) > (value(series, count) or 0))
        last_end = value(series, "amdgpu_exporter_last_poll_timestamp_seconds") or 0.0
        for gpu in "01":
            sample_time = value(after, "amdgpu_sample_timestamp_seconds", gpu=gpu) or 0.0
            assert sample_time > last_end > first_stamps[gpu]
        assert value(after, "amdgpu_up", gpu=hung_gpu) == 0
        # No leak: after 30 cycles the daemon has the child processes it had after 10 and at most two
        # more threads (allowing a moment for a worker restart in progress, whose old reader thread
        # is finishing, and for executor pools that grow lazily under load). A read re-issued while
        # stuck would add a thread per cycle: 20 here.
        assert threads is not None
        settle = poll_cycles(port) + 10  # counted in the daemon's cycles, not in seconds
        while (_threads(process.pid) > threads or len(_children(process.pid)) != children) and poll_cycles(
            port
        ) < settle:
            time.sleep(0.05)
        assert _threads(process.pid) <= threads + 2
        assert len(_children(process.pid)) == children == 1  # one worker; the killed ones were reaped
        restarts = value(after, "amdgpu_exporter_worker_restarts_total")
        assert restarts is not None and restarts >= 1
        power_file.unlink()
        power_file.write_bytes(content)
        back = wait_for(port, lambda s: value(s, "amdgpu_up", gpu=hung_gpu) == 1, process)
        assert value(back, "amdgpu_up", gpu=hung_gpu) == 1
        assert process.poll() is None
