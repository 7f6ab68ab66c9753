"""Leader election against the real kube-apiserver: two electors on one Lease, in one process
(so both read the same clock and times compare directly), with short timings so a test takes
seconds: lease 3 s, renew deadline 2 s, retry period 0.5 s.

A SIGKILL is stood in for by cancelling the leader's task: nothing is released, nothing more is
written. A cut network is the fault proxy's partition (new connections hang, old ones stall).
Measured times are printed (`pytest -s` shows them) and bounded.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from kubernetes import client, config

from testbed.faults import kubeconfig_via
from tests.support import waits
from tests.support.cluster import Kube
from tests.support.waits import deadline
from vigil.core.election import JITTER_FACTOR, ElectionConfig, StopReason
from vigil.kube.client import ApiClient, user_agent
from vigil.kube.config import Credentials
from vigil.leaderelection.elector import LeaderElector, NotLeading, monotonic

pytestmark = pytest.mark.integration

FAST = ElectionConfig(lease_duration=3, renew_deadline=2, retry_period=0.5)
LEASE = "vigil-leader"
# a follower polls every retry period x [1, 2.2); a read or write on a loaded test bed takes a while
POLL = FAST.retry_period * (1 + JITTER_FACTOR)
MARGIN = 1.0  # seconds; the bounds below are widened further by VIGIL_TEST_SLACK (waits.deadline)


async def until(condition: Callable[[], object], within: float, what: str) -> float:
    """Polls condition() every 20 ms; returns the (election) clock when it first held."""
    return await waits.until(condition, within, what, clock=monotonic)


async def holds(condition: Callable[[], object], during: float, what: str) -> None:
    """Checks condition() every 20 ms for a whole window: the test of something NOT happening
    (a standby taking over a live leader's lease) is a bounded observation, not a wait."""
    await waits.holds_async(condition, during, what, clock=monotonic)


def configuration(kubeconfig: Path) -> client.Configuration:
    conf = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
    return conf


class Candidates:
    """Electors on one Lease, each in a task; everything closed at the end."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.electors: list[LeaderElector] = []
        self.clients: list[ApiClient] = []
        self.tasks: dict[str, asyncio.Task] = {}
        self.stops: dict[str, list[StopReason]] = {}
        self.acquired: dict[str, float] = {}  # when (election clock) each SENT the write that made it leader

    def start(self, name: str, conf: client.Configuration) -> LeaderElector:
        stops: list[StopReason] = []

        def started() -> None:
            assert elector.state.renewed_at is not None
            self.acquired[name] = elector.state.renewed_at

        identity = f"{name}_{uuid.uuid4().hex[:6]}"
        lease_client = ApiClient(Credentials(conf), user_agent(identity, "leader-election"))
        self.clients.append(lease_client)
        elector = LeaderElector.for_lease(
            lease_client,
            self.namespace,
            LEASE,
            FAST,
            identity=identity,
            on_started_leading=started,
            on_stopped_leading=stops.append,
        )
        self.electors.append(elector)
        self.stops[name] = stops
        self.tasks[name] = asyncio.ensure_future(elector.run())
        return elector

    async def kill(self, name: str) -> None:
        task = self.tasks[name]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for lease_client in self.clients:
            await lease_client.close()


def run(kube: Kube, namespace: str, scenario: Callable[[Candidates], Awaitable[None]]) -> None:
    async def main() -> None:
        candidates = Candidates(namespace)
        try:
            await scenario(candidates)
        finally:
            await candidates.close()

    asyncio.run(main())


def read_lease(kube: Kube, namespace: str) -> client.V1Lease:
    return client.CoordinationV1Api(kube.api).read_namespaced_lease(LEASE, namespace, _request_timeout=deadline(10))


def test_one_leads_the_other_waits_and_takes_over_about_a_lease_duration_after_a_kill(kube, namespace):
    async def scenario(candidates: Candidates) -> None:
        conf = kube.api.configuration
        a = candidates.start("a", conf)
        await until(a.deadline_ok, 10, "a to lead")
        b = candidates.start("b", conf)
        await until(lambda: b.leader == a.identity, 10, "b to see a holding the lease")
        await holds(lambda: a.deadline_ok() and not b.leading.is_set(), 2 * FAST.lease_duration, "a leads, b waits")
        assert a.counters.renewals >= 8 and a.counters.renew_failures == 0
        lease = read_lease(kube, namespace)
        assert lease.spec.holder_identity == a.identity and lease.spec.lease_transitions == 0
        assert lease.spec.lease_duration_seconds == 3

        await candidates.kill("a")  # SIGKILL: no release
        killed_at = monotonic()
        last_renewal = a.state.renewed_at
        assert last_renewal is not None
        took_over = await until(b.deadline_ok, FAST.lease_duration + 2 * POLL + 3 * MARGIN, "b to take over")
        since_renewal, since_kill = took_over - last_renewal, took_over - killed_at
        print(f"\ntakeover after a kill: {since_kill:.2f}s after the kill, {since_renewal:.2f}s after a's last renewal")
        assert candidates.acquired["b"] - last_renewal >= FAST.lease_duration  # never before a full lease duration
        assert since_renewal <= deadline(FAST.lease_duration + 2 * POLL + MARGIN)
        lease = read_lease(kube, namespace)
        assert lease.spec.holder_identity == b.identity and lease.spec.lease_transitions == 1
        assert b.counters.acquired == 1

    run(kube, namespace, scenario)


def test_a_graceful_release_hands_over_within_about_a_retry_period(kube, namespace):
    async def scenario(candidates: Candidates) -> None:
        conf = kube.api.configuration
        a = candidates.start("a", conf)
        await until(a.deadline_ok, 10, "a to lead")
        b = candidates.start("b", conf)
        await until(lambda: b.leader == a.identity, 10, "b to see a holding the lease")

        began = monotonic()
        assert await a.release() is True
        released = monotonic()
        assert not a.deadline_ok()
        with pytest.raises(NotLeading):
            a.check()
        assert await asyncio.wait_for(candidates.tasks["a"], deadline(5)) is StopReason.RELEASED
        assert candidates.stops["a"] == [StopReason.RELEASED] and a.counters.released == 1
        took_over = await until(b.deadline_ok, POLL + 2 * MARGIN, "b to take over")
        print(
            f"\ntakeover after a release: {took_over - released:.2f}s after the release "
            f"(the release itself took {released - began:.2f}s)"
        )
        assert took_over - released <= deadline(POLL + MARGIN)
        lease = read_lease(kube, namespace)
        assert lease.spec.holder_identity == b.identity and lease.spec.lease_transitions == 1

    run(kube, namespace, scenario)


def test_the_released_lease_is_empty_for_one_second_and_keeps_its_metadata(kube, namespace):
    leases = client.CoordinationV1Api(kube.api)
    leases.create_namespaced_lease(
        namespace,
        client.V1Lease(metadata=client.V1ObjectMeta(name=LEASE, labels={"team": "batch"}), spec=client.V1LeaseSpec()),
    )

    async def scenario(candidates: Candidates) -> None:
        a = candidates.start("a", kube.api.configuration)
        await until(a.deadline_ok, 10, "a to lead")  # an empty holder is taken at once
        lease = read_lease(kube, namespace)
        assert lease.metadata.labels == {"team": "batch"}
        assert lease.spec.lease_transitions == 1  # a different identity acquired
        managers = {entry.manager for entry in lease.metadata.managed_fields or []}
        assert "vigil-leader-election" in managers
        assert await a.release() is True
        lease = read_lease(kube, namespace)
        assert lease.spec.holder_identity in (None, "")
        assert lease.spec.lease_duration_seconds == 1
        assert lease.spec.lease_transitions == 1
        assert lease.metadata.labels == {"team": "batch"}

    run(kube, namespace, scenario)


def test_a_leader_cut_off_stops_before_its_lease_expires_at_the_standby(kube, namespace, fault_proxy, tmp_path):
    via = configuration(kubeconfig_via(fault_proxy, kube.kubeconfig, tmp_path / "via-proxy"))

    async def scenario(candidates: Candidates) -> None:
        a = candidates.start("a", via)  # through the proxy
        await until(a.deadline_ok, 10, "a to lead")
        b = candidates.start("b", kube.api.configuration)
        await until(lambda: b.leader == a.identity, 10, "b to see a holding the lease")
        await holds(lambda: a.deadline_ok(), FAST.lease_duration, "a leads through the proxy")

        await asyncio.to_thread(fault_proxy.partition)  # a's connections stall, new ones hang
        cut_at = monotonic()
        fence_closed = await until(lambda: not a.deadline_ok(), FAST.renew_deadline + MARGIN, "a's fence to close")
        fence_deadline = a.state.deadline(FAST)  # its last renewal sent + renew deadline
        assert fence_deadline is None or fence_closed >= fence_deadline
        await until(lambda: candidates.tasks["a"].done(), 3, "a's run() to end")
        assert candidates.tasks["a"].result() is StopReason.DEADLINE
        assert candidates.stops["a"] == [StopReason.DEADLINE] and a.counters.lost == 1
        last_renewal = a.state.renewed_at
        assert last_renewal is not None

        took_over = await until(b.deadline_ok, FAST.lease_duration + 2 * POLL + 3 * MARGIN, "b to take over")
        b_sent = candidates.acquired["b"]
        print(
            f"\ncut-off leader: fence closed {fence_closed - cut_at:.2f}s after the cut "
            f"({fence_closed - last_renewal:.2f}s after its last renewal); "
            f"b took over {took_over - fence_closed:.2f}s after the fence closed, "
            f"{took_over - last_renewal:.2f}s after a's last renewal"
        )
        assert last_renewal + FAST.renew_deadline <= b_sent  # a's right to act ended before b's began
        assert b_sent - last_renewal >= FAST.lease_duration
        assert not a.deadline_ok()
        fault_proxy.heal()

    run(kube, namespace, scenario)


def test_a_leader_whose_api_server_refuses_connections_stops_too(kube, namespace, fault_proxy, tmp_path):
    via = configuration(kubeconfig_via(fault_proxy, kube.kubeconfig, tmp_path / "via-proxy"))

    async def scenario(candidates: Candidates) -> None:
        a = candidates.start("a", via)
        await until(a.deadline_ok, 10, "a to lead")
        await asyncio.to_thread(fault_proxy.partition, "refuse")
        await asyncio.to_thread(fault_proxy.reset)  # the kept-alive connection goes too: every call is refused
        cut_at = monotonic()
        await until(lambda: candidates.tasks["a"].done(), FAST.renew_deadline + MARGIN, "a to stop")
        assert candidates.tasks["a"].result() is StopReason.DEADLINE
        assert a.counters.errors >= 2
        print(f"\nrefused leader: stopped {monotonic() - cut_at:.2f}s after the cut")
        await asyncio.wait_for(candidates.clients[0].close(), deadline(MARGIN))  # nothing left hanging on the pool

    run(kube, namespace, scenario)
