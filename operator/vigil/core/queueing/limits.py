"""The two limits a queue puts on starts besides maxRunning: a token bucket for
maxStartsPerSecond, and the retry budget's sliding window. Pure values and counters; every time
is a float of seconds passed in."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# The retry budget's sliding window, counted in whole seconds. A minute is the time scale of
# jobs (the default backoff's first steps are 10 s and 20 s, so the retries a burst of failures
# asks for are weighed against the burst of starts that caused them), and short enough that a
# budget spent in an outage comes back a minute after it.
RETRY_WINDOW_SECONDS = 60

# The floor: retries a queue may start per window whatever its starts, so a quiet queue (a few
# starts an hour) still retries its rare failure at once. It grows with maxRunning, the
# capacity the queue's owner already granted: in a storm where every attempt fails, retries
# without fresh work behind them refill at most a tenth of the queue's slots per minute. The
# price: after such an outage the backlog of retries drains at that pace (plus the budget's
# share of fresh starts); a queue whose downstream recovers faster raises retryBudget (1: off).
RETRY_FLOOR_MIN = 3
RETRY_FLOOR_SHARE = 0.1

# The token bucket holds a tenth of a second of starts, at least one start. Starts are spaced
# as asked for (a burst of submissions reaches what the jobs call at most 0.1 s of load at
# once), and the shell wakes at most about ten times a second per queue to start the next few,
# whatever the rate: a burst of 1 at 1,000 starts/s would wake it 1,000 times a second.
BURST_SECONDS = 0.1

_EPSILON = 1e-9  # float slack: 0.1 x 30 must count as 3


def burst_for(rate: float) -> float:
    """The bucket's capacity at `rate` starts per second (see BURST_SECONDS)."""
    return max(1.0, rate * BURST_SECONDS)


@dataclass(frozen=True)
class TokenBucket:
    """A token bucket of capacity `burst` that refills continuously at `rate` tokens a second; a
    start takes a token. Over any span of T seconds it lets at most `burst + rate x T` starts
    through. A value: each operation returns a new bucket.

    It is kept as `full_at`, the time at which it is full again (the "theoretical arrival time"
    of GCRA, the same limiter): level(t) = burst - rate x (full_at - t). `ready` and
    `next_token_at` then compare and return one and the same float, so a wake at
    `next_token_at` always finds a token; a level kept as a float would miss it by a rounding
    error at epoch-sized times (2e-7 s apart) and wake again and again. A `now` before the last
    take (the wall clock stepped back) finds the bucket emptier, never fuller: starts are delayed
    by the step, never sped up.
    """

    rate: float
    burst: float
    full_at: float

    @classmethod
    def full(cls, rate: float, now: float) -> TokenBucket:
        return cls(rate, burst_for(rate), now)

    def level(self, now: float) -> float:
        return max(0.0, self.burst - self.rate * max(0.0, self.full_at - now))

    def next_token_at(self, now: float) -> float:
        """The earliest time from `now` at which a start may take a token."""
        return max(now, self.full_at - (self.burst - 1.0) / self.rate)

    def ready(self, now: float) -> bool:
        return self.next_token_at(now) <= now

    def take(self, now: float) -> TokenBucket:
        if not self.ready(now):
            raise ValueError("no token to take")
        return replace(self, full_at=max(self.full_at, now) + 1.0 / self.rate)

    def with_rate(self, rate: float, now: float) -> TokenBucket:
        """The bucket after maxStartsPerSecond changed: what is in it stays, up to the new burst."""
        burst = burst_for(rate)
        return TokenBucket(rate, burst, now + (burst - min(burst, self.level(now))) / rate)


def retry_floor(max_running: int) -> int:
    """Retries a queue may start per window whatever its starts (see RETRY_FLOOR_*)."""
    return max(RETRY_FLOOR_MIN, math.ceil(RETRY_FLOOR_SHARE * max_running))


def retry_allowed(retries: int, starts: int, budget: float, floor: int) -> bool:
    """Whether one more retry may start, given the retries and starts (retries included) already
    in the window: after it, retries <= max(floor, budget x starts), itself counted in both."""
    return retries + 1 <= max(floor, budget * (starts + 1)) + _EPSILON


class RetryWindow:
    """The attempt starts of one queue over the last RETRY_WINDOW_SECONDS, and how many of them
    were retries, in one-second buckets.

    Remembers: for each of the last `seconds` whole seconds, the starts and retries counted in
    it, and the totals. Bound: 2 x `seconds` integers, whatever the rate of starts. The window
    at time t is the whole seconds floor(t) - seconds + 1 ... floor(t) (so it reaches between
    seconds - 1 and seconds into the past). Time never goes back here: a `now` before the newest
    second seen counts in that second. Forgotten on restart: an empty window allows `floor`
    retries and no more, so a restart never loosens the budget by more than one floor.
    """

    def __init__(self, seconds: int = RETRY_WINDOW_SECONDS) -> None:
        self.seconds = seconds
        self._starts = [0] * seconds
        self._retries = [0] * seconds
        self._second: int | None = None  # the newest whole second seen
        self._start_total = 0
        self._retry_total = 0

    def _advance(self, now: float) -> int:
        second = math.floor(now)
        if self._second is None:
            self._second = second
        elif second > self._second:
            if second - self._second >= self.seconds:
                self._starts = [0] * self.seconds
                self._retries = [0] * self.seconds
                self._start_total = self._retry_total = 0
            else:
                for passed in range(self._second + 1, second + 1):
                    i = passed % self.seconds
                    self._start_total -= self._starts[i]
                    self._retry_total -= self._retries[i]
                    self._starts[i] = self._retries[i] = 0
            self._second = second
        return self._second

    def counts(self, now: float) -> tuple[int, int]:
        """(starts, retries) in the window at `now`; retries are counted among the starts."""
        self._advance(now)
        return self._start_total, self._retry_total

    def record(self, now: float, retry: bool) -> int:
        """Counts a start at `now`; returns its second, for `unrecord`."""
        second = self._advance(now)
        i = second % self.seconds
        self._starts[i] += 1
        self._start_total += 1
        if retry:
            self._retries[i] += 1
            self._retry_total += 1
        return second

    def unrecord(self, second: int, retry: bool) -> None:
        """Takes back a start `record` counted in `second`, if that second is still in the window."""
        if self._second is None or not self._second - self.seconds < second <= self._second:
            return
        i = second % self.seconds
        if self._starts[i] > 0:
            self._starts[i] -= 1
            self._start_total -= 1
        if retry and self._retries[i] > 0:
            self._retries[i] -= 1
            self._retry_total -= 1

    def allows_retry(self, now: float, budget: float, floor: int) -> bool:
        starts, retries = self.counts(now)
        return retry_allowed(retries, starts, budget, floor)

    def next_retry_at(self, now: float, budget: float, floor: int) -> float:
        """The earliest time from `now` at which a retry may start if no other start happens
        first (others only move it earlier). At most `seconds` ahead: by then the window is
        empty, and an empty window allows `floor` >= 1 retries."""
        newest = self._advance(now)
        starts, retries = self._start_total, self._retry_total
        if retry_allowed(retries, starts, budget, floor):
            return now
        for second in range(newest - self.seconds + 1, newest + 1):  # oldest first
            i = second % self.seconds
            starts -= self._starts[i]
            retries -= self._retries[i]
            if retry_allowed(retries, starts, budget, floor):
                return float(second + self.seconds)  # when that second leaves the window
        return float(newest + self.seconds)
