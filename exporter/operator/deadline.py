"""Run a blocking call on a daemon thread against a deadline.

A read stuck in a hung GPU's driver never returns. asyncio's default executor and
concurrent.futures both join their threads at exit, so a stuck read there would hang the command
forever; a daemon thread (exporter/threads.py) is simply abandoned when the process leaves.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from exporter.threads import run_once

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The call did not return in time; it may still be running on its (abandoned) thread."""


def call_with_deadline(function: Callable[[], T], seconds: float, name: str = "deadline") -> T:
    try:
        return run_once(function, name).result(timeout=seconds)
    except concurrent.futures.TimeoutError as error:
        raise DeadlineExceeded(f"no answer within {seconds:g} s") from error
