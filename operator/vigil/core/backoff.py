"""Every delay of Vigil that grows with failures, and every spread of a period: one formula each.

`backoff()` is exponential backoff capped, with jitter that only ever shortens the delay, so the
cap stays a true upper bound: base = min(largest, first x factor^(failures - 1)), delay = base x
(1 - jitter x u), with u drawn uniformly from [0, 1) by the caller (the randomness is passed in;
the same u gives the same delay). It spaces a job's attempts (its spec.retry.backoff), a
reconcile's retries after a failure, a watch's reconnections and an agent's retried beats.
`jitter_up()` spreads a period the way client-go's wait.Jitter does (a follower's retries of
the Lease); `spread()` moves a period both ways (an agent's beats).
"""

from __future__ import annotations

import random

from vigil.api import MIN_RETRY_SECONDS, Backoff

EQUAL_JITTER = 0.5  # half fixed, half random: retries of many keys do not align, none waits twice too long

# A reconcile that failed is retried after (first, largest) seconds: a conflict is routine
# (someone wrote the job first), so it is looked at again soon; anything else may take a while.
CONFLICT_DELAYS = (0.1, 5.0)
ERROR_DELAYS = (1.0, 300.0)


def exponential(failures: int, first: float, largest: float, factor: float = 2.0) -> float:
    """min(largest, first x factor^(failures - 1)), for `failures` >= 1."""
    if failures < 1:
        raise ValueError(f"failures must be >= 1, not {failures}")
    try:
        growth = factor ** (failures - 1)
    except OverflowError:  # a float power this large is past any cap
        return float(largest)
    return min(float(largest), first * growth)


def backoff(
    failures: int, first: float, largest: float, u: float, *, factor: float = 2.0, jitter: float = EQUAL_JITTER
) -> float:
    """Seconds before try `failures` + 1: `exponential()`, shortened by up to `jitter` of itself."""
    return exponential(failures, first, largest, factor) * (1.0 - jitter * u)


def attempt_delay(failed_attempts: int, policy: Backoff, rng: random.Random) -> float:
    """Seconds before a job's next attempt after `failed_attempts` (>= 1) counted failures of its
    round, as its spec.retry.backoff says: in (base x (1 - jitter), base]. jitter 0 is the plain
    exponential delay, 0.5 classic equal jitter, 1 full jitter. Never less than
    MIN_RETRY_SECONDS: the API server refuses a smaller initialSeconds, but a job stored before
    that rule, or a jitter that shortens the delay, would otherwise retry at once."""
    return max(
        float(MIN_RETRY_SECONDS),
        backoff(
            failed_attempts,
            policy.initial_seconds,
            policy.max_seconds,
            rng.random(),
            factor=policy.factor,
            jitter=policy.jitter,
        ),
    )


def reconcile_retry_delay(failures: int, u: float, *, conflict: bool = False) -> float:
    """Seconds before a reconcile that failed `failures` times in a row is tried again."""
    first, largest = CONFLICT_DELAYS if conflict else ERROR_DELAYS
    return backoff(failures, first, largest, u)


def jitter_up(period: float, factor: float, u: float) -> float:
    """period x (1 + factor x u): client-go's wait.Jitter."""
    return period * (1.0 + factor * u)


def spread(period: float, share: float, u: float) -> float:
    """`period` moved by up to +-`share` of itself."""
    return period * (1.0 - share + 2.0 * share * u)
