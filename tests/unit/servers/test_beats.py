"""POST /v1/heartbeat on the beat server, on loopback (real TLS, no cluster): a pod's beat is
counted without any request to an API server; a beat from anyone else, to a standby, or for a pod
the leader does not hold is refused and counts nothing. What a token's check may cost: the same
junk is checked once, new tokens within a budget per source address and in all, and a pod whose
token is known is never held back by a flood."""

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
from vigil.agent.channel import leader_outcome
from vigil.core import beats
from vigil.servers.beats import OUTCOMES, BeatEndpoint, outcome_counter
from vigil.servers.http import Bounds, Reply, Server, serve_fast

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

    def endpoint(self, budget: beats.VerificationBudget | None = None) -> BeatEndpoint:
        return BeatEndpoint(
            leading=lambda: self.leading,
            keys=self.fetch,
            held=lambda: self.held,
            pod_of=self.pods.get,
            heard=lambda pod: self.heard.append(pod["metadata"]["uid"]),
            count=lambda outcome: self.outcomes.update([outcome]),
            clock=self.clock,
            budget=budget,
        )

    def good_token(self, **over: Any) -> str:
        return token(claims(self.now, **over))


BODY = {"namespace": "team-a", "name": "ledger-1", "uid": "pod-uid-1", "beat": "7:abcd"}


async def serving(certs: Path, endpoint: BeatEndpoint) -> Server:
    """The endpoint's route on a beat server of its own, on loopback, over TLS."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
    (route,) = endpoint.routes()
    bounds = Bounds(max_connections=100, per_source=100)
    return await serve_fast(route, "127.0.0.1:0", bounds=bounds, ssl_context=context)


def beat_all(certs: Path, leader: Leader, requests: list[tuple[str | None, Any]]) -> list[tuple[int, dict]]:
    """Posts each (token, body) in turn to a real server; returns (status, JSON answer) of each."""
    answers: list[tuple[int, dict]] = []

    async def main() -> None:
        server = await serving(certs, leader.endpoint())
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
    (first,) = beat_all(certs, leader, [(leader.good_token(), BODY)])
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
    ((status, answer),) = beat_all(certs, leader, [(leader.good_token(), BODY)])
    assert status == 503 and "does not lead" in answer["error"] and leader.heard == []


def test_a_pod_the_leader_does_not_hold_is_not_counted(certs: Path) -> None:
    leader = Leader()
    leader.pods.clear()  # deleted, or its watch event not seen yet: the agent falls back to its annotation
    ((status, answer),) = beat_all(certs, leader, [(leader.good_token(), BODY)])
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
    ((status, answer),) = beat_all(certs, leader, [(leader.good_token(), BODY)])
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
    body = json.dumps(BODY).encode()
    got: list[tuple[int, str]] = []

    async def post_in_two(server: Server, rest: bytes | None) -> tuple[int, str]:
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
        server = await serving(certs, endpoint)
        try:
            got.append(await post_in_two(server, body))
            got.append(await post_in_two(server, None))
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


# --- what a token's check may cost (handle() called as the server calls it, on the fake clock) ---


def post(endpoint: BeatEndpoint, bearer: str, peer: str, body: dict = BODY) -> Reply:
    answer = endpoint.handle({"authorization": f"Bearer {bearer}"}, json.dumps(body).encode(), peer)
    assert isinstance(answer, Reply), "answered at once, the keys being held"
    return answer


def junk(n: int) -> str:
    return token(claims(FakeClock().wall().timestamp(), jti=f"junk-{n}"), key=OTHER_KEY)  # a bad signature


def small_budget(**over: Any) -> beats.VerificationBudget:
    return beats.VerificationBudget(**{"rate": 100.0, "burst": 100, "source_rate": 1.0, "source_burst": 3, **over})


def test_the_same_junk_token_repeated_is_checked_once() -> None:
    leader = Leader()
    endpoint = leader.endpoint(small_budget(source_burst=1, source_rate=0.001))
    forged = junk(0)
    statuses = [post(endpoint, forged, "10.0.0.66").status for _ in range(200)]
    assert statuses == [401] * 200, "refused every time, by a lookup after the first (one check in the budget)"
    assert endpoint.verified.refused() == 1 and leader.outcomes == Counter({"unauthenticated": 200})


def test_a_flood_from_one_address_spends_its_budget_and_a_second_addresss_fresh_token_still_verifies() -> None:
    leader = Leader()
    endpoint = leader.endpoint(small_budget())
    statuses = Counter(post(endpoint, junk(n), "10.0.0.66").status for n in range(100))
    assert statuses == Counter({401: 3, 503: 97}), "its burst of checks, then refused unchecked"
    answer = post(endpoint, leader.good_token(), "10.0.0.7")
    assert (answer.status, json.loads(answer.body)) == (200, {"state": "Renewed"})
    assert leader.outcomes["over-budget"] == 97 and leader.outcomes["counted"] == 1
    leader.clock.tick(1.0)  # one more check a second for the flooding address
    assert Counter(post(endpoint, junk(1000 + n), "10.0.0.66").status for n in range(10)) == Counter({401: 1, 503: 9})


def test_past_the_budget_the_agent_is_told_to_rest_and_beat_by_annotation() -> None:
    leader = Leader()
    endpoint = leader.endpoint(small_budget(source_burst=1))
    post(endpoint, junk(0), "10.0.0.66")
    answer = post(endpoint, leader.good_token(), "10.0.0.66")  # a pod sharing the flooder's address
    assert answer.status == 503 and answer.headers == {"Retry-After": str(beats.OVER_BUDGET_RETRY_SECONDS)}
    agent = leader_outcome(answer.status, answer.body, answer.headers["Retry-After"])
    assert agent.observed is None and agent.rest_seconds == beats.OVER_BUDGET_RETRY_SECONDS
    assert leader.heard == [] and leader.outcomes["over-budget"] == 1 and "over-budget" in OUTCOMES


def test_the_global_budget_caps_the_checks_of_every_address() -> None:
    leader = Leader()
    endpoint = leader.endpoint(small_budget(rate=10.0, burst=20))
    statuses = Counter(post(endpoint, junk(n), f"10.1.{n // 256}.{n % 256}").status for n in range(500))
    assert statuses == Counter({401: 20, 503: 480})
    assert len(endpoint.budget) == 500


def test_a_pod_whose_token_is_verified_is_never_refused_by_a_flood() -> None:
    leader = Leader()
    endpoint = leader.endpoint(small_budget(rate=1.0, burst=5))
    good = leader.good_token()
    assert post(endpoint, good, "10.0.0.7").status == 200
    for n in range(300):  # the global budget and the pod's own address's spent by others
        post(endpoint, junk(n), f"10.2.0.{n % 200}")
        post(endpoint, junk(1000 + n), "10.0.0.7")
        assert post(endpoint, good, "10.0.0.7").status == 200
    assert leader.outcomes["counted"] == 301 and leader.outcomes["over-budget"] > 500


def test_without_the_peers_address_the_global_budget_alone_holds() -> None:
    leader = Leader()
    endpoint = leader.endpoint(small_budget(burst=10))
    assert Counter(post(endpoint, junk(n), "").status for n in range(30)) == Counter({401: 10, 503: 20})
    assert len(endpoint.budget) == 0


def test_no_token_is_logged_whatever_the_beat(certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The operator's logs go to a pipeline many may read: a bearer token there is a credential.
    leader = Leader()
    tokens = [leader.good_token(), token(claims(leader.now, namespace="team-b")), junk(1)]
    with caplog.at_level("DEBUG"):
        answers = beat_all(certs, leader, [(t, BODY) for t in tokens] + [(tokens[0], b"{")])
    assert [status for status, _ in answers] == [200, 403, 401, 400]
    logged = caplog.text
    for t in tokens:
        assert t not in logged and t.split(".")[2] not in logged, "a token, or its signature, in the log"
