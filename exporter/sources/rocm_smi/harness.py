"""The worker process both SMI libraries run in, less the library: rocm_smi/worker.py and
amd_smi/worker.py each add one adapter (open the library, read one device).

The library can abort() the process or block forever on a hung file; here that costs this process,
which the daemon (supervisor.py) restarts, instead of the daemon itself. Shape:
- startup: the adapter opens the library and enumerates its devices; a "ready" (or "failed") event
  goes up the reply pipe;
- one thread per device serves that device's requests in order, so a call that blocks on a hung
  GPU holds up that device alone (the libraries serialise each card behind a mutex anyway);
- replies go up the reply pipe as they finish; the daemon matches them by request id;
- every library call runs under a breadcrumb (see protocol.py), and faulthandler writes the fatal
  thread's id to the crash log, so an abort can be blamed on one call.

Run as: python -m <adapter module> REQUEST_FD REPLY_FD BREADCRUMB_FD CRASH_LOG_FD
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from exporter.sources.rocm_smi import protocol as proto


class Breadcrumbs:
    """This process's view of the shared breadcrumb area: one slot per thread."""

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, proto.BREADCRUMB_BYTES)
        self._lock = threading.Lock()
        self._next = 0
        self._local = threading.local()

    def _slot(self) -> int:
        slot = getattr(self._local, "slot", None)
        if slot is None:
            with self._lock:
                slot = self._next % proto.SLOT_COUNT
                self._next += 1
            self._local.slot = slot
        return slot

    def mark(self, device: int, call: str) -> None:
        offset = self._slot() * proto.SLOT_SIZE
        crumb = proto.pack_slot(threading.get_ident(), threading.get_native_id(), device, call)
        self._map[offset : offset + proto.SLOT_SIZE] = crumb

    def call(self, device: int, name: str, function: Callable[..., Any], *args: Any) -> Any:
        self.mark(device, name)
        try:
            return function(*args)
        finally:
            self.mark(device, proto.IDLE)


class Calls:
    """One request's library calls on one device: skips what the daemon asked to skip, notes failures."""

    def __init__(self, crumbs: Breadcrumbs, device: int, skip: frozenset[str] = frozenset()) -> None:
        self.crumbs = crumbs
        self.device = device
        self.skip = skip
        self.failed: dict[str, int] = {}

    def call(self, name: str, function: Callable[..., Any], *args: Any) -> Any:
        """function(*args) under a breadcrumb; None when skipped or when it raised (its code noted)."""
        if name in self.skip:
            return None
        try:
            return self.crumbs.call(self.device, name, function, *args)
        except Exception as error:  # the library's own exception (amdsmi: not supported, DRM error ...)
            self.failed[name] = int(getattr(error, "err_code", -1) or -1)
            return None


class DeviceReader(Protocol):
    def identify(self, skip: frozenset[str]) -> dict[str, Any]: ...

    def read(self, skip: frozenset[str], request: Mapping[str, Any]) -> dict[str, Any]:
        """One read: the slow fields too when request["slow"]; the request's other options are the adapter's."""
        ...


@dataclass(frozen=True)
class Opened:
    """What an adapter's start-up found: the "ready" event's fields and a reader per device index."""

    devices: list[dict[str, Any]]
    readers: Mapping[int, DeviceReader]
    driver_version: str
    library_version: str


class Dispatcher:
    """One thread and one queue per device; replies written under a lock."""

    def __init__(self, reply_fd: int) -> None:
        self.reply_fd = reply_fd
        self.reply_lock = threading.Lock()
        self.readers: Mapping[int, DeviceReader] = {}
        self.queues: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}

    def send(self, message: dict[str, Any]) -> None:
        view = memoryview(proto.encode(message))
        with self.reply_lock:
            while view:
                view = view[os.write(self.reply_fd, view) :]

    def dispatch(self, request: dict[str, Any]) -> None:
        device = request.get("device")
        if not isinstance(device, int) or device not in self.readers:
            self.send({"id": request.get("id"), "ok": False, "reason": "no_such_device", "message": str(device)})
            return
        q = self.queues.get(device)
        if q is None:
            q = self.queues[device] = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(self.readers[device], q), name=f"device:{device}", daemon=True
            ).start()
        q.put(request)

    def _serve(self, reader: DeviceReader, q: queue.SimpleQueue[dict[str, Any]]) -> None:
        while True:
            request = q.get()
            try:
                result = _handle(reader, request)
            except Exception as error:  # a bug here must cost one reply, not the worker
                self.send({"id": request.get("id"), "ok": False, "reason": "worker_error", "message": repr(error)})
                continue
            self.send({"id": request.get("id"), "ok": True, "result": result})


def _handle(reader: DeviceReader, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    skip = frozenset(request.get("skip", ()))
    if op == "identify":
        return reader.identify(skip)
    if op == "read":
        return reader.read(skip, request)
    raise ValueError(f"unknown op {op!r}")


def serve(argv: list[str], open_library: Callable[[Breadcrumbs], Opened]) -> int:
    """The worker's main: open the library through the adapter, then answer requests until "exit"."""
    request_fd, reply_fd, crumbs_fd, crash_fd = (int(a) for a in argv[:4])
    faulthandler.enable(file=crash_fd, all_threads=True)
    crumbs = Breadcrumbs(crumbs_fd)
    dispatcher = Dispatcher(reply_fd)
    try:
        opened = open_library(crumbs)
    except Exception as error:
        dispatcher.send({"event": "failed", "reason": "init_failed", "message": f"{type(error).__name__}: {error}"})
        return 3
    dispatcher.readers = opened.readers
    dispatcher.send(
        {
            "event": "ready",
            "devices": opened.devices,
            "driver_version": opened.driver_version,
            "library_version": opened.library_version,
        }
    )
    for line in proto.read_lines(request_fd):
        try:
            request = proto.decode(line)
        except ValueError:
            continue
        if request.get("op") == "exit":
            break
        dispatcher.dispatch(request)
    # A device thread may be stuck in the kernel for good: leave without joining anything.
    os._exit(0)
