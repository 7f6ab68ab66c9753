"""A token bucket on a clock handed in: `burst` at once, then `rate` a second (golang.org/x/time's
limiter, which client-go's rate limiters wrap). The metrics server budgets its reviews with one
(`vigil.core.access.ReviewBudget`), the event correlator each object's events
(`vigil.core.events`). Times are a monotonic clock's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float
    burst: int
    _tokens: float = float("nan")
    _at: float = float("nan")

    def delay(self, now: float) -> float:
        """Seconds from `now` until `take` would let one more go (0: at once); counts nothing.
        A waiter sleeps this long instead of polling (`kubectl vigil redrive`)."""
        if self._tokens != self._tokens:  # never used: full
            return 0.0
        tokens = min(float(self.burst), self._tokens + max(0.0, now - self._at) * self.rate)
        return max(0.0, (1.0 - tokens) / self.rate)

    def take(self, now: float) -> bool:
        """Whether one more may go at `now` (and it is counted if so)."""
        if self._tokens != self._tokens:  # first use: full
            self._tokens, self._at = float(self.burst), now
        self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = max(self._at, now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
