"""HTTP routes: /metrics, /healthz, /readyz, /api/v1/devices, /api/v1/devices/{gpu}/cper,
/api/v1/alerts, /api/v1/health, /api/v1/waveform, / (status page).

The handlers never touch hardware: they read the PublishedState of the last poll cycle
(exporter/cycle.py). /metrics is answered by a raw ASGI fast path in front of FastAPI,
because a scrape should cost little more than sending bytes; everything else goes through FastAPI.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from exporter import __version__
from exporter.cycle import PublishedState
from exporter.exposition.views import (
    CPER_PAGE_DEFAULT,
    CPER_PAGE_MAX,
    alert_json,
    cper_document,
    devices_document,
    health_document,
)
from exporter.log import get_logger
from exporter.model import Published
from exporter.pipeline.readiness import Readiness
from exporter.threads import DaemonPool
from exporter.web.jobs import add_job_routes
from exporter.web.status_page import render_status_page
from exporter.web.waveform import WaveformSource, waveform_response

log = get_logger("exporter.web")

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

TEXT_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = b"application/openmetrics-text; version=1.0.0; charset=utf-8"
PLAIN_CONTENT_TYPE = b"text/plain; charset=utf-8"

# Content negotiation for /metrics, pure over header bytes. A media type or coding with q=0 is
# refused (RFC 9110 §12.4.2): prometheus-client's own helpers (choose_encoder, gzip_accepted) match
# names only and ignore q, so `Accept-Encoding: gzip;q=0` would still get gzip from them.


def _preferences(header: bytes) -> dict[bytes, float]:
    """b"a;q=0.5, b" -> {b"a": 0.5, b"b": 1.0}; the highest q wins for a name listed twice."""
    found: dict[bytes, float] = {}
    for item in header.split(b","):
        name, *params = item.split(b";")
        name = name.strip().lower()
        if not name:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition(b"=")
            if key.strip().lower() == b"q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0  # a q we cannot read is not a yes
                q = min(max(q, 0.0), 1.0)
        found[name] = max(found.get(name, 0.0), q)
    return found


def wants_openmetrics(accept: bytes) -> bool:
    """OpenMetrics when the client accepts it (q > 0) at least as much as the text format."""
    prefs = _preferences(accept)
    openmetrics = prefs.get(b"application/openmetrics-text", 0.0)
    if openmetrics <= 0.0:
        return False
    text = max(prefs.get(b"text/plain", 0.0), prefs.get(b"text/*", 0.0), prefs.get(b"*/*", 0.0))
    return openmetrics >= text


def wants_gzip(accept_encoding: bytes) -> bool:
    """gzip when it is accepted with q > 0, by name or through `*` (unless named with q=0)."""
    prefs = _preferences(accept_encoding)
    if b"gzip" in prefs:
        return prefs[b"gzip"] > 0.0
    return prefs.get(b"*", 0.0) > 0.0


class MetricsEndpoint:
    """ASGI middleware answering GET <telemetry path> from the cycle's RenderedMetrics (rendered on first ask)."""

    def __init__(self, app: Any, state_ref: Callable[[], PublishedState], path: str, readiness: Readiness) -> None:
        self.app = app
        self.state_ref = state_ref
        self.path = path
        self.readiness = readiness
        self._renderer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="render")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):  # before any rendering: a POST costs nothing and fails nothing
            await send_response(send, 405, b"method not allowed\n", [(b"allow", b"GET, HEAD")])
            return
        rendered = self.state_ref().metrics
        if rendered is None:
            await send_response(send, 503, b"no poll cycle has finished yet\n")
            return
        headers = dict(scope["headers"])  # a repeated header: the last one counts
        openmetrics = wants_openmetrics(headers.get(b"accept", b""))
        gzip_ok = wants_gzip(headers.get(b"accept-encoding", b""))
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        body = rendered.cached(openmetrics, gzip_ok)
        if body is None:
            # First scrape of this snapshot in this format: render off the event loop, on one
            # thread, so other requests keep being served meanwhile.
            loop = asyncio.get_running_loop()
            try:
                try:
                    rendering = loop.run_in_executor(self._renderer, rendered.body, openmetrics, gzip_ok)
                except RuntimeError:  # no thread can be started (RLIMIT_AS, RLIMIT_NPROC): render here, slower
                    body = rendered.body(openmetrics, gzip_ok)
                else:
                    body = await rendering
            except Exception as error:  # a rendering bug: a 500 and a failing readiness, never stale bytes
                if self.readiness.failed("render", f"{type(error).__name__}: {error}"):
                    log.exception("stage_failed", stage="render")
                await send_response(send, 500, b"rendering /metrics failed\n")
                return
            if self.readiness.ok("render"):
                log.info("stage_recovered", stage="render")
        extra = [(b"content-encoding", b"gzip")] if gzip_ok else []
        extra.append((b"vary", b"Accept, Accept-Encoding"))
        body_to_send = body if scope["method"] == "GET" else b""
        await send_response(send, 200, body_to_send, extra, content_type, content_length=len(body))


def json_bytes(document: Any) -> bytes | None:
    """A document as FastAPI's JSONResponse encodes it; text no reader cleaned (a lone surrogate)
    becomes "?" rather than failing the answer. None stays None (not found)."""
    if document is None:
        return None
    text = json.dumps(document, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
    return text.encode("utf-8", "replace")


async def off_loop(pool: DaemonPool, build: Callable[[], T]) -> T:
    """build() on the pool's thread; here, slower, when no thread can be started (RLIMIT_NPROC)."""
    try:
        future = pool.submit(build)
    except RuntimeError:
        return build()
    return await asyncio.wrap_future(future)


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    extra: Sequence[tuple[bytes, bytes]] = (),
    content_type: bytes = PLAIN_CONTENT_TYPE,
    content_length: int | None = None,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body) if content_length is None else content_length).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(
    state_ref: Callable[[], PublishedState],
    telemetry_path: str = "/metrics",
    readiness: Readiness | None = None,
    waveform: WaveformSource | None = None,
    refresh_seconds: float = 1.0,
    node: str | None = None,
) -> Any:
    """node: the name the page and /api/v1/devices show (--node-name), the host name when None."""
    # No /api/docs or /openapi.json (Swagger UI loads from a CDN and describes the
    # API to anyone); unknown paths and methods get a bare status line, no detail.
    app = FastAPI(title="amdgpu-exporter", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    # Without a poll loop's Readiness (tests, tools), only "no cycle yet" makes it unready.
    checks = readiness if readiness is not None else Readiness(interval=math.inf)
    shown_node = node if node is not None else socket.gethostname()

    @app.exception_handler(StarletteHTTPException)
    async def bare_error(_request: Any, error: StarletteHTTPException) -> PlainTextResponse:
        text = {404: "not found", 405: "method not allowed"}.get(error.status_code, "error")
        return PlainTextResponse(text + "\n", status_code=error.status_code)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> PlainTextResponse:
        alive, why = checks.liveness()
        return PlainTextResponse(f"{why}\n", status_code=200 if alive else 503)

    @app.get("/readyz", response_class=PlainTextResponse)
    async def readyz() -> PlainTextResponse:
        ready, why = checks.readiness(state_ref().published)
        return PlainTextResponse(f"{why}\n", status_code=200 if ready else 503)

    documents = DaemonPool(1, "api")  # one thread: two status-page tabs queue, they do not multiply

    async def published_json(document: Callable[[Published], Any]) -> Response:
        """The document of the last cycle, built and encoded on the worker thread (a devices document
        of a large node takes tens of ms: on the event loop every scrape would wait for it)."""
        published = state_ref().published
        if published is None:
            return JSONResponse({"error": "no poll cycle has finished yet"}, status_code=503)
        body = await off_loop(documents, lambda: json_bytes(document(published)))
        if body is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        return Response(body, media_type="application/json")

    @app.get("/api/v1/devices")
    async def devices() -> Response:
        return await published_json(lambda p: devices_document(p.snapshot, time.time(), shown_node))

    @app.get("/api/v1/devices/{gpu}/cper")
    async def cper(gpu: str, request: Request) -> Response:
        query = request.query_params
        numbers = (gpu, query.get("offset", "0"), query.get("limit", str(CPER_PAGE_DEFAULT)))
        if not all(text.isascii() and text.isdigit() and len(text) <= 9 for text in numbers):
            return JSONResponse({"error": "gpu, offset and limit are non-negative integers"}, status_code=400)
        index, offset, limit = (int(text) for text in numbers)
        limit = min(max(limit, 1), CPER_PAGE_MAX)
        return await published_json(lambda p: cper_document(p.snapshot, index, offset, limit))

    @app.get("/api/v1/alerts")
    async def alerts() -> Response:
        return await published_json(
            lambda p: {"taken_at": p.snapshot.taken_at, "alerts": [alert_json(a) for a in p.alerts]}
        )

    @app.get("/api/v1/health")
    async def health_route() -> Response:
        return await published_json(lambda p: health_document(p, shown_node))

    @app.get("/api/v1/waveform")
    async def waveform_route(request: Request) -> JSONResponse:
        status, body = waveform_response(waveform, request.query_params)
        return JSONResponse(body, status_code=status)

    add_job_routes(app, state_ref, shown_node)

    @app.get("/", response_class=HTMLResponse)
    async def status_page() -> str:
        state = state_ref()
        published = state.published
        sampled = tuple(waveform.gpus()) if waveform is not None else ()
        seconds = min(60.0, waveform.max_seconds) if waveform is not None else 60.0
        return render_status_page(
            published.snapshot if published is not None else None,
            published.alerts if published is not None else (),
            health=published.health if published is not None else None,
            version=__version__,
            source=state.source,
            telemetry_path=telemetry_path,
            refresh_seconds=refresh_seconds,
            # the fast sampler's ring, for the devices it samples (asking for another is a 404)
            waveform_url=f"api/v1/waveform?gpu={{gpu}}&seconds={seconds:g}" if waveform is not None else "",
            waveform_gpus=sampled,
            waveform_seconds=seconds,
            node=shown_node,
            rules=state.rules,
        )

    return MetricsEndpoint(app, state_ref, telemetry_path, checks)
