"""HTTP basic authentication against bcrypt hashes, with a cache of verified credentials.

bcrypt is deliberately slow (tens of ms at cost 10): paid on every scrape it would cost more
than the scrape. A credential that verified once is remembered as a keyed digest (never the
password) and later requests compare digests in constant time. Unverified attempts run on two
checker threads with a bounded queue, so guessing cannot stall the loop, and each client address
may have one check waiting at a time: the queue is first come, first served, so anonymous traffic
from any number of addresses delays a real scraper's first check by at most one check per address
and never locks it out. An unknown user is checked against the costliest configured hash, so a
wrong user and a wrong password take the same time (no user probing).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import hashlib
import hmac
import os
import threading

import bcrypt

_CACHE_LIMIT = 1024
_QUEUE_LIMIT = 256
_PER_CLIENT_LIMIT = 1


def parse_basic_authorization(header: bytes | None) -> tuple[str, bytes] | None:
    """b'Basic dXNlcjpwYXNz' -> ('user', b'pass'); None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"basic" or not token:
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class Overloaded(Exception):
    """This client already has a check waiting, or too many are queued: answered 429 at once."""


class BasicAuthVerifier:
    """Checks (user, password) against {user: bcrypt hash}; one instance per loaded configuration."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = dict(users)
        # bcrypt hashes are "$2b$NN$...": the costliest one stands in for unknown users.
        self._dummy_hash = max(self._users.values(), key=lambda hashed: int(hashed.split(b"$")[2]), default=b"")
        self._key = os.urandom(32)
        self._verified: dict[str, bytes] = {}  # user -> keyed digest of (hash, password) that verified
        self._lock = threading.Lock()
        self._pending = 0
        self._pending_by_client: dict[str, int] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="bcrypt")
        self.bcrypt_calls = 0

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def _digest(self, hashed: bytes, password: bytes) -> bytes:
        return hmac.new(self._key, hashed + b"\0" + password, hashlib.sha256).digest()

    def cached(self, user: str, password: bytes) -> bool:
        """True when this exact credential verified before (constant-time digest comparison)."""
        hashed = self._users.get(user)
        remembered = self._verified.get(user)
        if hashed is None or remembered is None:
            return False
        return hmac.compare_digest(self._digest(hashed, password), remembered)

    def check_slow(self, user: str, password: bytes) -> bool:
        """The bcrypt check (blocking); remembers a success."""
        hashed = self._users.get(user)
        self.bcrypt_calls += 1
        try:
            ok = bcrypt.checkpw(password, hashed if hashed is not None else self._dummy_hash)
        except ValueError:
            ok = False
        ok = ok and hashed is not None
        if ok:
            assert hashed is not None
            with self._lock:
                if len(self._verified) >= _CACHE_LIMIT:
                    self._verified.clear()
                self._verified[user] = self._digest(hashed, password)
        return ok

    async def check(self, user: str, password: bytes, client: str = "") -> bool:
        if self.cached(user, password):
            return True
        if self._pending >= _QUEUE_LIMIT or self._pending_by_client.get(client, 0) >= _PER_CLIENT_LIMIT:
            raise Overloaded
        self._pending += 1
        self._pending_by_client[client] = self._pending_by_client.get(client, 0) + 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self.check_slow, user, password)
        finally:
            self._pending -= 1
            left = self._pending_by_client.pop(client) - 1
            if left:
                self._pending_by_client[client] = left

    def close(self) -> None:
        self._executor.shutdown(wait=False)
