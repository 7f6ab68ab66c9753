"""Events are posted beside the work: recording one never waits for the API server, every event
is posted while the queue has room, the overflow is dropped and counted, and closing posts what
waits."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import FakeClock, settle
from vigil.kube.events import EventRecorder

pytestmark = pytest.mark.unit

JOB = {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}}
DEADLINE = 5.0


class SlowApi:
    """An API server that answers each event after `latency` seconds of `clock`; `gate` holds
    them all."""

    def __init__(self, clock: FakeClock, latency: float = 0.0):
        self.clock, self.latency, self.posted, self.gate = clock, latency, [], asyncio.Event()
        self.gate.set()

    async def post(self, job, type_, reason, message):
        await self.gate.wait()
        if self.latency:
            await self.clock.sleep(self.latency)
        if reason == "Refused":
            raise RuntimeError("the API server refused it")
        self.posted.append(reason)


def test_recording_returns_at_once_and_every_event_is_posted():
    async def scenario():
        clock = FakeClock()
        api = SlowApi(clock, latency=0.05)
        recorder = EventRecorder(api.post, concurrency=4, clock=clock)
        for n in range(20):
            recorder.record(JOB, "Normal", f"E{n}", "m")
        await settle()
        assert api.posted == [] and len(recorder) == 16, "recorded at once, four posts in flight"
        flushed = asyncio.ensure_future(recorder.flush(DEADLINE))
        await clock.advance(0.05 * 5)
        assert await flushed
        assert sorted(api.posted) == sorted(f"E{n}" for n in range(20))
        assert recorder.dropped == 0
        await recorder.close()

    asyncio.run(scenario())


def test_past_its_capacity_events_are_dropped_and_counted_not_waited_for():
    async def scenario():
        api = SlowApi(FakeClock())
        api.gate.clear()  # the API server hangs
        drops = []
        recorder = EventRecorder(api.post, capacity=5, concurrency=1, on_drop=lambda: drops.append(1), clock=api.clock)
        for n in range(12):
            recorder.record(JOB, "Normal", f"E{n}", "m")
        await asyncio.sleep(0)  # the sender takes the first event and hangs on it
        recorder.record(JOB, "Normal", "E12", "m")
        assert len(recorder) == 5, "the queue holds its capacity, no more"
        assert recorder.dropped == len(drops) == 7
        api.gate.set()
        assert await recorder.flush(DEADLINE)
        assert api.posted == ["E0", "E1", "E2", "E3", "E4", "E12"], "in order, the dropped ones never"
        await recorder.close()

    asyncio.run(scenario())


def test_a_refused_event_is_given_up_and_the_next_ones_still_go():
    async def scenario():
        api = SlowApi(FakeClock())
        recorder = EventRecorder(api.post, concurrency=1, clock=api.clock)
        for reason in ("A", "Refused", "B"):
            recorder.record(JOB, "Normal", reason, "m")
        assert await recorder.flush(DEADLINE)
        assert api.posted == ["A", "B"]
        await recorder.close()

    asyncio.run(scenario())


def test_closing_posts_what_waits_within_its_timeout_then_stops():
    async def scenario():
        clock = FakeClock()
        api = SlowApi(clock, latency=0.01)
        recorder = EventRecorder(api.post, concurrency=1, clock=clock)
        for n in range(3):
            recorder.record(JOB, "Normal", f"E{n}", "m")
        closing = asyncio.ensure_future(recorder.close(timeout=DEADLINE))
        await clock.advance(0.03)
        await closing
        assert api.posted == ["E0", "E1", "E2"]

        hung = SlowApi(clock)
        hung.gate.clear()
        recorder = EventRecorder(hung.post, clock=clock)
        recorder.record(JOB, "Normal", "never", "m")
        closing = asyncio.ensure_future(recorder.close(timeout=0.1))
        await clock.advance(0.1)
        assert closing.done(), "a hung API server does not hold the shutdown past its timeout"
        assert hung.posted == []

    asyncio.run(scenario())
