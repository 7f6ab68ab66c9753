"""Events are posted beside the work: recording one never waits for the API server; a repeat
becomes a PATCH of its Event's count (created again if that Event is gone), similar ones are
combined, a job past its budget is cut off; what waits is held per namespace, so one
namespace's flood drops only its own events, and every drop is counted; closing posts what
waits."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.support.clock import FakeClock, settle
from vigil.core.events import COMBINED, Create, Patch
from vigil.kube.events import EventRecorder

pytestmark = pytest.mark.unit

JOB = {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}}
DEADLINE = 5.0


def job(namespace: str, name: str) -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}/{name}"}}


class SlowApi:
    """An API server that answers each write after `latency` seconds of `clock`; `gate` holds
    them all. `written` lists (verb, namespace, reason, count, message); `events` the Events
    that exist, by (namespace, name)."""

    def __init__(self, clock: FakeClock, latency: float = 0.0):
        self.clock, self.latency, self.gate = clock, latency, asyncio.Event()
        self.written: list[tuple[str, str, str, int, str]] = []
        self.events: dict[tuple[str, str], int] = {}
        self.gate.set()

    async def _answer(self, reason: str) -> None:
        await self.gate.wait()
        if self.latency:
            await self.clock.sleep(self.latency)
        if reason == "Refused":
            raise RuntimeError("the API server refused it")

    async def post(self, job, event):
        assert isinstance(event, Create)
        await self._answer(event.reason)
        namespace = job["metadata"]["namespace"]
        self.events[namespace, event.name] = event.count
        self.written.append(("POST", namespace, event.reason, event.count, event.message))

    async def patch(self, namespace, event):
        assert isinstance(event, Patch)
        await self._answer(event.reason)
        if (namespace, event.name) not in self.events:
            return False
        assert event.count > self.events[namespace, event.name], "an Event's count only grows"
        self.events[namespace, event.name] = event.count
        self.written.append(("PATCH", namespace, event.reason, event.count, event.message))
        return True

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _, _ in self.written]


def recorder_for(api: SlowApi, **options) -> EventRecorder:
    return EventRecorder(api.post, api.patch, clock=api.clock, **options)


def test_recording_returns_at_once_and_every_event_is_posted():
    async def scenario():
        clock = FakeClock()
        api = SlowApi(clock, latency=0.05)
        recorder = recorder_for(api, concurrency=4)
        for n in range(20):
            recorder.record(JOB, "Normal", f"E{n}", "m")
        await settle()
        assert api.written == [] and len(recorder) == 16, "recorded at once, four posts in flight"
        flushed = asyncio.ensure_future(recorder.flush(DEADLINE))
        await clock.advance(0.05 * 5)
        assert await flushed
        assert sorted(api.reasons()) == sorted(f"E{n}" for n in range(20))
        assert recorder.dropped == 0
        await recorder.close()

    asyncio.run(scenario())


def test_past_its_capacity_events_are_dropped_and_counted_not_waited_for():
    async def scenario():
        api = SlowApi(FakeClock())
        api.gate.clear()  # the API server hangs
        drops: Counter[str] = Counter()
        recorder = recorder_for(api, capacity=5, concurrency=1, on_drop=lambda cause: drops.update([cause]))
        for n in range(12):
            recorder.record(JOB, "Normal", f"E{n}", "m")
        await asyncio.sleep(0)  # the sender takes the first event and hangs on it
        recorder.record(JOB, "Normal", "E12", "m")
        assert len(recorder) == 5, "the backlog holds its capacity, no more"
        assert recorder.dropped == 7 and drops == {"backlog": 7}
        api.gate.set()
        assert await recorder.flush(DEADLINE)
        assert api.reasons() == ["E0", "E1", "E2", "E3", "E4", "E12"], "in order, the dropped ones never"
        await recorder.close()

    asyncio.run(scenario())


def test_a_flood_in_one_namespace_drops_its_own_events_and_not_another_namespaces():
    async def scenario():
        api = SlowApi(FakeClock())
        api.gate.clear()
        drops: Counter[str] = Counter()
        recorder = recorder_for(api, on_drop=lambda cause: drops.update([cause]))
        for n in range(10_000):  # ten events on each of a thousand jobs: within each job's budget
            recorder.record(job("noisy", f"job-{n % 1000}"), "Normal", f"E{n // 1000}", f"event {n}")
        await settle()
        recorder.record(job("quiet", "alone"), "Warning", "Quiet", "the one event of this namespace")
        assert drops == {"backlog": 10_000 - 100}, "the flood filled its namespace's share, no more"
        assert len(recorder) == 100 - 4 + 1, "four in flight; the quiet namespace's one waits"
        api.gate.set()
        assert await recorder.flush(DEADLINE)
        written = [(namespace, reason) for _, namespace, reason, _, _ in api.written]
        assert len(written) == 101 and written.index(("quiet", "Quiet")) <= 4 + 1, "posted in its turn"
        await recorder.close()

    asyncio.run(scenario())


def test_a_repeat_patches_its_event_count_and_repeats_waiting_make_one_patch():
    async def scenario():
        clock = FakeClock()
        api = SlowApi(clock)
        recorder = recorder_for(api, concurrency=2)
        for _ in range(3):
            recorder.record(JOB, "Warning", "Stuck", "no heartbeat")
            assert await recorder.flush(DEADLINE)
            await clock.advance(10)
        assert [(verb, count) for verb, _, _, count, _ in api.written] == [("POST", 1), ("PATCH", 2), ("PATCH", 3)]
        [(name, count)] = [(name, count) for (_, name), count in api.events.items()]
        assert count == 3 and name.startswith("j.")

        api.gate.clear()  # the next patch hangs; five more repeats wait behind it as one
        recorder.record(JOB, "Warning", "Stuck", "no heartbeat")
        await settle()
        for _ in range(5):
            recorder.record(JOB, "Warning", "Stuck", "no heartbeat")
        await settle()
        assert len(recorder) == 1, "one write of the Event at a time (two senders), the newest waiting"
        api.gate.set()
        assert await recorder.flush(DEADLINE)
        assert [count for _, _, _, count, _ in api.written[3:]] == [4, 9]

        api.events.clear()  # the Event expired (events live an hour): created again, with its count
        recorder.record(JOB, "Warning", "Stuck", "no heartbeat")
        assert await recorder.flush(DEADLINE)
        assert api.written[-1] == ("POST", "ns", "Stuck", 10, "no heartbeat")
        assert list(api.events.items()) == [(("ns", name), 10)]
        await recorder.close()

    asyncio.run(scenario())


def test_similar_events_are_combined_from_the_tenth_and_a_job_past_its_budget_is_dropped():
    async def scenario():
        clock = FakeClock()
        api = SlowApi(clock)
        drops: Counter[str] = Counter()
        recorder = recorder_for(api, on_drop=lambda cause: drops.update([cause]))
        for n in range(1, 12):
            recorder.record(JOB, "Warning", "AttemptFailed", f"attempt {n} failed")
            assert await recorder.flush(DEADLINE)
            await clock.advance(20)  # eleven within ten minutes (and five: no token back yet)
        assert [(verb, count, message) for verb, _, _, count, message in api.written[8:]] == [
            ("POST", 1, "attempt 9 failed"),
            ("POST", 1, COMBINED + "attempt 10 failed"),
            ("PATCH", 2, COMBINED + "attempt 11 failed"),
        ]
        assert len(api.events) == 10

        for n in range(20):  # 11 + 20 events at once: past the job's burst of 25
            recorder.record(JOB, "Normal", f"Other{n}", "m")
        assert drops == {"rate-limit": 11 + 20 - 25} and recorder.dropped == 6
        assert await recorder.flush(DEADLINE)
        await recorder.close()

    asyncio.run(scenario())


def test_a_refused_event_is_given_up_and_the_next_ones_still_go():
    async def scenario():
        api = SlowApi(FakeClock())
        recorder = recorder_for(api, concurrency=1)
        for reason in ("A", "Refused", "B"):
            recorder.record(JOB, "Normal", reason, "m")
        assert await recorder.flush(DEADLINE)
        assert api.reasons() == ["A", "B"]
        await recorder.close()

    asyncio.run(scenario())


def test_closing_posts_what_waits_within_its_timeout_then_stops():
    async def scenario():
        clock = FakeClock()
        api = SlowApi(clock, latency=0.01)
        recorder = recorder_for(api, concurrency=1)
        for n in range(3):
            recorder.record(JOB, "Normal", f"E{n}", "m")
        closing = asyncio.ensure_future(recorder.close(timeout=DEADLINE))
        await clock.advance(0.03)
        await closing
        assert api.reasons() == ["E0", "E1", "E2"]

        hung = SlowApi(clock)
        hung.gate.clear()
        recorder = recorder_for(hung)
        recorder.record(JOB, "Normal", "never", "m")
        closing = asyncio.ensure_future(recorder.close(timeout=0.1))
        await clock.advance(0.1)
        assert closing.done(), "a hung API server does not hold the shutdown past its timeout"
        assert hung.written == []

    asyncio.run(scenario())
