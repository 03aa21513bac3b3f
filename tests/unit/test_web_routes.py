"""The HTTP routes over a published cycle: /metrics negotiation and fast path, readiness, the JSON API."""

from __future__ import annotations

import dataclasses
import gzip

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from exporter.alerting.rulefile import parse_rule_file
from exporter.cycle import PublishedState
from exporter.exposition.render import render
from exporter.model import AlertState, Published
from exporter.web.routes import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, create_app, wants_gzip, wants_openmetrics
from tests.unit.test_exposition import _snapshot

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


class Holder:
    """What the daemon's pipeline is to the app: something whose .state is replaced each cycle."""

    def __init__(self) -> None:
        self.state = PublishedState(source="sysfs", source_reason="chosen by --source")

    def publish(self, published: Published) -> None:
        self.state = PublishedState(
            source=self.state.source,
            source_reason=self.state.source_reason,
            published=published,
            metrics=render(published),
        )


@pytest.fixture
def served() -> tuple[Holder, TestClient]:
    holder = Holder()
    return holder, TestClient(create_app(lambda: holder.state, "/metrics"))


def test_before_the_first_cycle_everything_but_healthz_says_not_yet(served) -> None:
    _, client = served
    assert client.get("/healthz").status_code == 200
    for path in ("/metrics", "/readyz", "/api/v1/devices", "/api/v1/alerts"):
        assert client.get(path).status_code == 503, path
    assert "0 devices, 0 up" in client.get("/").text and "Waiting for the first poll cycle" in client.get("/").text


def test_metrics_formats_follow_accept_and_accept_encoding(served) -> None:
    holder, client = served
    published = _snapshot()
    holder.publish(published)
    expected = holder.state.metrics
    assert expected is not None
    plain = client.get("/metrics", headers={"accept-encoding": "identity"})
    assert plain.status_code == 200 and plain.headers["content-type"] == TEXT_CONTENT_TYPE.decode()
    assert plain.content == expected.text and "content-encoding" not in plain.headers
    om = client.get("/metrics", headers={"accept": PROMETHEUS_ACCEPT, "accept-encoding": "gzip"})
    assert om.headers["content-type"] == OPENMETRICS_CONTENT_TYPE.decode()
    assert om.headers["content-encoding"] == "gzip" and om.content == expected.openmetrics  # decoded by httpx
    assert om.headers["vary"] == "Accept, Accept-Encoding"
    refused = client.get(
        "/metrics", headers={"accept": "application/openmetrics-text;q=0", "accept-encoding": "gzip;q=0"}
    )
    assert refused.headers["content-type"] == TEXT_CONTENT_TYPE.decode() and "content-encoding" not in refused.headers
    assert refused.content == expected.text


def test_head_sends_the_length_without_a_body_and_other_methods_are_refused(served) -> None:
    holder, client = served
    holder.publish(_snapshot())
    head = client.head("/metrics", headers={"accept-encoding": "gzip"})
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(gzip.compress(holder.state.metrics.text, 5, mtime=0))
    post = client.post("/metrics")
    assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"


def test_api_serves_the_published_cycle(served) -> None:
    holder, client = served
    published = _snapshot()
    alert = AlertState(
        0, "GpuJunctionHot", "warning", True, 999.0, 86.0, suggestion="lower it", suggested_command="rocm-smi -d 0"
    )
    holder.publish(Published(published.snapshot, alerts=(alert,)))
    assert client.get("/readyz").text == "ready\n"
    devices = client.get("/api/v1/devices").json()
    assert devices["taken_at"] == 1001.0 and [d["gpu"] for d in devices["devices"]] == [0, 1, 2]
    assert devices["devices"][2]["up"] is False and devices["devices"][2]["down_reason"] == "timeout"
    assert devices["devices"][0]["sample"]["temperatures"] == {"junction": 71.0, "hbm0": 60.0}
    (served_alert,) = client.get("/api/v1/alerts").json()["alerts"]
    assert served_alert["state"] == "firing" and served_alert["suggested_command"] == "rocm-smi -d 0"
    # After it resolves, the restore advice (the one undo command) is served until it expires.
    restore = AlertState(
        0,
        "GpuJunctionHot",
        "warning",
        False,
        1000.0,
        79.0,
        suggestion="restore",
        suggested_command="rocm-smi -d 0 --resetclocks",
        undo_command="rocm-smi -d 0 --resetclocks",
        cool_since=1000.0,
    )
    holder.publish(Published(published.snapshot, alerts=(restore,)))
    (served_alert,) = client.get("/api/v1/alerts").json()["alerts"]
    assert served_alert["state"] == "inactive" and served_alert["undo_command"] == "rocm-smi -d 0 --resetclocks"
    assert served_alert["suggested_command"] == "rocm-smi -d 0 --resetclocks" and served_alert["cool_since"] == 1000.0
    landing = client.get("/").text
    assert "3 devices, 2 up · source sysfs" in landing  # the status page (tests/unit/test_status_page.py)
    assert landing.count('<article class="tile') == 3 and "down: timeout" in landing


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        ("", False),
        ("*/*", False),
        (PROMETHEUS_ACCEPT, True),
        ("application/openmetrics-text", True),
        ("APPLICATION/OPENMETRICS-TEXT; version=1.0.0", True),
        ("application/openmetrics-text;q=0", False),
        ("application/openmetrics-text;q=0.0, text/plain", False),
        ("text/plain;q=1, application/openmetrics-text;q=0.5", False),
        ("text/plain;q=0.2, application/openmetrics-text;q=0.5", True),
        ("application/openmetrics-text;q=nonsense", False),
    ],
)
def test_accept(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept.encode()) is openmetrics


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("", False),
        ("gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("*", True),
        ("*;q=0", False),
        ("gzip;q=0, *", False),
        ("identity", False),
    ],
)
def test_accept_encoding(accept_encoding: str, gzipped: bool) -> None:
    assert wants_gzip(accept_encoding.encode()) is gzipped


@given(st.binary(max_size=200))
def test_any_header_bytes_give_an_answer(header: bytes) -> None:
    assert isinstance(wants_openmetrics(header), bool) and isinstance(wants_gzip(header), bool)


def test_a_render_failure_is_a_500_and_a_failing_readiness_until_a_render_works() -> None:
    from exporter.pipeline.readiness import Readiness

    class Broken:
        def cached(self, openmetrics: bool, gzipped: bool) -> None:
            return None

        def body(self, openmetrics: bool, gzipped: bool) -> bytes:
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")

    holder = Holder()
    readiness = Readiness(interval=1e9)
    client = TestClient(create_app(lambda: holder.state, "/metrics", readiness))
    published = _snapshot()
    holder.state = PublishedState(published=published, metrics=Broken())  # type: ignore[arg-type]
    assert client.get("/metrics").status_code == 500
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "stage render is failing" in ready.text
    assert readiness.failures == {"render": 1}
    holder.publish(published)
    assert client.get("/metrics").status_code == 200
    assert client.get("/readyz").status_code == 200


def test_the_node_name_and_the_published_rules_reach_the_api_and_the_page() -> None:
    holder = Holder()
    client = TestClient(create_app(lambda: holder.state, "/metrics", node="gpu-node-7"))
    holder.publish(_snapshot())
    assert client.get("/api/v1/devices").json()["node"] == "gpu-node-7"
    landing = client.get("/").text
    assert '<h1 id="node">gpu-node-7</h1>' in landing and 'class="lvl-warning"' not in landing
    # a rule file reloaded with a lower junction threshold colours the 71 °C junction of GPU 0
    rules = parse_rule_file(
        "rules:\n  - {alert: Warm, metric: temperature_celsius, sensor: junction, comparison: '>', threshold: 70,"
        " for: 1s, severity: warning}\n"
    ).rules
    holder.state = dataclasses.replace(holder.state, rules=rules)
    assert 'data-field="junction" class="lvl-warning">71 °C' in client.get("/").text
