"""The token bucket behind web config's rate_limit and the HTTP layer's rate-limited log."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """rate_limit: {interval, burst}: one token per interval, at most burst stored; no token is a 429."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if interval <= 0 or burst < 1:
            raise ValueError("interval must be > 0 and burst >= 1")
        self.interval = interval
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) / self.interval)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def retry_after(self) -> int:
        """Whole seconds until the next token (for the Retry-After header)."""
        missing = max(0.0, 1.0 - self._tokens)
        return max(1, int(missing * self.interval + 0.999))
