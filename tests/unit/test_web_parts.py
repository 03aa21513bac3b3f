"""The parts behind --web.config.file: token bucket, credential cache, TLS context errors, reloader."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import pytest

from exporter.web.http_auth import BasicAuthVerifier, parse_basic_authorization
from exporter.web.http_log import HttpStats, RateLimitedLog
from exporter.web.http_server import ConnectionTable, HttpLimits, Slot, connection_budget
from exporter.web.ratelimit import TokenBucket
from exporter.web.webconfig import TLSServerConfig, WebConfigError
from exporter.web.webconfig_reload import WebConfigReloader
from exporter.web.webconfig_tls import build_ssl_context
from tests.webtls import Pki, bcrypt_hash, make_pki, write_web_config


class Recorder:
    """Stands in for a module's structlog logger (whatever structlog's global configuration is)."""

    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []

    def _log(self, event: str, **fields: object) -> None:
        self.events.append({"event": event, **fields})

    info = warning = error = _log


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    recorder = Recorder()
    from exporter.web import http_log, webconfig_reload

    monkeypatch.setattr(http_log, "log", recorder)
    monkeypatch.setattr(webconfig_reload, "log", recorder)
    return recorder.events


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_allows_burst_then_one_per_interval() -> None:
    clock = Clock()
    bucket = TokenBucket(interval=2.0, burst=3, clock=clock)
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]
    assert bucket.retry_after() == 2
    clock.now += 1.0
    assert not bucket.allow()
    clock.now += 1.0
    assert bucket.allow()
    clock.now += 1000
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]


def test_basic_authorization_header_parsing() -> None:
    token = base64.b64encode(b"prom:pa:ss").decode()
    assert parse_basic_authorization(f"Basic {token}".encode()) == ("prom", b"pa:ss")
    assert parse_basic_authorization(f"basic  {token}".encode()) == ("prom", b"pa:ss")
    for bad in (None, b"", b"Bearer abc", b"Basic", b"Basic !!!", b"Basic " + base64.b64encode(b"nocolon")):
        assert parse_basic_authorization(bad) is None


def test_a_verified_credential_is_cached_and_a_wrong_one_never_is() -> None:
    verifier = BasicAuthVerifier({"prom": bcrypt_hash("secret", rounds=4).encode()})

    async def run() -> list[bool]:
        return [
            await verifier.check("prom", b"secret"),
            await verifier.check("prom", b"secret"),
            await verifier.check("prom", b"wrong"),
            await verifier.check("prom", b"wrong"),
            await verifier.check("nobody", b"secret"),
        ]

    assert asyncio.run(run()) == [True, True, False, False, False]
    # one bcrypt for the good password, then every failure pays its own (unknown users too)
    assert verifier.bcrypt_calls == 4
    assert verifier.cached("prom", b"secret")
    assert not verifier.cached("prom", b"secre")


def test_rate_limited_log_reports_what_it_suppressed(logs: list[dict[str, object]]) -> None:
    clock = Clock()
    limited = RateLimitedLog(burst=2, per_seconds=10, clock=clock)
    results = [limited.warning("bad_request", n=i) for i in range(10)]
    clock.now += 5  # one token back
    limited.warning("bad_request", n=10)
    assert results == [True, True] + [False] * 8
    assert [entry["n"] for entry in logs] == [0, 1, 10]
    assert logs[-1]["suppressed_since_last"] == 8


def test_connection_table_evicts_the_oldest_idle_connection_never_a_busy_one() -> None:
    stats = HttpStats()
    table = ConnectionTable(HttpLimits(max_connections=2), stats)
    closed: list[str] = []
    busy = Slot(lambda reason: closed.append("busy"), "busy")
    idle = Slot(lambda reason: closed.append("idle"), "waiting")
    assert table.admit(busy) and table.admit(idle)
    newcomer = Slot(lambda reason: closed.append("new"), "waiting")
    assert table.admit(newcomer)
    assert closed == ["idle"]
    assert stats.rejections["idle_evicted"] == 1
    newcomer.enter("busy")
    assert not table.admit(Slot(lambda reason: None, "waiting"))
    assert stats.rejections["connection_limit"] == 1
    assert stats.open_connections == 2


def test_connection_budget_leaves_descriptors_for_device_reads() -> None:
    assert connection_budget(2000, 1024, 40, 8) == 1024 - 40 - 64 - (16 + 8) * 8  # kept files + transient reads
    assert connection_budget(512, 1 << 20, 40, 8) == 512
    assert connection_budget(512, 100, 90, 8) == 4


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_ssl_context_from_good_files(pki: Pki) -> None:
    tls = TLSServerConfig(
        cert_file=str(pki.server_cert),
        key_file=str(pki.server_key),
        client_ca_file=str(pki.ca),
        client_auth_type="RequireAndVerifyClientCert",
        cipher_suites=("ECDHE-ECDSA-AES128-GCM-SHA256",),
        curve="X25519",
    )
    context = build_ssl_context(tls)
    assert context.verify_mode.name == "CERT_REQUIRED"
    assert context.minimum_version.name == "TLSv1_2"
    inline = TLSServerConfig(cert=pki.server_cert.read_text(), key=pki.server_key.read_text())
    assert build_ssl_context(inline).verify_mode.name == "CERT_NONE"


def test_ssl_context_errors_are_one_sentence(pki: Pki, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    from tests.webtls import _openssl

    _openssl("ec", "-in", str(pki.server_key), "-aes256", "-passout", "pass:x", "-out", str(encrypted), cwd=tmp_path)
    cases = {
        "does not match": TLSServerConfig(cert_file=str(pki.server_cert), key_file=str(pki.client_key)),
        "missing: cannot read it": TLSServerConfig(cert_file=str(pki.server_cert), key_file=str(tmp_path / "missing")),
        "not a regular file": TLSServerConfig(cert_file=str(pki.server_cert), key_file=str(tmp_path)),
        "holds no PEM certificate": TLSServerConfig(cert_file=str(pki.server_key), key_file=str(pki.server_key)),
        "holds no PEM private key": TLSServerConfig(cert_file=str(pki.server_cert), key_file=str(pki.server_cert)),
        "is encrypted": TLSServerConfig(cert_file=str(pki.server_cert), key_file=str(encrypted)),
    }
    for needle, tls in cases.items():
        with pytest.raises(WebConfigError) as caught:
            build_ssl_context(tls)
        assert needle in str(caught.value), (needle, str(caught.value))
        assert "\n" not in str(caught.value)
        assert "PRIVATE KEY" not in str(caught.value)


def test_reloader_applies_valid_edits_and_keeps_the_last_good_one(
    pki: Pki, tmp_path: Path, logs: list[dict[str, object]]
) -> None:
    path = tmp_path / "web.yml"
    first, second = bcrypt_hash("one", 4), bcrypt_hash("two", 4)
    write_web_config(path, {"basic_auth_users": {"prom": first}})
    clock = Clock()
    reloader = WebConfigReloader(str(path), check_interval=1.0, clock=clock)
    assert reloader.load().config.users == {"prom": first.encode()}
    write_web_config(path, {"basic_auth_users": {"prom": second}})
    assert reloader.current().config.users == {"prom": first.encode()}  # not re-checked within a second
    clock.now += 1.1
    assert reloader.current().config.users == {"prom": second.encode()}
    assert (reloader.reload_successes, reloader.reload_failures) == (1, 0)
    logs.clear()
    path.write_text("basic_auth_users: {prom: plain-text}\n")
    for _ in range(5):
        clock.now += 1.1
        os.utime(path)  # touched again and again: still one failure, logged once
        assert reloader.current().config.users == {"prom": second.encode()}
    assert reloader.reload_failures == 1 and not reloader.last_reload_ok
    assert [entry["event"] for entry in logs] == ["web_config_reload_failed"]
    write_web_config(path, {"basic_auth_users": {"prom": second}})  # the edit reverted
    clock.now += 1.1
    reloader.current()
    assert reloader.last_reload_ok and reloader.reload_failures == 1
    # TLS may not be switched on by an edit (nor off): that needs a restart
    write_web_config(path, {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}})
    clock.now += 1.1
    assert reloader.current().ssl_context is None
    assert reloader.reload_failures == 2


def test_reloader_sees_a_rotated_certificate(pki: Pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    tls = {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    path = write_web_config(tmp_path / "web.yml", tls)
    clock = Clock()
    reloader = WebConfigReloader(str(path), clock=clock)
    before = reloader.load().ssl_context
    cert.write_bytes(pki.client_cert.read_bytes())  # a certificate without its key: invalid, kept old
    clock.now += 1.1
    assert reloader.current().ssl_context is before and reloader.reload_failures == 1
    key.write_bytes(pki.client_key.read_bytes())  # now the pair matches: applied
    clock.now += 1.1
    assert reloader.current().ssl_context is not before and reloader.reload_successes == 1


def test_startup_load_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"--web.config.file .*missing.yml: cannot read it: No such file"):
        WebConfigReloader(str(tmp_path / "missing.yml")).load()
