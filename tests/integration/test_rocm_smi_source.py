"""The rocm_smi source against the real librocm_smi64 5.2.3 reading the simulator's tree.

The worker runs in a private mount namespace with the tree bound over /sys (the library hard-codes
/sys); this test process stays outside and drives RocmSmiSource like the poller does. Each test
uses a frozen tree (written once, then ticked only where the test says so).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.model import DeviceIdentity, Sample
from exporter.simulator import Simulator
from exporter.sources.base import SourceError
from exporter.sources.rocm_smi.source import RocmSmiSource, probe_rocm_smi
from exporter.sources.sysfs import SysfsSource
from tests.realtools import ROCM_SMI_LIBRARY, require_file, require_root, require_tool

pytestmark = pytest.mark.integration

FLEET = "1xMI210,1xMI250X"
# Binds $0 over /sys and $1 over /dev/shm (a folder the test can look into), then runs "$@".
_SHARED_SHM_SCRIPT = 'mount --bind "$0" /sys && mount --bind "$1" /dev/shm && shift && exec "$@"'


def worker_prefix(sys_dir: Path, shm_dir: Path) -> list[str]:
    require_root()
    require_file(ROCM_SMI_LIBRARY, "librocm_smi64 (Debian librocm-smi64-1)")
    unshare = require_tool("unshare")
    return [unshare, "-m", "--propagation", "private", "sh", "-c", _SHARED_SHM_SCRIPT, str(sys_dir), str(shm_dir)]


@dataclasses.dataclass
class Node:
    sim: Simulator
    sys_dir: Path
    shm_dir: Path

    @property
    def prefix(self) -> list[str]:
        return worker_prefix(self.sys_dir, self.shm_dir)

    def source(self, *, fallback: bool = True, **kwargs: object) -> RocmSmiSource:
        return RocmSmiSource(
            SysfsSource(self.sys_dir) if fallback else None,
            worker_prefix=self.prefix,
            shm_dir=str(self.shm_dir),
            **kwargs,  # type: ignore[arg-type]
        )


def make_node(tmp_path: Path, fleet: str, scenario: str = "training", elapsed: float = 40.0) -> Node:
    sim = Simulator(tmp_path / "sys", fleet, scenario, seed=5)
    sim.write_tree()
    sim.tick(elapsed)
    shm = tmp_path / "shm"
    shm.mkdir()
    return Node(sim, tmp_path / "sys", shm)


def give_mi300x_a_vddgfx_label(node: Node) -> None:
    """librocm_smi64 5.2.3 fails rsmi_init for the whole node when any GPU's hwmon lacks in0_label,
    and MI300X kernels have none (see test_faithful_mi300x_...). With the label, init succeeds and the
    library reaches the MI300X code paths that abort."""
    for card in sorted((node.sys_dir / "class" / "drm").glob("card[0-9]*")):
        for hwmon in (card / "device" / "hwmon").iterdir():
            label = hwmon / "in0_label"
            if not label.exists():
                label.write_text("vddgfx\n")


@pytest.fixture
def closing() -> Iterator[Callable[[RocmSmiSource], RocmSmiSource]]:
    sources: list[RocmSmiSource] = []

    def register(source: RocmSmiSource) -> RocmSmiSource:
        sources.append(source)
        return source

    yield register
    for source in sources:
        source.close()


def read_all(source: object, devices: list[DeviceIdentity]) -> dict[str, Sample | SourceError]:
    """Read every device in parallel threads, like the poller."""
    results: dict[str, Sample | SourceError] = {}

    def one(device: DeviceIdentity) -> None:
        try:
            results[device.pci_bus_id] = source.read(device)  # type: ignore[attr-defined]
        except SourceError as error:
            results[device.pci_bus_id] = error

    threads = [threading.Thread(target=one, args=(device,)) for device in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def read_until_pcie_bandwidth(source: object, devices: list[DeviceIdentity], want: set[str]) -> dict[str, Sample]:
    """pcie_bw is read by a background reader: read until those that have it report it."""
    deadline = time.monotonic() + 10
    while True:
        samples = read_all(source, devices)
        assert all(isinstance(s, Sample) for s in samples.values()), samples
        ready = {
            bdf for bdf, s in samples.items() if isinstance(s, Sample) and s.pcie_bandwidth_upper_bound_bytes_per_second
        }
        if want <= ready or time.monotonic() > deadline:
            return samples  # type: ignore[return-value]
        time.sleep(0.05)


def differences(expected: object, actual: object, skip: tuple[str, ...] = ("timestamp",)) -> dict[str, tuple]:
    out = {}
    for field in dataclasses.fields(expected):  # type: ignore[arg-type]
        if field.name in skip:
            continue
        a, b = getattr(expected, field.name), getattr(actual, field.name)
        if hasattr(a, "items"):
            a, b = dict(a), dict(b)
        if a != b:
            out[field.name] = (a, b)
    return out


def test_library_and_sysfs_sources_agree_with_the_simulator_truth(tmp_path: Path, closing) -> None:
    node = make_node(tmp_path, FLEET)
    truth = node.sim.truth()
    sysfs = SysfsSource(node.sys_dir)
    source = closing(node.source())
    sysfs_devices = list(sysfs.discover())
    devices = list(source.discover())
    assert devices == sysfs_devices == [t.identity for t in truth]
    with_pcie_bw = {t.identity.pci_bus_id for t in truth if t.sample.pcie_bandwidth_upper_bound_bytes_per_second}
    ours = read_until_pcie_bandwidth(source, devices, with_pcie_bw)
    theirs = read_until_pcie_bandwidth(sysfs, sysfs_devices, with_pcie_bw)
    sysfs.close()
    for device in truth:
        bdf = device.identity.pci_bus_id
        assert differences(device.sample, ours[bdf]) == {}, bdf
        assert differences(theirs[bdf], ours[bdf]) == {}, bdf
    # the library really served them: one worker, no restart, nothing re-routed
    assert source.supervisor.starts == 1 and source.supervisor.restarts == 0
    assert all(source.unsafe_calls(d.pci_bus_id) == {} for d in devices)


def test_library_alone_reads_what_it_provides_equal_to_the_truth(tmp_path: Path, closing) -> None:
    """No fallback: every value in the sample comes from librocm_smi64 (energy with the hardware
    tick, PCIe throughput from its own background reader)."""
    node = make_node(tmp_path, FLEET)
    truth = {t.identity.pci_bus_id: t for t in node.sim.truth()}
    source = closing(node.source(fallback=False))
    devices = list(source.discover())
    assert [d.pci_bus_id for d in devices] == sorted(truth)
    for device in devices:
        identity = truth[device.pci_bus_id].identity
        # what only the sysfs tree has: hwmon/device folders as seen outside the namespace, CPU links,
        # the FRU part number (product_number: no librocm_smi64 call reads it)
        skip = ("device_dir", "hwmon_dir", "xgmi_physical_id", "topology", "product_number")
        assert differences(identity, device, skip=skip) == {}
        assert device.product_number == ""
        assert device.topology == tuple(link for link in identity.topology if link.peer_pci_bus_id)
    with_pcie_bw = {bdf for bdf, t in truth.items() if t.sample.pcie_bandwidth_upper_bound_bytes_per_second}
    samples = read_until_pcie_bandwidth(source, devices, with_pcie_bw)
    for bdf, sample in samples.items():
        expected = truth[bdf].sample
        # 5.2.3 has no VCLK/DCLK tables and drops the throttle bits from gpu_metrics; it has no call
        # for PCIe AER counts nor for the bad-page threshold (those come from sysfs, the fallback);
        # convert.py takes the current clocks of its gpu_metrics, not the MI200 averages (the fallback's)
        skip = (
            "timestamp",
            "clocks_average_hertz",
            "clocks_max_hertz",
            "clocks_min_hertz",
            "throttle",
            "pcie_aer_errors",
            "ras_bad_page_threshold",
        )
        assert differences(expected, sample, skip=skip) == {}, bdf
        for name in ("clocks_max_hertz", "clocks_min_hertz"):
            assert dict(getattr(sample, name)) == {
                k: v for k, v in getattr(expected, name).items() if k in ("gfx", "memory", "fabric", "soc")
            }, name
        if expected.energy_joules is not None:
            assert sample.energy_joules == pytest.approx(expected.energy_joules, rel=1e-12)


def test_mi300x_aborts_cost_one_restart_and_are_served_through_sysfs(tmp_path: Path, closing) -> None:
    # idle: the MI300X's clocks are in deep sleep, which its pp_dpm tables show as an "S:" line
    node = make_node(tmp_path, "1xMI210,1xMI250X,1xMI300X:gpu_metrics=1.5", scenario="idle")
    give_mi300x_a_vddgfx_label(node)
    truth = node.sim.truth()
    mi300x = truth[-1].identity.pci_bus_id
    source = closing(node.source())
    devices = list(source.discover())
    assert devices == [t.identity for t in truth]
    # gpu_metrics content 5 would abort: the worker never asks; that is known before any read
    assert set(source.unsafe_calls(mi300x)) == {"gpu_metrics", "energy"}
    first = read_all(source, devices)
    # The library's pp_dpm parser asserts on the "S:" line (get_multiplier_from_str) and aborts in
    # rsmi_dev_gpu_clk_freq_get. The worker died, the call was blamed, the read retried.
    assert all(isinstance(s, Sample) for s in first.values()), first
    assert source.supervisor.restarts >= 1
    assert "aborted in clock:gfx" in source.unsafe_calls(mi300x)["clock:gfx"]
    restarts = source.supervisor.restarts
    with_pcie_bw = {t.identity.pci_bus_id for t in truth if t.sample.pcie_bandwidth_upper_bound_bytes_per_second}
    samples = read_until_pcie_bandwidth(source, devices, with_pcie_bw)
    assert source.supervisor.restarts == restarts  # blamed once, skipped from then on
    for device in truth:
        assert differences(device.sample, samples[device.identity.pci_bus_id]) == {}, device.identity.pci_bus_id


def test_unguarded_gpu_metrics_abort_is_blamed_on_its_call(tmp_path: Path, closing) -> None:
    """Without the header check the library meets the v1.5 table and aborts; the breadcrumbs and
    faulthandler's report name the call, and the next reads skip it."""
    node = make_node(tmp_path, "1xMI210,1xMI300X:gpu_metrics=1.5")
    give_mi300x_a_vddgfx_label(node)
    truth = node.sim.truth()
    mi300x = truth[-1].identity.pci_bus_id
    source = closing(node.source(guard_gpu_metrics=False))
    devices = list(source.discover())
    assert source.unsafe_calls(mi300x) == {}
    deadline = time.monotonic() + 20
    while not {"gpu_metrics", "energy"} <= set(source.unsafe_calls(mi300x)) and time.monotonic() < deadline:
        read_all(source, devices)
    unsafe = source.unsafe_calls(mi300x)
    # The library reads past the table it does not know, so how it dies depends on what lies
    # beyond: usually its assert aborts, sometimes (seen under CI) the energy read segfaults
    # first. Either way the crash must be named and blamed on the call that made it.
    crashed = r"librocm_smi64 (aborted|signal:SIG[A-Z]+) in {} \(worker \d+\)"
    assert re.fullmatch(crashed.format("gpu_metrics"), unsafe["gpu_metrics"]), unsafe
    assert re.fullmatch(crashed.format("energy"), unsafe["energy"]), unsafe
    assert (source.stats().worker_restarts or 0) >= 1  # what amdgpu_exporter_worker_restarts shows
    assert "gpu_metrics" not in source.unsafe_calls(truth[0].identity.pci_bus_id)  # the MI210 is innocent
    samples = read_all(source, devices)
    assert (
        differences(
            truth[-1].sample,
            samples[mi300x],
            skip=("timestamp", "pcie_bandwidth_bytes_per_second", "pcie_bandwidth_upper_bound_bytes_per_second"),
        )
        == {}
    )


def test_faithful_mi300x_fails_rsmi_init_and_is_served_through_sysfs(tmp_path: Path, closing) -> None:
    node = make_node(tmp_path, "1xMI210,1xMI300X:gpu_metrics=1.5")
    ok, reason = probe_rocm_smi(str(node.sys_dir), worker_prefix=node.prefix)
    assert not ok
    assert "in0_label" in reason and "card1" in reason
    truth = node.sim.truth()
    source = closing(node.source(restart_backoff_max=0.2))
    devices = list(source.discover())
    assert devices == [t.identity for t in truth]
    for _ in range(3):
        samples = read_all(source, devices)
        time.sleep(0.25)
    assert all(isinstance(s, Sample) for s in samples.values())
    assert differences(truth[-1].sample, samples[truth[-1].identity.pci_bus_id], skip=("timestamp",)) == {}
    assert source.supervisor.starts >= 2 and source.supervisor.restarts == source.supervisor.starts - 1


def test_probe_passes_on_a_good_tree_and_refuses_another_root(tmp_path: Path) -> None:
    node = make_node(tmp_path, FLEET)
    ok, reason = probe_rocm_smi(str(node.sys_dir), worker_prefix=node.prefix)
    assert ok, reason
    assert "3 GPUs, self-check passed" in reason
    ok, reason = probe_rocm_smi(str(node.sys_dir))
    assert not ok and "reads /sys only" in reason


def _children() -> list[int]:
    """Live processes whose parent is this test process."""
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            found.append(int(pid))
    return found


@pytest.mark.parametrize("hung_file", ["hwmon/power1_average", "gpu_metrics"])
def test_a_hung_file_takes_down_one_gcd_only_and_it_comes_back(tmp_path: Path, closing, hung_file: str) -> None:
    node = make_node(tmp_path, FLEET, elapsed=5.0)
    source = closing(node.source(call_timeout=0.25, hang_backoff_initial=0.3, hang_backoff_max=1.0))
    devices = list(source.discover())
    assert all(isinstance(s, Sample) for s in read_all(source, devices).values())
    hung = devices[2]  # the MI250X's second die
    folder = Path(hung.hwmon_dir) if hung_file.startswith("hwmon/") else Path(hung.device_dir)
    path = folder / hung_file.removeprefix("hwmon/")
    content = path.read_bytes()

    def keep_it_hung() -> None:
        # A FIFO with no writer blocks its reader like a hung GPU. The simulator's tick replaces
        # files whose content changed, so the FIFO is put back after each tick.
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            path.unlink()
            os.mkfifo(path)

    keep_it_hung()
    last_timestamp = {d.pci_bus_id: 0.0 for d in devices}
    first_energy = None
    down_since: int | None = None
    threads = processes = 0
    for cycle in range(50):
        node.sim.tick(6.0 + cycle)
        keep_it_hung()
        results = read_all(source, devices)
        for device in devices[:2]:
            sample = results[device.pci_bus_id]
            assert isinstance(sample, Sample), (cycle, sample)
            assert sample.timestamp > last_timestamp[device.pci_bus_id]
            last_timestamp[device.pci_bus_id] = sample.timestamp
        energy = results[devices[0].pci_bus_id].energy_joules  # type: ignore[union-attr]
        first_energy = energy if first_energy is None else first_energy
        outcome = results[hung.pci_bus_id]
        if isinstance(outcome, SourceError):
            assert outcome.reason in ("timeout", "hung"), outcome
            down_since = cycle if down_since is None else down_since
        if cycle == 10:
            threads, processes = threading.active_count(), len(_children())
        time.sleep(0.1)  # the poller's pace, at a short interval
    assert down_since is not None and down_since <= 1
    assert energy is not None and first_energy is not None and energy > first_energy  # the others kept updating
    assert threading.active_count() == threads  # no thread leak across the cycles
    assert len(_children()) == processes == 1  # one worker; every killed one was reaped
    assert source.supervisor.restarts >= 2  # stuck calls were cleared by restarts, backing off
    path.unlink()
    path.write_bytes(content)  # the GPU answers again
    deadline = time.monotonic() + 10
    while True:
        outcome = read_all(source, [hung])[hung.pci_bus_id]
        if isinstance(outcome, Sample) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert isinstance(outcome, Sample), outcome
    # Killed workers left card mutexes owned by their dead threads; they were repaired, which is
    # why each new worker's rsmi_init did not take the card's mutex for good: the read above answered.
