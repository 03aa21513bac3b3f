"""The real exporter with faults injected while flag files exist (tests only, never shipped).

    python -m tests.integration.faulty_exporter FLAG_DIR [amdgpu-exporter arguments]

FLAG_DIR/rules: every rule evaluation raises. FLAG_DIR/publish: cycles are polled but not published
(a stage that silently stops). FLAG_DIR/loop: the poll loop stops making progress. FLAG_DIR/sender:
building an Alertmanager payload raises (the sender task dies). The faults stand for bugs, which a
test cannot otherwise cause in a correct program; everything else is the shipped daemon.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import exporter.alerting.alertmanager as alertmanager
import exporter.cycle as publish
import exporter.pipeline.poller as poller
from exporter.cli import main

flags = sys.argv[1]


def on(name: str) -> bool:
    return os.path.exists(os.path.join(flags, name))


real_evaluate = publish.evaluate


def evaluate(*args: Any, **kwargs: Any) -> Any:
    if on("rules"):
        raise RuntimeError("injected rule failure")
    return real_evaluate(*args, **kwargs)


real_on_snapshot = publish.Pipeline.on_snapshot


def on_snapshot(self: publish.Pipeline, snapshot: Any) -> None:
    if on("publish"):
        self.readiness.progress()  # the loop is alive; only publishing stopped
        return
    real_on_snapshot(self, snapshot)


real_poll_once = poller.Poller.poll_once


async def poll_once(self: poller.Poller) -> Any:
    while on("loop"):
        await asyncio.sleep(0.05)
    return await real_poll_once(self)


real_payload = alertmanager.AlertmanagerPusher.pending_payload
real_init = alertmanager.AlertmanagerPusher.__init__


def pending_payload(self: alertmanager.AlertmanagerPusher, now: float | None = None) -> Any:
    if on("sender"):
        raise RuntimeError("injected sender failure")
    return real_payload(self, now)


def init(self: alertmanager.AlertmanagerPusher, *args: Any, **kwargs: Any) -> None:
    kwargs.update(resend_interval=0.2, retry_initial=0.2)  # passes often enough for a test
    real_init(self, *args, **kwargs)


publish.evaluate = evaluate  # type: ignore[assignment]
publish.Pipeline.on_snapshot = on_snapshot  # type: ignore[method-assign]
poller.Poller.poll_once = poll_once  # type: ignore[method-assign]
alertmanager.AlertmanagerPusher.pending_payload = pending_payload  # type: ignore[method-assign]
alertmanager.AlertmanagerPusher.__init__ = init  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[2:]))
