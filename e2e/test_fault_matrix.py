"""The fault matrix: the control plane restarted, a relist after 410 Gone, the operator SIGKILLed,
each while jobs with retries run; every test measures what users rely on.

Each test asserts, and records in a row of the report (`fault_report`, printed at the end of
the session): no job is lost (every job ends in its expected phase after exactly its expected
number of attempts), no attempt number gets two pods (every pod the API server ever held is
recorded from a watch, so a pod made and deleted again is caught too), no attempt is declared
Lost while its pod was never taken away and its agent kept beating, and the operator keeps
serving (the time from the end of each fault to its next write to a job is measured).

Each test runs its own `vigil operator` in a namespace of its own (`own_namespace`, which the
session's operator, watching `t-*`, leaves alone). The full matrix (20 SIGKILL rounds) and its table:

    VIGIL_FAULT_ROUNDS=20 VIGIL_FAULT_REPORT=/tmp/faults.json .venv/bin/pytest -m e2e -s \\
        e2e/test_fault_matrix.py e2e/test_network_lies.py
    .venv/bin/python -m tests.support.fault_report /tmp/faults.json

VIGIL_FAULT_ROUNDS (default 3, what CI runs) is the number of SIGKILL rounds; VIGIL_CHAOS_SEED
replays a run's job mix and kill times.
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from testbed import cluster as testbed
from tests.support import fault_report
from tests.support.agents import HEARTBEAT, Agents, PodAgent, grant_heartbeat_rbac, heartbeat_job
from tests.support.cluster import SUITE_CLUSTER, Kube
from tests.support.jobs import FAST_BACKOFF, GROUP, PLURAL, SCENARIOS, VERSION, vigil_job
from tests.support.operators import OperatorProcess
from tests.support.waits import holds, poll, wait_until
from tests.support.watchers import JobLog, PodLog

pytestmark = pytest.mark.e2e  # the operator end to end, as a process, on a real cluster

ROUNDS = int(os.environ.get("VIGIL_FAULT_ROUNDS", "3"))
RETRY = {"maxAttempts": 3, "backoff": FAST_BACKOFF, "nonRetryableExitCodes": [7]}
# Heartbeats of jobs that beat through a restart of the control plane: the API server is away
# for ~7 s, so a timeout of 30 s (Uncertain after 15 s) leaves no verdict but Healthy.
SLOW_HEARTBEAT = {"intervalSeconds": 2, "timeoutSeconds": 30, "startupGraceSeconds": 10, "required": True}

Expected = dict[str, tuple[str, int]]  # job name -> (final phase, attempts it must take exactly)


# --- the report --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fault_table(request: pytest.FixtureRequest) -> Iterator[Callable[..., dict]]:
    """`record(fault, ...)` for a row of the report; the table is printed when the session ends."""
    yield fault_report.record
    if fault_report.ROWS:
        text = f"\nfault matrix (VIGIL_FAULT_ROUNDS={ROUNDS}):\n{fault_report.table(fault_report.ROWS)}\n"
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(text)
        else:
            print(text, file=sys.__stderr__)


def current_version(kube: Kube, namespace: str) -> int:
    """The API server's resourceVersion now: anything written later has a larger one."""
    listed = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, limit=1)
    return int(listed["metadata"]["resourceVersion"])


# --- jobs, operators, namespaces -----------------------------------------------------------------


def create_batch(
    kube: Kube, namespace: str, prefix: str, count: int, rng: random.Random, run_for: tuple[float, ...]
) -> Expected:
    """`count` jobs cycling through the crash-safety scenarios (success at once, after one or
    two failures, retries exhausted, a poison exit code); what each must end as."""
    expected: Expected = {}
    for i in range(count):
        codes = list(SCENARIOS)[i % len(SCENARIOS)]
        name = f"{prefix}-{i:02d}"
        job = vigil_job(name, codes, f"{rng.choice(run_for)}s", retry=RETRY)
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        expected[name] = SCENARIOS[codes]
    return expected


def wait_terminal(jobs: JobLog, names, timeout: float) -> bool:
    """Waits until every job named is Succeeded or DeadLettered; false if the time ran out (the
    tally then says which jobs were lost)."""
    names = list(names)
    return bool(poll(lambda: jobs.terminal(names) == len(names), timeout, interval=0.5))


def start_beating(kube: Kube, namespace: str, agents: Agents, heartbeat: dict) -> dict[str, PodAgent]:
    """Two jobs whose pods run `vigil-agent` as real processes, beating for as long as the test
    runs: one AtLeastOnce, one NoOverlap."""
    beating = {}
    grant_heartbeat_rbac(kube, namespace)
    for name, guarantee in (("hb-steady", "AtLeastOnce"), ("hb-careful", "NoOverlap")):
        job = heartbeat_job(name, guarantee=guarantee)
        job["spec"]["heartbeat"] = heartbeat
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    for name in ("hb-steady", "hb-careful"):
        beating[name] = agents.start(namespace, f"{name}-1", timeout=60)
    for name in beating:
        wait_until(
            lambda name=name: _job_phase(kube, namespace, name) == "Running", 60, f"{name} to be Running with beats"
        )
    return beating


def _ready_count(operator: OperatorProcess) -> int:
    """How many times the operator has listed and begun reconciling (its log says so each time)."""
    return operator.log().count("; reconciling")


def settle(jobs: JobLog, beating: dict[str, PodAgent], timeout: float = 30) -> None:
    """Gives the beating jobs a while to be Running again after a fault (the tally says if not)."""
    poll(lambda: all(jobs.phase.get(name) == "Running" for name in beating), timeout, interval=0.5)


def _job_phase(kube: Kube, namespace: str, name: str) -> str | None:
    job = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return (job.get("status") or {}).get("phase")


# --- the tally -------------------------------------------------------------------------------------


def pods_the_api_server_lost(kube: Kube) -> list[str]:
    """Pods (namespace/name) whose version stored in etcd, at or before the revision of an API
    server's list, is not the one that list shows (missing, or older). Lists are served from the
    API server's watch cache (ConsistentListFromCache), and so is every watch: an event lost
    there is lost for every watcher, the scheduler, kwok and kube-controller-manager too."""
    listed = kube.core.list_pod_for_all_namespaces()
    at = int(listed.metadata.resource_version)
    shown = {f"{p.metadata.namespace}/{p.metadata.name}": int(p.metadata.resource_version) for p in listed.items}
    stored = testbed.etcd_keys(SUITE_CLUSTER, "/registry/pods/")
    return sorted(
        name
        for key, revision in stored.items()
        if revision <= at and shown.get(name := key.removeprefix("/registry/pods/")) != revision
    )


def describe_pods(kube: Kube, namespace: str, job_name: str, job_uid: str, watched: PodLog) -> str:
    """A job's pods as the API server has them, for a failure message: which part of the
    cluster a stuck job waits on (the scheduler, the kubelet, or Vigil), and whether the test's
    own pod watch ever showed them (if not, the API server's watch lost the event, for every
    watcher: scheduler and kwok included)."""
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"vigil.dev/job-uid={job_uid}").items
    shown = set().union(*(uids for (uid, _), uids in watched.seen.items() if uid == job_uid))
    listed = "; ".join(
        f"{pod.metadata.name} phase={pod.status.phase} node={pod.spec.node_name} "
        f"deleting={pod.metadata.deletion_timestamp is not None} rv={pod.metadata.resource_version} "
        f"watched={pod.metadata.uid in shown}"
        for pod in pods
    )
    # Lists are served from the API server's watch cache (ConsistentListFromCache): etcd's own
    # keys say whether a pod the cache lacks is stored all the same.
    stored = testbed.etcd_keys(SUITE_CLUSTER, f"/registry/pods/{namespace}/{job_name}-") if kube.on_testbed else {}
    return f"listed: {listed or 'none'}; in etcd (key: mod revision): {stored}"


class Tally:
    """What the test found, counted for the report and spelled out for the assertion."""

    def __init__(self) -> None:
        self.jobs = self.lost = self.duplicates = self.false_lost = 0
        self.problems: list[str] = []

    def check(
        self,
        kube: Kube,
        namespace: str,
        expected: Expected,
        pods: PodLog,
        *,
        taken: frozenset[str] = frozenset(),
        beating: dict[str, PodAgent] | None = None,
    ) -> Tally:
        """`expected` jobs must end as told; `taken`: jobs whose pod the test removed (a Lost
        attempt there is true); `beating`: heartbeat jobs whose agents beat all along (one
        attempt, never closed)."""
        listed = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        jobs = {job["metadata"]["name"]: job for job in listed}
        beating = beating or {}
        everything = {**expected, **{name: ("Running", 1) for name in beating}}
        self.jobs += len(everything)
        for name, (phase, attempts) in everything.items():
            job = jobs.get(name)
            if job is None:
                self.lost += 1
                self.problems.append(f"{name}: gone")
                continue
            status, uid = job.get("status") or {}, job["metadata"]["uid"]
            history = status.get("history") or []
            numbers = [record["number"] for record in history]
            if name in beating:
                agent = beating[name]
                healthy = agent.proc.poll() is None and not agent.child_marker.exists()
                if status.get("attempts") != 1 or history or status.get("phase") != "Running":
                    self.lost += 1
                    self.problems.append(f"{name}: a beating attempt was closed or replaced: {status}")
                if not healthy:
                    self.problems.append(f"{name}: the agent exited or stopped its child ({agent.log})")
                self.false_lost += sum(record["outcome"] == "Lost" for record in history) if healthy else 0
            else:
                if (
                    status.get("phase") != phase
                    or status.get("attempts") != attempts
                    or numbers != list(range(1, attempts + 1))
                ):
                    self.lost += 1
                    self.problems.append(
                        f"{name}: expected {phase} after {attempts} attempts, got {status.get('phase')} "
                        f"after {status.get('attempts')} (history {numbers}, reason {status.get('reason')}); "
                        f"its pods now: {describe_pods(kube, namespace, name, uid, pods)}"
                    )
                if name not in taken:
                    self.false_lost += sum(record["outcome"] == "Lost" for record in history)
            for (job_uid, attempt), uids in sorted(pods.seen.items()):
                if job_uid != uid:
                    continue
                if len(uids) > 1:
                    self.duplicates += len(uids) - 1
                    self.problems.append(f"{name}: attempt {attempt} had {len(uids)} pods: {sorted(uids)}")
                if int(attempt) > attempts:
                    self.duplicates += 1
                    self.problems.append(f"{name}: a pod for attempt {attempt}, beyond the {attempts} expected")
        return self

    def assert_clean(self) -> None:
        assert not self.problems, f"{len(self.problems)} problems:\n" + "\n".join(self.problems[:40])


# --- 1, 2: the control plane restarted mid-run ------------------------------------------------------


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_a_restarted_control_plane_loses_no_job_and_duplicates_no_attempt(
    kube: Kube, component: str, own_namespace: str, own_operator, agents, fault_table, request: pytest.FixtureRequest
):
    """50 jobs with retries; `component` is restarted twice while they run: with SIGTERM once 5
    jobs have finished, and with SIGKILL (a crash) as soon as the operator wrote again.

    etcd runs here with --unsafe-no-fsync, as the suite's cluster does, and that is enough for
    the claim: a SIGKILLed etcd loses no acknowledged write, because etcd answers only after its
    WAL entry was written into the file, i.e. into the kernel's page cache, which outlives the
    process; --durable adds fdatasync, which matters only when the machine itself crashes, and no
    test on this machine can make it crash. So a cluster of its own with --durable (~20 s to
    start, slower writes) would test nothing more.
    """
    if not kube.on_testbed:
        pytest.skip("restarting the control plane needs the local test bed")
    began = time.monotonic()
    seed = int(os.environ.get("VIGIL_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"chaos seed: {seed}")
    namespace = own_namespace
    own_operator()
    restarts: list[tuple[float, int]] = []  # (when it returned, resourceVersion then)
    with PodLog(kube, namespace) as pods, JobLog(kube, namespace) as jobs:
        beating = start_beating(kube, namespace, agents, SLOW_HEARTBEAT)
        expected = create_batch(kube, namespace, "job", 45, rng, run_for=(1, 2, 3))
        for i in range(5):  # in flight through both restarts, however long they take
            kube.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, vigil_job(f"long-{i}", "0", "40s", retry=RETRY)
            )
            expected[f"long-{i}"] = ("Succeeded", 1)
        wait_until(lambda: jobs.terminal(expected) >= 5, 120, "5 jobs to finish")
        for kill in (False, True):
            in_flight = len(expected) - jobs.terminal(expected)
            assert in_flight > 0, "every job finished before the fault: it did not strike mid-run"
            print(f"{component}: restart ({'SIGKILL' if kill else 'SIGTERM'}) with {in_flight} jobs in flight")
            testbed.restart(SUITE_CLUSTER, component, kill=kill)
            since, version = time.monotonic(), current_version(kube, namespace)
            restarts.append((since, version))
            # The next fault strikes only once the operator has written again: each recovery is
            # measured on its own.
            wait_until(
                lambda s=since, v=version: jobs.recovered(s, v) is not None,
                120,
                f"the operator to write to a job after {component} restarted",
            )
        if not wait_terminal(jobs, expected, 180):
            # Say whether the API server itself lost pods: then no watcher saw them (the tally
            # names the jobs left waiting, and where their pods are).
            print(f"pods whose stored version the API server does not list: {pods_the_api_server_lost(kube)}")
        settle(jobs, beating)
        pods.caught_up()
        tally = Tally().check(kube, namespace, expected, pods, beating=beating)
    recover = [jobs.recovered(since, version) for since, version in restarts]
    fault_table(
        f"{component} restarted mid-run (SIGTERM, then SIGKILL)",
        rounds=len(restarts),
        jobs=tally.jobs,
        lost=tally.lost,
        duplicates=tally.duplicates,
        false_lost=tally.false_lost,
        recover_seconds=[r for r in recover if r is not None],
        seconds=time.monotonic() - began,
        test=request.node.nodeid,
    )
    tally.assert_clean()
    assert None not in recover, f"no write to a job after a restart: {recover}"


# --- 3: a relist after 410 Gone while jobs and pods are deleted ------------------------------------

GONE = re.compile(r"(jobs|pods) in .*: listed again at \d+: \d+ changes, (\d+) gone meanwhile")


def test_a_relist_after_410_leaves_no_phantom_and_no_loop(
    kube: Kube, own_namespace: str, own_operator, fault_table, request: pytest.FixtureRequest
):
    """The operator is cut off (its proxy partitioned); meanwhile jobs are deleted, pods are
    force-deleted (grace 0), and the API server restarts, so that the resourceVersions the
    operator's watches hold are too old (410 Gone). After the heal, its watches list again and
    report what vanished: a NoOverlap job whose pod was force-deleted goes on to its next attempt
    (no wait for a phantom), so does an AtLeastOnce one, the deleted jobs are forgotten (a few
    log lines each, no retry loop), and the other jobs finish."""
    if not kube.on_testbed:
        pytest.skip("restarting the control plane needs the local test bed")
    began = time.monotonic()
    namespace = own_namespace
    operator, proxy = own_operator(proxied=True)
    assert proxy is not None
    run_for = "15s"  # long enough to be running when the fault strikes, and to finish after the heal
    expected: Expected = {f"keep-{i}": ("Succeeded", 1) for i in range(6)}
    vanishing = {"careful-0": "NoOverlap", "careful-1": "NoOverlap", "eager-0": "AtLeastOnce", "eager-1": "AtLeastOnce"}
    doomed = [f"doomed-{i}" for i in range(4)]
    with PodLog(kube, namespace) as pods, JobLog(kube, namespace) as jobs:
        for name in expected:
            kube.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, vigil_job(name, "0", run_for)
            )
        for name, guarantee in vanishing.items():
            job = vigil_job(name, "0", run_for, guarantee=guarantee, retry=RETRY)
            kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
            expected[name] = ("Succeeded", 2)  # attempt 1's pod is taken away, attempt 2 succeeds
        for name in doomed:
            job = vigil_job(name, exit_code=None, run_for=None)  # runs until deleted
            kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        every = [*expected, *doomed]
        wait_until(lambda: all(jobs.phase.get(name) == "Running" for name in every), 60, "every job to be Running")

        proxy.partition()  # open connections freeze, new ones hang: the operator hears and says nothing
        # The API server restarts first, so that nothing of what follows is already on its way to
        # the operator in a frozen connection (a heal delivers what those held): the operator
        # can learn of it only by a new watch, which 410 Gone turns into a list.
        # One write the operator cannot see, so that the resourceVersion of each of its watches is
        # older than the restarted API server's watch cache (without it, a watch whose last event
        # was the newest write would resume there and need no list).
        kube.core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="bump")))
        testbed.restart(SUITE_CLUSTER, "kube-apiserver")
        for name in doomed:
            kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        for name in vanishing:
            kube.core.delete_namespaced_pod(f"{name}-1", namespace, grace_period_seconds=0)
        healed_at = time.monotonic()
        healed_version = current_version(kube, namespace)
        proxy.heal()

        # The operator keeps serving: a job created after the heal runs too.
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, vigil_job("after", "0", "1s"))
        expected["after"] = ("Succeeded", 1)
        wait_terminal(jobs, expected, 120)
        pods.caught_up()
        tally = Tally().check(kube, namespace, expected, pods, taken=frozenset(vanishing))
        # No phantom: the deleted jobs' pods go too (garbage collected, and released by Vigil if
        # it holds them with its finalizer).
        wait_until(
            lambda: (
                not [p for p in kube.core.list_namespaced_pod(namespace).items if p.metadata.name.startswith("doomed-")]
            ),
            60,
            "the deleted jobs' pods to be gone",
        )
    recover = jobs.recovered(healed_at, healed_version)
    fault_table(
        "relist after 410 Gone (partition + kube-apiserver restart; jobs deleted, pods force-deleted)",
        rounds=1,
        jobs=tally.jobs + len(doomed),
        lost=tally.lost,
        duplicates=tally.duplicates,
        false_lost=tally.false_lost,
        recover_seconds=[recover] if recover is not None else [],
        seconds=time.monotonic() - began,
        test=request.node.nodeid,
    )
    tally.assert_clean()
    for name in vanishing:
        history = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)["status"]["history"]
        assert history[0]["outcome"] != "Succeeded" and history[-1]["outcome"] == "Succeeded", (name, history)

    log = operator.log_path.read_text(errors="replace")
    gone: dict[str, int] = {}
    for kind, count in GONE.findall(log):
        gone[kind] = gone.get(kind, 0) + int(count)
    print(f"gone meanwhile, as the relists reported: {gone}")
    for kind in ("jobs", "pods"):
        assert re.search(rf"{kind} in .*410 Gone", log), f"the {kind} watch did not get 410 Gone"
        assert kind in gone, f"the {kind} watch did not list again"
    assert gone["jobs"] >= len(doomed), f"the relist reported the deleted jobs gone: {gone}"

    # Bounded: the deleted jobs are forgotten, not retried in a loop. Counted now and again after
    # a quiet while (a bounded wait on purpose: the claim is that nothing more is said of them).
    def said_of_doomed() -> list[str]:
        text = operator.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if "doomed-" in line]

    lines = said_of_doomed()

    def quiet_about_them() -> None:
        assert said_of_doomed() == lines, "the operator keeps talking about deleted jobs"

    holds(quiet_about_them, 5)
    assert len(lines) <= 5 * len(doomed), f"{len(lines)} log lines about {len(doomed)} deleted jobs:\n" + "\n".join(
        lines[:40]
    )
    assert recover is not None, "no write to a job after the heal"


# --- 4: the operator SIGKILLed at random instants ------------------------------------------------------


def test_sigkilling_the_operator_in_rounds_loses_no_job_and_duplicates_no_attempt(
    kube: Kube, own_namespace: str, own_operator, agents, fault_table, request: pytest.FixtureRequest
):
    """VIGIL_FAULT_ROUNDS rounds of 20 jobs with retries; in each the operator is SIGKILLed at
    random instants while they run and started again after a random pause. Two jobs whose agents
    beat (every 1 s, timeout 6 s) run through every round: a restart must never make them Lost."""
    began = time.monotonic()
    seed = int(os.environ.get("VIGIL_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"chaos seed: {seed} (VIGIL_CHAOS_SEED={seed} replays the job mix and kill times)")
    namespace = own_namespace
    ready_before = 0
    operator, _ = own_operator()
    expected: Expected = {}
    starts: list[tuple[float, int]] = []  # (when the operator was started again, resourceVersion then)
    kills: list[tuple[float, str]] = []  # (when, and whether it was starting or working)
    with PodLog(kube, namespace) as pods, JobLog(kube, namespace) as jobs:
        beating = start_beating(kube, namespace, agents, HEARTBEAT)
        for round_ in range(ROUNDS):
            batch = create_batch(kube, namespace, f"r{round_:02d}", 20, rng, run_for=(0.5, 1, 1.5, 2))
            expected.update(batch)
            round_began, working_kills = time.monotonic(), 0
            while True:
                # A random instant: now and then while it starts (it takes seconds to import and
                # list on a busy machine), mostly while it works, i.e. once it has listed and
                # reconciles. A round ends once its jobs are done, or after 20 s of chaos, with
                # at least one kill of a working operator.
                if rng.random() < 0.25:
                    time.sleep(rng.uniform(0.0, 2.0))
                else:
                    wait_until(
                        lambda n=ready_before: _ready_count(operator) > n, 60, "the operator to start reconciling"
                    )
                    time.sleep(rng.uniform(0.0, 3.0))
                over = jobs.terminal(batch) == len(batch) or time.monotonic() - round_began > 20
                if working_kills and over:
                    break
                working = _ready_count(operator) > ready_before
                operator.kill()
                kills.append((time.monotonic(), "working" if working else "starting"))
                working_kills += working
                time.sleep(rng.uniform(0.0, 1.0))
                ready_before = _ready_count(operator)
                operator.start()
                starts.append((time.monotonic(), current_version(kube, namespace)))
            if not wait_terminal(jobs, batch, 120):
                break  # the tally says which
        settle(jobs, beating)
        pods.caught_up()
        tally = Tally().check(kube, namespace, expected, pods, beating=beating)
    # Recovery after a restart counts only if the operator was not killed again before it wrote.
    until = [*(when for when, _ in kills[1:]), float("inf")]
    recover = [
        jobs.recovered(since, version, next_kill) for (since, version), next_kill in zip(starts, until, strict=True)
    ]
    fault_table(
        "operator SIGKILLed at random instants",
        rounds=ROUNDS,
        jobs=tally.jobs,
        lost=tally.lost,
        duplicates=tally.duplicates,
        false_lost=tally.false_lost,
        recover_seconds=[r for r in recover if r is not None],
        seconds=time.monotonic() - began,
        test=request.node.nodeid,
    )
    working = sum(phase == "working" for _, phase in kills)
    print(f"{len(kills)} kills in {ROUNDS} rounds: {working} of a working operator, the others while it started")
    tally.assert_clean()
    assert working >= ROUNDS, "the chaos did not happen"
    assert any(r is not None for r in recover), "no operator started again made progress"
