"""HTTP basic authentication against bcrypt hashes, with a cache of verified credentials.

bcrypt is deliberately slow (tens of ms at cost 10): paid on every scrape it would cost more
than the scrape. A credential that verified once is remembered as a keyed digest (never the
password) and later requests compare digests in constant time. Unverified attempts run on two
checker threads, so guessing cannot stall the loop. Each client address may have one check waiting
at a time, and an address whose last check failed (within FAILED_MEMORY seconds) waits behind every
address without such a failure: anonymous traffic from any number of addresses cannot hold a real
scraper's first check back for more than the checks already running. The order depends on the
address's history only, never on the user name. An unknown user is checked against the costliest
configured hash, so a wrong user and a wrong password take the same time (no user probing).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import heapq
import hmac
import itertools
import os
import threading
import time

import bcrypt

_CACHE_LIMIT = 1024
_QUEUE_LIMIT = 256
_CHECKERS = 2
FAILED_MEMORY = 300.0  # seconds an address's failed check puts it behind the others


def parse_basic_authorization(header: bytes | None) -> tuple[str, bytes] | None:
    """b'Basic dXNlcjpwYXNz' -> ('user', b'pass'); None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"basic" or not token:
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).partition(b":")
        return (user.decode("utf-8"), password) if sep else None
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
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
        self._waiting_clients: set[str] = set()
        self._failed_at: dict[str, float] = {}  # client address -> monotonic time of its last failed check
        self._free_checkers = _CHECKERS
        self._turns: list[tuple[int, int, asyncio.Future[None]]] = []  # (behind, arrival, wake-up), a heap
        self._arrivals = itertools.count()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=_CHECKERS, thread_name_prefix="bcrypt")
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
        if client in self._waiting_clients or len(self._waiting_clients) >= _QUEUE_LIMIT:
            raise Overloaded
        self._waiting_clients.add(client)
        try:
            await self._my_turn(client)
            try:
                loop = asyncio.get_running_loop()
                ok = await loop.run_in_executor(self._executor, self.check_slow, user, password)
            finally:
                self._next_turn()
        finally:
            self._waiting_clients.discard(client)
        if ok:
            self._failed_at.pop(client, None)
        else:
            if len(self._failed_at) >= _CACHE_LIMIT:
                self._failed_at.clear()
            self._failed_at[client] = time.monotonic()
        return ok

    async def _my_turn(self, client: str) -> None:
        """Wait for a free checker: addresses without a recent failure first, then in arrival order."""
        if self._free_checkers and not self._turns:
            self._free_checkers -= 1
            return
        failed = self._failed_at.get(client)
        behind = int(failed is not None and time.monotonic() - failed < FAILED_MEMORY)
        wake = asyncio.get_running_loop().create_future()
        heapq.heappush(self._turns, (behind, next(self._arrivals), wake))
        try:
            await wake
        except asyncio.CancelledError:
            if wake.done() and not wake.cancelled():
                self._next_turn()  # handed a checker just as it was cancelled: pass it on
            raise

    def _next_turn(self) -> None:
        while self._turns:
            _behind, _arrival, wake = heapq.heappop(self._turns)
            if not wake.done():
                wake.set_result(None)
                return
        self._free_checkers += 1

    def close(self) -> None:
        self._executor.shutdown(wait=False)
