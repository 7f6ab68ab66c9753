"""Who may read /metrics, decided as controller-runtime's secure metrics serving decides it
(`filters.WithAuthenticationAndAuthorization`): the bearer token is reviewed by the API server
(a TokenReview), then the user it names is checked for `get` on the non-resource URL /metrics
(a SubjectAccessReview). This module holds the pure part: what a review's answers mean, the
cache of verdicts, and the budget of reviews; `vigil.servers.metrics` makes the calls.

Verdicts are cached briefly per token (by its SHA-256, never the token itself): an allowed one
for `ALLOWED_TTL_SECONDS` (controller-runtime caches an authentication for a minute), a
forbidden one for `FORBIDDEN_TTL_SECONDS` (its deny TTL), a refused token for
`UNAUTHENTICATED_TTL_SECONDS` (the API server's own token webhook caches failures as long). The
cache holds at most `CACHE_ENTRIES` verdicts, the least recently used going first. A token not
in the cache costs two requests to the API server, so reviews are budgeted, per source address
and in all (`vigil.core.ratelimit.SourceBudget`): `REVIEWS_PER_SOURCE_PER_SECOND` (burst
`REVIEW_SOURCE_BURST`) for one address, `REVIEWS_PER_SECOND` (burst `REVIEW_BURST`) for every
address together. Past either a scrape with an unknown token is answered 429 without any review,
so a flood of made-up tokens costs the API server at most the global rate, a flood from one
address spends that address's reviews and not the real Prometheus's, and a scraper whose
verdict is cached is never held back. Times are a monotonic clock's, handed in.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vigil.core import fields
from vigil.core.lru import Lru
from vigil.core.ratelimit import SourceBudget

METRICS_PATH = "/metrics"
ALLOWED_TTL_SECONDS = 60.0
FORBIDDEN_TTL_SECONDS = 30.0
UNAUTHENTICATED_TTL_SECONDS = 10.0
CACHE_ENTRIES = 1024
REVIEWS_PER_SECOND = 5.0  # every address together: at most 10 API requests a second
REVIEW_BURST = 10
# One address: a scraper needs one review per token a minute (an allowed verdict is cached 60 s),
# so one a second with a burst of 3 (a Prometheus pair behind one address, a token rotated) is
# ample, and a flood from one address leaves 4 of the 5 a second to the others.
REVIEWS_PER_SOURCE_PER_SECOND = 1.0
REVIEW_SOURCE_BURST = 3
REVIEW_SOURCES = 1024  # addresses whose budgets are kept (least recently heard out)
MAX_TOKEN_BYTES = 16 * 1024  # far above a service account token (about 1 KiB); larger is refused unread


class Verdict(enum.Enum):
    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403


TTL = {
    Verdict.ALLOWED: ALLOWED_TTL_SECONDS,
    Verdict.FORBIDDEN: FORBIDDEN_TTL_SECONDS,
    Verdict.UNAUTHENTICATED: UNAUTHENTICATED_TTL_SECONDS,
}


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when there is none."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_BYTES:
        return None
    return token


def token_key(token: str) -> str:
    """What the cache is keyed by: a digest, so no token is kept in memory beyond its request."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def reviewed_user(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """The user a TokenReview's answer names; None when the token is not authenticated."""
    status = fields.status(answer)
    if not status.get("authenticated"):
        return None
    return dict(status.get("user") or {})


def access_review(user: Mapping[str, Any], path: str = METRICS_PATH) -> dict[str, Any]:
    """A SubjectAccessReview of `get` on the non-resource URL `path` for that user, with their
    groups, uid and extra attributes, as the API server's delegated authorizer sends it."""
    spec: dict[str, Any] = {
        "nonResourceAttributes": {"path": path, "verb": "get"},
        "user": user.get("username", ""),
        "groups": list(user.get("groups") or []),
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = dict(user["extra"])
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def access_verdict(answer: Mapping[str, Any]) -> Verdict:
    status = fields.status(answer)
    return Verdict.ALLOWED if status.get("allowed") and not status.get("denied") else Verdict.FORBIDDEN


@dataclass
class VerdictCache:
    """Verdicts by token key, each until it expires; at most `entries`, least recently used out."""

    entries: int = CACHE_ENTRIES
    _held: Lru[str, tuple[Verdict, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._held = Lru(self.entries)

    def get(self, key: str, now: float) -> Verdict | None:
        held = self._held.get(key)
        if held is None:
            return None
        verdict, until = held
        if now >= until:
            self._held.discard(key)
            return None
        return verdict

    def put(self, key: str, verdict: Verdict, now: float) -> None:
        self._held.put(key, (verdict, now + TTL[verdict]))

    def __len__(self) -> int:
        return len(self._held)


@dataclass
class ReviewBudget(SourceBudget):
    """Reviews of unknown tokens: `rate` a second in all (at most `burst` at once), and
    `source_rate` a second from any one address (at most `source_burst` at once)."""

    rate: float = REVIEWS_PER_SECOND
    burst: int = REVIEW_BURST
    source_rate: float = REVIEWS_PER_SOURCE_PER_SECOND
    source_burst: int = REVIEW_SOURCE_BURST
    sources: int = REVIEW_SOURCES
