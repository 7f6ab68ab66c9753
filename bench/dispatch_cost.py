"""Dispatch cost: picking the next job to start among N queued jobs, with Vigil's index (the
QueueBook's heaps) side by side with a baseline measured in the same run.

    python bench/dispatch_cost.py [--sizes 100,1000,10000,100000] [--picks 5000] [--seed 1]

No cluster: this times the pure core (vigil.core.queueing). For each N, one queue holds N waiting
jobs of mixed priorities and ages, with maxRunning 1. One pick is a `dispatch` that starts the
head of the line; the started job then finishes, a random waiting job is deleted, and two new
ones are submitted, so the queue stays at N. Timed separately: the pick, the add of a job
(`observe`) and the removal of a waiting one (`forget`).

The baseline is what a controller without an index does for each pick: scan all the queue's
jobs (counting the running ones, keeping the waiting ones), sort the waiting ones by (priority,
creation time, name) and take the first. Its add and remove are a dict's. A plain scan for the
minimum (no sort) is shown as well: the best any O(n) pick can do. Both pick the same job as
the index at every step of a short cross-check run first.

Times are means over all picks (amortised: the index's occasional sweep of dead heap entries
is included), in microseconds, with the garbage collector off while timing.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from vigil.core.queueing.book import QueueBook, QueueEntry, QueueSpec, Standing  # noqa: E402

NS, Q = "bench", "q"
QK = (NS, Q)
NOW = 1_700_000_000.0


class Jobs:
    """Makes waiting jobs with random priorities (-5..5) and creation times (over a day)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.serial = 0

    def make(self) -> QueueEntry:
        self.serial += 1
        return QueueEntry(
            NS,
            f"job-{self.serial:07d}",
            Q,
            self.rng.randint(-5, 5),
            NOW - self.rng.uniform(0, 86_400),
            Standing.QUEUED,
        )


def running(view: QueueEntry) -> QueueEntry:
    return replace(view, standing=Standing.RUNNING, attempts=view.attempts + 1)


# --------------------------------------------------------------------------------- the index


class Index:
    def __init__(self, views: list[QueueEntry]) -> None:
        self.book = QueueBook()
        self.book.set_queue(NS, Q, QueueSpec(max_running=1, max_queued=10**9), NOW)
        self.waiting = {view.name: view for view in views}
        for view in views:
            self.book.observe(view)

    def pick(self) -> str:
        (_, name), *_ = self.book.dispatch(QK, NOW).start
        return name

    def finish(self, name: str) -> None:
        self.book.observe(running(self.waiting.pop(name)))
        self.book.forget(NS, name)

    def add(self, view: QueueEntry) -> None:
        self.waiting[view.name] = view
        self.book.observe(view)

    def remove(self, name: str) -> None:
        del self.waiting[name]
        self.book.forget(NS, name)

    def names(self) -> list[str]:
        return list(self.waiting)

    def has(self, name: str) -> bool:
        return name in self.waiting


# ------------------------------------------------------------------------------ the baseline


class Scan:
    """No index: every job of the queue in a dict, scanned at each pick."""

    def __init__(self, views: list[QueueEntry], sort: bool) -> None:
        self.jobs = {view.name: view for view in views}
        self.sort = sort

    def pick(self) -> str:
        running, waiting = 0, []
        for view in self.jobs.values():
            if view.standing is Standing.RUNNING:
                running += 1
            elif view.standing is Standing.QUEUED:
                waiting.append(view)
        assert running < 1
        if self.sort:
            waiting.sort(key=lambda v: v.order)
            head = waiting[0]
        else:
            head = min(waiting, key=lambda v: v.order)
        self.jobs[head.name] = running_view = replace(head, standing=Standing.RUNNING)
        return running_view.name

    def finish(self, name: str) -> None:
        del self.jobs[name]

    def add(self, view: QueueEntry) -> None:
        self.jobs[view.name] = view

    def remove(self, name: str) -> None:
        del self.jobs[name]

    def names(self) -> list[str]:
        return list(self.jobs)

    def has(self, name: str) -> bool:
        return name in self.jobs  # between rounds every job is waiting


# ---------------------------------------------------------------------------------- the run


def run(subject: Index | Scan, jobs: Jobs, picks: int, budget_s: float) -> dict[str, float]:
    """Times `picks` rounds (or as many as fit in `budget_s`, at least 5) of: pick, finish the
    picked job, remove a random waiting job, add two. Means in microseconds."""
    names = subject.names()
    pick_ns = add_ns = remove_ns = 0
    rounds = 0
    gc.disable()
    started = time.perf_counter()
    try:
        while rounds < picks and (rounds < 5 or time.perf_counter() - started < budget_s):
            t0 = time.perf_counter_ns()
            head = subject.pick()
            pick_ns += time.perf_counter_ns() - t0
            subject.finish(head)
            while True:  # a random waiting job (`names` still holds the ones picked)
                i = jobs.rng.randrange(len(names))
                victim, names[i] = names[i], names[-1]
                names.pop()
                if subject.has(victim):
                    break
            t0 = time.perf_counter_ns()
            subject.remove(victim)
            remove_ns += time.perf_counter_ns() - t0
            for _ in range(2):
                view = jobs.make()
                names.append(view.name)
                t0 = time.perf_counter_ns()
                subject.add(view)
                add_ns += time.perf_counter_ns() - t0
            rounds += 1
    finally:
        gc.enable()
    return {
        "rounds": rounds,
        "pick": pick_ns / rounds / 1000,
        "add": add_ns / (2 * rounds) / 1000,
        "remove": remove_ns / rounds / 1000,
    }


def cross_check(views: list[QueueEntry], seed: int, rounds: int = 20) -> None:
    """The index, the sorting scan and the min scan pick the same jobs on the same story."""
    subjects = [Index(views), Scan(views, sort=True), Scan(views, sort=False)]
    rng = random.Random(seed)
    makers = [Jobs(seed + 1) for _ in subjects]
    for _ in range(rounds):
        picked = [s.pick() for s in subjects]
        assert len(set(picked)) == 1, picked
        for s in subjects:
            s.finish(picked[0])
        victim = rng.choice(sorted(subjects[0].names()))
        for s, maker in zip(subjects, makers, strict=True):
            s.remove(victim)
            s.add(maker.make())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="queued jobs, comma-separated")
    parser.add_argument("--picks", type=int, default=5000, help="picks timed per size for the index")
    parser.add_argument("--baseline-seconds", type=float, default=3.0, help="time spent on each baseline per size")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        f"means in µs; baselines timed for up to {args.baseline_seconds:g} s per size\n"
    )
    print(
        "| queued | index: pick | index: add | index: remove | scan+sort: pick | scan+min: pick | scan+sort / index |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in sizes:
        maker = Jobs(args.seed * 1_000_003 + n)
        views = [maker.make() for _ in range(n)]
        cross_check(views, args.seed)
        index = run(Index(views), Jobs(args.seed + n), args.picks, budget_s=60.0)
        scan_sort = run(Scan(views, sort=True), Jobs(args.seed + n), args.picks, budget_s=args.baseline_seconds)
        scan_min = run(Scan(views, sort=False), Jobs(args.seed + n), args.picks, budget_s=args.baseline_seconds)
        print(
            f"| {n:,} | {index['pick']:.1f} | {index['add']:.1f} | {index['remove']:.1f} "
            f"| {scan_sort['pick']:,.0f} | {scan_min['pick']:,.0f} | {scan_sort['pick'] / index['pick']:,.0f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
