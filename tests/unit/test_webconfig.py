"""--web.config.file parsing: valid files become the expected WebConfig, anything else one clear error."""

from __future__ import annotations

import string

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.web.webconfig import (
    ALLOWED_HEADERS,
    CIPHER_SUITES,
    CLIENT_AUTH_TYPES,
    CURVES,
    RateLimit,
    TLSServerConfig,
    WebConfig,
    WebConfigError,
    parse_go_duration,
    parse_web_config,
)

HASH = "$2b$10$cTu9zeTqcSuFlhqUjzlBCOpDiPJzlFBCFoPxORX/AmVts4qN7mrGO"


def parse(data: object) -> WebConfig:
    return parse_web_config(yaml.safe_dump(data), "/etc/amdgpu-exporter")


def test_empty_file_is_plain_http() -> None:
    assert parse_web_config("", "/x") == WebConfig()
    assert parse_web_config("# nothing\n", "/x") == WebConfig()


def test_full_file() -> None:
    config = parse(
        {
            "tls_server_config": {
                "cert_file": "tls/server.crt",
                "key_file": "/abs/server.key",
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": "ca.crt",
                "client_allowed_sans": ["prometheus.example"],
                "min_version": "TLS13",
                "cipher_suites": ["TLS_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
                "curve_preferences": ["X25519"],
            },
            "http_server_config": {"http2": False, "headers": {"x-frame-options": "DENY"}},
            "basic_auth_users": {"prom": HASH},
            "rate_limit": {"interval": "1m30s", "burst": 5},
        }
    )
    assert config.tls == TLSServerConfig(
        cert_file="/etc/amdgpu-exporter/tls/server.crt",
        key_file="/abs/server.key",
        client_ca_file="/etc/amdgpu-exporter/ca.crt",
        client_auth_type="RequireAndVerifyClientCert",
        client_allowed_sans=("prometheus.example",),
        min_version="TLS13",
        cipher_suites=("ECDHE-RSA-AES128-GCM-SHA256",),
        curve="X25519",
    )
    assert config.headers == (("X-Frame-Options", "DENY"),)
    assert config.users == {"prom": HASH.encode()}
    assert config.rate_limit == RateLimit(interval=90.0, burst=5)
    assert config.files == (
        "/etc/amdgpu-exporter/tls/server.crt",
        "/abs/server.key",
        "/etc/amdgpu-exporter/ca.crt",
    )


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ("tls_server_config: [", "line 1 is not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ({"tls_config": {}}, "unknown key 'tls_config'"),
        ({"tls_server_config": {"cert_file": "a"}}, "missing key_file"),
        ({"tls_server_config": {"key_file": "a"}}, "missing cert_file"),
        ({"tls_server_config": {"cert_file": "a", "cert": "b", "key_file": "k"}}, "not both"),
        ({"tls_server_config": {"min_version": "TLS13"}}, "but no cert_file"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "certfile": "c"}}, "unknown key 'certfile'"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "Yes"}}, "is not one of"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "c"}}, "NoClientCert"),
        (
            {"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAnyClientCert"}},
            "Python's ssl",
        ),
        (
            {"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "VerifyClientCertIfGiven"}},
            "needs client_ca_file",
        ),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_allowed_sans": ["x"]}}, "client_ca_file"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "SSL3"}}, "min_version"),
        (
            {"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS13", "max_version": "TLS12"}},
            "below min_version",
        ),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "cipher_suites": ["TLS_RSA_WITH_RC4"]}}, "cipher"),
        (
            {"tls_server_config": {"cert_file": "a", "key_file": "b", "curve_preferences": ["X25519", "CurveP256"]}},
            "one curve only",
        ),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "curve_preferences": ["P256"]}}, "is not one of"),
        ({"basic_auth_users": {"prom": "plaintext-password"}}, "not a bcrypt hash"),
        ({"basic_auth_users": {"a:b": HASH}}, "not a user name"),
        ({"basic_auth_users": ["prom"]}, "mapping of user"),
        ({"http_server_config": {"headers": {"Server": "x"}}}, "cannot be set"),
        ({"http_server_config": {"headers": {"X-Content-Type-Options": "sniff"}}}, "nosniff"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "DENY", "x-frame-options": "deny"}}}, "twice"),
        ({"http_server_config": {"headers": {"Content-Security-Policy": "a\nb"}}}, "one-line"),
        ({"http_server_config": {"http2": "yes"}}, "http2"),
        ({"rate_limit": {"interval": "1s"}}, "both interval"),
        ({"rate_limit": {"interval": "1s", "burst": 0}}, "at least 1"),
        ({"rate_limit": {"interval": "soon", "burst": 1}}, "not a duration"),
        ({"rate_limit": {"interval": 5, "burst": 1}}, "not a duration"),
    ],
)
def test_invalid_files_are_one_clear_sentence(data: object, needle: str) -> None:
    text = data if isinstance(data, str) else yaml.safe_dump(data)
    with pytest.raises(WebConfigError) as caught:
        parse_web_config(text, "/x")
    message = str(caught.value)
    assert needle in message
    assert "\n" not in message


def test_a_password_pasted_instead_of_a_hash_is_never_echoed() -> None:
    with pytest.raises(WebConfigError) as caught:
        parse({"basic_auth_users": {"prom": "hunter2-secret"}})
    assert "hunter2" not in str(caught.value)


def test_every_mapped_name_is_known() -> None:
    assert len(CLIENT_AUTH_TYPES) == 5
    assert set(ALLOWED_HEADERS) == {
        "Content-Security-Policy",
        "X-Frame-Options",
        "X-Content-Type-Options",
        "X-XSS-Protection",
        "Strict-Transport-Security",
    }
    assert all(v and "_" not in v for v in CIPHER_SUITES.values())
    assert set(CURVES) == {"CurveP256", "CurveP384", "CurveP521", "X25519"}


@pytest.mark.parametrize(
    ("text", "seconds"), [("1s", 1), ("500ms", 0.5), ("1m30s", 90), ("2h", 7200), ("1d", 86400), ("1w", 604800)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text, "x") == seconds


@pytest.mark.parametrize("text", ["", "1", "1 s", "s", "1.5s", "-1s", "0s", "1s1", "1x"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(WebConfigError):
        parse_go_duration(text, "x")


# --- fuzzing -------------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 100), st.text(string.printable, max_size=12), st.sampled_from([HASH])
)
_keys = st.sampled_from(
    [
        "tls_server_config",
        "http_server_config",
        "basic_auth_users",
        "rate_limit",
        "cert_file",
        "key_file",
        "client_auth_type",
        "client_ca_file",
        "min_version",
        "headers",
        "interval",
        "burst",
        "X-Frame-Options",
        "prom",
        *CLIENT_AUTH_TYPES,
    ]
)
_documents = st.recursive(
    _scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_keys, children, max_size=5)),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_documents)
def test_any_document_is_a_config_or_one_clear_error(document: object) -> None:
    try:
        config = parse_web_config(yaml.safe_dump(document), "/base")
    except WebConfigError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert isinstance(config, WebConfig)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_config_or_one_clear_error(raw: bytes) -> None:
    try:
        parse_web_config(raw.decode("utf-8", errors="replace"), "/base")
    except WebConfigError as error:
        assert "\n" not in str(error)


@st.composite
def _valid(draw: st.DrawFn) -> tuple[dict, WebConfig]:
    data: dict = {}
    tls = None
    if draw(st.booleans()):
        auth = draw(st.sampled_from(CLIENT_AUTH_TYPES))
        raw_tls: dict = {"cert_file": "c.pem", "key_file": "k.pem", "client_auth_type": auth}
        ca = ""
        if auth != "NoClientCert" and (auth != "RequestClientCert" or draw(st.booleans())):
            raw_tls["client_ca_file"] = "ca.pem"
            ca = "/base/ca.pem"
        suites = draw(st.lists(st.sampled_from(sorted(CIPHER_SUITES)), max_size=3, unique=True))
        if suites:
            raw_tls["cipher_suites"] = suites
        data["tls_server_config"] = raw_tls
        tls = TLSServerConfig(
            cert_file="/base/c.pem",
            key_file="/base/k.pem",
            client_ca_file=ca,
            client_auth_type=auth,
            cipher_suites=tuple(CIPHER_SUITES[s] for s in suites),
        )
    users = draw(st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=8), st.just(HASH), max_size=3))
    if users:
        data["basic_auth_users"] = users
    burst = draw(st.one_of(st.none(), st.integers(1, 1000)))
    if burst is not None:
        data["rate_limit"] = {"interval": f"{draw(st.integers(1, 999))}ms", "burst": burst}
    expected = WebConfig(
        tls=tls,
        basic_auth_users=tuple(sorted((u, HASH.encode()) for u in users)),
        rate_limit=RateLimit(parse_go_duration(data["rate_limit"]["interval"], ""), burst) if burst else None,
    )
    return data, expected


@settings(max_examples=200, deadline=None)
@given(_valid())
def test_valid_documents_parse_to_what_they_say(case: tuple[dict, WebConfig]) -> None:
    data, expected = case
    assert parse_web_config(yaml.safe_dump(data), "/base") == expected
