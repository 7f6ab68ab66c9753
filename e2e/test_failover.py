"""Two `vigil operator --leader-elect` processes on one Lease: the leader is SIGKILLed while jobs
run and the standby takes over after about a lease duration; every job finishes and no attempt
gets two pods. A leader stopped with SIGTERM releases the Lease, and the standby takes over
within a few retry periods, not a lease duration.

Timings: lease 4 s, renew deadline 3 s, retry 1 s. VIGIL_FAILOVER_JOBS (50) jobs run through
VIGIL_FAILOVERS (3) SIGKILLs of whoever leads, each attempt lasting VIGIL_FAILOVER_RUN_FOR (15s)
so that every kill strikes while they run; the test prints the takeover times.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path

import pytest

from tests.support.cluster import Kube, install_crds
from tests.support.jobs import FAST_BACKOFF, create, pods_per_attempt, status, vigil_job
from tests.support.operators import electing, holder, identity
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.e2e

JOBS = int(os.environ.get("VIGIL_FAILOVER_JOBS", 50))
FAILOVERS = int(os.environ.get("VIGIL_FAILOVERS", 3))
RUN_FOR = os.environ.get("VIGIL_FAILOVER_RUN_FOR", "15s")


def test_a_killed_leader_is_replaced_and_a_stopped_one_hands_over_at_once(
    kube: Kube, own_namespace: str, tmp_path: Path
):
    install_crds(kube)
    logs = iter(tmp_path / f"operator-{i}.log" for i in range(100))
    operators = [electing(kube, own_namespace, next(logs)) for _ in range(2)]
    for operator in operators:
        operator.start()
    try:
        first = wait_until(lambda: holder(kube, own_namespace), 30, "a leader")
        for i in range(JOBS):
            retry = {"maxAttempts": 3, "backoff": FAST_BACKOFF}
            job = vigil_job(f"j{i}", exit_code="1,0", run_for=RUN_FOR, retry=retry)
            create(kube, own_namespace, job)
        wait_until(
            lambda: sum(bool(status(kube, own_namespace, f"j{i}").get("attempts")) for i in range(JOBS)) > 5,
            60,
            "jobs running under the first leader",
        )
        # Kill whoever leads, FAILOVERS times; the killed one comes back as a standby before the next.
        takeovers, unfinished_at_kill, current = [], [], first
        for _ in range(FAILOVERS):
            leader = next(op for op in operators if op.proc.poll() is None and identity(op) == current)
            unfinished_at_kill.append(
                sum(status(kube, own_namespace, f"j{i}").get("phase") != "Succeeded" for i in range(JOBS))
            )
            killed_at = time.monotonic()
            leader.kill()
            previous = current
            current = wait_until(
                lambda previous=previous: (h := holder(kube, own_namespace)) != previous and h, 30, "a new leader"
            )
            takeovers.append(time.monotonic() - killed_at)
            operators.remove(leader)
            comeback = electing(kube, own_namespace, next(logs))
            comeback.start()
            operators.append(comeback)
            wait_until(lambda comeback=comeback: identity(comeback), 30, "the restarted process to campaign")
        summary = (
            f"takeover after SIGKILL over {FAILOVERS} failovers (lease 4 s, retry 1 s): "
            f"min {min(takeovers):.2f}s, median {statistics.median(takeovers):.2f}s, max {max(takeovers):.2f}s; "
            f"jobs unfinished at each kill: {unfinished_at_kill}"
        )
        print(summary)
        assert max(takeovers) < deadline(4 + 4), summary
        assert all(unfinished_at_kill), f"a kill struck after every job had finished: {summary}"
        wait_until(
            lambda: all(status(kube, own_namespace, f"j{i}").get("phase") == "Succeeded" for i in range(JOBS)),
            180,
            "every job to finish under the last leader",
        )
        assert all(count == 1 for count in pods_per_attempt(kube, own_namespace).values())
        assert all(status(kube, own_namespace, f"j{i}")["attempts"] == 2 for i in range(JOBS))
        second = current
        standby = next(op for op in operators if identity(op) == current)

        # A graceful stop releases the Lease: a fresh standby takes over in about a retry period.
        newcomer = electing(kube, own_namespace, next(logs))
        newcomer.start()
        operators.append(newcomer)
        wait_until(lambda: identity(newcomer), 30, "the newcomer to campaign")
        stopped_at = time.monotonic()
        standby.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: holder(kube, own_namespace) not in (second, None), 15, "the newcomer to lead")
        handover = time.monotonic() - stopped_at
        assert handover < deadline(4), f"a released lease took {handover:.1f}s to change hands"
        assert standby.proc.wait(deadline(30)) == 0
        print(f"takeover after SIGTERM: {handover:.2f}s")
    finally:
        for operator in operators:
            operator.stop()
