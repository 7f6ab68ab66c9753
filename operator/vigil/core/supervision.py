"""A supervisor's decisions, pure: how long a crashed worker waits before it is restarted, and
whether the workers are healthy (what `/healthz` says).

A worker that ends by an exception (a bug, or a failure inside its own error handling) is
restarted after a backoff that grows with the crashes of the last `window` seconds, so a worker
that keeps dying does not spin. The workers are unhealthy, and the kubelet restarts the process,
when one has been down longer than any restart takes (it is dead: its restart never came), or
when more than `limit` crashes fell within `window` (it keeps dying: a restart of the process
is the better chance). Times are a monotonic clock's, handed in; the randomness too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from vigil.core.backoff import backoff

RESTART_DELAYS = (0.1, 10.0)  # (first, largest) seconds before a crashed worker is restarted
CRASH_WINDOW_SECONDS = 60.0
CRASHES_TOLERATED = 5  # within the window; one more and /healthz fails
DOWN_GRACE_SECONDS = 5.0  # beyond the largest restart delay: a worker down longer is dead


@dataclass
class Crashes:
    """The crashes of one set of workers within the window, and what they mean."""

    window: float = CRASH_WINDOW_SECONDS
    limit: int = CRASHES_TOLERATED
    times: deque[float] = field(default_factory=deque)

    def _prune(self, now: float) -> None:
        while self.times and self.times[0] <= now - self.window:
            self.times.popleft()

    def crashed(self, now: float, u: float) -> float:
        """Records a crash at `now`; the seconds before the worker is restarted (u in [0, 1))."""
        self._prune(now)
        self.times.append(now)
        return backoff(len(self.times), *RESTART_DELAYS, u)

    def recent(self, now: float) -> int:
        self._prune(now)
        return len(self.times)

    def verdict(self, now: float, down_since: Iterable[float]) -> str | None:
        """None while healthy, else why not: `down_since` holds when each worker that is down
        (crashed, its restart not yet made) went down."""
        longest = max((now - since for since in down_since), default=0.0)
        if longest > RESTART_DELAYS[1] + DOWN_GRACE_SECONDS:
            return f"a worker has been dead for {longest:.0f}s"
        recent = self.recent(now)
        if recent > self.limit:
            return f"workers crashed {recent} times in the last {self.window:g}s"
        return None
