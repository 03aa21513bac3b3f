"""HTTP: /metrics (bytes rendered once per snapshot), /healthz, /readyz, /api/v1/devices, /api/v1/alerts, /.

The handlers never touch hardware: they read the state published at the end of the last poll
cycle. /metrics is answered by a raw ASGI fast path in front of FastAPI, because a scrape
should cost little more than sending bytes; everything else goes through FastAPI.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from exporter import __version__
from exporter.exposition import RenderedMetrics
from exporter.model import AlertState, DeviceState, Snapshot

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

TEXT_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = b"application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclasses.dataclass(slots=True)
class PublishedState:
    """What the poll loop publishes after each cycle; replaced whole, never mutated."""

    snapshot: Snapshot | None = None
    metrics: RenderedMetrics | None = None
    started_at: float = dataclasses.field(default_factory=time.time)
    source: str = ""
    source_reason: str = ""
    alert_commands: dict[tuple[int, str], str] = dataclasses.field(default_factory=dict)


class MetricsFastPath:
    """ASGI middleware answering GET <telemetry path> straight from the pre-rendered bytes."""

    def __init__(self, app: Any, state_ref: Callable[[], PublishedState], path: str) -> None:
        self.app = app
        self.state_ref = state_ref
        self.path = path
        self._renderer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="render")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        rendered = self.state_ref().metrics
        if rendered is None:
            await _send(send, 503, b"text/plain; charset=utf-8", b"no poll cycle has finished yet\n", [])
            return
        accept = b""
        accept_encoding = b""
        for name, value in scope["headers"]:
            if name == b"accept":
                accept = value
            elif name == b"accept-encoding":
                accept_encoding = value
        openmetrics = b"application/openmetrics-text" in accept
        gzip_ok = b"gzip" in accept_encoding
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        body = rendered.cached(openmetrics, gzip_ok)
        if body is None:
            # First scrape of this snapshot in this format: render off the event loop, on one
            # thread, so other requests keep being served meanwhile.
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._renderer, rendered.body, openmetrics, gzip_ok)
        extra = [(b"content-encoding", b"gzip")] if gzip_ok else []
        extra.append((b"vary", b"Accept, Accept-Encoding"))
        if scope["method"] == "HEAD":
            body_to_send = b""
        elif scope["method"] == "GET":
            body_to_send = body
        else:
            await _send(send, 405, b"text/plain; charset=utf-8", b"method not allowed\n", [(b"allow", b"GET, HEAD")])
            return
        await _send(send, 200, content_type, body_to_send, extra, content_length=len(body))


async def _send(
    send: Send,
    status: int,
    content_type: bytes,
    body: bytes,
    extra: list[tuple[bytes, bytes]],
    content_length: int | None = None,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body) if content_length is None else content_length).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def device_json(state: DeviceState) -> dict[str, Any]:
    ident = state.identity
    sample = state.sample
    data: dict[str, Any] = {
        "gpu": state.gpu,
        "up": state.up,
        "down_reason": state.down_reason or None,
        "identity": {
            "pci_bus_id": ident.pci_bus_id,
            "card": ident.card,
            "unique_id": ident.unique_id,
            "product": ident.product,
            "asic": ident.asic,
            "device_id": ident.device_id,
            "serial": ident.serial,
            "vbios": ident.vbios,
            "driver_version": ident.driver_version,
            "package": ident.package,
            "die": ident.die,
            "compute_partition": ident.compute_partition,
            "memory_partition": ident.memory_partition,
            "gpu_metrics_version": ident.gpu_metrics_version,
            "firmware": dict(ident.firmware),
            "topology": [dataclasses.asdict(link) for link in ident.topology],
        },
        "sample": None,
        "read_errors": dict(state.read_errors),
        "read_timeouts": state.read_timeouts,
    }
    if sample is not None:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(sample):
            value = getattr(sample, f.name)
            if isinstance(value, MutableMapping) or hasattr(value, "items"):
                value = {"/".join(k) if isinstance(k, tuple) else str(k): v for k, v in value.items()}
            out[f.name] = value
        out["age_seconds"] = round(time.time() - sample.timestamp, 3)
        data["sample"] = out
    return data


def alert_json(alert: AlertState, command: str) -> dict[str, Any]:
    data = dataclasses.asdict(alert)
    data["state"] = "firing" if alert.firing else ("pending" if alert.pending_since is not None else "inactive")
    data["suggested_command"] = command or None
    data["note"] = "A suggestion only: the exporter never changes GPU settings."
    return data


def create_app(
    state_ref: Callable[[], PublishedState], telemetry_path: str = "/metrics", refresh_seconds: float = 1.0
) -> Any:
    app = FastAPI(title="amdgpu-exporter", version=__version__, docs_url="/api/docs", redoc_url=None)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok\n"

    @app.get("/readyz", response_class=PlainTextResponse)
    async def readyz() -> PlainTextResponse:
        if state_ref().snapshot is None:
            return PlainTextResponse("waiting for the first poll cycle\n", status_code=503)
        return PlainTextResponse("ready\n")

    @app.get("/api/v1/devices")
    async def devices() -> JSONResponse:
        snapshot = state_ref().snapshot
        if snapshot is None:
            return JSONResponse({"error": "no poll cycle has finished yet"}, status_code=503)
        return JSONResponse(
            {
                "taken_at": snapshot.taken_at,
                "source": snapshot.source,
                "cycle": snapshot.cycle,
                "poll_duration_seconds": snapshot.poll_duration_seconds,
                "devices": [device_json(d) for d in snapshot.devices],
            }
        )

    @app.get("/api/v1/alerts")
    async def alerts() -> JSONResponse:
        state = state_ref()
        snapshot = state.snapshot
        if snapshot is None:
            return JSONResponse({"error": "no poll cycle has finished yet"}, status_code=503)
        return JSONResponse(
            {
                "taken_at": snapshot.taken_at,
                "alerts": [
                    alert_json(a, state.alert_commands.get((a.gpu, a.alert), a.suggestion)) for a in snapshot.alerts
                ],
            }
        )

    @app.get("/", response_class=HTMLResponse)
    async def status_page() -> str:
        from exporter.web.status_page import render_status_page

        state = state_ref()
        snapshot = state.snapshot
        return render_status_page(
            snapshot,
            snapshot.alerts if snapshot is not None else (),
            version=__version__,
            source=state.source,
            telemetry_path=telemetry_path,
            refresh_seconds=refresh_seconds,
        )

    return MetricsFastPath(app, state_ref, telemetry_path)
