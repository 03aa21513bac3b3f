"""What the HTTP layer reports: access and protocol errors through structlog, rate-limited per
event, and counters of rejections and connections.

A scanner or a broken client can cause thousands of errors a second; each event name may log a
few lines, then stays quiet and reports how many it suppressed with its next line. The standard
library loggers of uvicorn and asyncio (which print tracebacks and plain-text lines) are routed
here too. The counters are copied into each poll cycle's ExporterStats.web (exposition/metrics.py
declares their families, shown only with --web.config.file).
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from structlog import get_logger

from exporter.web.ratelimit import TokenBucket

log = get_logger("exporter.web")


class RateLimitedLog:
    """One token bucket per event name: `burst` lines, then one per per_seconds/burst."""

    def __init__(self, burst: int = 5, per_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._new_bucket = functools.partial(TokenBucket, per_seconds / burst, burst, clock)
        self._buckets: dict[str, TokenBucket] = {}
        self._suppressed: Counter[str] = Counter()

    def warning(self, event: str, **fields: Any) -> bool:
        """Logs unless this event has logged too often lately; True when it logged."""
        bucket = self._buckets.get(event) or self._buckets.setdefault(event, self._new_bucket())
        if not bucket.allow():
            self._suppressed[event] += 1
            return False
        if self._suppressed[event]:
            fields["suppressed_since_last"] = self._suppressed.pop(event)
        log.warning(event, **fields)
        return True


LIMITED = RateLimitedLog()


class _ToStructlog(logging.Handler):
    """uvicorn.error / asyncio records -> one rate-limited structlog event, no traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        fields: dict[str, Any] = {"logger": record.name, "message": message[:200]}
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            fields["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        event = "http_server_error" if record.levelno >= logging.ERROR else "http_protocol_warning"
        LIMITED.warning(event, **fields)


def route_library_logs() -> None:
    """Send uvicorn's and asyncio's warnings through the rate-limited structlog path."""
    handler = _ToStructlog(level=logging.WARNING)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.WARNING)


REJECTION_REASONS = (
    "unauthorized",
    "rate_limited",
    "auth_overloaded",
    "header_too_large",
    "too_many_headers",
    "header_timeout",
    "response_timeout",
    "bad_request",
    "connection_limit",
    "idle_evicted",
    "tls_handshake",
    "client_cert_not_allowed",
)


class HttpStats:
    def __init__(self) -> None:
        self.rejections: Counter[str] = Counter()
        self.open_connections = 0
        self.max_connections = 0

    def reject(self, reason: str, event: str, /, **fields: Any) -> None:
        self.rejections[reason] += 1
        LIMITED.warning(event, **fields)
