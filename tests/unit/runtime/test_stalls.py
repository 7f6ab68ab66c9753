"""What holds the event loop: the lag probe observes how late its timer fires, once per stall,
and the collector's pauses are timed by generation."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tests.support.clock import FakeClock
from vigil.metrics import Metrics
from vigil.runtime.stalls import CollectorPauses, CollectorWatch, LagProbe

pytestmark = pytest.mark.unit


def test_the_probe_observes_how_late_its_timer_fires_and_a_stall_once():
    clock = FakeClock()
    lags: list[float] = []
    probe = LagProbe(clock, lags.append, period=0.25)
    asyncio.run(probe.start())
    clock.tick(1.0)  # a loop that runs on time: four looks, none late
    assert lags == [0.0] * 4
    # The loop is held 1.2 s past the next timer's due time (a long collection): the timer
    # fires that late, once, and the probe carries on from then, not from the periods it missed.
    due = clock.next_due()
    assert due is not None
    clock.now = due + 1.2
    clock.tick(0.0)
    assert lags[4:] == [pytest.approx(1.2)]
    clock.tick(0.5)
    assert lags[5:] == [0.0, 0.0]
    asyncio.run(probe.stop())
    assert clock.pending() == 0  # stopped: no timer left behind


def test_each_collection_is_timed_by_its_generation():
    now = [100.0]
    seen: list[tuple[int, float]] = []
    pauses = CollectorPauses(lambda: now[0], lambda gen, seconds: seen.append((gen, seconds)))
    pauses("start", {"generation": 0})
    now[0] += 0.002
    pauses("stop", {"generation": 0, "collected": 3, "uncollectable": 0})
    pauses("stop", {"generation": 1})  # a stop without its start (hooked mid-collection): nothing
    pauses("start", {"generation": 2})
    now[0] += 0.9
    pauses("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    assert seen == [(0, pytest.approx(0.002)), (2, pytest.approx(0.9))]


def test_a_hooked_collector_reports_a_real_full_collection_to_the_metric_and_unhooks():
    metrics = Metrics()
    pauses = CollectorPauses(lambda: 0.0, lambda gen, seconds: metrics.gc_pauses.labels(str(gen)).observe(seconds))
    watch = CollectorWatch(pauses)  # the interpreter's own gc.callbacks
    asyncio.run(watch.start())
    try:
        gc.collect(2)
    finally:
        asyncio.run(watch.stop())
    full = metrics.registry.get_sample_value("vigil_gc_pause_seconds_count", {"generation": "2"})
    assert full is not None and full >= 1
    assert pauses not in gc.callbacks
    gc.collect(2)  # unhooked: counted no more
    assert metrics.registry.get_sample_value("vigil_gc_pause_seconds_count", {"generation": "2"}) == full
