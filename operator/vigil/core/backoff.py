"""Exponential backoff with jitter between the attempts of a job."""

from __future__ import annotations

import random

from vigil.api import Backoff


def base_delay(failed_attempts: int, backoff: Backoff) -> float:
    """The delay before the next attempt, before jitter, after `failed_attempts` (>= 1) failures.

    base = min(maxSeconds, initialSeconds * factor^(failed_attempts - 1))
    """
    if failed_attempts < 1:
        raise ValueError(f"failed_attempts must be >= 1, not {failed_attempts}")
    try:
        growth = backoff.factor ** (failed_attempts - 1)
    except OverflowError:  # a float power this large is past any maxSeconds
        return float(backoff.max_seconds)
    return min(float(backoff.max_seconds), backoff.initial_seconds * growth)


def retry_delay(failed_attempts: int, backoff: Backoff, rng: random.Random) -> float:
    """Seconds to wait before the next attempt, after `failed_attempts` (>= 1) failures.

    Jitter is "equal jitter" generalised to any share `jitter` in [0, 1]:

        delay = base * (1 - jitter * u),  u drawn uniformly from [0, 1) by `rng`

    so the delay lies in (base * (1 - jitter), base]: jitter 0 is the plain exponential delay,
    0.5 is classic equal jitter, 1 is full jitter. Jitter only ever shortens the delay, so
    maxSeconds stays a true upper bound. The same `rng` state gives the same delay.
    """
    base = base_delay(failed_attempts, backoff)
    return base * (1.0 - backoff.jitter * rng.random())
