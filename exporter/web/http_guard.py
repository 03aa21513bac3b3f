"""ASGI middleware applying the web configuration to every request: headers, rate limit, basic auth.

The order is exporter-toolkit's: the configured response headers go on every answer, then the
token bucket (429), then the credentials (401). Rejections are counted and logged rate-limited.
One bucket serves the whole server, as exporter-toolkit has: it caps what all clients together
can make the exporter do.

One deliberate difference from upstream: the liveness and readiness probes (/healthz, /readyz)
need no credentials and take no token. Kubernetes' httpGet probes cannot do basic auth without
putting the password in the pod spec, and a rate limit must never get a healthy pod restarted;
those two answers carry nothing but "ok"/"ready". TLS still applies to them.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from exporter.web.http_auth import Overloaded, parse_basic_authorization
from exporter.web.http_log import HttpStats
from exporter.web.routes import Receive, Scope, Send, send_response
from exporter.web.webconfig_reload import ActiveWebConfig

_OPEN_PATHS = frozenset(("/healthz", "/readyz"))
_REALM = (b"www-authenticate", b'Basic realm="amdgpu-exporter", charset="UTF-8"')


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


class WebGuard:
    def __init__(self, app: Any, current: Callable[[], ActiveWebConfig], stats: HttpStats) -> None:
        self.app = app
        self.current = current
        self.stats = stats

    def _reject(self, reason: str, scope: Scope, status: int) -> None:
        self.stats.reject(
            reason,
            "http_request_rejected",
            reason=reason,
            status=status,
            client=_client(scope),
            method=scope.get("method", ""),
            path=str(scope.get("path", ""))[:100],
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        active = self.current()
        if active.headers:
            extra = list(active.headers)
            inner = send

            async def send(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = dict(message)
                    message["headers"] = [*message.get("headers", ()), *extra]
                await inner(message)

        if scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if active.bucket is not None and not active.bucket.allow():
            self._reject("rate_limited", scope, 429)
            retry = str(active.bucket.retry_after()).encode()
            await send_response(send, 429, b"too many requests\n", [(b"retry-after", retry)])
            return
        verifier = active.verifier
        if verifier.enabled:
            authorization = next((value for name, value in scope["headers"] if name == b"authorization"), None)
            credentials = parse_basic_authorization(authorization)
            ok = False
            if credentials is not None:
                try:
                    ok = await verifier.check(*credentials, client=_client(scope))
                except Overloaded:
                    self._reject("auth_overloaded", scope, 429)
                    await send_response(send, 429, b"too many authentication attempts\n", [(b"retry-after", b"1")])
                    return
            if not ok:
                self._reject("unauthorized", scope, 401)
                await send_response(send, 401, b"unauthorized\n", [_REALM])
                return
        await self.app(scope, receive, send)
