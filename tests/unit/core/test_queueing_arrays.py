"""The queue book and task arrays: an array's tasks count as jobs do (toward maxRunning and in the
queue's status), its holds carry several starts, and what it does not use goes back."""

from __future__ import annotations

import pytest

from tests.support.queueing import NS, QK, T0, Q, book_of, waiting
from vigil.core.queueing.book import QueueSpec, Standing, entry_of
from vigil.core.queueing.status import queue_status

pytestmark = pytest.mark.unit


def array_body(
    name: str, *, total: int = 10, parallelism: int = 4, active: list[dict] | None = None, **status: object
) -> dict:
    return {
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": "2025-03-01T12:00:00Z"},
        "spec": {"queue": Q, "tasks": {"count": total, "parallelism": parallelism}, "template": {}},
        "status": {"tasks": {"total": total, "active": active or [], **status.pop("tasks", {})}, **status},
    }


def running_task(index: int) -> dict:
    return {
        "index": index,
        "phase": "Running",
        "attempts": 1,
        "currentAttempt": {"number": 1, "podName": f"a-{index}-1"},
    }


def test_an_array_wants_its_room_under_parallelism_and_counts_its_tasks() -> None:
    entry = entry_of(array_body("a", total=10, parallelism=4, active=[running_task(0)], attempts=1))
    assert entry.standing is Standing.QUEUED and entry.wants == 3
    assert dict(entry.units or ()) == {"running": 1, "queued": 9, "backingOff": 0, "deadLettered": 0}
    book = book_of(QueueSpec(max_running=100), entry)
    status = queue_status(book, QK, T0)
    assert status is not None and status.running == 1 and status.queued == 9


def test_a_hold_carries_several_starts_within_max_running_and_ends_when_status_shows_them() -> None:
    entry = entry_of(array_body("a", total=10, parallelism=8))
    book = book_of(QueueSpec(max_running=5), entry)
    assert [name for _, name in book.dispatch(QK, T0).start] == ["a"]
    permit = book.permit(NS, "a", T0)
    assert permit.may_start and permit.starts == 5  # maxRunning, not parallelism
    assert book.count(QK, Standing.RUNNING) == 5
    # nobody else may start meanwhile
    book.observe(waiting("other"))
    assert book.dispatch(QK, T0).start == ()
    # the look used 3: two go back at once
    book.use(NS, "a", 3, T0)
    assert book.count(QK, Standing.RUNNING) == 3
    assert [name for _, name in book.dispatch(QK, T0).start] == ["other"]
    # status shows the three starts: the hold ends, the tasks count as running from status
    active = [running_task(i) for i in range(3)]
    book.observe(entry_of(array_body("a", total=10, parallelism=8, active=active, attempts=3)))
    assert book.count(QK, Standing.RUNNING) == 3 + 1  # and "other"'s held start


def test_top_up_takes_starts_at_once_only_when_no_other_job_waits_ahead() -> None:
    first = waiting("first", created=-10)
    active = [running_task(i) for i in range(2)]
    entry = entry_of(array_body("a", total=10, parallelism=2, active=active, attempts=2))
    assert entry.wants == 0
    book = book_of(QueueSpec(max_running=3), first, entry)
    book.dispatch(QK, T0)  # "first" holds the one free start
    book.top_up(NS, "a", 2, T0)
    assert not book.permit(NS, "a", T0).may_start  # the queue is full
    book.forget(NS, "first")
    book.observe(waiting("second", created=-5))  # waits ahead of the array's new wants
    book.top_up(NS, "a", 2, T0)
    assert not book.permit(NS, "a", T0).may_start
    book.forget(NS, "second")
    book.top_up(NS, "a", 2, T0)
    permit = book.permit(NS, "a", T0)
    assert permit.may_start and permit.starts == 1  # the room left: 3 - 2 running


def test_unused_starts_of_a_retry_give_their_budget_back() -> None:
    backing = {"index": 0, "phase": "BackingOff", "attempts": 1, "nextAttemptAt": "2025-03-01T12:00:00Z"}
    entry = entry_of(array_body("a", total=1, parallelism=1, active=[backing], attempts=1))
    assert entry.is_retry and entry.standing is Standing.BACKING_OFF
    due = entry.ready_at
    assert due is not None
    book = book_of(QueueSpec(max_running=10), entry, now=due)
    assert book.dispatch(QK, due - 1).start == ()  # not before its backoff ends
    book.dispatch(QK, due)
    assert book.permit(NS, "a", due).may_start
    assert book.window_counts(QK, due) == (1, 1)
    book.use(NS, "a", 0, due)
    assert book.window_counts(QK, due) == (0, 0)  # as a job's retry that did not run


def test_a_dead_lettered_array_counts_its_dead_tasks_and_wants_nothing() -> None:
    body = array_body("a", total=5, phase="DeadLettered", attempts=5, tasks={"succeeded": 3, "deadLettered": 2})
    entry = entry_of(body)
    assert entry.standing is Standing.DEAD_LETTERED
    book = book_of(QueueSpec(), entry)
    assert book.count(QK, Standing.DEAD_LETTERED) == 2 and book.dispatch(QK, T0).start == ()
