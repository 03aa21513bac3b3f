"""Counters of the HTTP layer and their Prometheus families (registered when --web.config.file is used).

The families are declared here (WEB_METRICS, same shape as exposition.EXPORTER_METRICS) until they
join the one metric declaration table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from exporter.web.webconfig_reload import WebConfigReloader

WEB_METRICS: tuple[tuple[str, str, str, str], ...] = (
    (
        "amdgpu_exporter_web_config_reloads_total",
        "counter",
        "result",
        "Reloads of --web.config.file after a change, by result (failure: the last good one was kept).",
    ),
    (
        "amdgpu_exporter_web_config_last_reload_successful",
        "gauge",
        "",
        "1 if the web configuration on disk is the one in effect, 0 after an invalid edit.",
    ),
    (
        "amdgpu_exporter_http_rejections_total",
        "counter",
        "reason",
        "Connections and requests refused by the HTTP layer, by reason.",
    ),
    ("amdgpu_exporter_http_connections", "gauge", "", "Open HTTP connections (including TLS handshakes)."),
    ("amdgpu_exporter_http_max_connections", "gauge", "", "Cap on open HTTP connections (from the file budget)."),
)
_HELP = {name: text for name, _, _, text in WEB_METRICS}

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


class WebCollector:
    """prometheus-client collector over HttpStats and the reloader."""

    def __init__(self, stats: HttpStats, reloader: WebConfigReloader | None) -> None:
        self.stats = stats
        self.reloader = reloader

    def collect(self) -> Iterator[Metric]:
        if self.reloader is not None:
            reloads = CounterMetricFamily(
                "amdgpu_exporter_web_config_reloads",
                _HELP["amdgpu_exporter_web_config_reloads_total"],
                labels=("result",),
            )
            reloads.add_metric(["success"], float(self.reloader.reload_successes))
            reloads.add_metric(["failure"], float(self.reloader.reload_failures))
            yield reloads
            ok = GaugeMetricFamily(
                "amdgpu_exporter_web_config_last_reload_successful",
                _HELP["amdgpu_exporter_web_config_last_reload_successful"],
            )
            ok.add_metric([], 1.0 if self.reloader.last_reload_ok else 0.0)
            yield ok
        rejections = CounterMetricFamily(
            "amdgpu_exporter_http_rejections", _HELP["amdgpu_exporter_http_rejections_total"], labels=("reason",)
        )
        for reason in REJECTION_REASONS:
            rejections.add_metric([reason], float(self.stats.rejections.get(reason, 0)))
        yield rejections
        for name, value in (
            ("amdgpu_exporter_http_connections", self.stats.open_connections),
            ("amdgpu_exporter_http_max_connections", self.stats.max_connections),
        ):
            gauge = GaugeMetricFamily(name, _HELP[name])
            gauge.add_metric([], float(value))
            yield gauge
