"""Who may read /metrics: the reviews' answers read, verdicts cached briefly and boundedly, and
reviews budgeted, per address and in all, so a flood of unknown tokens cannot become a flood of
TokenReviews, nor spend the real Prometheus's."""

from __future__ import annotations

import pytest

from tests.support.clock import FakeClock
from vigil.core.access import (
    ALLOWED_TTL_SECONDS,
    FORBIDDEN_TTL_SECONDS,
    MAX_TOKEN_BYTES,
    REVIEW_BURST,
    REVIEW_SOURCE_BURST,
    REVIEW_SOURCES,
    UNAUTHENTICATED_TTL_SECONDS,
    ReviewBudget,
    Verdict,
    VerdictCache,
    access_review,
    access_verdict,
    bearer_token,
    reviewed_user,
    token_key,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        (None, None),
        ("", None),
        ("Basic dXNlcjpwdw==", None),
        ("Bearer", None),
        ("Bearer " + "x" * (MAX_TOKEN_BYTES + 1), None),
    ],
)
def test_only_a_bearer_token_is_read(header, token):
    assert bearer_token(header) == token


def test_the_cache_keys_by_digest_never_the_token():
    assert token_key("s3cret") != "s3cret" and len(token_key("s3cret")) == 64


def test_a_review_names_the_user_and_asks_for_get_on_the_metrics_url():
    user = reviewed_user(
        {"status": {"authenticated": True, "user": {"username": "system:serviceaccount:mon:prom", "uid": "u",
                                                     "groups": ["system:serviceaccounts"], "extra": {"k": ["v"]}}}}
    )  # fmt: skip
    assert user is not None
    assert access_review(user)["spec"] == {
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        "user": "system:serviceaccount:mon:prom",
        "groups": ["system:serviceaccounts"],
        "uid": "u",
        "extra": {"k": ["v"]},
    }
    assert reviewed_user({"status": {"authenticated": False}}) is None
    assert reviewed_user({}) is None
    assert access_verdict({"status": {"allowed": True}}) is Verdict.ALLOWED
    assert access_verdict({"status": {"allowed": True, "denied": True}}) is Verdict.FORBIDDEN
    assert access_verdict({"status": {}}) is Verdict.FORBIDDEN


@pytest.mark.parametrize(
    ("verdict", "ttl"),
    [
        (Verdict.ALLOWED, ALLOWED_TTL_SECONDS),
        (Verdict.FORBIDDEN, FORBIDDEN_TTL_SECONDS),
        (Verdict.UNAUTHENTICATED, UNAUTHENTICATED_TTL_SECONDS),
    ],
)
def test_a_verdict_is_cached_for_its_ttl(verdict, ttl):
    cache = VerdictCache()
    cache.put("k", verdict, 1000.0)
    assert cache.get("k", 1000.0 + ttl - 0.01) is verdict
    assert cache.get("k", 1000.0 + ttl) is None
    assert len(cache) == 0, "an expired verdict is dropped"


def test_the_cache_is_bounded_and_keeps_the_recently_used():
    cache = VerdictCache(entries=3)
    for key in "abc":
        cache.put(key, Verdict.ALLOWED, 1000.0)
    assert cache.get("a", 1000.0) is Verdict.ALLOWED  # a is now the most recent
    cache.put("d", Verdict.UNAUTHENTICATED, 1000.0)
    assert len(cache) == 3 and cache.get("b", 1000.0) is None and cache.get("a", 1000.0) is Verdict.ALLOWED


def test_reviews_are_budgeted_a_burst_then_the_rate():
    budget = ReviewBudget(rate=5.0, burst=10)
    scrapers = [f"10.0.0.{n}" for n in range(100)]  # one each: the global budget alone holds them back
    assert sum(budget.take(source, 1000.0) for source in scrapers) == 10
    assert sum(budget.take(source, 1001.0) for source in scrapers) == 5, "one second later: five more"
    assert sum(budget.take(source, 1100.0) for source in scrapers) == 10, "never more than the burst saved up"


def test_reviews_are_budgeted_per_address_too():
    clock, budget = FakeClock(), ReviewBudget()
    flood = sum(budget.take("10.9.9.9", clock.monotonic()) for _ in range(100))
    assert flood == REVIEW_SOURCE_BURST, "one address: its own burst, not the whole budget"
    assert budget.take("10.0.0.1", clock.monotonic()), "the real Prometheus, from another address, is reviewed"
    clock.tick(10.0)
    flood = sum(budget.take("10.9.9.9", clock.monotonic()) for _ in range(100))
    assert flood == REVIEW_SOURCE_BURST  # 10 s at 1 a second, but never more than its burst saved up
    many = sum(budget.take(f"10.8.0.{n}", clock.monotonic()) for n in range(100))
    assert many <= REVIEW_BURST, "many addresses together: the global budget"
    for n in range(5000):
        budget.take(f"10.7.{n // 256}.{n % 256}", clock.monotonic())
    assert len(budget) <= REVIEW_SOURCES
