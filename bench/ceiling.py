"""The ceiling: a bare ASGI app on the same uvicorn, serving fixed bytes for every request.

Run as `python -m bench.ceiling --body FILE --listen 127.0.0.1:PORT [--content-type T] [--gzip]`.
It answers every request with the status, headers and body the exporter's /metrics fast path
sends for one kind of request (plain text, or OpenMetrics gzip as Prometheus asks), and does
nothing else, so the exporter's throughput divided by this one is the share of the
HTTP server's best that a scrape achieves.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn

from exporter.daemon import open_listener
from exporter.web.routes import TEXT_CONTENT_TYPE

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def bare_app(
    body: bytes, content_type: bytes = TEXT_CONTENT_TYPE, gzipped: bool = False
) -> Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if gzipped:
        headers.append((b"content-encoding", b"gzip"))
    headers.append((b"vary", b"Accept, Accept-Encoding"))
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    message = {"type": "http.response.body", "body": body}

    async def app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        await send(start)
        await send(message)

    return app


def uvicorn_config(app: Any) -> uvicorn.Config:
    """The settings exporter.daemon.serve gives uvicorn, so both servers run the same stack."""
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__)
    parser.add_argument("--body", required=True, help="file whose bytes every response carries")
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port")
    parser.add_argument("--content-type", default=TEXT_CONTENT_TYPE.decode())
    parser.add_argument("--gzip", action="store_true", help="the body is gzip-compressed: say so")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    listener = open_listener(host, int(port))
    app = bare_app(Path(args.body).read_bytes(), args.content_type.encode(), args.gzip)
    server = uvicorn.Server(uvicorn_config(app))
    asyncio.run(server.serve(sockets=[listener]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
