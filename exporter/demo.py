"""The folder standing for /sys: --path.sysfs, or with --demo the simulator run in-process on a
temporary folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from exporter.config import ConfigError, Settings
from exporter.log import get_logger

log = get_logger("exporter.demo")
_PREFIX = "amdgpu-exporter-demo-"  # then the pid of the process that made the tree
# At their default these end the process without unwinding, which would leave the tree behind.
_FATAL_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _unwound_on_signals() -> Iterator[None]:
    """While the tree exists, SIGTERM/SIGHUP at their default raise SystemExit, so the tree's removal
    runs; a handler set meanwhile (the daemon's graceful stop) is left alone."""
    main = threading.current_thread() is threading.main_thread()
    mine = [sig for sig in _FATAL_SIGNALS if main and signal.getsignal(sig) == signal.SIG_DFL]
    for sig in mine:
        signal.signal(sig, _exit_on_signal)
    try:
        yield
    finally:
        for sig in mine:
            if signal.getsignal(sig) == _exit_on_signal:
                signal.signal(sig, signal.SIG_DFL)


def _remove_orphans(folder: str | None) -> None:
    """Trees of this user's demos whose process is gone (ended by SIGKILL, nothing could remove them)."""
    folder = folder or tempfile.gettempdir()
    for name in os.listdir(folder):
        pid = name[len(_PREFIX) :].partition("-")[0]
        path = os.path.join(folder, name)
        if not (name.startswith(_PREFIX) and pid.isdecimal()) or os.lstat(path).st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


@contextlib.contextmanager
def sysfs_tree(settings: Settings) -> Iterator[str]:
    """Yields the folder standing for /sys; a --demo tree keeps ticking until the block is left."""
    if not settings.demo:
        yield settings.path_sysfs
        return
    # tmpfs where there is one: the simulator rewrites a few files per GCD every tick.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    _remove_orphans(shm)
    from exporter.simulator.simulator import Simulator  # only a demo pays for the simulator's import

    with _unwound_on_signals(), tempfile.TemporaryDirectory(prefix=f"{_PREFIX}{os.getpid()}-", dir=shm) as tmp:
        root = Path(tmp) / "sys"
        try:
            simulator = Simulator(root, fleet=settings.demo_fleet, scenario=settings.demo_scenario)
        except ValueError as error:
            raise ConfigError(f"--demo.fleet/--demo.scenario: {error}") from error
        if settings.collector_processes:
            simulator.simulate_processes()  # kfd/proc with processes coming and going
        stop = threading.Event()
        truth = Path(settings.demo_truth_file) if settings.demo_truth_file else None
        thread = threading.Thread(
            target=simulator.run, args=(min(settings.interval, 1.0), stop, truth), name="simulator", daemon=True
        )
        # Written here first so discovery never races the thread (run() writes the same t=0 tree again).
        simulator.write_tree()
        if truth is not None:
            simulator.write_truth_json(truth)
        thread.start()
        log.info("demo_started", sysfs=str(root), fleet=settings.demo_fleet, scenario=settings.demo_scenario)
        try:
            yield str(root)
        finally:
            stop.set()
            thread.join(timeout=0.5)  # a tick in progress ends within it; the thread is a daemon
