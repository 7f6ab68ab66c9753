"""A process that fails on its way up (a server that cannot bind its port) stops campaigning at
once, and a watch that does not end when cancelled cannot keep it up: else it would take the
Lease meanwhile and lead, running nothing, until the Lease ran out (seen on the bed: 7 minutes)."""

from __future__ import annotations

import asyncio

import pytest

from vigil import manager as manager_module
from vigil.manager import Manager

pytestmark = pytest.mark.unit


class Elector:
    """Campaigns until `free` is set (the Lease's holder is gone), then leads."""

    def __init__(self, free: asyncio.Event) -> None:
        self.free, self.leading, self.led, self.cancelled = free, asyncio.Event(), False, False

    async def run(self) -> None:
        try:
            await self.free.wait()
            self.led = True
            self.leading.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class StubbornWatch:
    """A watch whose first cancel is swallowed: it ends only once `until` is set."""

    name = "pods"

    def __init__(self, until: asyncio.Event) -> None:
        self.until, self.synced = until, asyncio.Event()

    async def run(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.until.wait()


class Unbindable:
    async def start(self) -> None:
        for _ in range(3):  # the watches and the campaign are under way by then
            await asyncio.sleep(0)
        raise OSError(98, "address already in use")

    async def stop(self) -> None:
        pass


def run_failing(until_watch_ends: bool) -> Elector:
    async def scenario() -> Elector:
        free = asyncio.Event()
        watch_may_end = asyncio.Event()
        elector = Elector(free)
        manager = Manager(
            informers=[StubbornWatch(watch_may_end)],  # type: ignore[list-item]
            always=[Unbindable()],  # type: ignore[list-item]
            leader_only=[],
            elector=elector,  # type: ignore[arg-type]
            clients=[],
        )
        running = asyncio.ensure_future(manager.run(asyncio.Event()))
        for _ in range(5):
            await asyncio.sleep(0)
        free.set()  # the old leader's Lease runs out while this process is on its way out
        for _ in range(5):
            await asyncio.sleep(0)
        if until_watch_ends:
            watch_may_end.set()
        with pytest.raises(OSError):
            await running
        return elector

    return asyncio.run(scenario())


def test_a_process_that_fails_to_start_stops_campaigning_before_anything_else():
    elector = run_failing(until_watch_ends=True)
    assert elector.cancelled and not elector.led, "it took the Lease on its way out"


def test_a_watch_that_ignores_its_cancel_does_not_keep_the_process_up(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(manager_module, "STOP_WATCHES_SECONDS", 0.05)
    elector = run_failing(until_watch_ends=False)  # the watch never ends: the stop goes on without it
    assert elector.cancelled and not elector.led
