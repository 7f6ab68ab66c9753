"""The issuer's keys: when they are fetched (`fetch_due`, pure), and that a beat asking for them
while none is due takes them as held, while one asking during a fetch waits for its keys."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support.clock import FakeClock
from tests.support.tokens import ISSUER, KEYS, RSA_KEY, jwk
from vigil.core import beats
from vigil.kube.issuer import REFRESH_SECONDS, IssuerKeySource, fetch_due

pytestmark = pytest.mark.unit


def test_keys_are_fetched_when_none_are_held_when_old_and_for_an_unknown_key_at_most_every_period() -> None:
    period = beats.KEY_REFRESH_SECONDS
    assert fetch_due(None, None, None)  # never fetched
    assert not fetch_due(None, period / 2, None)  # a failed fetch is not retried at once
    assert fetch_due(None, period, None)
    assert not fetch_due(KEYS, 1.0, None) and not fetch_due(KEYS, 1.0, "k1")  # held, fresh, known
    assert fetch_due(KEYS, REFRESH_SECONDS, None)  # held, but old
    assert not fetch_due(KEYS, period / 2, "k-new") and fetch_due(KEYS, period, "k-new")


class Client:
    """The API server's discovery document and key set; `gate` holds each fetch until set."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.requests.append(path)
        await self.gate.wait()
        if path.endswith("openid-configuration"):
            return {"issuer": ISSUER}
        return json.dumps({"keys": [jwk(RSA_KEY, "k1", "RS256")]}).encode()


def test_held_keys_are_answered_without_a_fetch_and_a_call_during_a_fetch_waits_for_it() -> None:
    clock = FakeClock()
    client = Client()
    source = IssuerKeySource(client, clock)  # type: ignore[arg-type]

    async def main() -> None:
        client.gate.clear()
        first = asyncio.create_task(source.keys())
        await asyncio.sleep(0)  # the first call is fetching
        second = asyncio.create_task(source.keys())
        await asyncio.sleep(0)
        assert not second.done()  # it waits for the fetch under way instead of answering None
        client.gate.set()
        got = await asyncio.gather(first, second)
        assert got[0] is got[1] is source.current and got[0] is not None and "k1" in got[0].keys
        held = source.current
        clock.tick(1.0)
        assert await source.keys() is held and await source.keys("k1") is held

    asyncio.run(main())
    assert source.fetches == 1 and len(client.requests) == 2
