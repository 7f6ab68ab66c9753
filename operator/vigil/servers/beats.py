"""POST /v1/heartbeat: the agents' beats, to the leader, verified without an API request.

Served by the admission webhook's HTTPS server (the same port, certificate and Service, which
selects the leader's pod alone): see `vigil.core.beats` for what is checked and docs/heartbeats.md
for the channel's costs and its fallback. A replica that does not lead answers 503, so an agent
that reached a standby (a Service not yet updated after a failover) beats by its pod annotation
for that beat and finds the new leader with its next one.

Anyone who can reach the port can post here, so what a request may cost is bounded before it
costs it: the token's and body's sizes, the body's arrival time, and the requests in flight (the
excess is answered 503 at once). A verified beat is O(1) on the event loop: a signature check
the first time a token is seen (about 50 us for RS256, then remembered, see
`beats.VerifiedTokens`) and a few dictionary operations.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from vigil import api
from vigil.core import beats
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256  # beats being read or verified at once; a beat is answered in well under 1 ms
READ_SECONDS = 2.0  # for the body (under 1 KiB) to arrive
# Outcomes counted in vigil_heartbeat_posts_total (a bounded label set).
OUTCOMES = ("counted", "bad-request", "unauthenticated", "wrong-pod", "unknown-pod", "busy", "not-leader", "no-keys")
_OUTCOME_OF_STATUS = {
    400: "bad-request",
    413: "bad-request",
    401: "unauthenticated",
    403: "wrong-pod",
    404: "unknown-pod",
}

# A verified beat's answer, one of three: made once, not encoded again for every beat.
ANSWERS = {state: json.dumps({"state": state}).encode() for state in (beats.RENEWED, beats.SUPERSEDED, beats.DELETING)}

Keys = Callable[[str | None], Awaitable[beats.IssuerKeys | None]]


def outcome_counter(posts: Counter) -> Callable[[str], None]:
    """`count` for a Counter labelled by outcome: each outcome's series looked up once (labels()
    takes a lock and a lookup, on every beat otherwise), so each is exported from the start, at 0."""
    series = {outcome: posts.labels(outcome) for outcome in OUTCOMES}
    return lambda outcome: series[outcome].inc()


class BeatEndpoint:
    """The route's handler and what it needs, each given as a function:

    leading: whether this process leads (only the leader counts beats).
    keys: the issuer's keys, refreshed when given a key id they lack (`vigil.kube.issuer`).
    pod_of: the attempt pod of a UID the leader holds (the pod cache), or None.
    heard: counts a verified beat for that pod (`JobEvents.beat_heard`).
    count: called with each request's outcome (one of OUTCOMES), for the metrics.
    """

    def __init__(
        self,
        *,
        leading: Callable[[], bool],
        keys: Keys,
        pod_of: Callable[[str], Mapping[str, Any] | None],
        heard: Callable[[Mapping[str, Any]], None],
        count: Callable[[str], None] = lambda outcome: None,
        audience: str = beats.AUDIENCE,
        clock: Clock = SYSTEM,
        read_seconds: float = READ_SECONDS,
    ) -> None:
        self.leading, self.keys, self.pod_of, self.heard, self.count = leading, keys, pod_of, heard, count
        self.audience, self.clock, self.read_seconds = audience, clock, read_seconds
        self.in_flight = 0
        self.verified = beats.VerifiedTokens()  # a pod's token is checked once, not on every beat

    def routes(self) -> list[web.RouteDef]:
        return [web.post(beats.PATH, self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.in_flight >= MAX_IN_FLIGHT:
            return self._refuse(request, "busy", 503, f"{MAX_IN_FLIGHT} beats in flight already; retry", close=True)
        self.in_flight += 1
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if not self.leading():
            return self._refuse(request, "not-leader", 503, "this replica does not lead: beat by the pod annotation")
        length = request.content_length
        if length is not None and length > beats.MAX_BODY_BYTES:
            return self._refuse(
                request, "bad-request", 413, f"a beat is at most {beats.MAX_BODY_BYTES} bytes", close=True
            )
        try:
            token = beats.bearer(request.headers.get("Authorization"))
            body = await self._body(request)
            claimed = beats.read_body(body)
            keys = await self.keys(None)
            if keys is None:
                return self._refuse(request, "no-keys", 503, "the issuer's keys are not fetched yet; retry")
            try:
                identity = self.verified.verify(token, keys, self.clock.wall().timestamp(), self.audience)
            except beats.UnknownKey as unknown:
                fresh = await self.keys(unknown.kid)  # a rotated key: fetched at most every few seconds
                if fresh is None or fresh is keys:
                    raise
                identity = self.verified.verify(token, fresh, self.clock.wall().timestamp(), self.audience)
            beats.check_claimed(identity, claimed)
            pod = self.pod_of(identity.uid)
            state = beats.answer(identity, pod, api.ANNOTATION_SUPERSEDED)
        except TimeoutError:
            return self._refuse(
                request, "bad-request", 408, f"the beat did not arrive within {self.read_seconds:g} s", close=True
            )
        except beats.Refused as refused:
            return self._refuse(
                request, _OUTCOME_OF_STATUS.get(refused.status, "bad-request"), refused.status, str(refused)
            )
        assert pod is not None  # answer() refuses a pod it does not hold
        self.heard(pod)
        self.count("counted")
        return web.Response(body=ANSWERS[state], content_type="application/json")

    async def _body(self, request: web.Request) -> bytes:
        """The body, at most MAX_BODY_BYTES + 1 of it (more is refused). A beat's body comes in
        the same TLS record as its headers, so it is most often all here already: then it is read
        without arming a timer (a timer per beat, set and cancelled, was a cost of every beat);
        else it has `read_seconds` to arrive."""
        content = request.content
        if content.is_eof():
            return await content.read(beats.MAX_BODY_BYTES + 1)
        async with asyncio.timeout(self.read_seconds):
            return await content.read(beats.MAX_BODY_BYTES + 1)

    def _refuse(
        self, request: web.Request, outcome: str, status: int, why: str, *, close: bool = False
    ) -> web.Response:
        self.count(outcome)
        response = web.json_response({"error": why}, status=status)
        if close:  # the body was not read: do not let aiohttp read and discard it on the loop
            response.force_close()
        return response
