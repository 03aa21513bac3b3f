"""A node's worst day, through the real daemon: GCDs that come late, fall off the bus and come back,
hang during repeated rediscovery or at start-up, hold garbage in every kind of file, a log reader
that goes away. Each case runs the `amdgpu-exporter` process on a simulated tree and reads only
what it serves (/metrics, /readyz, /api/v1/devices) and its exit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from exporter.simulator import Simulator
from tests.harness import (
    BROKEN_RUN,
    CYCLES,
    EXPORTER,
    Series,
    poll_cycles,
    scrape,
    start_exporter,
    stop,
    value,
    wait_for_cycles,
    wait_for_series,
    wait_ready,
    wait_until,
)
from tests.realtools import run_in_sysfs_namespace

pytestmark = pytest.mark.integration


def gpu_of(series: Series) -> dict[str, str]:
    """pci_bus_id -> gpu label, from amdgpu_device_info."""
    return {dict(k)["pci_bus_id"]: dict(k)["gpu"] for name, k in series if name == "amdgpu_device_info"}


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def terminate(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM; its exit code. A daemon that waited for a read stuck in a named pipe would never exit:
    the wait's bound only ends such a broken run, it does not time the stop."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(BROKEN_RUN)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise AssertionError(f"still running {BROKEN_RUN} s after SIGTERM") from None


def hang(path: Path) -> bytes:
    """A named pipe in place of `path`: every read blocks, as on a hung SMU. Returns the old content."""
    content = path.read_bytes()
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo)
    os.replace(fifo, path)
    return content


def unhang(path: Path, content: bytes) -> None:
    """Release the readers blocked in the pipe, then put the file back."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_bytes(content)
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # the blocked open()s return; their read sees EOF
    os.close(fd)
    os.replace(temp, path)


@contextmanager
def exporter(*args: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    proc, port = start_exporter(*args)
    try:
        yield proc, port
    finally:
        stop(proc)


def tree(tmp_path: Path, fleet: str = "2xMI250X", seed: int = 3) -> tuple[Path, Simulator]:
    root = tmp_path / "sys"
    simulator = Simulator(root, fleet=fleet, scenario="training", seed=seed)
    simulator.write_tree()
    simulator.tick(5.0)
    return root, simulator


def card_link(root: Path, card: str) -> Path:
    return root / "class" / "drm" / card


# --- identity --------------------------------------------------------------------------------------------


def test_late_gcd_gets_the_next_index_and_a_gcd_off_the_bus_keeps_its_own(tmp_path: Path) -> None:
    root, simulator = tree(tmp_path)
    truth = {t.identity.card: t.identity for t in simulator.truth()}
    # card1's driver probe is late: it is not in class/drm at start-up
    late = card_link(root, "card1")
    target = os.readlink(late)
    late.unlink()
    with exporter(f"--path.sysfs={root}", "--interval=100ms", "--discovery-interval=200ms") as (proc, port):
        wait_ready(port, proc)
        first = gpu_of(scrape(port))
        expected = {truth[c].pci_bus_id: str(i) for i, c in enumerate(("card0", "card2", "card3"))}
        assert first == expected
        os.symlink(target, late)
        series = wait_for_series(port, lambda s: len(gpu_of(s)) == 4, what="the late GCD is found")
        assert gpu_of(series) == {**expected, truth["card1"].pci_bus_id: "3"}, "nobody moved; the late one is 3"
        series = wait_for_series(port, lambda s: value(s, "amdgpu_up", gpu="3") == 1, what="the late GCD is read")

        # card2's GCD falls off the bus: its PCI directory vanishes
        device_dir = Path(truth["card2"].device_dir)
        away = tmp_path / "away"
        shutil.move(device_dir, away)
        gone_gpu = expected[truth["card2"].pci_bus_id]
        series = wait_for_series(
            port, lambda s: value(s, "amdgpu_device_present", gpu=gone_gpu) == 0, what="the GCD is marked gone"
        )
        assert value(series, "amdgpu_up", gpu=gone_gpu) == 0
        assert value(series, "amdgpu_device_down_info", gpu=gone_gpu, reason="gone") == 1
        assert gpu_of(series)[truth["card2"].pci_bus_id] == gone_gpu, "a gone GCD keeps its index and identity"
        assert value(series, "amdgpu_temperature_celsius", gpu=gone_gpu, sensor="junction") is None
        others = [g for g in ("0", "1", "2", "3") if g != gone_gpu]
        assert all(value(series, "amdgpu_up", gpu=g) == 1 for g in others)

        # and comes back: the same index, up again
        shutil.move(away, device_dir)
        series = wait_for_series(port, lambda s: value(s, "amdgpu_up", gpu=gone_gpu) == 1, what="the GCD is back")
        assert value(series, "amdgpu_device_present", gpu=gone_gpu) == 1
        assert gpu_of(series) == {**expected, truth["card1"].pci_bus_id: "3"}
        assert len([k for k in series if k[0] == "amdgpu_up"]) == 4, "no phantom device"
        assert terminate(proc) == 0


def test_a_bad_unique_id_read_leaves_no_phantom(tmp_path: Path) -> None:
    root, simulator = tree(tmp_path)
    card1 = simulator.truth()[1].identity
    unique_id = Path(card1.device_dir) / "unique_id"
    with exporter(f"--path.sysfs={root}", "--interval=100ms", "--discovery-interval=100ms") as (proc, port):
        wait_ready(port, proc)
        before = gpu_of(scrape(port))
        original = unique_id.read_bytes()
        # a bad read of unique_id during the rediscoveries (an empty one is the kernel's "no id": a VF's)
        unique_id.write_bytes(b"0x\xff\n")
        bad_gpu = before[card1.pci_bus_id]
        bad = wait_for_series(
            port,
            lambda s: bool(
                value(s, "amdgpu_exporter_file_errors_total", gpu=bad_gpu, file="unique_id", reason="parse")
            ),
            what="the bad unique_id read by a rediscovery",
        )
        assert gpu_of(bad) == before
        unique_id.write_bytes(original)
        done = value(bad, "amdgpu_exporter_discoveries_total", result="ok") or 0
        # two more rediscoveries, the second begun after the good content is back
        series = wait_for_series(
            port,
            lambda s: (value(s, "amdgpu_exporter_discoveries_total", result="ok") or 0) >= done + 2,
            what="two more rediscoveries",
        )
        assert gpu_of(series) == before
        assert len([k for k in series if k[0] == "amdgpu_up"]) == 4
        assert all(v == 1 for k, v in series.items() if k[0] == "amdgpu_up")


def test_cold_start_indices_follow_rocm_smi(tmp_path: Path) -> None:
    """rocm-smi numbers GPU[N] in card order; a node whose cards are not in PCI order shows it."""
    from tests.realtools import require_tool

    tool = require_tool("rocm-smi")
    root, _ = tree(tmp_path)
    drm = root / "class" / "drm"
    first, last = os.readlink(drm / "card0"), os.readlink(drm / "card3")
    (drm / "card0").unlink()
    (drm / "card3").unlink()
    os.symlink(last, drm / "card0")
    os.symlink(first, drm / "card3")
    result = run_in_sysfs_namespace(root, [tool, "--showbus", "--json"], timeout=60)
    report = json.loads(result.stdout[result.stdout.index("{") :])
    smi = {card["PCI Bus"].lower(): name.removeprefix("card") for name, card in report.items()}
    assert len(smi) == 4 and smi != {bdf: str(i) for i, bdf in enumerate(sorted(smi))}, "not PCI order"
    with exporter(f"--path.sysfs={root}", "--interval=100ms") as (proc, port):
        wait_ready(port, proc)
        assert gpu_of(scrape(port)) == smi


# --- hung GCDs -----------------------------------------------------------------------------------------


def test_hung_gcd_during_repeated_rediscovery(tmp_path: Path) -> None:
    root, simulator = tree(tmp_path)
    hung = simulator.truth()[1].identity
    with exporter(f"--path.sysfs={root}", "--interval=100ms", "--read-timeout=300ms", "--discovery-interval=10ms") as (
        proc,
        port,
    ):
        wait_ready(port, proc)
        hung_gpu = gpu_of(scrape(port))[hung.pci_bus_id]
        content = hang(Path(hung.device_dir) / "gpu_metrics")
        series = wait_for_series(
            port, lambda s: value(s, "amdgpu_up", gpu=hung_gpu) == 0, what="the hung GCD goes down"
        )
        start = value(series, "amdgpu_exporter_discoveries_total", result="ok") or 0
        timeouts_at_down = value(series, "amdgpu_exporter_read_timeouts_total", gpu=hung_gpu)
        assert timeouts_at_down is not None and timeouts_at_down >= 1, "the hung read timed out"
        warm, most_threads = 0, 0
        while (done := (value(series, "amdgpu_exporter_discoveries_total", result="ok") or 0) - start) < 30:
            previous, series = series, scrape(port)
            # The thread pools start their threads as they are needed, up to a size of their own:
            # taken after ten rediscoveries with the GCD hung, the count is the pools' working size.
            if done < 10:
                warm = threads_of(proc.pid)
            else:
                most_threads = max(most_threads, threads_of(proc.pid))
            # Healthy GCDs are read in every cycle: once a cycle has been published since the last
            # scrape, each of their samples is newer than the end of the cycle that scrape showed
            # (both times are the daemon's; a sample held up behind the hung GCD would be older).
            cycles_since = value(series, CYCLES) != value(previous, CYCLES)
            last_end = value(previous, "amdgpu_exporter_last_poll_timestamp_seconds") or 0
            for bdf, gpu in gpu_of(series).items():
                if bdf != hung.pci_bus_id:
                    assert value(series, "amdgpu_up", gpu=gpu) == 1
                    sampled = value(series, "amdgpu_sample_timestamp_seconds", gpu=gpu) or 0
                    assert not cycles_since or sampled > last_end, f"gpu {gpu}: a stale sample"
            assert value(series, "amdgpu_up", gpu=hung_gpu) == 0
            assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            assert proc.poll() is None
            time.sleep(0.05)
        # No thread left behind per rediscovery: twenty more of them here.
        assert most_threads <= warm + 2, (warm, most_threads)
        # Counted, not timed: a healthy read that missed the 300 ms deadline on a loaded machine before the
        # hang may have counted one too; what matters is that the stuck read adds none per rediscovery.
        assert value(series, "amdgpu_exporter_read_timeouts_total", gpu=hung_gpu) == timeouts_at_down, (
            "the stuck read is not re-issued"
        )
        # back without a restart
        unhang(Path(hung.device_dir) / "gpu_metrics", content)
        wait_for_series(port, lambda s: value(s, "amdgpu_up", gpu=hung_gpu) == 1, what="the GCD recovers")
        # hang it again and stop the daemon while it is stuck
        hang(Path(hung.device_dir) / "gpu_metrics")
        wait_for_series(port, lambda s: value(s, "amdgpu_up", gpu=hung_gpu) == 0, what="hung again")
        assert terminate(proc) == 0, "stopped although a read is stuck for good"


def test_hung_gcd_at_start_up_is_served_as_down(tmp_path: Path) -> None:
    root, simulator = tree(tmp_path)
    hung = simulator.truth()[2].identity
    hang(Path(hung.device_dir) / "gpu_metrics")
    # The read stays stuck for good: a start-up that waited for it would never be ready.
    with exporter(f"--path.sysfs={root}", "--interval=100ms", "--read-timeout=500ms") as (proc, port):
        wait_ready(port, proc)
        series = scrape(port)
        ups = {dict(k[1])["gpu"]: v for k, v in series.items() if k[0] == "amdgpu_up"}
        assert sorted(ups.values()) == [0, 1, 1, 1]
        (down,) = [g for g, v in ups.items() if v == 0]
        assert value(series, "amdgpu_device_down_info", gpu=down, reason="identify_timeout") == 1
        devices = httpx.get(f"http://127.0.0.1:{port}/api/v1/devices", timeout=5).json()["devices"]
        assert {d["identity"]["pci_bus_id"] for d in devices if not d["up"]} == {hung.pci_bus_id}
        assert terminate(proc) == 0, "stopped although a read is stuck for good"


def test_snapshot_exits_within_the_read_timeout_with_a_stuck_read(tmp_path: Path) -> None:
    root, simulator = tree(tmp_path)
    hung = simulator.truth()[0].identity
    hang(Path(hung.device_dir) / "gpu_metrics")
    # The read stays stuck for good: a snapshot that waited for it would never exit (the bound of
    # subprocess.run only ends such a broken run); the device says it was given up at the deadline.
    result = subprocess.run(
        [EXPORTER, "snapshot", "--json", f"--path.sysfs={root}", "--read-timeout=1s"], capture_output=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    devices = {d["identity"]["pci_bus_id"]: d for d in json.loads(result.stdout)["devices"]}
    assert devices[hung.pci_bus_id]["up"] is False
    assert devices[hung.pci_bus_id]["down_reason"] == "identify_timeout"
    assert sum(d["up"] for d in devices.values()) == 3


# --- errors are data ---------------------------------------------------------------------------------------


def _garbage(simulator: Simulator) -> dict[tuple[str, str], str]:
    """Write garbage into one file of each kind on GCD 0 (text, hwmon, binary, identity); -> (file, reason)."""
    ident = simulator.truth()[0].identity
    dev, hwmon = Path(ident.device_dir), Path(ident.hwmon_dir)
    (dev / "gpu_busy_percent").write_text("abc\n")
    (dev / "mem_info_vram_used").write_text("-5\n")
    (dev / "mem_info_gtt_used").write_text("18446744073709551615\n")
    (dev / "gpu_metrics").write_bytes((dev / "gpu_metrics").read_bytes()[:50])
    (hwmon / "temp2_input").write_text("1000000000\n")  # 1e6 °C
    (hwmon / "in0_input").write_text("18446744073709551615\n")
    (dev / "pp_dpm_sclk").write_text("unavailable\n")
    (dev / "pcie_replay_count").unlink()
    (dev / "pcie_replay_count").mkdir()  # "is a directory"
    (dev / "mem_busy_percent").unlink()
    os.symlink("mem_busy_percent", dev / "mem_busy_percent")  # a symlink loop
    (dev / "current_link_width").write_bytes(b"1" * 100_000)  # longer than any attribute
    (dev / "xgmi_error").write_text("18446744073709551615\n")  # one absurd read must not poison the counter
    (dev / "product_name").write_bytes(b"AMD\x00Instinct\x1b[2J" + b"X" * 300)  # NUL, escapes, too long
    return {
        ("gpu_busy_percent", "parse"): "text",
        ("mem_info_vram_used", "parse"): "text",
        ("mem_info_gtt_used", "implausible"): "text (more than the pool holds)",
        ("gpu_metrics", "parse"): "binary",
        ("temp2_input", "implausible"): "hwmon",
        ("in0_input", "implausible"): "hwmon",
        ("pp_dpm_sclk", "unavailable"): "dpm",
        ("pcie_replay_count", "eisdir"): "text",
        ("mem_busy_percent", "eloop"): "text",
        ("current_link_width", "too_large"): "text",
        ("xgmi_error", "implausible"): "slow text",
    }


def test_garbage_in_every_file_kind_is_counted_by_reason_and_logged_once(tmp_path: Path) -> None:
    root, simulator = tree(tmp_path)
    expected = _garbage(simulator)
    gcd0 = simulator.truth()[0].identity
    with exporter(f"--path.sysfs={root}", "--interval=100ms", "--slow-interval=200ms") as (proc, port):
        wait_ready(port, proc)
        gpu = gpu_of(scrape(port))[gcd0.pci_bus_id]

        def counted(s: Series) -> bool:
            return all((value(s, "amdgpu_exporter_file_errors_total", gpu=gpu, file=f, reason=r) or 0) >= 2
                       for f, r in expected)  # fmt: skip

        series = wait_for_series(port, counted, what="every garbage file counted, more than once")
        # identity strings are read at discovery: counted once, and the label is clean and capped
        assert value(series, "amdgpu_exporter_file_errors_total", gpu=gpu, file="product_name", reason="label") == 1
        product = next(
            dict(k[1])["product"] for k in series if k[0] == "amdgpu_device_info" and dict(k[1])["gpu"] == gpu
        )
        assert product.startswith("AMDInstinct[2J") and len(product) == 128
        assert value(series, "amdgpu_xgmi_error_events_total", gpu=gpu) != float(2**64 - 1)
        assert value(series, "amdgpu_up", gpu=gpu) == 1, "the rest of the device is still read"
        # nothing impossible is exported as fact
        assert value(series, "amdgpu_temperature_celsius", gpu=gpu, sensor="junction") != 1e6
        assert all(v < 200 for k, v in series.items() if k[0] == "amdgpu_temperature_celsius")
        assert value(series, "amdgpu_voltage_volts", gpu=gpu, rail="gfx") is None
        assert value(series, "amdgpu_memory_used_bytes", gpu=gpu, pool="gtt") is None
        assert value(series, "amdgpu_memory_used_bytes", gpu=gpu, pool="vram") is None
        other = [g for b, g in gpu_of(series).items() if b != gcd0.pci_bus_id]
        assert not any(k[0] == "amdgpu_exporter_file_errors_total" and dict(k[1])["gpu"] in other for k in series)
        wait_for_cycles(port, poll_cycles(port) + 3)  # more cycles of the same garbage
        proc.terminate()
        _, err = proc.communicate(timeout=5)
    events = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    file_errors = [(e["file"], e["reason"]) for e in events if e.get("event") == "file_error"]
    assert sorted(file_errors) == sorted([*expected, ("product_name", "label")]), "logged once, not per cycle"


def test_a_vanished_log_reader_does_not_kill_it(tmp_path: Path) -> None:
    from tests.harness import start_listening

    root, simulator = tree(tmp_path)
    proc, port = start_listening(
        lambda p: [EXPORTER, f"--path.sysfs={root}", "--interval=100ms", f"--web.listen-address=127.0.0.1:{p}",
                   "--log.format=json"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None and proc.stdout is not None
        proc.stderr.readline()  # it has logged
        proc.stderr.close()  # the reader goes away (journald restarted, a `| head` done)
        proc.stdout.close()
        # make it log: a GCD falls off the bus, its read fails and is logged in the cycle that marks it down
        bus_id = simulator.truth()[3].identity.pci_bus_id
        gpu = gpu_of(wait_for_series(port, lambda s: bus_id in gpu_of(s), what="the GCD is up"))[bus_id]
        shutil.rmtree(simulator.truth()[3].identity.device_dir)
        wait_for_series(port, lambda s: value(s, "amdgpu_up", gpu=gpu) == 0, what="the GCD off the bus is down")
        wait_for_cycles(port, poll_cycles(port) + 3)
        assert proc.poll() is None, f"exited with {proc.returncode}"
    finally:
        assert terminate(proc) == 0


# --- counters across a u32 wrap, through Prometheus ----------------------------------------------------------


def v1_0_blob(energy_ticks: int, clock_ns: int) -> bytes:
    """A gpu_metrics v1_0 table (80 bytes, every field not set all-ones), per the kernel's struct layout."""
    blob = bytearray(b"\xff" * 80)
    struct.pack_into("<HBB", blob, 0, 80, 1, 0)
    struct.pack_into("<Q", blob, 8, clock_ns)
    struct.pack_into("<6H", blob, 16, 40, 55, 50, 45, 45, 45)  # edge, hotspot, mem, vr*: °C
    struct.pack_into("<3H", blob, 28, 90, 40, 0)  # gfx, umc, mm activity %
    struct.pack_into("<H", blob, 34, 300)  # average socket power, W
    struct.pack_into("<I", blob, 36, energy_ticks % 2**32)  # energy_accumulator: u32 in v1_0
    return bytes(blob)


def test_energy_counter_stays_monotonic_across_a_u32_wrap_in_prometheus(tmp_path: Path) -> None:
    from tests.harness import free_port
    from tests.realtools import require_tool

    prometheus = require_tool("prometheus")
    root, simulator = tree(tmp_path, fleet="1xMI210")
    metrics = Path(simulator.truth()[0].identity.device_dir) / "gpu_metrics"
    watts = 300
    start_joules = 65536 - 12 * watts  # wraps after 12 s
    stop_writer = threading.Event()
    started = time.monotonic()

    def write_blob() -> None:
        elapsed = time.monotonic() - started
        ticks = int((start_joules + watts * elapsed) * 2**16)
        temp = metrics.with_name("gpu_metrics.tmp")
        temp.write_bytes(v1_0_blob(ticks, int(elapsed * 1e9)))
        os.replace(temp, metrics)

    write_blob()

    def writer() -> None:
        while not stop_writer.wait(0.05):
            write_blob()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    prom_port = free_port()
    with exporter(f"--path.sysfs={root}", "--interval=200ms", "--discovery-interval=1h") as (proc, port):
        wait_ready(port, proc)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            f"scrape_configs: [{{job_name: x, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n"
        )
        prom = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while time.monotonic() - started < 20:
                time.sleep(0.5)
            raw = scrape(port)
            assert (value(raw, "amdgpu_energy_joules_total", gpu="0") or 0) > 65536, "past the u32 wrap"

            def query(expr: str) -> float:
                deadline = time.monotonic() + 15
                while True:
                    try:
                        body = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/query", params={"query": expr}).json()
                        result = body["data"]["result"]
                        if result:
                            return float(result[0]["value"][1])
                    except httpx.HTTPError:
                        pass
                    assert time.monotonic() < deadline, f"no result for {expr}"
                    time.sleep(0.5)

            assert query('resets(amdgpu_energy_joules_total{gpu="0"}[1m])') == 0
            rate = query('rate(amdgpu_energy_joules_total{gpu="0"}[15s])')
            # A wrap taken for a reset would count the whole counter (~65,000 J) in the window: a
            # rate in the thousands of watts. Scrape and write jitter on a loaded machine move an
            # honest rate by tens of percent, not by that.
            assert 0.5 * watts < rate < 1.5 * watts, f"rate() across the wrap is the power, not a reset: {rate}"
            increase = query('max_over_time(amdgpu_energy_joules_total{gpu="0"}[1m])'
                             ' - min_over_time(amdgpu_energy_joules_total{gpu="0"}[1m])')  # fmt: skip
            assert 10 * watts < increase < 25 * watts
        finally:
            stop_writer.set()
            prom.terminate()
            prom.wait(10)


# --- readiness and liveness --------------------------------------------------------------------------------


def test_readyz_goes_503_on_each_failing_stage_and_back_and_healthz_on_a_stuck_loop(tmp_path: Path) -> None:
    import sys

    from tests.harness import free_port, start_listening

    root, _ = tree(tmp_path, fleet="1xMI210")
    flags = tmp_path / "flags"
    flags.mkdir()
    dead_alertmanager = f"http://127.0.0.1:{free_port()}"
    proc, port = start_listening(
        lambda p: [sys.executable, "-m", "tests.integration.faulty_exporter", str(flags), f"--path.sysfs={root}",
                   "--interval=100ms", "--read-timeout=200ms", f"--alertmanager.url={dead_alertmanager}",
                   f"--web.listen-address=127.0.0.1:{p}", "--log.format=json"],
        stdout=subprocess.DEVNULL, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def status(path: str) -> tuple[int, str]:
        response = httpx.get(base + path, timeout=2)
        return response.status_code, response.text

    def until(path: str, code: int) -> str:
        def answered() -> str | None:
            got, text = status(path)
            return text + " " if got == code else None

        return wait_until(answered, f"{path} answering {code}", process=proc)

    try:
        wait_ready(port, proc)
        for stage, flag in (("rules", "rules"), ("alertmanager", "sender")):
            (flags / flag).touch()
            assert f"stage {stage} is failing" in until("/readyz", 503)
            assert (value(scrape(port), "amdgpu_exporter_stage_failures_total", stage=stage) or 0) >= 1
            assert status("/metrics")[0] == 200 and status("/healthz")[0] == 200
            (flags / flag).unlink()
            until("/readyz", 200)
        (flags / "publish").touch()  # polled but no longer published: the snapshot ages
        assert "old" in until("/readyz", 503)
        assert status("/healthz")[0] == 200
        (flags / "publish").unlink()
        until("/readyz", 200)
        (flags / "loop").touch()  # the poll loop stops making progress
        assert "no progress" in until("/healthz", 503)
        (flags / "loop").unlink()
        until("/healthz", 200)
        until("/readyz", 200)
    finally:
        stop(proc)


def test_device_missing_fires_on_what_the_exporter_serves_for_a_vanished_gcd(tmp_path: Path) -> None:
    """A real scrape before and after a GCD falls off the bus, replayed through promtool with the shipped rules."""
    from tests.realtools import require_tool

    promtool = require_tool("promtool")
    root, simulator = tree(tmp_path)
    vanished = simulator.truth()[2].identity
    with exporter(f"--path.sysfs={root}", "--interval=100ms", "--discovery-interval=200ms") as (proc, port):
        wait_ready(port, proc)
        before = scrape(port)
        shutil.rmtree(vanished.device_dir)
        after = wait_for_series(port, lambda s: 0 in {v for k, v in s.items() if k[0] == "amdgpu_device_present"})
    gpu = gpu_of(after)[vanished.pci_bus_id]
    lines = []
    names = ("amdgpu_up", "amdgpu_device_present", "amdgpu_device_down_info", "amdgpu_device_info")
    for key in sorted(k for k in {*before, *after} if k[0] in names):
        labels = ",".join(f'{k}="{v}"' for k, v in (*key[1], ("instance", "node:9442"), ("job", "amdgpu-exporter")))
        old = f"{before[key]:g}x30" if key in before else "_x30"
        new = f"{after[key]:g}x30" if key in after else "_x30"
        lines.append(f"      - series: '{key[0]}{{{labels}}}'\n        values: '{old} {new}'")
    expected = {
        "exp_labels": {"instance": "node:9442", "job": "amdgpu-exporter", "severity": "critical", "gpu": gpu,
                       "pci_bus_id": vanished.pci_bus_id},
        "exp_annotations": {
            "summary": f"GPU {gpu} ({vanished.pci_bus_id}) has gone from node:9442",
            "description": f"GPU {gpu} ({vanished.pci_bus_id}) has vanished from node node:9442: its device is no"
            " longer on the bus or in the driver.",
            "runbook_url": "docs/runbooks.md#amdgpudevicemissing",
        },
    }  # fmt: skip
    rules = Path(__file__).parents[2] / "deploy" / "prometheus" / "amdgpu-exporter.rules.yml"
    test = tmp_path / "missing.yml"
    test.write_text(
        f"rule_files: ['{rules}']\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
        + "\n".join(lines)
        + "\n    alert_rule_test:\n      - eval_time: 30m\n        alertname: AMDGPUDeviceMissing\n"
        f"      - eval_time: 40m\n        alertname: AMDGPUDeviceMissing\n"
        f"        exp_alerts: [{json.dumps(expected)}]\n"
    )
    result = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- dies and packages ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fleet", ["2xMI250X", "2xMI250X:serial=unique_id", "1xMI210,1xMI250X:serial=unique_id"])
def test_mi250x_dies_pair_with_either_serial_style(tmp_path: Path, fleet: str) -> None:
    from tests.realtools import require_tool

    root, simulator = tree(tmp_path, fleet=fleet)
    truth = {t.identity.pci_bus_id: t.identity for t in simulator.truth()}
    if "unique_id" in fleet:
        mi250x = [i for i in truth.values() if i.device_id == "0x740c"]
        assert len({i.serial for i in mi250x}) == len(mi250x), "no FRU: every die has its own serial"
    with exporter(f"--path.sysfs={root}", "--interval=100ms") as (proc, port):
        wait_ready(port, proc)
        series = scrape(port)
    info = {dict(k[1])["pci_bus_id"]: dict(k[1]) for k in series if k[0] == "amdgpu_device_info"}
    for bdf, expected in truth.items():
        assert (info[bdf]["package"], info[bdf]["die"]) == (expected.package, str(expected.die)), bdf
        power = value(series, "amdgpu_power_watts", gpu=info[bdf]["gpu"])
        assert (power is None) == (expected.die == 1), f"{bdf}: die 1 has no power reading of its own"
    packages = [i["package"] for i in info.values() if i["product"].startswith("AMD Instinct MI250X")]
    assert all(packages.count(p) == 2 for p in packages), "each MI250X package has two dies"
    # rocm-smi says "Secondary die" on exactly the dies we call die 1
    result = run_in_sysfs_namespace(root, [require_tool("rocm-smi"), "--showpower", "--json"], timeout=60)
    report = json.loads(result.stdout[result.stdout.index("{") :])
    smi_secondary = {
        name for name, card in report.items() if "Secondary die" in card.get("Average Graphics Package Power (W)", "")
    }
    ours = {f"card{i['gpu']}" for i in info.values() if i["die"] == "1"}
    assert smi_secondary == ours and ours


# --- hostile config and rules files --------------------------------------------------------------------------

LAUGHS = (
    "a: &a ["
    + ",".join(['"lol"'] * 9)
    + "]\n"
    + "".join(f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (bytes(range(256)), "not UTF-8 text"),
        (b"[" * 100_000, "nested deeper than 64 levels"),
        (("{a: " * 3000 + "1" + "}" * 3000).encode(), "nested deeper than 64 levels"),
        (LAUGHS.encode(), "alias bomb"),
        (b"x" * (2 << 20), "larger than {limit} KiB"),
    ],
)
@pytest.mark.parametrize("flag", ["--config.file", "--rules.file"])
def test_hostile_config_and_rules_files_fail_fast_in_one_line(
    tmp_path: Path, flag: str, content: bytes, words: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    words = words.format(limit={"--config.file": 256, "--rules.file": 1024}[flag])  # a config file is smaller
    # Fails fast: nothing parsed beyond the limits (an alias bomb or a deep nesting expanded would take
    # far more memory); the time it takes on a loaded machine is not the measure.
    result = subprocess.run(
        ["/usr/bin/time", "-f", "%M", EXPORTER, f"{flag}={path}", f"--path.sysfs={tmp_path}"],  # a folder with no GPU
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    *lines, max_rss_kib = [line for line in result.stderr.strip().splitlines() if not line.startswith("Command exited")]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("amdgpu-exporter: error: ") and words in lines[0], lines
    assert "Traceback" not in result.stderr and len(lines[0]) < 300
    assert int(max_rss_kib) < 200_000, max_rss_kib
