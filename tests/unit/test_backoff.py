"""Backoff: the exponential base, its cap, and the jitter's bounds and determinism."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.api import Backoff
from vigil.core.backoff import base_delay, retry_delay

pytestmark = pytest.mark.unit

DEFAULT = Backoff()


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 10.0), (2, 20.0), (3, 40.0), (4, 80.0), (5, 160.0), (6, 320.0), (7, 600.0), (50, 600.0)],
)
def test_the_default_base_doubles_from_10s_up_to_600s(failures: int, expected: float) -> None:
    assert base_delay(failures, DEFAULT) == expected


def test_factor_one_keeps_the_delay_constant() -> None:
    backoff = Backoff(initial_seconds=7, factor=1.0, max_seconds=100)
    assert [base_delay(n, backoff) for n in (1, 2, 10)] == [7.0, 7.0, 7.0]


def test_a_huge_exponent_is_capped_instead_of_overflowing() -> None:
    backoff = Backoff(initial_seconds=1, factor=10.0, max_seconds=3600)
    assert base_delay(10_000, backoff) == 3600.0


def test_there_is_no_delay_before_the_first_failure() -> None:
    with pytest.raises(ValueError, match="failed_attempts must be >= 1"):
        base_delay(0, DEFAULT)


def test_no_jitter_gives_the_base_exactly() -> None:
    backoff = Backoff(jitter=0.0)
    assert retry_delay(3, backoff, random.Random(1)) == 40.0


def test_equal_jitter_draws_from_the_upper_half() -> None:
    backoff = Backoff(jitter=0.5)
    delays = [retry_delay(2, backoff, random.Random(seed)) for seed in range(200)]
    assert all(10.0 < d <= 20.0 for d in delays)
    assert max(delays) - min(delays) > 8.0  # it does spread over the range


def test_the_same_random_state_gives_the_same_delay() -> None:
    assert retry_delay(4, DEFAULT, random.Random(42)) == retry_delay(4, DEFAULT, random.Random(42))
    assert retry_delay(4, DEFAULT, random.Random(42)) != retry_delay(4, DEFAULT, random.Random(43))


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
    delay = retry_delay(failures, backoff, random.Random(seed))
    base = base_delay(failures, backoff)
    assert base * (1 - jitter) <= delay <= base <= backoff.max_seconds
    assert base >= min(initial, backoff.max_seconds)
    assert base_delay(failures + 1, backoff) >= base  # never shrinks as failures grow
