"""/metrics in Prometheus' text format, or in OpenMetrics 1.0 when the scraper's `Accept` asks for
`application/openmetrics-text` (prometheus-client's handler chooses), from the operator's registry
(`vigil.metrics`).

Served over HTTPS behind authentication and authorization by default, as controller-runtime
serves its metrics: the scraper's bearer token is reviewed by the API server (TokenReview), and
the user it names must be allowed `get` on the non-resource URL /metrics (SubjectAccessReview).
No token, or one the API server refuses: 401; a user without the permission: 403; too many
unknown tokens at once, from the scraper's address or from all: 429 without a review; the API
server unable to answer: 503. What the answers mean, the cache of verdicts and the budget of
reviews (per address and in all) are `vigil.core.access`'s.
`routes(registry)` alone (plain, no authentication) is what `vigil operator --metrics-insecure`
serves, for a scraper on the same machine.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from vigil.core.access import (
    METRICS_PATH,
    ReviewBudget,
    Verdict,
    VerdictCache,
    access_review,
    access_verdict,
    bearer_token,
    reviewed_user,
    token_key,
    token_review,
)
from vigil.kube.client import ApiClient
from vigil.kube.errors import ApiError
from vigil.metrics import Metrics
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

REVIEW_TIMEOUT_SECONDS = 10.0  # controller-runtime's TokenAccessReviewTimeout
REVIEW_CONNECTIONS = 2  # the reviews' own pool: at most this many in flight, beside no other work
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


def routes(registry: CollectorRegistry) -> list[web.RouteDef]:
    return [web.get(METRICS_PATH, make_aiohttp_handler(registry))]


class Access:
    """The verdict on a token, from the cache or from two reviews by the API server; concurrent
    scrapes with one token share one review."""

    def __init__(
        self,
        http: ApiClient,
        metrics: Metrics,
        clock: Clock = SYSTEM,
        *,
        cache: VerdictCache | None = None,
        budget: ReviewBudget | None = None,
    ) -> None:
        self.http, self.metrics, self.clock = http, metrics, clock
        self.cache = cache if cache is not None else VerdictCache()  # an empty one is falsy (__len__)
        self.budget = budget if budget is not None else ReviewBudget()
        self._reviews: dict[str, asyncio.Future[Verdict]] = {}

    async def verdict(self, token: str, source: str | None = None) -> Verdict | None:
        """The token's verdict; None when it is unknown and the budget of reviews is spent, the
        budget of `source` (the scraper's address; None: not known, the global budget alone) or
        the global one. Raises ApiError when the API server cannot say."""
        key = token_key(token)
        cached = self.cache.get(key, self.clock.monotonic())
        if cached is not None:
            return cached
        running = self._reviews.get(key)
        if running is None:
            if not self.budget.take(source, self.clock.monotonic()):
                return None
            running = self._reviews[key] = asyncio.ensure_future(self._review(key, token))
            running.add_done_callback(lambda _: self._reviews.pop(key, None))
        return await asyncio.shield(running)  # a scraper that hangs up does not cancel the others'

    async def _review(self, key: str, token: str) -> Verdict:
        with self.metrics.timed_request("create", "tokenreviews"):
            answer = await self.http.request(
                "POST", TOKEN_REVIEWS, body=token_review(token), timeout=REVIEW_TIMEOUT_SECONDS
            )
        user = reviewed_user(answer or {})
        if user is None:
            verdict = Verdict.UNAUTHENTICATED
        else:
            with self.metrics.timed_request("create", "subjectaccessreviews"):
                answer = await self.http.request(
                    "POST", ACCESS_REVIEWS, body=access_review(user), timeout=REVIEW_TIMEOUT_SECONDS
                )
            verdict = access_verdict(answer or {})
        self.cache.put(key, verdict, self.clock.monotonic())
        return verdict


def secure_routes(registry: CollectorRegistry, access: Access, metrics: Metrics) -> list[web.RouteDef]:
    serve_metrics = make_aiohttp_handler(registry)

    def refuse(status: int, text: str, **headers: str) -> web.Response:
        metrics.metrics_requests.labels(str(status)).inc()
        response = web.Response(status=status, text=text + "\n", headers=headers)
        response.force_close()  # a refused client holds no connection: it comes back on a new one
        return response

    async def handler(request: web.Request) -> web.StreamResponse:
        token = bearer_token(request.headers.get("Authorization"))
        if token is None:
            return refuse(
                401, "Unauthorized: send a bearer token (Authorization: Bearer ...)", **{"WWW-Authenticate": "Bearer"}
            )
        try:
            verdict = await access.verdict(token, request.remote)
        except ApiError as err:
            log.warning("metrics: could not review a token: %s", err)
            return refuse(503, "the API server could not review the token; retry later", **{"Retry-After": "5"})
        if verdict is None:
            return refuse(429, "too many unknown tokens at once; retry later", **{"Retry-After": "1"})
        if verdict is Verdict.UNAUTHENTICATED:
            return refuse(401, "Unauthorized: the API server refused the token", **{"WWW-Authenticate": "Bearer"})
        if verdict is Verdict.FORBIDDEN:
            return refuse(403, f"Forbidden: the token's user may not get the non-resource URL {METRICS_PATH}")
        metrics.metrics_requests.labels("200").inc()
        return await serve_metrics(request)

    return [web.get(METRICS_PATH, handler)]
