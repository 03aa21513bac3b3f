"""Start, talk to, and restart the rocm_smi worker process.

One worker at a time. Requests are JSON lines down a pipe; one reader thread per worker matches
replies to waiting futures by id. When the worker dies the reader thread finds out (end of file),
works out why — the exit signal, the breadcrumbs and faulthandler's report — repairs the card
mutexes the dead worker held, reports the blamed library call(s) to `on_crash`, and fails every
pending request with WorkerGone so callers can retry on the next worker.

Restarts back off: the first after a run of good service is immediate, then 0.5 s, 1 s, 2 s ...
up to `backoff_max`. A killed worker that the kernel cannot reap (a thread stuck in
uninterruptible sleep inside the driver) is kept on a list; while two such processes exist no
new worker is started, so a wedged GPU cannot make us pile up processes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.log import get_logger
from exporter.sources.rocm_smi import protocol as proto
from exporter.sources.rocm_smi.library import find_library
from exporter.sources.rocm_smi.mutex import repair_abandoned_mutexes

log = get_logger("exporter.sources.rocm_smi")

_CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
_MAX_UNREAPED = 2
_START_TIMEOUT = 10.0  # seconds a worker may take from exec to "ready"
_BACKOFF_INITIAL = 0.5
_HEALTHY_AFTER = 60.0  # a worker that served this long before dying restarts without delay
ROCM_SMI_WORKER = "exporter.sources.rocm_smi.worker"
AMD_SMI_WORKER = "exporter.sources.amd_smi.worker"


class WorkerError(Exception):
    """`reason` is a short machine word (the SourceError reason it becomes); the message is for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class WorkerUnavailable(WorkerError):
    """No worker can serve requests right now (start failed, backing off, library missing)."""


class WorkerGone(WorkerError):
    """The worker serving a request ended before answering (crashed, or killed by us)."""


class RequestFailed(WorkerError):
    """The worker answered with an error."""


@dataclass(frozen=True, slots=True)
class CrashReport:
    pid: int
    reason: str  # "aborted" | "signal:SIGSEGV" | "exited:3" | "killed"
    blamed: tuple[tuple[int, str], ...]  # (device index, library call) in flight at the crash
    devices: tuple[Mapping[str, Any], ...]  # the dead worker's enumeration (index -> BDF)


@dataclass(eq=False)
class Worker:
    generation: int
    process: subprocess.Popen[bytes]
    request_fd: int
    reply_fd: int
    crumbs: mmap.mmap
    crash_fd: int
    started_at: float
    devices: tuple[Mapping[str, Any], ...] = ()
    driver_version: str = ""
    pending: dict[int, concurrent.futures.Future[dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    killed_by_us: str = ""
    init_error: str = ""
    ready: concurrent.futures.Future[dict[str, Any]] = field(default_factory=concurrent.futures.Future)
    ended: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return not self.ended.is_set()


class Supervisor:
    def __init__(
        self,
        *,
        worker_prefix: Sequence[str] = (),
        shm_dir: str = "/dev/shm",
        backoff_max: float = 10.0,
        on_crash: Callable[[CrashReport], None] | None = None,
        quiet: bool = False,
        worker_module: str = ROCM_SMI_WORKER,
    ) -> None:
        self.worker_module = worker_module
        # The amd-smi worker's `amdsmi` module finds libamd_smi itself.
        self.library = find_library() if worker_module == ROCM_SMI_WORKER else worker_module
        self._rocm_path: tempfile.TemporaryDirectory[str] | None = None  # see _spawn
        self.worker_prefix = list(worker_prefix)
        self.shm_dir = shm_dir
        self.backoff_max = backoff_max
        self.on_crash = on_crash
        # A probe expects workers that cannot start: their events go to debug, not warning.
        self._warn = log.debug if quiet else log.warning
        self.starts = 0
        self.last_error = ""
        self.library_version = ""  # as the last worker that started reported it, e.g. "7.6.0"
        self._lock = threading.RLock()  # worker lifecycle; never taken by a reader thread
        self._backoff_lock = threading.Lock()
        self._worker: Worker | None = None
        self._unreaped: list[subprocess.Popen[bytes]] = []
        self._consecutive_failures = 0
        self._next_start = 0.0
        self._ids = itertools.count(1)
        self._generations = itertools.count(1)
        self._closed = False

    @property
    def restarts(self) -> int:
        """Workers started after the first (crashes, hang recoveries)."""
        return max(self.starts - 1, 0)

    # -- lifecycle -------------------------------------------------------------------------

    def ensure_worker(self, deadline: float | None = None) -> Worker:
        """The serving worker, starting one if none runs and the backoff allows it.

        A start takes ~0.1-0.3 s. A caller whose deadline ends first gets WorkerUnavailable
        ("worker_starting") and the start carries on for the next caller, up to _START_TIMEOUT.
        """
        with self._lock:
            current = self._worker
            if current is None or not current.alive:
                if self._closed:
                    raise WorkerUnavailable("closed", "the rocm_smi source is closed")
                if self.library is None:
                    raise WorkerUnavailable("library_missing", "librocm_smi64 not found")
                self._wait_for_cleanup(current)
                now = time.monotonic()
                if now < self._next_start:
                    raise WorkerUnavailable(
                        "worker_backoff", f"worker restart in {self._next_start - now:.1f} s: {self.last_error}"
                    )
                self._reap()
                if len(self._unreaped) >= _MAX_UNREAPED:
                    raise WorkerUnavailable("worker_unkillable", "earlier workers are stuck in the kernel")
                current = self._spawn()
        now = time.monotonic()
        left = current.started_at + _START_TIMEOUT - now
        wait = left if deadline is None else min(left, deadline - now)
        try:
            event = current.ready.result(timeout=max(wait, 0.0))
        except concurrent.futures.TimeoutError:
            if time.monotonic() >= current.started_at + _START_TIMEOUT:
                self._give_up_start(current)
                raise WorkerUnavailable("worker_start_timeout", self.last_error) from None
            raise WorkerUnavailable("worker_starting", "the worker is still starting") from None
        except WorkerGone as gone:
            self._wait_for_cleanup(current)
            raise WorkerUnavailable("worker_start_failed", f"the worker died while starting: {gone}") from gone
        if event.get("event") != "ready":
            self._wait_for_cleanup(current)
            raise WorkerUnavailable(str(event.get("reason", "init_failed")), str(event.get("message", "")))
        return current

    def _give_up_start(self, worker: Worker) -> None:
        with self._lock:
            if worker.alive and not worker.ready.done():
                worker.killed_by_us = "start timeout"
                _kill(worker.process)
        self._wait_for_cleanup(worker)

    def restart(self, why: str) -> None:
        """Kill the running worker (a request is stuck in it); the next request starts another."""
        with self._lock:
            current = self._worker
            if current is None or not current.alive:
                return
            current.killed_by_us = why
            log.warning("rocm_smi_worker_kill", pid=current.pid, generation=current.generation, why=why)
            _kill(current.process)
            self._wait_for_cleanup(current)

    def in_flight(self, worker: Worker, device: int) -> str:
        """The library call a device's worker thread is inside right now ("" when none)."""
        try:
            raw = bytes(worker.crumbs[:])
        except ValueError:  # the worker ended and its breadcrumb map is closed
            return ""
        return next((crumb.call for crumb in proto.unpack_slots(raw) if crumb.device == device and crumb.call), "")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            current = self._worker
            if current is not None and current.alive:
                current.killed_by_us = "closing"
                with contextlib.suppress(OSError):
                    os.write(current.request_fd, proto.encode({"op": "exit"}))
                try:
                    current.process.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    _kill(current.process)
                self._wait_for_cleanup(current)
            self._reap()
            if self._rocm_path is not None:
                self._rocm_path.cleanup()

    def _wait_for_cleanup(self, worker: Worker | None) -> None:
        if worker is not None and worker.reader is not None and worker.reader is not threading.current_thread():
            worker.ended.wait(timeout=5.0)

    def _spawn(self) -> Worker:
        """Start a worker process; the reader thread resolves worker.ready with its first message."""
        generation = next(self._generations)
        request_r, request_w = os.pipe2(os.O_CLOEXEC)
        reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        crumbs_fd = os.memfd_create("rocm-smi-breadcrumbs")
        os.ftruncate(crumbs_fd, proto.BREADCRUMB_BYTES)
        crash_fd = os.memfd_create("rocm-smi-crash-log")
        child_fds = (request_r, reply_w, crumbs_fd, crash_fd)
        argv = [*self.worker_prefix, sys.executable, "-m", self.worker_module, *(str(fd) for fd in child_fds)]
        # The folder that holds the `exporter` package, so `python -m` finds it in any cwd.
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = {**os.environ, "PYTHONPATH": package_root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if self.worker_module == ROCM_SMI_WORKER and self.library is not None:
            # pyrsmi loads $ROCM_PATH/lib/librocm_smi64.so only, and Debian ships only the versioned
            # name: the worker's ROCM_PATH is a folder whose lib/ links to the library found.
            if self._rocm_path is None:
                self._rocm_path = tempfile.TemporaryDirectory(prefix="amdgpu-exporter-rocm-")
                lib_dir = os.path.join(self._rocm_path.name, "lib")
                os.mkdir(lib_dir)
                os.symlink(os.path.realpath(self.library), os.path.join(lib_dir, "librocm_smi64.so"))
            env["ROCM_PATH"] = self._rocm_path.name
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                argv,
                pass_fds=child_fds,
                env=env,
                # Nothing the library, pyrsmi or the interpreter prints may reach the terminal:
                # replies, breadcrumbs and crash dumps have their own descriptors.
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to the daemon is the daemon's to handle
            )
        except OSError as error:
            for fd in (request_r, request_w, reply_r, reply_w, crumbs_fd, crash_fd):
                os.close(fd)
            self._note_failure(f"cannot start the worker: {error}")
            raise WorkerUnavailable("worker_start_failed", str(error)) from error
        os.close(request_r)
        os.close(reply_w)
        crumbs = mmap.mmap(crumbs_fd, proto.BREADCRUMB_BYTES)
        os.close(crumbs_fd)
        os.set_blocking(request_w, False)  # a wedged worker must not block the daemon's writes
        worker = Worker(
            generation=generation,
            process=process,
            request_fd=request_w,
            reply_fd=reply_r,
            crumbs=crumbs,
            crash_fd=crash_fd,
            started_at=started,
        )
        self.starts += 1
        worker.pending[0] = worker.ready
        worker.reader = threading.Thread(
            target=self._read_replies, args=(worker,), name=f"rocm-smi-reader-{generation}", daemon=True
        )
        self._worker = worker
        worker.reader.start()
        return worker

    def _note_failure(self, message: str, *, reset: bool = False) -> None:
        with self._backoff_lock:
            if reset:
                self._consecutive_failures = 0
            self.last_error = message
            self._consecutive_failures += 1
            failures = self._consecutive_failures
            delay = 0.0 if failures <= 1 else min(_BACKOFF_INITIAL * 2 ** (failures - 2), self.backoff_max)
            self._next_start = time.monotonic() + delay
        self._warn("rocm_smi_worker_down", error=message, retry_in=round(delay, 2))

    def _reap(self) -> None:
        self._unreaped = [p for p in self._unreaped if p.poll() is None]

    # -- requests --------------------------------------------------------------------------
    def submit(self, worker: Worker, message: dict[str, Any]) -> concurrent.futures.Future[dict[str, Any]]:
        """Send one request to `worker`; the future resolves to its result or raises."""
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        request_id = next(self._ids)
        data = proto.encode({**message, "id": request_id})
        with worker.lock:
            if not worker.alive:
                raise WorkerGone("worker_gone", "the worker has ended")
            worker.pending[request_id] = future
            try:
                written = os.write(worker.request_fd, data)
            except BlockingIOError:
                written = 0
            except OSError as error:
                worker.pending.pop(request_id, None)
                raise WorkerGone("worker_gone", f"cannot write to the worker: {error}") from error
        if written != len(data):
            # The pipe is full: the worker stopped reading requests. Treat it as hung.
            with worker.lock:
                worker.pending.pop(request_id, None)
            self.restart("request pipe full")
            raise WorkerGone("worker_unresponsive", "the worker stopped reading requests")
        return future

    def _read_replies(self, worker: Worker) -> None:
        try:
            for line in proto.read_lines(worker.reply_fd):
                self._deliver(worker, line)
        finally:
            self._worker_ended(worker)

    def _deliver(self, worker: Worker, line: bytes) -> None:
        try:
            message = proto.decode(line)
        except ValueError:
            return
        key = 0 if "event" in message else message.get("id", -1)
        with worker.lock:
            future = worker.pending.pop(key, None)
        if future is None or future.done():
            return
        if message.get("event") == "ready":
            worker.devices = tuple(message.get("devices", ()))
            worker.driver_version = str(message.get("driver_version", ""))
            self.library_version = str(message.get("library_version", ""))
            log.info(
                "rocm_smi_worker_started",
                library_version=self.library_version,
                pid=worker.pid,
                generation=worker.generation,
                devices=len(worker.devices),
                seconds=round(time.monotonic() - worker.started_at, 3),
                library=self.library,
            )
        elif "event" in message:
            worker.init_error = str(message.get("message", "rsmi_init failed"))
        if "event" in message or message.get("ok"):
            future.set_result(message.get("result", message))
        else:
            future.set_exception(RequestFailed(str(message.get("reason")), str(message.get("message"))))

    def _worker_ended(self, worker: Worker) -> None:
        """Runs on the reader thread once the reply pipe closes: find out why, clean up, report."""
        process = worker.process
        try:
            process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            _kill(process)
            try:
                process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._unreaped.append(process)
        code = process.returncode
        crumbs = proto.unpack_slots(bytes(worker.crumbs[:]))
        crash_log = os.pread(worker.crash_fd, proto.CRASH_LOG_BYTES, 0)
        blamed: list[proto.Breadcrumb] = []
        if worker.killed_by_us:
            reason = "killed"
        elif code is None:
            reason = "unreapable"
        elif code < 0:
            sig = signal.Signals(-code)
            reason = "aborted" if sig == signal.SIGABRT else f"signal:{sig.name}"
            if sig in _CRASH_SIGNALS:
                blamed = proto.blamed_calls(crumbs, crash_log)
        else:
            reason = f"exited:{code}"
        dead_tids = {crumb.tid for crumb in crumbs} | {process.pid}
        mutex_actions = repair_abandoned_mutexes(self.shm_dir, dead_tids) if code is not None else []
        report = CrashReport(process.pid, reason, tuple((crumb.device, crumb.call) for crumb in blamed), worker.devices)
        lived = time.monotonic() - worker.started_at
        # A worker we killed on purpose is replaced at once (the caller backs off its kills); one that
        # died on its own, failed rsmi_init or never became ready backs off.
        if not worker.devices and worker.killed_by_us in ("", "start timeout"):
            self._note_failure(worker.init_error or f"worker {process.pid} failed to start: {reason}")
        elif worker.devices and not worker.killed_by_us:
            self._note_failure(f"worker {process.pid} ended: {reason}", reset=lived >= _HEALTHY_AFTER)
        if reason != "killed" or mutex_actions:
            (self._warn if not worker.devices else log.warning)(
                "rocm_smi_worker_ended",
                pid=process.pid,
                generation=worker.generation,
                reason=reason,
                blamed=[f"{crumb.device}:{crumb.call}" for crumb in blamed],
                mutexes=mutex_actions,
                lived_seconds=round(lived, 3),
            )
        if self.on_crash is not None and worker.devices:
            try:
                self.on_crash(report)
            except Exception:  # reporting must not stop the cleanup below
                log.exception("rocm_smi_crash_handler_failed")
        with worker.lock:
            pending, worker.pending = worker.pending, {}
            worker.ended.set()
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    WorkerGone("worker_" + reason.split(":")[0], f"worker {process.pid} ended: {reason}")
                )
        for fd in (worker.request_fd, worker.reply_fd, worker.crash_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        worker.crumbs.close()


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        process.kill()
