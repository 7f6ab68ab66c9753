"""A token bucket on a clock handed in: `burst` at once, then `rate` a second (golang.org/x/time's
limiter, which client-go's rate limiters wrap). The event correlator paces each object's events
with one (`vigil.core.events`), `kubectl vigil redrive` its writes.

`SourceBudget` is costly work done for callers known only by their address (a token's check
before anyone is authenticated): one bucket per source, so that a flood from one address spends
that address's budget alone, and a global bucket that caps the sum whatever the number of
addresses. The metrics server budgets its reviews with one (`vigil.core.access.ReviewBudget`),
the heartbeat endpoint its signature checks (`vigil.servers.beats`). Times are a monotonic
clock's."""

from __future__ import annotations

from dataclasses import dataclass, field

from vigil.core.lru import Lru

# Sources whose buckets are kept: a source not among the most recently heard comes back with a
# full bucket, so a flood of addresses gets no more than the global bucket lets through, and the
# memory stays bounded (a bucket is ~0.2 KiB: ~2 MiB at most).
MAX_SOURCES = 8192


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


@dataclass
class SourceBudget:
    """A global bucket (`rate`, `burst`) and one per source (`source_rate`, `source_burst`), the
    buckets of at most `sources` sources kept, the least recently heard going first. One more
    goes only when both its source's bucket and the global one have a token, and then both are
    spent: a refusal spends nothing, so a source refused because others drained the global
    bucket keeps its own share for later."""

    rate: float
    burst: int
    source_rate: float
    source_burst: int
    sources: int = MAX_SOURCES
    _global: TokenBucket = field(init=False, repr=False)
    _by_source: Lru[str, TokenBucket] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._global = TokenBucket(self.rate, self.burst)
        self._by_source = Lru(self.sources)

    def take(self, source: str | None, now: float) -> bool:
        """Whether one more may go for `source` at `now` (counted if so). A source of None (an
        address not known) is held to the global bucket alone."""
        if source is None:
            return self._global.take(now)
        bucket = self._by_source.get(source)
        if bucket is None:
            bucket = TokenBucket(self.source_rate, self.source_burst)
            self._by_source.put(source, bucket)
        if bucket.delay(now) > 0.0 or self._global.delay(now) > 0.0:
            return False
        return bucket.take(now) and self._global.take(now)

    def __len__(self) -> int:
        """The sources whose buckets are kept."""
        return len(self._by_source)
