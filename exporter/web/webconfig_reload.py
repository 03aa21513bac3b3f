"""--web.config.file, loaded at start and re-read when it (or a file it names) changes.

The daemon asks for the current configuration on every connection and request; at most once a
second that costs a few stat() calls, and only a changed size, mtime or inode leads to reading
and hashing the files. A change to a valid configuration applies to the next connection and
request; an invalid one keeps the last good configuration, is logged once and counted.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from structlog import get_logger

from exporter import boundedfile
from exporter.model import WebStats
from exporter.web.http_auth import BasicAuthVerifier
from exporter.web.http_log import REJECTION_REASONS, HttpStats
from exporter.web.ratelimit import TokenBucket
from exporter.web.webconfig import WebConfig, WebConfigError, parse_web_config
from exporter.web.webconfig_tls import build_ssl_context

MAX_WEB_CONFIG_BYTES = 1 << 20
_CLIENT_CERT_REQUIRED = frozenset({"RequireAnyClientCert", "RequireAndVerifyClientCert"})

log = get_logger("exporter.web.config")


@dataclass(frozen=True)
class ActiveWebConfig:
    """A loaded configuration with everything built from it."""

    config: WebConfig
    ssl_context: ssl.SSLContext | None
    verifier: BasicAuthVerifier
    bucket: TokenBucket | None
    headers: tuple[tuple[bytes, bytes], ...]  # http_server_config.headers as raw ASGI pairs


PLAIN = ActiveWebConfig(WebConfig(), None, BasicAuthVerifier({}), None, ())


def build_active(config: WebConfig, previous: ActiveWebConfig | None = None) -> ActiveWebConfig:
    """Builds the TLS context (reading the files); keeps the previous bucket and credential cache
    when their part of the configuration did not change."""
    context = build_ssl_context(config.tls) if config.tls is not None else None
    verifier = BasicAuthVerifier(config.users)
    bucket = None
    if config.rate_limit is not None:
        bucket = TokenBucket(config.rate_limit.interval, config.rate_limit.burst)
    if previous is not None:
        if previous.config.basic_auth_users == config.basic_auth_users:
            verifier = previous.verifier
        if previous.config.rate_limit == config.rate_limit:
            bucket = previous.bucket
    # Validated in webconfig.py: only the five allowed names, one-line values.
    headers = tuple((name.lower().encode("ascii"), value.encode("latin-1")) for name, value in config.headers)
    return ActiveWebConfig(config, context, verifier, bucket, headers)


def _weakening(previous: WebConfig, config: WebConfig) -> str:
    """What a reload from `previous` to `config` would switch off, or "". An editor that truncates
    the file before writing it, or a half-written copy, must never be taken for "no authentication"."""
    if (previous.tls is None) != (config.tls is None):
        return "switching TLS on or off"
    if previous.basic_auth_users and not config.basic_auth_users:
        return "turning basic authentication off"
    required_before = previous.tls is not None and previous.tls.client_auth_type in _CLIENT_CERT_REQUIRED
    if required_before and config.tls is not None and config.tls.client_auth_type not in _CLIENT_CERT_REQUIRED:
        return "no longer requiring client certificates"
    return ""


def _stat(path: str) -> tuple[str, int, int, int] | tuple[str]:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return (path,)
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)


def _digest(paths: tuple[str, ...]) -> str:
    hasher = hashlib.sha256()
    for path in paths:
        hasher.update(path.encode() + b"\0")
        try:
            hasher.update(boundedfile.read_bytes(path, "watched file", MAX_WEB_CONFIG_BYTES))
        except boundedfile.FileReadError as error:
            hasher.update(f"\0unreadable {error}".encode())
        hasher.update(b"\0")
    return hasher.hexdigest()


class WebConfigReloader:
    def __init__(self, path: str, check_interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.abspath(path)
        self.check_interval = check_interval
        self._clock = clock
        self.reload_successes = 0
        self.reload_failures = 0
        self.last_reload_ok = True
        self._active = PLAIN
        self._signature: tuple[object, ...] = ()
        self._good_digest = ""
        self._bad_digest = ""
        self._checked_at = clock()

    def _read_and_build(self, previous: ActiveWebConfig | None) -> ActiveWebConfig:
        """The configuration on disk, built; WebConfigError for anything wrong, whatever the file holds."""
        try:
            text = boundedfile.read_text(self.path, "the web configuration", MAX_WEB_CONFIG_BYTES)
            config = parse_web_config(text, os.path.dirname(self.path))
            refusal = _weakening(previous.config, config) if previous is not None else ""
            if refusal:
                raise WebConfigError(f"{refusal} needs a restart")
            return build_active(config, previous)
        except boundedfile.FileReadError as error:
            raise WebConfigError(error.reason) from None
        except WebConfigError:
            raise
        except Exception as error:
            raise WebConfigError(f"{type(error).__name__}: {error}") from None

    def _watched(self) -> tuple[str, ...]:
        return (self.path, *self._active.config.files)

    def _remember_good(self) -> None:
        # The configuration may name other files: watch those from now on.
        self._signature = tuple(_stat(p) for p in self._watched())
        self._good_digest = _digest(self._watched())
        self._bad_digest = ""

    def load(self) -> ActiveWebConfig:
        """The first load, at start-up: WebConfigError names the file."""
        try:
            self._active = self._read_and_build(None)
        except WebConfigError as error:
            raise WebConfigError(f"--web.config.file {self.path}: {error}") from None
        self._remember_good()
        log.info(
            "web_config_loaded",
            tls=self._active.ssl_context is not None,
            client_auth=self._active.config.tls.client_auth_type if self._active.config.tls else "NoClientCert",
            basic_auth_users=len(self._active.config.basic_auth_users),
            rate_limit=self._active.bucket is not None,
        )
        return self._active

    def current(self) -> ActiveWebConfig:
        now = self._clock()
        if now - self._checked_at >= self.check_interval:
            self._checked_at = now
            self.check()
        return self._active

    def check(self) -> bool:
        """Reload if anything watched changed; True when a new configuration took effect."""
        signature = tuple(_stat(p) for p in self._watched())
        if signature == self._signature:
            return False
        self._signature = signature
        digest = _digest(self._watched())
        if digest == self._good_digest:  # an invalid edit was reverted
            self.last_reload_ok, self._bad_digest = True, ""
            return False
        if digest == self._bad_digest:
            return False
        try:
            active = self._read_and_build(self._active)
        except WebConfigError as error:  # nothing a file holds may end the server: keep the last good state
            self._bad_digest = digest
            self.reload_failures += 1
            self.last_reload_ok = False
            log.warning("web_config_reload_failed", file=self.path, error=str(error), kept="last good configuration")
            return False
        self._active = active
        self._remember_good()
        self.reload_successes += 1
        self.last_reload_ok = True
        log.info("web_config_reloaded", file=self.path)
        return True


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
