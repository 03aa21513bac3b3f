"""`amdgpu-exporter snapshot [--watch SECONDS] [--json]`: the daemon's sources and model, once or
repeatedly, as a table for people or as the /api/v1/devices document for machines."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, TextIO

from exporter.config import Settings, node_name
from exporter.exposition.views import devices_document
from exporter.log import get_logger
from exporter.model import Published
from exporter.operator.snapshot_table import render_table
from exporter.threads import run_once

log = get_logger("exporter.snapshot")

# ANSI: cursor home, clear screen; what `watch` does between frames.
CLEAR = "\x1b[H\x1b[2J"


def run(settings: Settings, *, watch: float | None, as_json: bool, out: TextIO | None = None) -> int:
    """Returns the exit status. The caller leaves with os._exit: a hung read's thread is never joined."""
    from exporter.alerting.rulefile import rule_file_of
    from exporter.cycle import Pipeline
    from exporter.demo import sysfs_tree
    from exporter.pipeline.poller import Poller
    from exporter.sources.base import StartupError
    from exporter.sources.select import select_source

    rule_file = rule_file_of(settings)
    with sysfs_tree(settings) as root:
        source, name, why = select_source(settings.source_choice(), root)
        log.debug("source_selected", source=name, reason=why)
        poller = Poller(
            source, interval=watch or settings.interval, read_timeout=settings.read_timeout, source_name=name
        )
        try:
            started = time.monotonic()
            try:
                devices = run_once(poller.discover, "discovery").result(timeout=poller.discovery_deadline)
            except TimeoutError as error:  # its daemon thread is abandoned: a hung read never holds up the exit
                raise StartupError(
                    f"device discovery under {root} did not finish within {poller.discovery_deadline:g} s: "
                    "a GPU or its driver may be hung (see dmesg)"
                ) from error
            log.debug("discovered", devices=len(devices), seconds=round(time.monotonic() - started, 4))
            if not devices:
                raise StartupError(f"no AMD GPU found under {root}/class/drm (to try without a GPU: --demo)")
            # The daemon's own stages after the poller (enrich, alert rules), without an Alertmanager.
            node = node_name(settings)
            pipeline = Pipeline(
                source_name=name,
                source_reason=why,
                rules=rule_file.rules,
                health_thresholds=rule_file.health,
                node=node,
            )
            return asyncio.run(_loop(poller, pipeline, node, watch=watch, as_json=as_json, out=out or sys.stdout))
        finally:
            poller.close()


async def _loop(poller: Any, pipeline: Any, node: str, *, watch: float | None, as_json: bool, out: TextIO) -> int:
    redraw = watch is not None and out.isatty() and not as_json
    next_tick = time.monotonic()
    while True:
        pipeline.on_snapshot(await poller.poll_once())
        published: Published | None = pipeline.state.published
        assert published is not None  # on_snapshot publishes every cycle
        snapshot, alerts = published.snapshot, published.alerts
        log.debug(
            "polled",
            cycle=snapshot.cycle,
            up=sum(d.up for d in snapshot.devices),
            down=[d.gpu for d in snapshot.devices if not d.up],
            seconds=round(snapshot.poll_duration_seconds, 4),
        )
        if as_json:
            text = json.dumps(devices_document(snapshot, time.time(), node), indent=None if watch else 2) + "\n"
        else:
            text = render_table(
                snapshot.devices, alerts, source=snapshot.source, taken_at=snapshot.taken_at, health=published.health
            )
            if redraw:
                text = CLEAR + text
            elif watch is not None:
                text += "\n"
        out.write(text)
        out.flush()
        if watch is None:
            return 0
        next_tick += watch
        await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
