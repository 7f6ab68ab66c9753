"""A part's background coroutine ends with the part: stop cancels it and waits for it."""

from __future__ import annotations

import asyncio

import pytest

from vigil.runtime.background import Background

pytestmark = pytest.mark.unit


def test_stop_cancels_the_coroutine_and_waits_for_it_to_end() -> None:
    ended: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("cleaned up")

    async def scenario() -> None:
        background = Background(forever)
        background.start()
        background.start()  # once: a second start runs nothing more
        await asyncio.sleep(0)
        assert len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()]) == 1
        await background.stop()
        assert ended == ["cleaned up"]
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
        await background.stop()  # stopped twice, or never started: nothing to do

    asyncio.run(scenario())


def test_a_coroutine_that_failed_is_not_raised_again_at_stop() -> None:
    async def fails() -> None:
        raise RuntimeError("the issuer refused the keys")

    async def scenario() -> None:
        background = Background(fails)
        background.start()
        await asyncio.sleep(0)
        await background.stop()

    asyncio.run(scenario())
