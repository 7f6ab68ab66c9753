"""Backoff: the exponential base, its cap, and the jitter's bounds and determinism, for a job's
attempts and for a reconcile's retries."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.api import MIN_RETRY_SECONDS, Backoff
from vigil.core.backoff import CONFLICT_DELAYS, ERROR_DELAYS, attempt_delay, exponential, reconcile_retry_delay, spread

pytestmark = pytest.mark.unit

DEFAULT = Backoff()


def base(failures: int, policy: Backoff) -> float:
    """The delay before jitter, as the job's policy gives it."""
    return exponential(failures, policy.initial_seconds, policy.max_seconds, policy.factor)


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 10.0), (2, 20.0), (3, 40.0), (4, 80.0), (5, 160.0), (6, 320.0), (7, 600.0), (50, 600.0)],
)
def test_the_default_base_doubles_from_10s_up_to_600s(failures: int, expected: float) -> None:
    assert base(failures, DEFAULT) == expected


def test_factor_one_keeps_the_delay_constant() -> None:
    backoff = Backoff(initial_seconds=7, factor=1.0, max_seconds=100)
    assert [base(n, backoff) for n in (1, 2, 10)] == [7.0, 7.0, 7.0]


def test_a_huge_exponent_is_capped_instead_of_overflowing() -> None:
    backoff = Backoff(initial_seconds=1, factor=10.0, max_seconds=3600)
    assert base(10_000, backoff) == 3600.0


def test_there_is_no_delay_before_the_first_failure() -> None:
    with pytest.raises(ValueError, match="failures must be >= 1"):
        base(0, DEFAULT)


def test_no_jitter_gives_the_base_exactly() -> None:
    backoff = Backoff(jitter=0.0)
    assert attempt_delay(3, backoff, random.Random(1)) == 40.0


def test_equal_jitter_draws_from_the_upper_half() -> None:
    backoff = Backoff(jitter=0.5)
    delays = [attempt_delay(2, backoff, random.Random(seed)) for seed in range(200)]
    assert all(10.0 < d <= 20.0 for d in delays)
    assert max(delays) - min(delays) > 8.0  # it does spread over the range


def test_the_same_random_state_gives_the_same_delay() -> None:
    assert attempt_delay(4, DEFAULT, random.Random(42)) == attempt_delay(4, DEFAULT, random.Random(42))
    assert attempt_delay(4, DEFAULT, random.Random(42)) != attempt_delay(4, DEFAULT, random.Random(43))


@settings(max_examples=300)
@given(
    initial=st.integers(0, 1000),
    extra=st.integers(0, 10_000),
    factor=st.floats(1.0, 10.0),
    jitter=st.floats(0.0, 1.0),
    failures=st.integers(1, 200),
    seed=st.integers(0, 2**32),
)
def test_every_delay_lies_between_the_jittered_floor_and_the_cap(
    initial: int, extra: int, factor: float, jitter: float, failures: int, seed: int
) -> None:
    backoff = Backoff(initial_seconds=initial, factor=factor, max_seconds=initial + extra, jitter=jitter)
    delay = attempt_delay(failures, backoff, random.Random(seed))
    floor = base(failures, backoff)
    assert max(MIN_RETRY_SECONDS, floor * (1 - jitter)) <= delay <= max(MIN_RETRY_SECONDS, floor)
    assert floor <= backoff.max_seconds
    assert floor >= min(initial, backoff.max_seconds)
    assert base(failures + 1, backoff) >= floor  # never shrinks as failures grow


@settings(max_examples=200)
@given(
    initial=st.integers(0, 3),
    factor=st.floats(1.0, 10.0),
    jitter=st.floats(0.0, 1.0),
    failures=st.integers(1, 10_000),
    seed=st.integers(0, 2**32),
)
def test_no_delay_is_under_the_floor_not_even_a_stored_zero_or_a_full_jitter(
    initial: int, factor: float, jitter: float, failures: int, seed: int
) -> None:
    """initialSeconds 0 (admitted before the floor), factor 1, jitter 1: still a second apart."""
    backoff = Backoff(initial_seconds=initial, factor=factor, max_seconds=initial, jitter=jitter)
    assert attempt_delay(failures, backoff, random.Random(seed)) >= MIN_RETRY_SECONDS == 1


@given(st.integers(min_value=1, max_value=10_000), st.booleans(), st.floats(0, 1, exclude_max=True))
def test_reconcile_retries_back_off_from_their_first_delay_to_their_cap_with_equal_jitter(count, conflict, u):
    first, largest = CONFLICT_DELAYS if conflict else ERROR_DELAYS
    delay = reconcile_retry_delay(count, u, conflict=conflict)
    base = min(largest, first * 2.0 ** min(count - 1, 64))
    assert base / 2 <= delay <= base


@given(st.floats(0.1, 3600.0), st.floats(0, 0.5), st.floats(0, 1, exclude_max=True))
def test_a_spread_period_stays_within_its_share(period, share, u):
    assert period * (1 - share) - 1e-9 <= spread(period, share, u) <= period * (1 + share) + 1e-9
