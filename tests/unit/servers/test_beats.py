"""POST /v1/heartbeat on the webhook's HTTPS server, on loopback (real TLS, no cluster): a pod's
beat is counted without any request to an API server; a beat from anyone else, to a standby, or
for a pod the leader does not hold is refused and counts nothing."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from tests.support.clock import FakeClock
from tests.support.tokens import KEYS, OTHER_KEY, claims, token
from vigil import api
from vigil.core import beats
from vigil.core.queueing.book import QueueSpec
from vigil.servers.beats import OUTCOMES, BeatEndpoint, outcome_counter
from vigil.servers.webhook import WebhookServer

pytestmark = pytest.mark.unit


class Leader:
    """What the endpoint is given: the cache's pods, the beats heard, the key fetches."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.now = self.clock.wall().timestamp()
        self.leading = True
        self.pods = {"pod-uid-1": {"metadata": {"namespace": "team-a", "name": "ledger-1", "uid": "pod-uid-1"}}}
        self.heard: list[str] = []
        self.outcomes: Counter[str] = Counter()
        self.key_requests: list[str | None] = []
        self.keys: beats.IssuerKeys | None = KEYS  # what a fetch brings
        self.held: beats.IssuerKeys | None = KEYS  # what is held without a fetch

    async def fetch(self, kid: str | None) -> beats.IssuerKeys | None:
        self.key_requests.append(kid)
        return self.keys

    def endpoint(self) -> BeatEndpoint:
        return BeatEndpoint(
            leading=lambda: self.leading,
            keys=self.fetch,
            held=lambda: self.held,
            pod_of=self.pods.get,
            heard=lambda pod: self.heard.append(pod["metadata"]["uid"]),
            count=lambda outcome: self.outcomes.update([outcome]),
            clock=self.clock,
        )

    def good_token(self, **over: Any) -> str:
        return token(claims(self.now, **over))


BODY = {"namespace": "team-a", "name": "ledger-1", "uid": "pod-uid-1", "beat": "7:abcd"}


def beat_all(certs: Path, leader: Leader, requests: list[tuple[str | None, Any]]) -> list[tuple[int, dict]]:
    """Posts each (token, body) in turn to a real server; returns (status, JSON answer) of each."""
    server = WebhookServer(lambda namespace, queue: (QueueSpec(), 0))
    answers: list[tuple[int, dict]] = []

    async def main() -> None:
        await server.start("127.0.0.1:0", certs / "tls.crt", certs / "tls.key", also=leader.endpoint().routes())
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        try:
            async with aiohttp.ClientSession() as session:
                for bearer, body in requests:
                    headers = {"Authorization": f"Bearer {bearer}"} if bearer is not None else {}
                    data = body if isinstance(body, bytes) else json.dumps(body).encode()
                    url = f"https://127.0.0.1:{server.port}{beats.PATH}"
                    async with session.post(url, data=data, headers=headers, ssl=context) as response:
                        answers.append((response.status, await response.json()))
        finally:
            await server.stop()

    asyncio.run(main())
    return answers


def test_a_pods_beat_is_counted_and_answered_with_its_state(certs: Path) -> None:
    leader = Leader()
    superseded = {"metadata": {**leader.pods["pod-uid-1"]["metadata"], "annotations": {api.ANNOTATION_SUPERSEDED: "2"}}}
    first, = beat_all(certs, leader, [(leader.good_token(), BODY)])
    assert first == (200, {"state": "Renewed"}) and leader.heard == ["pod-uid-1"]
    leader.pods["pod-uid-1"] = superseded
    assert beat_all(certs, leader, [(leader.good_token(), BODY)]) == [(200, {"state": "Superseded"})]
    assert leader.outcomes["counted"] == 2


def test_forged_beats_are_refused_and_count_nothing(certs: Path) -> None:
    leader = Leader()
    now = leader.now
    leader.pods["pod-uid-2"] = {"metadata": {"namespace": "team-a", "name": "ledger-2", "uid": "pod-uid-2"}}
    other_pods = token(claims(now, name="ledger-2", uid="pod-uid-2"))
    answers = beat_all(
        certs,
        leader,
        [
            (other_pods, BODY),  # another pod's token, beating for ledger-1
            (token(claims(now, namespace="team-b")), BODY),  # a pod of another namespace
            (token(claims(now, exp=int(now) - 3600)), BODY),  # expired
            (token(claims(now, aud=["https://kubernetes.default.svc"])), BODY),  # a token for the API server
            (token(claims(now), key=OTHER_KEY), BODY),  # signed by a key not the issuer's
            (None, BODY),  # no token at all
            (leader.good_token(), b"{"),  # not JSON
        ],
    )
    assert [status for status, _ in answers] == [403, 403, 401, 401, 401, 401, 400]
    assert all("error" in answer for _, answer in answers)
    assert leader.heard == [] and leader.outcomes["counted"] == 0
    assert leader.outcomes == Counter({"wrong-pod": 2, "unauthenticated": 4, "bad-request": 1})


def test_a_standby_counts_no_beat_and_says_so(certs: Path) -> None:
    leader = Leader()
    leader.leading = False
    (status, answer), = beat_all(certs, leader, [(leader.good_token(), BODY)])
    assert status == 503 and "does not lead" in answer["error"] and leader.heard == []


def test_a_pod_the_leader_does_not_hold_is_not_counted(certs: Path) -> None:
    leader = Leader()
    leader.pods.clear()  # deleted, or its watch event not seen yet: the agent falls back to its annotation
    (status, answer), = beat_all(certs, leader, [(leader.good_token(), BODY)])
    assert status == 404 and leader.heard == []


def test_a_rotated_key_is_fetched_once_then_the_beat_counts(certs: Path) -> None:
    leader = Leader()
    rotated = token(claims(leader.now), kid="k-new")
    assert beat_all(certs, leader, [(rotated, BODY)])[0][0] == 401  # the fetch brought no such key
    assert leader.key_requests == ["k-new"]  # the keys held were used first, without a fetch
    leader.keys = beats.IssuerKeys(KEYS.issuer, {**KEYS.keys, "k-new": KEYS.keys["k1"]})
    assert beat_all(certs, leader, [(rotated, BODY)]) == [(200, {"state": "Renewed"})]


def test_without_keys_a_beat_is_turned_away_to_retry(certs: Path) -> None:
    leader = Leader()
    leader.keys = leader.held = None
    (status, answer), = beat_all(certs, leader, [(leader.good_token(), BODY)])
    assert status == 503 and "keys" in answer["error"] and leader.heard == []


def test_a_body_that_comes_after_its_headers_is_waited_for_and_one_that_never_comes_is_a_408(certs: Path) -> None:
    leader = Leader()
    endpoint = BeatEndpoint(
        leading=lambda: True,
        keys=leader.fetch,
        held=lambda: leader.held,
        pod_of=leader.pods.get,
        heard=lambda pod: leader.heard.append(pod["metadata"]["uid"]),
        count=lambda outcome: leader.outcomes.update([outcome]),
        clock=leader.clock,
        read_seconds=0.3,
    )
    server = WebhookServer(lambda namespace, queue: (QueueSpec(), 0))
    body = json.dumps(BODY).encode()
    got: list[tuple[int, str]] = []

    async def post_in_two(rest: bytes | None) -> tuple[int, str]:
        """The headers, then (once the server has them) the body, or nothing: a raw connection."""
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=context)
        head = (
            f"POST {beats.PATH} HTTP/1.1\r\nHost: vigil\r\nAuthorization: Bearer {leader.good_token()}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode())
        await writer.drain()
        await asyncio.sleep(0.05)  # lets the server take the headers alone (either way, the answer is the same)
        if rest is not None:
            writer.write(rest)
            await writer.drain()
        answer = (await reader.read(65536)).decode()
        writer.close()
        await writer.wait_closed()
        return int(answer.split()[1]), answer.rsplit("\r\n\r\n", 1)[1]

    async def main() -> None:
        await server.start("127.0.0.1:0", certs / "tls.crt", certs / "tls.key", also=endpoint.routes())
        try:
            got.append(await post_in_two(body))
            got.append(await post_in_two(None))
        finally:
            await server.stop()

    asyncio.run(main())
    assert got[0] == (200, '{"state": "Renewed"}')
    assert got[1][0] == 408 and "did not arrive within 0.3 s" in got[1][1]
    assert leader.heard == ["pod-uid-1"] and leader.outcomes == Counter({"counted": 1, "bad-request": 1})


def test_the_outcome_counter_counts_each_outcome_and_shows_every_one_from_the_start() -> None:
    registry = CollectorRegistry()
    posts = PromCounter("posts", "Beats by outcome.", ["outcome"], registry=registry)
    count = outcome_counter(posts)
    assert {registry.get_sample_value("posts_total", {"outcome": o}) for o in OUTCOMES} == {0.0}
    count("counted")
    count("counted")
    count("busy")
    assert registry.get_sample_value("posts_total", {"outcome": "counted"}) == 2.0
    assert registry.get_sample_value("posts_total", {"outcome": "busy"}) == 1.0
    assert registry.get_sample_value("posts_total", {"outcome": "wrong-pod"}) == 0.0
