"""client-go's event correlator, on a clock moved by hand: an exact repeat patches the first
Event's count; the 10th distinct message of a job's reason within 10 minutes, and each new one
after it, make one combined Event; a job may burst 25 events, then one every 5 minutes; every
cache keeps its bound. The backlog keeps one write per Event and each namespace to its share."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.core.events import (
    CACHE_ENTRIES,
    COMBINED,
    MAX_EVENT_NAME,
    SPAM_BURST,
    SPAM_QPS,
    Backlog,
    Create,
    Drop,
    EventCorrelator,
    Patch,
    Write,
    created,
    event_name,
    supersede,
)

pytestmark = pytest.mark.unit

T0 = 1000.0
WALL0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
JOB = ("work", "ledger", "uid-1")
OTHER = ("work", "other", "uid-2")


class Events:
    """A correlator and the clock it is handed."""

    def __init__(self, **options) -> None:
        self.correlator = EventCorrelator(rng=random.Random(0), **options)
        self.now = T0

    def __call__(self, message: str = "m", reason: str = "AttemptFailed", involved=JOB, type_: str = "Warning"):
        wall = WALL0 + timedelta(seconds=self.now - T0)
        return self.correlator.correlate(involved, type_, reason, message, now=self.now, wall=wall)


def test_an_exact_repeat_patches_the_first_event_with_its_count_and_last_time():
    events = Events()
    first = events()
    assert isinstance(first, Create) and (first.count, first.message) == (1, "m")
    assert first.first == first.last == WALL0 and first.name.startswith("ledger.")
    writes = []
    for _ in range(3):
        events.now += 7
        writes.append(events())
    assert all(isinstance(w, Patch) for w in writes)
    assert [(w.name, w.count, w.first) for w in writes] == [(first.name, n, WALL0) for n in (2, 3, 4)]
    assert writes[-1].last == WALL0 + timedelta(seconds=21)
    other = events(involved=OTHER)
    assert isinstance(other, Create) and other.name != first.name, "another job's event is its own"


def test_the_tenth_distinct_message_within_ten_minutes_and_the_next_ones_are_combined():
    events = Events()
    alone = [events(f"attempt {n} failed") for n in range(1, 10)]
    assert all(isinstance(w, Create) for w in alone) and len({w.name for w in alone}) == 9
    events.now += 599
    tenth = events("attempt 10 failed")
    assert isinstance(tenth, Create) and tenth.message == COMBINED + "attempt 10 failed"
    events.now += 1
    eleventh = events("attempt 11 failed")
    assert isinstance(eleventh, Patch)
    assert (eleventh.name, eleventh.count, eleventh.message) == (tenth.name, 2, COMBINED + "attempt 11 failed")
    assert isinstance(events("attempt 12 failed", reason="Other"), Create), "another reason is not similar"
    events.now += 601  # quiet for longer than the interval: the group starts again
    fresh = events("attempt 13 failed")
    assert isinstance(fresh, Create) and fresh.message == "attempt 13 failed"


def test_a_job_bursts_25_events_then_one_every_five_minutes_and_the_dropped_still_count():
    events = Events()
    writes = [events() for _ in range(30)]
    assert sum(not isinstance(w, Drop) for w in writes) == SPAM_BURST
    assert all(isinstance(w, Drop) for w in writes[SPAM_BURST:])
    assert isinstance(events(involved=OTHER), Create), "each job has its own bucket"
    events.now += 299
    assert isinstance(events(), Drop)
    events.now += 1
    after = events()
    assert isinstance(after, Patch) and after.count == 32, "the dropped ones are counted in the next"
    assert isinstance(events(), Drop)


def test_an_event_name_is_valid_for_the_longest_job_name():
    name = event_name("a" * 250 + "-b", "0123456789abcdef")
    assert len(name) == MAX_EVENT_NAME and name.endswith("a.0123456789abcdef")
    assert event_name("ledger", "ff") == "ledger.ff"


def test_a_waiting_create_stays_a_create_when_a_newer_write_supersedes_it():
    create = Create("e.1", "Normal", "R", "m", 1, WALL0, WALL0)
    patch = Patch("e.1", "Normal", "R", "m", 2, WALL0, WALL0 + timedelta(seconds=5))
    assert supersede(create, patch) == created(patch) == Create("e.1", "Normal", "R", "m", 2, WALL0, patch.last)
    later = Patch("e.1", "Normal", "R", "m", 3, WALL0, WALL0 + timedelta(seconds=9))
    assert supersede(patch, later) is later


# (job, reason, message, seconds later, how many times at once)
occurrences = st.lists(
    st.tuples(
        st.sampled_from([JOB, OTHER, ("team-b", "ledger", "uid-3")]),
        st.sampled_from(["A", "B"]),
        st.sampled_from([f"m{n}" for n in range(12)]),
        st.sampled_from([0.0, 1.0, 60.0, 299.0, 301.0, 700.0]),
        st.integers(1, 30),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(occurrences, st.sampled_from([1, 2, 5, CACHE_ENTRIES]))
def test_never_more_than_the_burst_and_the_refill_counts_only_grow_and_the_caches_keep_their_bound(script, entries):
    events = Events(entries=entries)
    began: dict[tuple, float] = {}
    let_through: dict[tuple, int] = defaultdict(int)
    last_of: dict[str, Write] = {}
    for involved, reason, message, later, times in script:
        events.now += later
        began.setdefault(involved, events.now)
        for _ in range(times):
            write = events(message, reason=reason, involved=involved)
            correlator = events.correlator
            assert max(len(correlator.similar), len(correlator.written), len(correlator.buckets)) <= entries
            if isinstance(write, Drop):
                continue
            let_through[involved] += 1
            if entries >= 3:  # no job's bucket forgotten (three jobs): the rate holds from its first event
                allowed = SPAM_BURST + (events.now - began[involved]) * SPAM_QPS
                assert let_through[involved] <= allowed + 1e-9
            assert isinstance(write, Create) == (write.count == 1)
            before = last_of.get(write.name)
            if before is not None:  # the same Event again: a higher count, the same first time, later
                assert write.count > before.count and write.first == before.first and write.last >= before.last
            last_of[write.name] = write


# ("put", namespace, event) or ("pop", index among the waiting, None)
backlog_steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abcd"), st.integers(0, 8)),
        st.tuples(st.just("pop"), st.integers(0, 50), st.none()),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(backlog_steps, st.integers(1, 12), st.integers(1, 5))
def test_the_backlog_keeps_one_write_per_event_and_refuses_only_past_a_share_or_the_capacity(script, capacity, share):
    backlog = Backlog(capacity, share)
    waiting: dict[tuple[str, str], Write] = {}
    count: dict[str, int] = defaultdict(int)
    for op, a, b in script:
        if op == "put":
            namespace, name = str(a), f"e{b}"
            count[name] += 1
            kind = Create if count[name] == 1 else Patch
            write = kind(name, "Normal", "R", "m", count[name], WALL0, WALL0)
            held = sum(ns == namespace for ns, _ in waiting)
            key = backlog.put({"metadata": {"namespace": namespace}}, write)
            if (namespace, name) in waiting:
                assert key == (namespace, name), "the same Event takes no more room"
                waiting[key] = supersede(waiting[key], write)
            elif held >= share or len(waiting) >= capacity:
                assert key is None
            else:
                assert key == (namespace, name)
                waiting[key] = write
        elif waiting:
            key = sorted(waiting)[int(a) % len(waiting)]
            job, write = backlog.pop(key)
            assert job["metadata"]["namespace"] == key[0] and write == waiting.pop(key)
        assert len(backlog) == len(waiting) <= capacity
        assert all(backlog.held(ns) == sum(k[0] == ns for k in waiting) <= share for ns in "abcd")
