"""Counters of the HTTP layer, copied into each poll cycle's ExporterStats.web (exposition/metrics.py
declares their families, shown only with --web.config.file)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from exporter.model import WebStats

if TYPE_CHECKING:
    from exporter.web.webconfig_reload import WebConfigReloader

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

    def reject(self, reason: str) -> None:
        self.rejections[reason] += 1


def web_stats(stats: HttpStats, reloader: WebConfigReloader) -> WebStats:
    """An immutable copy for one cycle."""
    return WebStats(
        config_reload_successes=reloader.reload_successes,
        config_reload_failures=reloader.reload_failures,
        config_last_reload_ok=reloader.last_reload_ok,
        rejections=tuple((reason, stats.rejections.get(reason, 0)) for reason in REJECTION_REASONS),
        open_connections=stats.open_connections,
        max_connections=stats.max_connections,
    )
