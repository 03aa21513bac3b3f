"""Run a blocking call on a daemon thread against a deadline.

A read stuck in a hung GPU's driver never returns. asyncio's default executor and
concurrent.futures both join their threads at exit, so a stuck read there would hang the command
forever; a daemon thread is simply abandoned when the process leaves.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The call did not return in time; it may still be running on its (abandoned) thread."""


def call_with_deadline(function: Callable[[], T], seconds: float, name: str = "deadline") -> T:
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(function())
        except BaseException as error:  # handed to the caller, whatever it is
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        return future.result(timeout=seconds)
    except concurrent.futures.TimeoutError as error:
        raise DeadlineExceeded(f"no answer within {seconds:g} s") from error
