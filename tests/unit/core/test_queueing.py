"""Queueing: the order of the line, maxRunning, pause, the token bucket and the retry budget.

The property tests drive a QueueBook as the shell would (observe, dispatch, confirm or give
back each start, jobs that finish, fail and back off, time passing) against a small model of
the queue kept by the test, and check the rules on every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.queueing import NS, QK, T0, Q, book_of, waiting
from vigil.api import DEFAULT_QUEUE
from vigil.core.queueing.book import (
    RELEASE_RECHECK_SECONDS,
    QueueBook,
    QueueEntry,
    QueueSpec,
    Standing,
    entry_of,
    order_key,
)
from vigil.core.queueing.heap import LazyHeap
from vigil.core.queueing.limits import (
    BURST_SECONDS,
    RETRY_WINDOW_SECONDS,
    RetryWindow,
    TokenBucket,
    burst_for,
    retry_allowed,
    retry_floor,
)
from vigil.core.queueing.status import queue_status

pytestmark = pytest.mark.unit


def running(view: QueueEntry) -> QueueEntry:
    """The job as its status shows it once its reserved attempt is written."""
    return replace(view, standing=Standing.RUNNING, attempts=view.attempts + 1, ready_at=None)


def backing_off(view: QueueEntry, ready_at: float) -> QueueEntry:
    return replace(view, standing=Standing.BACKING_OFF, is_retry=True, ready_at=ready_at)


def names(dispatch_start: tuple[tuple[str, str], ...]) -> list[str]:
    return [name for _, name in dispatch_start]


def run_one_at_a_time(book: QueueBook, views: dict[str, QueueEntry], now: float) -> list[str]:
    """With room for one, starts, confirms and finishes jobs until none is left to start."""
    order = []
    while started := book.dispatch(QK, now).start:
        (_, name), *rest = started
        assert not rest
        order.append(name)
        book.observe(running(views[name]))
        book.forget(NS, name)
    return order


# ------------------------------------------------------------------------------ entry_of


def job(status: dict | None = None, **spec: object) -> dict:
    return {
        "metadata": {"name": "j", "namespace": NS, "creationTimestamp": "2024-05-01T12:00:00Z"},
        "spec": {"queue": Q, "priority": 3, **spec},
        "status": status or {},
    }


def test_a_new_job_waits_in_its_queue_as_a_first_attempt() -> None:
    view = entry_of(job())
    assert (view.key, view.queue_key, view.priority, view.standing) == ((NS, "j"), QK, 3, Standing.QUEUED)
    assert (view.is_retry, view.ready_at, view.blocked, view.attempts) == (False, None, False, 0)
    assert view.created == 1714564800.0


def test_a_job_naming_no_queue_is_in_the_default_one() -> None:
    raw = job()
    del raw["spec"]["queue"], raw["spec"]["priority"]
    assert (entry_of(raw).queue, entry_of(raw).priority) == (DEFAULT_QUEUE, 0)


@pytest.mark.parametrize(
    ("status", "spec", "standing", "is_retry"),
    [
        ({"phase": "Queued"}, {}, Standing.QUEUED, False),
        ({"phase": "Queued", "attempts": 1, "startedAt": "2024-05-01T12:00:05Z"}, {}, Standing.QUEUED, True),
        ({"phase": "BackingOff", "attempts": 1, "startedAt": "2024-05-01T12:00:05Z"}, {}, Standing.BACKING_OFF, True),
        ({"phase": "Running", "attempts": 1, "currentAttempt": {"number": 1}}, {}, Standing.RUNNING, False),
        ({"phase": "Uncertain", "currentAttempt": {"number": 1}}, {}, Standing.RUNNING, False),
        ({"phase": "Starting", "currentAttempt": {"number": 1}}, {}, Standing.RUNNING, False),
        ({"phase": "Succeeded"}, {}, None, False),
        ({"phase": "DeadLettered", "startedAt": "2024-05-01T12:00:05Z"}, {}, Standing.DEAD_LETTERED, True),
        ({"phase": "Running", "currentAttempt": {"number": 1}}, {"suspend": True}, None, False),
        # suspend turned off: the next decision resumes it, a new round that is no retry
        ({"phase": "Suspended", "startedAt": "2024-05-01T12:00:05Z"}, {}, Standing.QUEUED, False),
    ],
)
def test_standing_follows_the_phase(status: dict, spec: dict, standing: Standing | None, is_retry: bool) -> None:
    view = entry_of(job(status, **spec))
    assert view.standing == standing
    if standing is not None:
        assert view.is_retry == is_retry


def test_a_redrive_not_yet_honoured_puts_a_dead_lettered_job_back_in_line_as_no_retry() -> None:
    raw = job({"phase": "DeadLettered", "startedAt": "2024-05-01T12:00:05Z", "lastRedrive": "1"})
    raw["metadata"]["annotations"] = {"vigil.dev/redrive": "2"}
    assert (entry_of(raw).standing, entry_of(raw).is_retry) == (Standing.QUEUED, False)
    raw["metadata"]["annotations"] = {"vigil.dev/redrive": "1"}  # already honoured
    assert entry_of(raw).standing == Standing.DEAD_LETTERED


def test_a_job_being_deleted_is_not_tracked() -> None:
    raw = job({"phase": "Queued"})
    raw["metadata"]["deletionTimestamp"] = "2024-05-01T12:01:00Z"
    assert entry_of(raw).standing is None


def test_next_attempt_at_and_a_wait_for_the_previous_pod_are_read() -> None:
    view = entry_of(job({"phase": "BackingOff", "nextAttemptAt": "2024-05-01T12:00:10.5+00:00", "reason": "X"}))
    assert view.ready_at == 1714564810.5 and not view.blocked
    assert entry_of(job({"phase": "Queued", "reason": "WaitingForPreviousPod"})).blocked


# -------------------------------------------------------------------------------- order


def test_twenty_jobs_of_mixed_priorities_start_in_priority_then_age_then_name_order() -> None:
    # The test bed's check, without a cluster: maxRunning 1, priorities, ages and ties mixed.
    jobs = {  # name: (priority, created)
        "ingest-a": (0, 10), "ingest-b": (0, 10), "ingest-c": (0, 5), "urgent-1": (5, 30),
        "urgent-2": (5, 20), "backfill-1": (-1, 0), "backfill-2": (-1, 1), "report-x": (1, 15),
        "report-y": (1, 15), "report-z": (1, 14), "ingest-d": (0, 11), "urgent-3": (5, 20),
        "backfill-3": (-1, 0), "report-w": (1, 40), "ingest-e": (0, 0), "critical": (100, 99),
        "ingest-f": (0, 10), "backfill-4": (-5, 0), "report-v": (1, 15), "urgent-4": (5, 31),
    }  # fmt: skip
    views = {name: waiting(name, priority=p, created=float(c)) for name, (p, c) in jobs.items()}
    book = book_of(QueueSpec(max_running=1), *views.values())
    assert run_one_at_a_time(book, views, T0 + 100) == [
        "critical",
        "urgent-2", "urgent-3", "urgent-1", "urgent-4",
        "report-z", "report-v", "report-x", "report-y", "report-w",
        "ingest-e", "ingest-c", "ingest-a", "ingest-b", "ingest-f", "ingest-d",
        "backfill-1", "backfill-3", "backfill-2",
        "backfill-4",
    ]  # fmt: skip


def test_a_retry_after_backoff_keeps_its_place_by_priority_and_age() -> None:
    old, young = waiting("old", created=0), waiting("young", created=5)
    book = book_of(QueueSpec(max_running=1), old, young)
    assert names(book.dispatch(QK, T0 + 1).start) == ["old"]
    book.observe(running(old))
    book.observe(backing_off(running(old), ready_at=T0 + 30))  # attempt 1 failed
    assert names(book.dispatch(QK, T0 + 2).start) == ["young"]  # old backs off meanwhile
    book.observe(running(young))
    book.observe(waiting("late", created=20))
    book.observe(waiting("later", created=25))
    assert book.dispatch(QK, T0 + 31).start == ()  # full
    book.forget(NS, "young")  # finished at T0 + 40
    assert names(book.dispatch(QK, T0 + 40).start) == ["old"]  # due, and older than both


def test_a_changed_priority_moves_a_waiting_job() -> None:
    a, b = waiting("a", created=0), waiting("b", created=1)
    book = book_of(QueueSpec(max_running=1), a, b)
    book.observe(replace(b, priority=5))
    assert names(book.dispatch(QK, T0 + 2).start) == ["b"]


def test_head_of_line_and_oldest_wait_are_read_without_starting_anything() -> None:
    views = [waiting(f"j{i}", priority=i % 2, created=float(i)) for i in range(8)]
    book = book_of(QueueSpec(max_running=0), *views)
    book.dispatch(QK, T0 + 100)
    assert book.head_of_line(QK) == ["j1", "j3", "j5", "j7", "j0"]
    assert book.oldest_waiting_since(QK) == T0
    book.forget(NS, "j0")
    assert book.oldest_waiting_since(QK) == T0 + 1
    status = queue_status(book, QK, T0 + 100.7)
    assert status is not None
    assert (status.queued, status.running, status.oldest_queued_seconds) == (7, 0, 99)


@given(
    st.lists(st.tuples(st.sampled_from(["push", "discard", "pop", "smallest"]), st.integers(0, 30), st.integers(0, 9)))
)
@settings(max_examples=300)
def test_the_lazy_heap_behaves_as_a_sorted_dict(ops: list[tuple[str, int, int]]) -> None:
    heap, model = LazyHeap(), {}
    for op, n, key in ops:
        name = f"n{n}"
        if op == "push":
            heap.push(name, (key, name))
            model[name] = (key, name)
        elif op == "discard":
            heap.discard(name)
            model.pop(name, None)
        elif op == "pop":
            expected = min(model.values(), default=None)
            got = heap.pop()
            assert (got[0] if got else None) == expected
            if expected is not None:
                del model[expected[1]]
        else:
            assert [k for k, _ in heap.smallest(key)] == sorted(model.values())[:key]
        assert len(heap) == len(model)
        assert len(heap._heap) <= 2 * len(model) + 65  # the bound the docstring states


def test_dead_entries_are_swept_so_the_heap_stays_within_its_bound() -> None:
    heap = LazyHeap()
    for i in range(10_000):  # one job whose priority keeps changing, and a few others
        heap.push("busy", (i % 7, "busy"))
        if i % 1000 == 0:
            heap.push(f"other-{i}", (3, f"other-{i}"))
    assert len(heap) == 11 and len(heap._heap) <= 2 * 11 + 65
    assert heap.pop() == ((9999 % 7, "busy"), "busy")  # its last push, ahead of the others' (3, ...)


# ---------------------------------------------------------------------------- capacity


def test_running_counts_starting_running_and_uncertain_and_not_backing_off() -> None:
    a, b, c = waiting("a"), waiting("b", created=1), waiting("c", created=2)
    book = book_of(QueueSpec(max_running=2), running(a), backing_off(running(b), ready_at=T0 + 999), c)
    assert book.count(QK, Standing.RUNNING) == 1 and book.count(QK, Standing.BACKING_OFF) == 1
    assert names(book.dispatch(QK, T0 + 1).start) == ["c"]
    assert book.dispatch(QK, T0 + 1).start == ()


def test_a_start_is_held_until_the_status_shows_it_and_a_stale_event_does_not_free_the_slot() -> None:
    a, b = waiting("a"), waiting("b", created=1)
    book = book_of(QueueSpec(max_running=1), a, b)
    assert names(book.dispatch(QK, T0).start) == ["a"]
    assert book.permit(NS, "a", T0).may_start
    book.observe(a)  # a late event from before the start
    assert book.count(QK, Standing.RUNNING) == 1
    assert book.dispatch(QK, T0).start == ()
    refused = book.permit(NS, "b", T0)
    assert (refused.may_start, refused.reason) == (False, "QueueSaturated")
    book.observe(running(a))
    assert not book.permit(NS, "a", T0).may_start  # it runs: no new start for it
    book.forget(NS, "a")  # it succeeded
    assert names(book.dispatch(QK, T0).start) == ["b"]


def test_a_start_given_back_keeps_the_jobs_place_and_is_not_offered_again_at_once() -> None:
    a, b = waiting("a"), waiting("b", created=1)
    book = book_of(QueueSpec(max_running=1), a, b)
    assert names(book.dispatch(QK, T0).start) == ["a"]
    book.release(NS, "a", T0)
    dispatch = book.dispatch(QK, T0)
    assert names(dispatch.start) == ["b"]  # the slot is free again, "a" waits a moment
    book.forget(NS, "b")
    dispatch = book.dispatch(QK, T0 + 0.5)
    assert dispatch.start == () and dispatch.wake_at == T0 + RELEASE_RECHECK_SECONDS
    book.observe(waiting("c", created=0.5))
    assert names(book.dispatch(QK, T0 + RELEASE_RECHECK_SECONDS).start) == ["a"]  # before the younger c


def test_a_job_gone_while_held_gives_its_slot_back() -> None:
    a, b = waiting("a"), waiting("b", created=1)
    book = book_of(QueueSpec(max_running=1), a, b)
    book.dispatch(QK, T0)
    book.forget(NS, "a")
    assert names(book.dispatch(QK, T0).start) == ["b"]


def test_a_job_waiting_for_its_previous_pod_is_counted_but_not_offered_a_start() -> None:
    blocked = replace(waiting("a"), blocked=True)
    book = book_of(QueueSpec(max_running=1), blocked, waiting("b", created=1))
    assert names(book.dispatch(QK, T0).start) == ["b"]
    assert book.count(QK, Standing.QUEUED) == 1


def test_paused_starts_nothing_and_running_attempts_go_on() -> None:
    a, b = waiting("a"), waiting("b", created=1)
    book = book_of(QueueSpec(max_running=5, paused=True), running(a), b)
    assert book.dispatch(QK, T0) == book.dispatch(QK, T0 + 100)
    assert book.dispatch(QK, T0).start == ()
    assert book.permit(NS, "b", T0).reason == "QueuePaused"
    status = queue_status(book, QK, T0)
    assert status is not None and status.running == 1
    assert [(c.type, c.status) for c in status.conditions] == [
        ("Saturated", "False"),
        ("Paused", "True"),
        ("RetryBudgetExhausted", "False"),
    ]
    book.set_queue(NS, Q, QueueSpec(max_running=5), T0)
    assert names(book.dispatch(QK, T0).start) == ["b"]


def test_a_changed_max_running_takes_effect_at_once() -> None:
    views = [waiting(f"j{i}", created=float(i)) for i in range(6)]
    book = book_of(QueueSpec(max_running=2), *views)
    assert names(book.dispatch(QK, T0).start) == ["j0", "j1"]
    book.set_queue(NS, Q, QueueSpec(max_running=5), T0)
    assert names(book.dispatch(QK, T0).start) == ["j2", "j3", "j4"]
    book.set_queue(NS, Q, QueueSpec(max_running=1), T0)
    book.forget(NS, "j0")
    assert book.dispatch(QK, T0).start == ()  # 4 still run: nothing stopped, nothing started
    status = queue_status(book, QK, T0)
    assert status is not None and status.conditions[0].status == "True"


def test_a_missing_queue_holds_its_jobs_until_it_exists_and_a_missing_default_runs_unlimited() -> None:
    book = QueueBook()
    book.observe(waiting("a"))
    book.observe(waiting("d", queue=DEFAULT_QUEUE))
    missing = book.permit(NS, "a", T0)
    assert (missing.may_start, missing.reason) == (False, "QueueNotFound")
    assert "VigilQueue batch does not exist in namespace team" in missing.message
    assert book.permit(NS, "d", T0).may_start  # no default queue: as before queues existed
    assert book.dispatch(QK, T0).start == () and queue_status(book, QK, T0) is None
    book.observe(running(waiting("d", queue=DEFAULT_QUEUE)))
    book.set_queue(NS, DEFAULT_QUEUE, QueueSpec(max_running=1), T0)
    book.observe(waiting("e", queue=DEFAULT_QUEUE))
    assert book.dispatch((NS, DEFAULT_QUEUE), T0).start == ()  # d, started unlimited, counts
    book.set_queue(NS, Q, QueueSpec(), T0)
    assert names(book.dispatch(QK, T0).start) == ["a"]


def test_a_job_moved_to_another_queue_leaves_the_first() -> None:
    book = book_of(QueueSpec(max_running=0), waiting("a"))
    book.set_queue(NS, "other", QueueSpec(), T0)
    book.observe(waiting("a", queue="other"))
    assert book.count(QK, Standing.QUEUED) == 0
    assert book.dispatch((NS, "other"), T0).start == ((NS, "a"),)


@dataclass
class _Model:
    """The test's own account of one queue's jobs."""

    views: dict[str, QueueEntry]
    state: dict[str, str]  # waiting | held | running
    not_before: dict[str, float]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 4),
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(-2, 2), st.integers(0, 6), st.booleans()),
            st.tuples(st.just("dispatch")),
            st.tuples(st.just("confirm"), st.integers(0, 20)),
            st.tuples(st.just("stale"), st.integers(0, 20)),
            st.tuples(st.just("release"), st.integers(0, 20)),
            st.tuples(st.just("finish"), st.integers(0, 20)),
            st.tuples(st.just("fail"), st.integers(0, 20), st.integers(0, 30)),
            st.tuples(st.just("reprioritize"), st.integers(0, 20), st.integers(-2, 2)),
            st.tuples(st.just("delete"), st.integers(0, 20)),
            st.tuples(st.just("tick"), st.integers(0, 20)),
            st.tuples(st.just("max"), st.integers(0, 4)),
        ),
        max_size=80,
    ),
)
def test_starts_follow_the_order_among_the_jobs_waiting_and_never_exceed_max_running(
    max_running: int, ops: list[tuple]
) -> None:
    """No budget and no rate limit here: each dispatch must start exactly the first free-slots
    jobs of those waiting and due, in order, whatever came before: stale events, starts given
    back, failures and backoffs, priority changes, deletions, maxRunning changes."""
    now, spec = T0, QueueSpec(max_running=max_running, retry_budget=1.0)
    book = book_of(spec)
    model = _Model({}, {}, {})

    def pick(i: int, *states: str) -> str | None:
        names = sorted(n for n, s in model.state.items() if s in states)
        return names[i % len(names)] if names else None

    for op in ops:
        kind = op[0]
        if kind == "add":
            name = f"j{len(model.views)}"
            view = replace(waiting(name, priority=op[1], created=float(op[2])), is_retry=op[3])
            model.views[name], model.state[name] = view, "waiting"
            book.observe(view)
        elif kind == "dispatch":
            due = [
                n
                for n, s in model.state.items()
                if s == "waiting"
                and max(model.views[n].ready_at or -math.inf, model.not_before.get(n, -math.inf)) <= now
            ]
            busy = sum(s in ("held", "running") for s in model.state.values())
            free = max(0, spec.max_running - busy)
            expected = sorted(due, key=lambda n: model.views[n].order)[:free]
            assert names(book.dispatch(QK, now).start) == expected
            for n in expected:
                model.state[n] = "held"
            assert book.count(QK, Standing.RUNNING) == busy + len(expected) <= max(busy, spec.max_running)
        elif kind == "confirm" and (name := pick(op[1], "held")):
            model.views[name] = running(model.views[name])
            model.state[name] = "running"
            book.observe(model.views[name])
        elif kind == "stale" and (name := pick(op[1], "held")):
            book.observe(model.views[name])  # the event from before the start, late
        elif kind == "release" and (name := pick(op[1], "held")):
            book.release(NS, name, now)
            model.state[name], model.not_before[name] = "waiting", now + RELEASE_RECHECK_SECONDS
        elif kind == "finish" and (name := pick(op[1], "running")):
            book.forget(NS, name)
            del model.state[name]
        elif kind == "fail" and (name := pick(op[1], "running")):
            model.views[name] = backing_off(model.views[name], ready_at=now + op[2])
            model.state[name] = "waiting"
            book.observe(model.views[name])
        elif kind == "reprioritize" and (name := pick(op[1], "waiting")):
            model.views[name] = replace(model.views[name], priority=op[2])
            book.observe(model.views[name])
        elif kind == "delete" and (name := pick(op[1], "waiting", "held", "running")):
            book.forget(NS, name)
            del model.state[name]
        elif kind == "tick":
            now += op[1]
        elif kind == "max":
            spec = replace(spec, max_running=op[1])
            book.set_queue(NS, Q, spec, now)
        queued = sum(s == "waiting" and model.views[n].standing is Standing.QUEUED for n, s in model.state.items())
        assert book.count(QK, Standing.QUEUED) == queued


# ------------------------------------------------------------------------- token bucket


@pytest.mark.parametrize(("rate", "burst"), [(0.1, 1.0), (1.0, 1.0), (10.0, 1.0), (25.0, 2.5), (1000.0, 100.0)])
def test_the_burst_is_a_tenth_of_a_second_of_starts_and_at_least_one(rate: float, burst: float) -> None:
    assert burst_for(rate) == pytest.approx(burst) and BURST_SECONDS == 0.1


def test_the_bucket_refills_continuously_up_to_its_burst() -> None:
    bucket = TokenBucket.full(20.0, T0)  # burst 2
    assert bucket.level(T0) == 2.0
    bucket = bucket.take(T0).take(T0)
    assert not bucket.ready(T0)
    assert bucket.next_token_at(T0) == pytest.approx(T0 + 0.05, abs=1e-6)
    assert bucket.ready(bucket.next_token_at(T0))  # the wake finds its token, to the last bit
    assert bucket.level(T0 + 0.025) == pytest.approx(0.5, abs=1e-4)  # epoch floats: 2e-7 s apart
    assert bucket.level(T0 + 60) == 2.0
    assert bucket.level(T0 - 5) == 0.0  # a clock stepped back refills nothing
    with pytest.raises(ValueError, match="no token"):
        bucket.take(T0 + 0.01)


def test_a_burst_of_100_submissions_at_10_per_second_starts_one_every_tenth_of_a_second() -> None:
    views = [waiting(f"j{i:03d}", created=float(i)) for i in range(100)]
    book = book_of(QueueSpec(max_running=1000, max_starts_per_second=10.0), *views)
    now, times = T0, []
    while len(times) < 100:
        dispatch = book.dispatch(QK, now)
        times += [now] * len(dispatch.start)
        assert dispatch.wake_at is not None or len(times) == 100
        if dispatch.wake_at is not None:
            assert book.permit(NS, f"j{len(times):03d}", now).reason == "StartRateLimited"
            now = dispatch.wake_at
    assert times[-1] - times[0] == pytest.approx(9.9)
    assert all(b - a == pytest.approx(0.1) for a, b in zip(times, times[1:], strict=False))


def test_a_changed_rate_keeps_the_tokens_up_to_the_new_burst() -> None:
    spec = QueueSpec(max_running=1000, max_starts_per_second=1000.0)  # burst 100
    book = book_of(spec, *(waiting(f"j{i}", created=float(i)) for i in range(300)))
    assert len(book.dispatch(QK, T0).start) == 100
    book.set_queue(NS, Q, replace(spec, max_starts_per_second=20.0), T0 + 0.01)  # burst 2, 10 tokens back
    assert len(book.dispatch(QK, T0 + 0.01).start) == 2
    assert book.dispatch(QK, T0 + 0.01).wake_at == pytest.approx(T0 + 0.06, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0.2, 50.0),
    st.lists(st.one_of(st.floats(0.0, 3.0), st.just(-1.0)), min_size=1, max_size=60),
)
def test_starts_over_any_span_never_exceed_burst_plus_rate_times_the_span(rate: float, steps: list[float]) -> None:
    """Time moves by the drawn steps, or (-1) straight to the next wake; jobs finish at once."""
    views = [waiting(f"j{i:03d}", created=float(i)) for i in range(200)]
    book = book_of(QueueSpec(max_running=10_000, max_starts_per_second=rate), *views)
    now, wake, times = T0, None, []
    for step in steps:
        now = wake if step < 0 and wake is not None and wake > now else now + max(step, 0.0)
        dispatch = book.dispatch(QK, now)
        times += [now] * len(dispatch.start)
        wake = dispatch.wake_at
    burst = burst_for(rate)
    slack = 1e-4  # seconds: epoch floats are 2.4e-7 s apart, and each take adds 1/rate to full_at
    # For every i <= j: starts i..j (j - i + 1 of them) <= burst + rate x (t_j - t_i); in one
    # pass, keeping the i that makes the left side largest.
    worst_i = -math.inf
    for j, t in enumerate(times):
        worst_i = max(worst_i, rate * t - j)
        assert (j + 1 - rate * t) + worst_i <= burst + rate * slack


# ------------------------------------------------------------------------- retry budget


@pytest.mark.parametrize(("max_running", "floor"), [(0, 3), (1, 3), (10, 3), (31, 4), (100, 10), (1000, 100)])
def test_the_floor_is_a_tenth_of_max_running_and_at_least_three(max_running: int, floor: int) -> None:
    assert retry_floor(max_running) == floor == QueueSpec(max_running=max_running).retry_floor


def test_retries_are_at_most_the_budget_share_of_starts_counting_themselves() -> None:
    assert retry_allowed(retries=0, starts=4, budget=0.2, floor=0)  # 1 retry of 5 starts
    assert not retry_allowed(retries=1, starts=5, budget=0.2, floor=0)  # 2 of 6 > 20%
    assert retry_allowed(retries=1, starts=9, budget=0.2, floor=0)  # 2 of 10
    assert retry_allowed(retries=2, starts=2, budget=0.0, floor=3)  # the floor
    assert not retry_allowed(retries=3, starts=3, budget=0.0, floor=3)
    assert retry_allowed(retries=10**6, starts=10**6, budget=1.0, floor=3)  # 1: no budget at all
    assert retry_allowed(retries=2, starts=29, budget=0.1, floor=0)  # float slack: 0.1 x 30 is 3


def test_the_window_forgets_starts_a_minute_old_and_says_when_a_retry_may_go() -> None:
    window = RetryWindow()
    for _ in range(3):
        window.record(T0 + 0.5, retry=True)
    window.record(T0 + 10.2, retry=True)
    assert window.counts(T0 + 30) == (4, 4)
    assert not window.allows_retry(T0 + 30, budget=0.2, floor=3)
    assert window.next_retry_at(T0 + 30, budget=0.2, floor=3) == T0 + RETRY_WINDOW_SECONDS
    assert window.counts(T0 + 59.9) == (4, 4) and window.counts(T0 + 60) == (1, 1)
    assert window.allows_retry(T0 + 60, budget=0.2, floor=3)
    window.record(T0 + 500, retry=False)
    assert window.counts(T0 + 400) == (1, 0)  # a clock stepped back counts in the newest second


def test_a_retry_over_budget_waits_while_first_attempts_go_past_it_and_goes_when_the_window_frees() -> None:
    spec = QueueSpec(max_running=100, retry_budget=0.0)  # floor 10: only the floor
    retries = [replace(waiting(f"r{i}", created=float(i)), is_retry=True) for i in range(12)]
    book = book_of(spec, *retries, waiting("fresh", created=100.0))
    first = book.dispatch(QK, T0)
    assert names(first.start) == [f"r{i}" for i in range(10)] + ["fresh"]
    assert first.wake_at == T0 + RETRY_WINDOW_SECONDS
    admission = book.permit(NS, "r10", T0 + 1)
    assert (admission.reason, admission.retry_at) == ("RetryBudgetExhausted", T0 + RETRY_WINDOW_SECONDS)
    status = queue_status(book, QK, T0 + 1)
    assert status is not None and status.conditions[2].status == "True"
    assert "10 of the 11 attempt starts in the last 60s were retries" in status.conditions[2].message
    assert names(book.dispatch(QK, T0 + RETRY_WINDOW_SECONDS).start) == ["r10", "r11"]


def test_a_queue_with_a_shorter_window_gets_its_budget_back_after_that_window() -> None:
    spec = QueueSpec(max_running=30, retry_budget=0.0, retry_window_seconds=15)  # floor 3
    retries = [replace(waiting(f"r{i}", created=float(i)), is_retry=True) for i in range(5)]
    book = book_of(spec, *retries)
    first = book.dispatch(QK, T0)
    assert names(first.start) == ["r0", "r1", "r2"] and first.wake_at == T0 + 15
    status = queue_status(book, QK, T0 + 1)
    assert status is not None and "3 of the 3 attempt starts in the last 15s were retries" in (
        status.conditions[2].message
    )
    assert "floor 3 per 15s" in status.conditions[2].message
    assert book.dispatch(QK, T0 + 14.9).start == ()
    assert names(book.dispatch(QK, T0 + 15).start) == ["r3", "r4"]


def test_a_changed_window_starts_empty_and_loosens_the_budget_by_one_floor_at_most() -> None:
    spec = QueueSpec(max_running=30, retry_budget=0.0)  # floor 3, a 60 s window
    retries = [replace(waiting(f"r{i}", created=float(i)), is_retry=True) for i in range(8)]
    book = book_of(spec, *retries)
    assert len(book.dispatch(QK, T0).start) == 3
    book.set_queue(NS, QK[1], replace(spec, retry_window_seconds=20), T0 + 1)
    assert book.window_counts(QK, T0 + 1) == (0, 0)
    assert names(book.dispatch(QK, T0 + 1).start) == ["r3", "r4", "r5"]
    assert book.dispatch(QK, T0 + 2).start == ()
    book.set_queue(NS, QK[1], replace(spec, retry_window_seconds=20), T0 + 3)  # the same: kept
    assert book.window_counts(QK, T0 + 3) == (3, 3)


def test_a_retry_that_did_not_start_costs_no_budget() -> None:
    spec = QueueSpec(max_running=10, retry_budget=0.0)  # floor 3
    retries = [replace(waiting(f"r{i}", created=float(i)), is_retry=True) for i in range(4)]
    book = book_of(spec, *retries)
    assert len(book.dispatch(QK, T0).start) == 3
    book.release(NS, "r0", T0)
    assert book.window_counts(QK, T0) == (2, 2)
    assert names(book.dispatch(QK, T0).start) == ["r3"]


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0.0, 1.0),
    st.integers(1, 12),
    st.lists(st.tuples(st.floats(0.0, 20.0), st.booleans()), max_size=120),
)
def test_the_window_counts_exactly_the_last_minute_and_admits_retries_only_within_budget(
    budget: float, floor: int, events: list[tuple[float, bool]]
) -> None:
    window, log, now = RetryWindow(), [], T0
    for step, retry in events:
        now += step
        starts = [e for e in log if math.floor(e[0]) > math.floor(now) - RETRY_WINDOW_SECONDS]
        counts = (len(starts), sum(r for _, r in starts))
        assert window.counts(now) == counts
        allowed = window.allows_retry(now, budget, floor)
        assert allowed == retry_allowed(counts[1], counts[0], budget, floor)
        if retry and not allowed:
            at = window.next_retry_at(now, budget, floor)
            assert now < at <= now + RETRY_WINDOW_SECONDS  # delayed, never dropped
            assert not window.allows_retry(math.nextafter(at, -math.inf), budget, floor)
            assert window.allows_retry(at, budget, floor)
            now = at
        window.record(now, retry)
        log.append((now, retry))
        if retry:  # the rule, in the window ending at this retry, itself included
            inside = [e for e in log if math.floor(e[0]) > math.floor(now) - RETRY_WINDOW_SECONDS]
            assert sum(r for _, r in inside) <= max(floor, budget * len(inside)) + 1e-9


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.floats(0.0, 1.0),
    st.integers(1, 40),
    st.lists(st.tuples(st.integers(-1, 1), st.integers(0, 10), st.booleans(), st.integers(0, 90)), max_size=40),
)
def test_with_a_budget_each_start_is_the_first_eligible_job_and_every_retry_eventually_starts(
    budget: float, max_running: int, arrivals: list[tuple[int, int, bool, int]]
) -> None:
    """Jobs arrive over time (first attempts and retries), finish as soon as they start, and
    the shell follows wake_at. Each start is the first in order among the jobs due, retries
    counting only while the budget (computed here from the log of starts) allows one; the rule
    holds in the window ending at every retry; and every job starts in the end."""
    spec = QueueSpec(max_running=max_running, retry_budget=budget)
    book = book_of(spec)
    arrivals = sorted(arrivals, key=lambda a: a[3])
    waiting_now: dict[str, QueueEntry] = {}
    log: list[tuple[float, bool]] = []
    now, pending = T0, list(enumerate(arrivals))

    def window_at(t: float) -> list[tuple[float, bool]]:
        return [e for e in log if math.floor(e[0]) > math.floor(t) - RETRY_WINDOW_SECONDS]

    for _ in range(10_000):
        while pending and T0 + pending[0][1][3] <= now:
            i, (priority, created, retry, _) = pending.pop(0)
            view = replace(waiting(f"j{i:02d}", priority, float(created)), is_retry=retry)
            waiting_now[view.name] = view
            book.observe(view)
        dispatch = book.dispatch(QK, now)
        for _, name in dispatch.start:
            inside = window_at(now)
            starts, retries = len(inside), sum(r for _, r in inside)
            eligible = [
                v
                for v in waiting_now.values()
                if not v.is_retry or retry_allowed(retries, starts, budget, spec.retry_floor)
            ]
            assert name == min(eligible, key=lambda v: v.order).name
            view = waiting_now.pop(name)
            log.append((now, view.is_retry))
            if view.is_retry:
                inside = window_at(now)
                assert sum(r for _, r in inside) <= max(spec.retry_floor, budget * len(inside)) + 1e-9
            book.observe(running(view))
            book.forget(NS, name)
        if not waiting_now and not pending:
            break
        if not dispatch.start:
            times = [t for t in (dispatch.wake_at, T0 + pending[0][1][3] if pending else None) if t is not None]
            assert times, "jobs wait and nothing will wake the queue"
            assert min(times) > now
            now = min(times)
    assert not waiting_now and not pending  # nothing dropped
    assert now <= T0 + 90 + RETRY_WINDOW_SECONDS * (len(arrivals) + 1)


# -------------------------------------------------------------------------------- status


def test_the_status_counts_each_kind_of_job_once() -> None:
    views = {n: waiting(n, created=float(i)) for i, n in enumerate("abcdef")}
    book = book_of(
        QueueSpec(max_running=2),
        views["a"],
        running(views["b"]),
        backing_off(running(views["c"]), ready_at=T0 + 500),
        replace(views["d"], standing=Standing.DEAD_LETTERED),
        views["e"],
        replace(views["f"], blocked=True),
    )
    assert names(book.dispatch(QK, T0 + 10).start) == ["a"]  # held: running, no longer queued
    status = queue_status(book, QK, T0 + 10)
    assert status is not None
    assert status.numbers() == {
        "queued": 2,
        "running": 2,
        "backingOff": 1,
        "deadLettered": 1,
        "oldestQueuedSeconds": 6,
        "headOfLine": ["e"],
    }
    assert [c.reason for c in status.conditions] == ["AtMaxRunning", "NotPaused", "WithinBudget"]


def test_changed_queues_are_collected_for_a_batched_status_write() -> None:
    book = book_of(QueueSpec(), waiting("a"))
    assert book.take_changed() == {QK}
    assert book.take_changed() == set()
    book.dispatch(QK, T0)
    assert book.take_changed() == {QK}
    assert book.dispatch(QK, T0).start == () and book.take_changed() == set()


def test_order_key_puts_high_priority_then_old_then_name_first() -> None:
    keys = [order_key(0, 5.0, "b"), order_key(1, 9.0, "z"), order_key(0, 5.0, "a"), order_key(0, 1.0, "c")]
    assert sorted(keys) == [
        order_key(1, 9.0, "z"),
        order_key(0, 1.0, "c"),
        order_key(0, 5.0, "a"),
        order_key(0, 5.0, "b"),
    ]


def test_a_start_whose_pod_came_first_counts_as_running_until_status_shows_it() -> None:
    """After a restart the book is rebuilt from statuses, which do not show a start whose pod was
    created just before the crash; the shell tells the book of that pod before any dispatch."""
    a, b = waiting("a"), waiting("b", created=1)
    book = book_of(QueueSpec(max_running=1), a, b)
    book.started_unseen(NS, "b", 1, T0)  # b's pod exists; its status still says Queued
    assert book.count(QK, Standing.RUNNING) == 1
    assert book.dispatch(QK, T0).start == (), "maxRunning 1 is used by b, though a is first in line"
    book.started_unseen(NS, "b", 1, T0)  # seen again: still one
    book.observe(b)  # a stale event does not free the slot
    assert book.count(QK, Standing.RUNNING) == 1
    book.observe(running(b))  # the look that found the pod recorded the attempt
    assert book.count(QK, Standing.RUNNING) == 1
    book.forget(NS, "b")
    assert names(book.dispatch(QK, T0).start) == ["a"]
    book.started_unseen(NS, "a", 1, T0)  # a's own pod, while it holds the start dispatch gave: no change
    assert book.count(QK, Standing.RUNNING) == 1


def test_a_retry_whose_first_status_shows_it_done_keeps_its_count() -> None:
    """An attempt's pod comes first and the look that records the attempt may find it finished:
    the status that ends the hold is the job's last one (Succeeded: no longer tracked). The retry
    happened and must stay in the window, or the budget lets the next ones through at once."""
    spec = QueueSpec(max_running=10, retry_budget=0.0)  # floor 3
    retries = [replace(waiting(f"r{i}", created=float(i)), is_retry=True, attempts=1) for i in range(4)]
    book = book_of(spec, *retries)
    assert len(book.dispatch(QK, T0).start) == 3
    book.observe(replace(retries[0], standing=None, attempts=2))  # r0's attempt 2 recorded as it succeeded
    assert book.window_counts(QK, T0) == (3, 3)
    assert book.dispatch(QK, T0 + 1).start == (), "the floor is spent: r3 waits"


# ------------------------------------------------------------- the cluster-wide default policy


def default_job(name: str, created: float = 0.0) -> QueueEntry:
    return waiting(name, created=created, queue=DEFAULT_QUEUE)


def test_without_a_default_policy_a_namespace_without_a_default_queue_runs_unlimited() -> None:
    book = QueueBook()
    for i in range(3):
        book.observe(default_job(f"j{i}"))
    assert book.dispatch((NS, DEFAULT_QUEUE), T0).start == ()
    assert book.permit(NS, "j2", T0).reason == "NoQueue"


def test_the_default_policy_caps_a_namespace_without_a_default_queue() -> None:
    book = QueueBook(QueueSpec(max_running=2, retry_budget=0.2))
    for i in range(5):
        book.observe(default_job(f"j{i}", created=i))
    assert names(book.dispatch((NS, DEFAULT_QUEUE), T0).start) == ["j0", "j1"]
    refused = book.permit(NS, "j2", T0)
    assert (refused.may_start, refused.reason) == (False, "QueueSaturated")
    assert "cluster-wide default policy" in refused.message
    assert f"no VigilQueue {DEFAULT_QUEUE} in {NS}" in refused.message
    assert book.permit(NS, "j0", T0).reason == "Admitted"


def test_the_default_policy_budgets_retries_and_first_attempts_go_past_them() -> None:
    book = QueueBook(QueueSpec(max_running=1000, retry_budget=0.2))
    floor = retry_floor(1000)  # 100
    retries = [replace(default_job(f"r{i}"), is_retry=True, attempts=1) for i in range(floor + 5)]
    for view in retries:
        book.observe(view)
    started = names(book.dispatch((NS, DEFAULT_QUEUE), T0).start)
    assert len(started) == floor  # the budget's floor, no more
    book.observe(default_job("new", created=10))
    assert names(book.dispatch((NS, DEFAULT_QUEUE), T0).start) == ["new"]
    (left, *_) = sorted({view.name for view in retries} - set(started))
    assert book.permit(NS, left, T0).reason == "RetryBudgetExhausted"


def test_a_default_vigilqueue_overrides_the_default_policy_and_its_deletion_restores_it() -> None:
    book = QueueBook(QueueSpec(max_running=1))
    for i in range(3):
        book.observe(default_job(f"j{i}", created=i))
    book.set_queue(NS, DEFAULT_QUEUE, QueueSpec(max_running=3), T0)
    assert names(book.dispatch((NS, DEFAULT_QUEUE), T0).start) == ["j0", "j1", "j2"]
    assert book.policy((NS, DEFAULT_QUEUE)) == QueueSpec(max_running=3)
    book.set_queue(NS, DEFAULT_QUEUE, None, T0)
    assert book.policy((NS, DEFAULT_QUEUE)) == QueueSpec(max_running=1)
    assert book.spec((NS, DEFAULT_QUEUE)) is None  # no VigilQueue: no status, no maxQueued at admission


def test_the_default_policy_is_only_for_the_default_queue() -> None:
    book = QueueBook(QueueSpec(max_running=1))
    book.observe(waiting("j"))  # names queue batch, which does not exist
    assert book.permit(NS, "j", T0).reason == "QueueNotFound"
