"""Threads for blocking reads that may never return: daemon threads, so a stuck read cannot hold up exit.

concurrent.futures.ThreadPoolExecutor (and asyncio's default executor) join their worker threads
when the interpreter exits and when asyncio.run() finishes: one read stuck in a hung GPU's driver
would then keep the process alive after SIGTERM until systemd's SIGKILL. These pools use daemon
threads and are never joined.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DaemonPool:
    """A small executor of daemon threads: at most `max_workers`, started on demand, never joined."""

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self.name = name
        self._work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} pool is closed")
            self._work.put((future, lambda: fn(*args)))
            self._threads = [t for t in self._threads if t.is_alive()]
            if self._idle == 0 and len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._worker, name=f"{self.name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1 if self._idle else 0
        return future

    def resize(self, max_workers: int) -> None:
        with self._lock:
            self.max_workers = max(self.max_workers, max_workers)

    @property
    def threads(self) -> int:
        with self._lock:
            return sum(1 for t in self._threads if t.is_alive())

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as error:  # handed to whoever waits on the future
                    future.set_exception(error)
                else:
                    future.set_result(result)
            with self._lock:
                if self._closed:
                    return
                self._idle += 1

    def close(self) -> None:
        """Let idle workers end; busy (possibly stuck) ones are abandoned (they are daemon threads)."""
        with self._lock:
            self._closed = True
            count = len(self._threads)
        for _ in range(count):
            self._work.put(None)


def run_once(fn: Callable[[], T], name: str) -> concurrent.futures.Future[T]:
    """fn on a daemon thread of its own, which ends when fn returns (or is abandoned if it never does)."""
    pool = DaemonPool(1, name)
    future = pool.submit(fn)
    pool.close()
    return future
