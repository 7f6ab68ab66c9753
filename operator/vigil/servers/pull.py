"""POST /v1/pull: the workers of VigilWorkerPools claim tasks, renew their leases and report
results (docs/pull.md), on the beat server's port.

A request is checked as a beat is, and with the same budget (`BeatEndpoint.identify`): the body's
size and arrival time before anything, then the token (verified locally, once per token), which
must name the pod the body names; that pod must be a pod of a pool this leader knows (one being
deleted still beats and reports while it drains, and claims nothing), and its pool's namespace is
the only one whose tasks it gets. Only then does it cost the lease state anything. A replica that
does not lead answers 503 with a Retry-After.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import Counter

from vigil.core import beats, pull
from vigil.core.pull import PoolPod
from vigil.servers.beats import BeatEndpoint, Unavailable
from vigil.servers.http import FastRoute, Reply

PATH = "/v1/pull"
READ_SECONDS = 5.0  # for a body of up to 256 KiB to arrive
NOT_LEADING_RETRY_SECONDS = 1
OUTCOMES = ("answered", "bad-request", "refused", "not-leader", "unavailable")


class PullEndpoint:
    """leading: whether this process leads. request(pool, request): the lease state's answer
    (`controllers.jobs.pulled.Pulled.request`). pool_of(namespace, name): the pool pod of that
    name, if the leader knows one. count(outcome): for the metrics; claimed(n): tasks handed out."""

    def __init__(
        self,
        beat: BeatEndpoint,
        *,
        leading: Callable[[], bool],
        request: Callable[[str, pull.PullRequest], Awaitable[pull.Answer]],
        pool_of: Callable[[str, str], PoolPod | None],
        requests: Counter | None = None,
    ) -> None:
        self.beat, self.leading, self.request, self.pool_of = beat, leading, request, pool_of
        self.requests = requests

    def routes(self) -> list[FastRoute]:
        return [FastRoute(PATH, self.handle, pull.MAX_BODY_BYTES, READ_SECONDS, self._refused)]

    def handle(self, headers: Mapping[str, str], body: bytes, peer: str) -> Reply | Awaitable[Reply]:
        if not self.leading():
            return self._no(
                "not-leader",
                Reply.error(
                    503,
                    "this replica does not lead: retry (the Service finds the leader)",
                    headers={"Retry-After": str(NOT_LEADING_RETRY_SECONDS)},
                ),
            )
        try:
            token = beats.bearer(headers.get("authorization"))
            request = pull.read_request(body)
            identity = self.beat.identify(token, peer)
        except pull.BadRequest as bad:
            return self._no("bad-request", Reply.error(400, str(bad)))
        except (beats.OverBudget, beats.Refused, Unavailable) as refused:
            return self._no("refused", self.beat.refusal(refused))
        return self._answer(identity, request)

    async def _answer(
        self, identity: beats.PodIdentity | Awaitable[beats.PodIdentity], request: pull.PullRequest
    ) -> Reply:
        try:
            if not isinstance(identity, beats.PodIdentity):
                identity = await identity
        except (beats.OverBudget, beats.Refused, Unavailable) as refused:
            return self._no("refused", self.beat.refusal(refused))
        if (identity.namespace, identity.name) != (request.namespace, request.name) or (
            request.uid is not None and request.uid != identity.uid
        ):
            return self._no("refused", Reply.error(403, "the token is another pod's: a worker asks for itself alone"))
        pod = self.pool_of(identity.namespace, identity.name)
        if pod is None or pod.uid != identity.uid:
            return self._no(
                "refused",
                Reply.error(404, f"pod {identity.namespace}/{identity.name} is not a worker of a VigilWorkerPool"),
            )
        if pod.deleting:
            # Draining: its beats and results still count (its tasks finish and are recorded
            # once), but it is given nothing more.
            request = dataclasses.replace(request, free=0)
        try:
            answer = await self.request(pod.pool, request)
        except RuntimeError:  # stopped leading meanwhile
            return self._no("not-leader", Reply.error(503, "this replica no longer leads: retry"))
        self._count("answered")
        return Reply(200, json.dumps(answer.body, separators=(",", ":")).encode())

    def _no(self, outcome: str, reply: Reply) -> Reply:
        self._count(outcome)
        return reply

    def _count(self, outcome: str) -> None:
        if self.requests is not None:
            self.requests.labels(outcome).inc()

    def _refused(self, status: int) -> None:
        self._count("unavailable" if status == 503 else "bad-request")
