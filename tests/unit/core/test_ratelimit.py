"""Budgets of work done for callers known only by their address (`SourceBudget`): one address
spends its own share, all of them together at most the global one, and the addresses remembered
stay bounded however many there are. On the fake clock."""

from __future__ import annotations

import pytest

from tests.support.clock import FakeClock
from vigil.core.ratelimit import SourceBudget, TokenBucket

pytestmark = pytest.mark.unit


def budget(**over: float) -> SourceBudget:
    settings = {"rate": 100.0, "burst": 200, "source_rate": 2.0, "source_burst": 5, "sources": 64, **over}
    return SourceBudget(**settings)  # type: ignore[arg-type]


def takes(b: SourceBudget, source: str | None, n: int, now: float) -> int:
    return sum(b.take(source, now) for _ in range(n))


def test_a_flood_from_one_source_spends_its_own_budget_and_not_anothers() -> None:
    clock, b = FakeClock(), budget()
    assert takes(b, "10.0.0.66", 1000, clock.monotonic()) == 5, "its burst"
    assert b.take("10.0.0.7", clock.monotonic()), "another address is not held back"
    clock.tick(1.0)
    assert takes(b, "10.0.0.66", 1000, clock.monotonic()) == 2, "then its rate"
    clock.tick(60.0)
    assert takes(b, "10.0.0.66", 1000, clock.monotonic()) == 5, "never more than its burst saved up"


def test_the_global_budget_caps_the_sum_of_every_source() -> None:
    clock, b = FakeClock(), budget(rate=10.0, burst=20, sources=10_000)
    taken = sum(b.take(f"10.1.{n // 256}.{n % 256}", clock.monotonic()) for n in range(1000))
    assert taken == 20
    clock.tick(2.0)
    taken = sum(b.take(f"10.2.{n // 256}.{n % 256}", clock.monotonic()) for n in range(1000))
    assert taken == 20, "two seconds at 10 a second"


def test_a_refusal_spends_nothing() -> None:
    clock, b = FakeClock(), budget(rate=1.0, burst=3, source_rate=0.1)
    assert takes(b, "10.0.0.1", 3, clock.monotonic()) == 3  # the global burst is gone
    assert takes(b, "10.0.0.2", 100, clock.monotonic()) == 0
    clock.tick(3.0)  # three more in all; 10.0.0.2's own bucket was never spent by its refusals
    assert takes(b, "10.0.0.2", 100, clock.monotonic()) == 3


def test_the_sources_remembered_stay_bounded_under_100000_addresses() -> None:
    clock, b = FakeClock(), budget(rate=1000.0, burst=1000, sources=4096)
    taken = 0
    for n in range(100_000):
        taken += b.take(f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}", clock.monotonic())
        clock.tick(0.0001)  # 10 s in all
        assert len(b) <= 4096
    assert len(b) == 4096
    assert taken <= 1000 + 1000 * 10.0 + 1, "a flood of addresses gets no more than the global budget"


def test_the_source_held_longest_unheard_is_forgotten_first_and_comes_back_full() -> None:
    clock, b = FakeClock(), budget(sources=2)
    assert takes(b, "a", 10, clock.monotonic()) == 5
    b.take("b", clock.monotonic())
    assert takes(b, "a", 10, clock.monotonic()) == 0, "still remembered: still spent"
    b.take("c", clock.monotonic())  # b goes (a was heard more recently)
    assert takes(b, "a", 10, clock.monotonic()) == 0 and len(b) == 2
    b.take("d", clock.monotonic())
    b.take("e", clock.monotonic())  # now a goes too
    assert takes(b, "a", 10, clock.monotonic()) == 5


def test_an_address_not_known_is_held_to_the_global_budget_alone() -> None:
    clock, b = FakeClock(), budget(rate=1.0, burst=50)
    assert takes(b, None, 100, clock.monotonic()) == 50 and len(b) == 0


def test_a_token_bucket_says_how_long_until_the_next() -> None:
    clock, bucket = FakeClock(), TokenBucket(rate=4.0, burst=2)
    assert bucket.delay(clock.monotonic()) == 0.0
    assert bucket.take(clock.monotonic()) and bucket.take(clock.monotonic())
    assert not bucket.take(clock.monotonic()) and bucket.delay(clock.monotonic()) == pytest.approx(0.25)
