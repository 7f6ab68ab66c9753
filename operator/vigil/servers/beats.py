"""POST /v1/heartbeat: the agents' beats, to the leader, verified without an API request.

Served by the admission webhook's HTTPS server (the same port, certificate and Service, which
selects the leader's pod alone): see `vigil.core.beats` for what is checked and docs/heartbeats.md
for the channel's costs and its fallback. A replica that does not lead answers 503, so an agent
that reached a standby (a Service not yet updated after a failover) beats by its pod annotation
for that beat and finds the new leader with its next one.

Anyone who can reach the port can post here, so what a request may cost is bounded before it
costs it: the token's and body's sizes, the body's arrival time, the requests in flight (the
excess is answered 503 at once), and the checks of tokens not seen before, within a budget per
source address and in all (`beats.VerificationBudget`; past it 503 with a Retry-After of
`beats.OVER_BUDGET_RETRY_SECONDS`, outcome over-budget). A verified beat is O(1) on the event
loop: a token's check the first time it is seen (about 0.4 ms for RS256, then remembered, see
`beats.VerifiedTokens`; a refused token is remembered too, for a while) and a few dictionary
operations.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import Counter

from vigil import api
from vigil.core import beats
from vigil.runtime.clock import SYSTEM, Clock
from vigil.servers.http import FastRoute, Reply

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256  # beats waiting for the issuer's keys at once (the rest are answered without waiting)
READ_SECONDS = 2.0  # for the body (under 1 KiB) to arrive
# Outcomes counted in vigil_heartbeat_posts_total (a bounded label set).
OUTCOMES = (
    "counted", "bad-request", "unauthenticated", "wrong-pod", "unknown-pod", "busy", "not-leader", "no-keys",
    "over-capacity", "over-budget",
)  # fmt: skip
_OUTCOME_OF_STATUS = {
    400: "bad-request",
    413: "bad-request",
    401: "unauthenticated",
    403: "wrong-pod",
    404: "unknown-pod",
}

# A verified beat's answer, one of three: made once, not encoded again for every beat.
ANSWERS = {
    state: Reply(200, json.dumps({"state": state}).encode())
    for state in (beats.RENEWED, beats.SUPERSEDED, beats.DELETING)
}
# A beat past the budget of checks, made once too (a flood's answers cost no encoding): 503 with
# a Retry-After, which the agent honours by beating by annotation meanwhile (agent.channel).
OVER_BUDGET = Reply.error(503, str(beats.OverBudget()), headers={"Retry-After": str(beats.OVER_BUDGET_RETRY_SECONDS)})

Keys = Callable[[str | None], Awaitable[beats.IssuerKeys | None]]


class Unavailable(Exception):
    """No verdict for now (503): too many requests wait for the keys, or there are none yet.
    `outcome` is its name in vigil_heartbeat_posts_total."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def outcome_counter(posts: Counter) -> Callable[[str], None]:
    """`count` for a Counter labelled by outcome: each outcome's series looked up once (labels()
    takes a lock and a lookup, on every beat otherwise), so each is exported from the start, at 0."""
    series = {outcome: posts.labels(outcome) for outcome in OUTCOMES}
    return lambda outcome: series[outcome].inc()


class BeatEndpoint:
    """The route's handler and what it needs, each given as a function:

    leading: whether this process leads (only the leader counts beats).
    keys: the issuer's keys, refreshed when given a key id they lack (`vigil.kube.issuer`).
    held: the keys held now (None before the first fetch, or when one is due), not awaited.
    pod_of: the attempt pod of a UID the leader holds (the pod cache), or None.
    heard: counts a verified beat for that pod (`JobEvents.beat_heard`).
    count: called with each request's outcome (one of OUTCOMES), for the metrics.
    budget: the checks of tokens not seen before, per source address and in all.
    """

    def __init__(
        self,
        *,
        leading: Callable[[], bool],
        keys: Keys,
        held: Callable[[], beats.IssuerKeys | None],
        pod_of: Callable[[str], Mapping[str, Any] | None],
        heard: Callable[[Mapping[str, Any]], None],
        count: Callable[[str], None] = lambda outcome: None,
        audience: str = beats.AUDIENCE,
        clock: Clock = SYSTEM,
        read_seconds: float = READ_SECONDS,
        budget: beats.VerificationBudget | None = None,
    ) -> None:
        self.leading, self.keys, self.pod_of, self.heard, self.count = leading, keys, pod_of, heard, count
        self.audience, self.clock, self.read_seconds = audience, clock, read_seconds
        self.in_flight = 0
        self.verified = beats.VerifiedTokens()  # a pod's token is checked once, not on every beat
        self.budget = budget if budget is not None else beats.VerificationBudget()
        self.held = held  # the keys held now, without a fetch: what the beats answered at once use

    def routes(self) -> list[FastRoute]:
        # Answered by the server's protocol itself (`vigil.servers.http.FastRoute`): a beat whose
        # token was seen before is answered from the parser's callback, with no task.
        return [FastRoute(beats.PATH, self.handle, beats.MAX_BODY_BYTES, self.read_seconds, self._refused)]

    def handle(self, headers: Mapping[str, str], body: bytes, peer: str) -> Reply | Awaitable[Reply]:
        """A beat's answer: at once when its token verifies against the keys held (nearly every
        beat), else awaited (the keys not fetched yet, or a key id they lack). `peer` is the
        client's address, whose budget a check of a token not seen before spends ("": not known,
        the global budget alone)."""
        if not self.leading():
            return self._refuse("not-leader", 503, "this replica does not lead: beat by the pod annotation")
        try:
            token = beats.bearer(headers.get("authorization"))
            claimed = beats.read_body(body)
            identity = self.identify(token, peer)
            if isinstance(identity, beats.PodIdentity):
                return self._counted(identity, claimed)
            return self._counted_later(identity, claimed)
        except (beats.OverBudget, beats.Refused, Unavailable) as refused:
            return self.refusal(refused)

    def identify(self, token: str, peer: str) -> beats.PodIdentity | Awaitable[beats.PodIdentity]:
        """The pod `token` was made for: at once when it verifies against the keys held, else
        awaited (the keys fetched first). Raises (or the awaitable raises) beats.Refused,
        beats.OverBudget or Unavailable; `refusal` is the answer to each. Shared by every route
        of the beat server that pods call (the beats, and the workers' pulls)."""
        keys = self.held()
        if keys is None:
            return self._identified_later(token, None, peer)
        try:
            return self.verified.verify(
                token, keys, self.clock.wall().timestamp(), self.audience, self._may_check(peer)
            )
        except beats.UnknownKey as unknown:
            return self._identified_later(token, unknown.kid, peer)

    def refusal(self, refused: Exception) -> Reply:
        """The answer to what `identify` raised, counted."""
        if isinstance(refused, beats.OverBudget):
            self.count("over-budget")
            return OVER_BUDGET
        if isinstance(refused, Unavailable):
            return self._refuse(refused.outcome, 503, str(refused))
        assert isinstance(refused, beats.Refused)
        return self._refused_by(refused)

    def _may_check(self, peer: str) -> Callable[[], bool]:
        """Asked only for a token neither verified nor refused before: a pod whose token is
        known never spends (nor waits for) the budget."""
        return lambda: self.budget.take(peer or None, self.clock.monotonic())

    async def _identified_later(self, token: str, kid: str | None, peer: str) -> beats.PodIdentity:
        if self.in_flight >= MAX_IN_FLIGHT:
            raise Unavailable("busy", f"{MAX_IN_FLIGHT} requests waiting for the issuer's keys already; retry")
        self.in_flight += 1
        try:
            keys = await self.keys(kid)  # a rotated key: fetched at most every few seconds
            if keys is None:
                raise Unavailable("no-keys", "the issuer's keys are not fetched yet; retry")
            return self.verified.verify(
                token, keys, self.clock.wall().timestamp(), self.audience, self._may_check(peer)
            )
        finally:
            self.in_flight -= 1

    async def _counted_later(self, identity: Awaitable[beats.PodIdentity], claimed: beats.PodIdentity) -> Reply:
        try:
            return self._counted(await identity, claimed)
        except (beats.OverBudget, beats.Refused, Unavailable) as refused:
            return self.refusal(refused)

    def _counted(self, identity: beats.PodIdentity, claimed: beats.PodIdentity) -> Reply:
        beats.check_claimed(identity, claimed)
        pod = self.pod_of(identity.uid)
        state = beats.answer(identity, pod, api.ANNOTATION_SUPERSEDED)
        assert pod is not None  # answer() refuses a pod it does not hold
        self.heard(pod)
        self.count("counted")
        return ANSWERS[state]

    def _refused_by(self, refused: beats.Refused) -> Reply:
        return self._refuse(_OUTCOME_OF_STATUS.get(refused.status, "bad-request"), refused.status, str(refused))

    def _refused(self, status: int) -> None:
        """A request the server refused before this endpoint saw it (too large, too slow, malformed;
        503: on a connection past the server's limit, servers.http.connection_limit)."""
        self.count("over-capacity" if status == 503 else _OUTCOME_OF_STATUS.get(status, "bad-request"))

    def _refuse(self, outcome: str, status: int, why: str) -> Reply:
        self.count(outcome)
        return Reply.error(status, why)
