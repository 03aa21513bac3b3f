"""The response headers a web configuration may add (http_server_config.headers), as raw ASGI pairs."""

from __future__ import annotations

from exporter.web.webconfig import WebConfig


def response_headers(config: WebConfig) -> list[tuple[bytes, bytes]]:
    """Validated in webconfig.py: only the five allowed names, one-line values."""
    return [(name.lower().encode("ascii"), value.encode("latin-1")) for name, value in config.headers]
