"""The exporter-toolkit web configuration file (--web.config.file), parsed and validated.

Pure: text in, a frozen WebConfig (or one WebConfigError sentence) out. Files the configuration
names are not opened here (webconfig_tls.py does that); relative paths are resolved against the
configuration file's folder, as exporter-toolkit does. Unknown keys are errors, as upstream's
strict YAML decoding makes them, so a typo never silently turns TLS or authentication off.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter import safeyaml
from exporter.config import ConfigError


class WebConfigError(ConfigError):
    """An invalid web configuration; the message is one sentence naming the key at fault."""


# Go's names -> OpenSSL's names (TLS 1.2 suites; the only ones either Go or Python lets you choose).
CIPHER_SUITES: Mapping[str, str] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
}
# Always enabled under TLS 1.3 and not selectable (Go ignores them in cipher_suites too).
TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"})
CURVES: Mapping[str, str] = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# What each client_auth_type becomes in OpenSSL's terms. Python's ssl always verifies a client
# certificate it asks for, so RequestClientCert only asks when a client CA is given and
# RequireAnyClientCert (accepted only with a client CA, see _tls below) verifies: both are
# stricter than Go, never looser.
VERIFY_MODES: Mapping[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
CLIENT_AUTH_TYPES = tuple(VERIFY_MODES)
# The response headers exporter-toolkit lets a configuration set, with the values it accepts
# (None: any value). Canonical spelling as sent.
ALLOWED_HEADERS: Mapping[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
# Each unverified request costs one bcrypt check at the hash's cost: 2^cost rounds, ~60 ms at 10 and
# ~1 s at 14 on a server core. A higher cost would let one anonymous request hold a checker for
# minutes (cost 31: days), so it is refused with the reason.
MIN_BCRYPT_COST, MAX_BCRYPT_COST = 4, 14
_DURATION_PART = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


@dataclass(frozen=True)
class TLSServerConfig:
    cert_file: str = ""  # absolute, or "" when the certificate is inline
    key_file: str = ""
    cert: str = ""  # inline PEM
    key: str = ""
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = ""  # "" = the highest this OpenSSL speaks
    cipher_suites: tuple[str, ...] = ()  # OpenSSL names, in the order given
    curve: str = ""  # OpenSSL name; Python's ssl can set one group only


@dataclass(frozen=True)
class RateLimit:
    interval: float  # seconds per token
    burst: int


@dataclass(frozen=True)
class WebConfig:
    tls: TLSServerConfig | None = None
    basic_auth_users: tuple[tuple[str, bytes], ...] = ()  # (user, bcrypt hash), sorted by user
    headers: tuple[tuple[str, str], ...] = ()  # response headers, canonical names
    rate_limit: RateLimit | None = None

    @property
    def users(self) -> dict[str, bytes]:
        return dict(self.basic_auth_users)

    @property
    def files(self) -> tuple[str, ...]:
        """The files this configuration reads (watched for changes besides the YAML itself)."""
        tls = self.tls
        return tuple(path for path in (tls.cert_file, tls.key_file, tls.client_ca_file) if path) if tls else ()


def parse_go_duration(text: Any, where: str) -> float:
    """Prometheus' duration syntax (1s, 500ms, 1m30s, 1h, 1d): seconds, > 0."""
    stripped = text.strip() if isinstance(text, str) else ""
    parts = _DURATION_PART.findall(stripped)
    if not parts or "".join(n + u for n, u in parts) != stripped:
        raise WebConfigError(f"{where}: {text!r} is not a duration such as 1s, 500ms or 1m30s")
    seconds = sum(int(n) * _DURATION_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise WebConfigError(f"{where}: {text!r} must be longer than zero")
    return float(seconds)


def _mapping(value: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    for key in value:
        if not isinstance(key, str) or key not in known:
            raise WebConfigError(f"{where}: unknown key {key!r} (known: {', '.join(known)})")
    return value


def _string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WebConfigError(f"{where} must be a string")
    return value


def _path(value: Any, where: str, base_dir: str) -> str:
    text = _string(value, where)
    if not text:
        return ""
    return os.path.normpath(os.path.join(base_dir, text))


def _string_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise WebConfigError(f"{where} must be a list of strings")
    return tuple(value)


def _tls(raw: Any, base_dir: str) -> TLSServerConfig | None:
    known = (
        "cert_file",
        "key_file",
        "cert",
        "key",
        "client_ca_file",
        "client_auth_type",
        "client_allowed_sans",
        "min_version",
        "max_version",
        "cipher_suites",
        "curve_preferences",
        "prefer_server_cipher_suites",
    )
    data = _mapping(raw, "tls_server_config", known)
    w = "tls_server_config."
    cert_file = _path(data.get("cert_file"), w + "cert_file", base_dir)
    key_file = _path(data.get("key_file"), w + "key_file", base_dir)
    cert = _string(data.get("cert"), w + "cert")
    key = _string(data.get("key"), w + "key")
    if not (cert_file or key_file or cert or key):
        # As upstream: a tls_server_config without a certificate serves plain HTTP; anything
        # else set in it then would be a silent no-op, so it is an error here.
        extra = sorted(k for k in data if data[k] not in (None, "", [], False))
        if extra:
            raise WebConfigError(f"tls_server_config sets {extra[0]} but no cert_file/key_file (or cert/key)")
        return None
    for name, from_file, inline in (("cert", cert_file, cert), ("key", key_file, key)):
        if from_file and inline:
            raise WebConfigError(f"tls_server_config: give {name}_file or {name}, not both")
        if not (from_file or inline):
            raise WebConfigError(f"tls_server_config: missing {name}_file (or an inline {name})")
    auth = _string(data.get("client_auth_type"), w + "client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(f"{w}client_auth_type: {auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}")
    client_ca = _path(data.get("client_ca_file"), w + "client_ca_file", base_dir)
    if client_ca and auth == "NoClientCert":
        raise WebConfigError("tls_server_config: client_ca_file is set but client_auth_type is NoClientCert")
    if not client_ca and auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
        raise WebConfigError(f"tls_server_config: client_auth_type {auth} needs client_ca_file")
    if not client_ca and auth == "RequireAnyClientCert":
        raise WebConfigError(
            "tls_server_config: RequireAnyClientCert accepts unverified certificates, which Python's ssl "
            "cannot do; give client_ca_file (certificates are then verified) or use RequireAndVerifyClientCert"
        )
    sans = _string_list(data.get("client_allowed_sans"), w + "client_allowed_sans")
    if sans and not client_ca:
        raise WebConfigError("tls_server_config: client_allowed_sans needs client_ca_file")
    min_version = _string(data.get("min_version"), w + "min_version") or "TLS12"
    max_version = _string(data.get("max_version"), w + "max_version")
    for name, version in (("min_version", min_version), ("max_version", max_version)):
        if version and version not in TLS_VERSIONS:
            raise WebConfigError(f"{w}{name}: {version!r} is not one of {', '.join(TLS_VERSIONS)}")
    if max_version and TLS_VERSIONS[max_version] < TLS_VERSIONS[min_version]:
        raise WebConfigError(f"tls_server_config: max_version {max_version} is below min_version {min_version}")
    suites: list[str] = []
    for name in _string_list(data.get("cipher_suites"), w + "cipher_suites"):
        if name in TLS13_SUITES:
            continue
        if name not in CIPHER_SUITES:
            raise WebConfigError(f"{w}cipher_suites: {name!r} is not a supported TLS 1.2 cipher suite")
        suites.append(CIPHER_SUITES[name])
    curves = _string_list(data.get("curve_preferences"), w + "curve_preferences")
    for name in curves:
        if name not in CURVES:
            raise WebConfigError(f"{w}curve_preferences: {name!r} is not one of {', '.join(CURVES)}")
    if len(curves) > 1:
        raise WebConfigError(
            f"{w}curve_preferences: Python's ssl can restrict key exchange to one curve only; list one of "
            f"{', '.join(curves)}"
        )
    prefer = data.get("prefer_server_cipher_suites")
    if prefer is not None and not isinstance(prefer, bool):
        raise WebConfigError(f"{w}prefer_server_cipher_suites must be true or false")
    return TLSServerConfig(
        cert_file=cert_file,
        key_file=key_file,
        cert=cert,
        key=key,
        client_ca_file=client_ca,
        client_auth_type=auth,
        client_allowed_sans=sans,
        min_version=min_version,
        max_version=max_version,
        cipher_suites=tuple(suites),
        curve=CURVES[curves[0]] if curves else "",
    )


def _users(raw: Any) -> tuple[tuple[str, bytes], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise WebConfigError("basic_auth_users must be a mapping of user: bcrypt hash")
    users = []
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: {user!r} is not a user name (non-empty, no ':')")
        if not isinstance(hashed, str) or (match := _BCRYPT_HASH.match(hashed)) is None:
            # Never echo the value: it may be a password pasted by mistake.
            raise WebConfigError(f"basic_auth_users: the value for {user!r} is not a bcrypt hash ($2y$10$...)")
        cost = int(match.group(1))
        if not MIN_BCRYPT_COST <= cost <= MAX_BCRYPT_COST:
            raise WebConfigError(
                f"basic_auth_users: the hash for {user!r} has bcrypt cost {cost}; this exporter accepts "
                f"{MIN_BCRYPT_COST} to {MAX_BCRYPT_COST}, since every unverified request pays one check at that "
                "cost (14 is about a second of a core; 10 or 12 is usual)"
            )
        users.append((user, hashed.encode("ascii")))
    return tuple(sorted(users))


def _headers(raw: Any) -> tuple[tuple[str, str], ...]:
    data = _mapping(raw, "http_server_config", ("http2", "headers"))
    # http2 is accepted for compatibility and otherwise ignored: this server speaks HTTP/1.1 only.
    if not isinstance(data.get("http2", True), bool):
        raise WebConfigError("http_server_config.http2 must be true or false")
    raw_headers = data.get("headers") or {}
    if not isinstance(raw_headers, dict):
        raise WebConfigError("http_server_config.headers must be a mapping of header: value")
    canonical = {name.lower(): name for name in ALLOWED_HEADERS}
    headers: dict[str, str] = {}
    for name, value in raw_headers.items():
        if not isinstance(name, str) or name.lower() not in canonical:
            raise WebConfigError(
                f"http_server_config.headers: {name!r} cannot be set (allowed: {', '.join(ALLOWED_HEADERS)})"
            )
        proper = canonical[name.lower()]
        if proper in headers:
            raise WebConfigError(f"http_server_config.headers: {proper} is given twice")
        if not isinstance(value, str) or not value or not value.isascii() or not value.isprintable():
            raise WebConfigError(f"http_server_config.headers.{proper} must be a one-line string")
        allowed = ALLOWED_HEADERS[proper]
        if allowed is not None and value.lower() not in allowed:
            raise WebConfigError(f"http_server_config.headers.{proper}: {value!r} is not one of {', '.join(allowed)}")
        headers[proper] = value
    return tuple(sorted(headers.items()))


def _rate_limit(raw: Any) -> RateLimit | None:
    data = _mapping(raw, "rate_limit", ("interval", "burst"))
    if not data:
        return None
    if "interval" not in data or "burst" not in data:
        raise WebConfigError("rate_limit needs both interval (a duration) and burst (a count)")
    burst = data["burst"]
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise WebConfigError(f"rate_limit.burst: {burst!r} must be a whole number of at least 1")
    return RateLimit(interval=parse_go_duration(data["interval"], "rate_limit.interval"), burst=burst)


def parse_web_config(text: str, base_dir: str) -> WebConfig:
    """The YAML text of a web configuration file -> WebConfig; WebConfigError on anything invalid."""
    try:
        data = safeyaml.safe_load(text, "the web configuration")
    except safeyaml.YamlLimitError as error:
        raise WebConfigError(str(error)) from None
    known = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
    data = _mapping(data, "the web configuration", known)
    return WebConfig(
        tls=_tls(data.get("tls_server_config"), base_dir),
        basic_auth_users=_users(data.get("basic_auth_users")),
        headers=_headers(data.get("http_server_config")),
        rate_limit=_rate_limit(data.get("rate_limit")),
    )
