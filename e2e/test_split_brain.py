"""Split brain, checked from the API server: the leader of two `vigil operator --leader-elect`
processes is frozen (SIGSTOP) past its lease while jobs run, the standby takes the Lease over
and goes on, and the old leader, woken (SIGCONT), sends no further write and exits.

"No further write" is read from kube-apiserver's audit log (the test bed logs every write at
level Metadata, testbed/cluster.py AUDIT_POLICY), not from the process: each process names its
holder identity in its User-Agent (`vigil/<version> (<identity>)`, and `...; leader-election)`
for the Lease), so every write that reached the API server is attributed to a process.

The bound: the old leader's fence closes one renew deadline after it SENT its last successful
renewal, and that renewal reached the API server no earlier than it was sent. So no write of
the old leader may have been received later than (its last renewal received) + renew deadline,
plus a little for a request sent just before the fence closed to cross loopback. That moment is
before the standby's takeover (at least lease duration - renew deadline = 1 s before it), and
long before SIGCONT. What no client-side fence can stop (docs/leader-election.md, "a process
frozen mid-write") is a write frozen between its last fence check and its bytes reaching the
socket: that stretch is synchronous code on the one event loop, so at most one write can be in it,
and it is sent the moment the process wakes. On a loaded 2-core bed a run catches one now and
then (CI did, 2026-12-03: `patch vigiljobs/j11/status -> 409`, received 6 ms before the woken
operator logged its timeout). So the bound the test holds is: after the fence, at most one write,
received within WAKE_SLACK of SIGCONT (a write whose check ran after waking is refused before it
is sent); every other write before the fence. That one write carries the preconditions every
write of Vigil carries, so it changes nothing a newer decision made (here: 409).

Timings: lease 4 s, renew deadline 3 s, retry 1 s (as test_failover.py).
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from pathlib import Path

import pytest
from kubernetes import client

from testbed import cluster as testbed
from tests.support.cluster import SUITE_CLUSTER, Kube, install_crds
from tests.support.jobs import FAST_BACKOFF, create, pods_per_attempt, status, vigil_job
from tests.support.operators import LEASE_NAME, electing, holder, identity
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.e2e

LEASE_DURATION, RENEW_DEADLINE = 4.0, 3.0  # tests.support.operators.LEASE
LOOPBACK_SLACK = 0.25  # a write sent just before the fence closed, on its way over loopback
WAKE_SLACK = 1.0  # the one write frozen past its fence check, sent on the woken loop's first turns
JOBS = 12
WRITES = ("create", "update", "patch", "delete", "deletecollection")


def lease(kube: Kube, namespace: str) -> client.V1Lease:
    return client.CoordinationV1Api(kube.api).read_namespaced_lease(LEASE_NAME, namespace)


def at(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def audit_writes(namespace: str) -> list[dict]:
    """Every write the API server completed in `namespace` (and its Lease), oldest first, from the
    audit log and its rotated backups."""
    events = []
    for path in sorted(SUITE_CLUSTER.logs.glob("audit*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if namespace not in line:
                continue
            event = json.loads(line)
            if (
                event.get("stage") == "ResponseComplete"
                and event.get("verb") in WRITES
                and (event.get("objectRef") or {}).get("namespace") == namespace
            ):
                events.append(event)
    return sorted(events, key=lambda e: e["requestReceivedTimestamp"])


def by(events: list[dict], who: str) -> list[dict]:
    """The events of the process whose holder identity is `who` (operator and election clients)."""
    return [e for e in events if f"({who})" in e.get("userAgent", "") or f"({who};" in e.get("userAgent", "")]


def renewals(events: list[dict], who: str) -> list[dict]:
    return [
        e
        for e in by(events, who)
        if e["verb"] in ("create", "update")
        and e["objectRef"].get("resource") == "leases"
        and (e.get("responseStatus") or {}).get("code") in (200, 201)
    ]


def describe(event: dict) -> str:
    ref = event["objectRef"]
    what = "/".join(x for x in (ref.get("resource"), ref.get("name"), ref.get("subresource")) if x)
    return f"{event['requestReceivedTimestamp']} {event['verb']} {what} -> {event['responseStatus'].get('code')}"


def test_a_frozen_leader_is_replaced_and_once_woken_writes_nothing_and_exits(
    kube: Kube, own_namespace: str, tmp_path: Path
):
    if not kube.on_testbed:
        pytest.skip("reads the test bed's kube-apiserver audit log")
    pid = testbed.running_pid(SUITE_CLUSTER, "kube-apiserver")
    if pid is None or b"--audit-log-path" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        pytest.fail(
            f"the test bed's kube-apiserver writes no audit log (started before it did): "
            f"python -m testbed.cluster down --name {SUITE_CLUSTER.name}, and run again"
        )
    namespace = own_namespace
    install_crds(kube)
    operators = [electing(kube, namespace, tmp_path / f"operator-{i}.log") for i in range(2)]
    for operator in operators:
        operator.start()
    try:
        first = wait_until(lambda: holder(kube, namespace), 30, "a leader")
        old = next(op for op in operators if identity(op) == first)
        standby = next(op for op in operators if op is not old)
        wait_until(lambda: identity(standby), 30, "the standby to campaign")
        transitions = lease(kube, namespace).spec.lease_transitions or 0
        # Each fails once, then succeeds: pods, status writes, events and retries throughout.
        for i in range(JOBS):
            job = vigil_job(f"j{i}", exit_code="1,0", run_for="4s", retry={"maxAttempts": 3, "backoff": FAST_BACKOFF})
            create(kube, namespace, job)
        wait_until(
            lambda: sum(bool(status(kube, namespace, f"j{i}").get("attempts")) for i in range(JOBS)) >= JOBS // 2,
            60,
            "jobs running under the first leader",
        )

        stopped_at = dt.datetime.now(dt.UTC)
        t_stop = time.monotonic()
        old.proc.send_signal(signal.SIGSTOP)
        second = wait_until(
            lambda: (h := holder(kube, namespace)) not in (first, None) and h, 30, "the standby to take the Lease"
        )
        takeover = time.monotonic() - t_stop
        assert second == identity(standby)
        assert (lease(kube, namespace).spec.lease_transitions or 0) == transitions + 1
        # The new leader works while the old one is still frozen: a job moves on under it (only
        # Vigil writes a job's status, and the old leader cannot).
        frozen = {i: status(kube, namespace, f"j{i}") for i in range(JOBS)}
        wait_until(
            lambda: any(status(kube, namespace, f"j{i}") != frozen[i] for i in range(JOBS)),
            30,
            "a job to move on under the new leader while the old one is frozen",
        )
        woken_at, t_cont = dt.datetime.now(dt.UTC), time.monotonic()
        old.proc.send_signal(signal.SIGCONT)
        code = old.proc.wait(deadline(30))
        exited = time.monotonic() - t_cont
        log = old.log_path.read_text(errors="replace")
        assert code == 1, f"the old leader exited with {code}, not 1 (LeadershipLost)\n{log[-3000:]}"
        assert "lost the lease" in log

        wait_until(
            lambda: all(status(kube, namespace, f"j{i}").get("phase") == "Succeeded" for i in range(JOBS)),
            120,
            "every job to finish under the new leader",
        )
        assert all(status(kube, namespace, f"j{i}")["attempts"] == 2 for i in range(JOBS))
        assert all(count == 1 for count in pods_per_attempt(kube, namespace).values()), pods_per_attempt(
            kube, namespace
        )
        assert lease(kube, namespace).spec.holder_identity == second

        # From the API server: what each process wrote, and when it was received.
        events = audit_writes(namespace)
        mine, theirs = by(events, first), by(events, second)
        assert mine and theirs, "the audit log names neither process: is the User-Agent set?"
        last_renewal = at(renewals(events, first)[-1]["requestReceivedTimestamp"])
        took_over = at(renewals(events, second)[0]["requestReceivedTimestamp"])
        fence = last_renewal + dt.timedelta(seconds=RENEW_DEADLINE + LOOPBACK_SLACK)
        late = [e for e in mine if at(e["requestReceivedTimestamp"]) > fence]
        woke_late = [
            e
            for e in late
            if woken_at <= at(e["requestReceivedTimestamp"]) <= woken_at + dt.timedelta(seconds=WAKE_SLACK)
        ]
        assert len(late) <= 1 and late == woke_late, (
            f"the old leader wrote after its fence closed ({fence}), other than the one write frozen "
            f"past its fence check and sent as it woke ({woken_at}): {[describe(e) for e in late]}"
        )
        assert fence < took_over
        last_write = max(at(e["requestReceivedTimestamp"]) for e in mine if e not in late)
        operator_writes = [e for e in mine if "leader-election" not in e["userAgent"]]
        assert operator_writes, "the old leader made no write at all before it was frozen: nothing was tested"
        print(
            f"\nsplit brain: SIGSTOP {stopped_at:%H:%M:%S.%f}; standby leading {takeover:.2f}s later "
            f"(its acquiring write received {(took_over - stopped_at).total_seconds():.2f}s after SIGSTOP, "
            f"{(took_over - last_renewal).total_seconds():.2f}s after the old leader's last renewal); "
            f"old leader: {len(mine)} writes ({len(operator_writes)} by the operator, {len(late)} sent as it woke), "
            f"the last before its fence received "
            f"{(took_over - last_write).total_seconds():.2f}s before the takeover and "
            f"{(woken_at - last_write).total_seconds():.2f}s before SIGCONT; it exited with {code} "
            f"{exited:.2f}s after SIGCONT; the new leader made {len(theirs)} writes"
        )
    finally:
        for operator in operators:
            if operator.proc and operator.proc.poll() is None:
                operator.proc.send_signal(signal.SIGCONT)
            operator.stop()
