"""Property tests: decide() driven through a small simulated cluster full of doubt.

The world keeps the truth (the job with its resourceVersion, every version of every pod) and
the operator's views of it, which lag: a job view read at the last reconcile, or one kept by a
deposed leader long ago, and a pod cache refreshed only when events are delivered. Hypothesis
draws a story: reconciles on those views with stale duplicate pod snapshots mixed in, crashes
that drop the rest of a decision, restarts, pods that run, fail, succeed, get evicted or deleted,
suspends, redrives, heartbeat verdicts that flap between Healthy, Uncertain and Lost, pods that
take their time to terminate (and may succeed meanwhile: a late success), and time passing. The
world executes actions as the API server would (resourceVersion preconditions, AlreadyExists,
UID preconditions; a deleted pod terminates until a step or the end lets it go) and checks the
invariants on every write. At the end the pods are let finish and the job must reach a terminal
phase.

Two assumptions are stated here rather than tested:
- Nobody else deletes an attempt's pod before Vigil has seen it once (recorded its UID). Such a
  deletion cannot be told from "not created yet", so the same attempt number would be created
  again.
- Under NoOverlap the shell writes the pods it creates through into its pod cache (a lagging
  cache that missed a pod Vigil created could not show that pod still exists); the world does so
  for NoOverlap jobs only, so AtLeastOnce jobs still meet caches that lag behind creations.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.factories import T0, make_job, merge_patch
from vigil import api
from vigil.actions import (
    AnnotatePod,
    CreatePod,
    DeleteJob,
    DeletePod,
    EmitEvent,
    PatchStatus,
    RequeueAfter,
    SetDeadLetterLabel,
)
from vigil.lifecycle import LATE_SUCCESS_OUTCOMES, decide
from vigil.liveness import Verdict

pytestmark = pytest.mark.unit

FAILURES = {"Failed", "Lost", "DeadlineExceeded"}


class Conflict(Exception):
    """The API server refused a write: the shell drops the rest of the decision."""


@dataclass
class StoredPod:
    versions: list[dict[str, Any]]  # every version the API server stored; the last is current
    deleted: bool = False

    @property
    def current(self) -> dict[str, Any]:
        return self.versions[-1]

    @property
    def uid(self) -> str:
        return self.current["metadata"]["uid"]

    @property
    def attempt(self) -> int:
        return int(self.current["metadata"]["labels"][api.LABEL_ATTEMPT])

    @property
    def deleting(self) -> bool:
        return self.current["metadata"].get("deletionTimestamp") is not None

    @property
    def finished(self) -> bool:
        return self.current["status"]["phase"] in ("Succeeded", "Failed")


@dataclass
class World:
    spec: dict[str, Any]
    rng: random.Random
    now: datetime = T0
    job: dict[str, Any] = field(init=False)
    job_deleted: bool = False
    pods: dict[str, StoredPod] = field(default_factory=dict)  # by uid
    pod_uids_by_attempt: dict[int, list[str]] = field(default_factory=dict)
    outcomes: dict[int, str] = field(default_factory=dict)  # every attempt's written outcome
    reasons: dict[int, str | None] = field(default_factory=dict)  # and its reason
    verdicts: dict[str, str] = field(default_factory=dict)  # pod uid -> the detector's state
    round_of: dict[int, int] = field(default_factory=dict)  # attempt -> redrives when it started
    cached_job: dict[str, Any] = field(init=False)  # the operator's job view
    old_leader_job: dict[str, Any] = field(init=False)  # a deposed leader's view
    cached_pods: dict[str, int] = field(default_factory=dict)  # uid -> index of version seen
    seen_by_vigil: set[str] = field(default_factory=set)  # pod UIDs a landed decision has seen
    requeue_at: datetime | None = None
    uids: int = 0
    status_before: dict[str, Any] = field(default_factory=dict)  # before the last status write

    def __post_init__(self) -> None:
        self.job = make_job(spec=self.spec, resource_version="1")
        self.cached_job = copy.deepcopy(self.job)
        self.old_leader_job = copy.deepcopy(self.job)

    @property
    def status(self) -> dict[str, Any]:
        return self.job["status"]

    # ------------------------------------------------------------------ the operator's side

    def reconcile(
        self,
        *,
        view: str = "fresh",
        fresh_pods: bool = True,
        stale_duplicates: bool = False,
        shuffle_seed: int = 0,
        crash_after: int | None = None,
        may_start: bool = True,
    ) -> None:
        if self.job_deleted:
            return
        if view == "fresh":
            self.cached_job = copy.deepcopy(self.job)
        if fresh_pods:
            self.deliver_pods()
        job = self.old_leader_job if view == "old_leader" else self.cached_job
        pods = [self.pods[uid].versions[index] for uid, index in self.cached_pods.items()]
        if stale_duplicates:
            pods += [stored.versions[0] for stored in self.pods.values() if len(stored.versions) > 1]
        random.Random(shuffle_seed).shuffle(pods)
        decision = decide(
            copy.deepcopy(job),
            copy.deepcopy(pods),
            self.now,
            rng=self.rng,
            may_start=may_start,
            liveness=self.liveness(),
        )
        actions = decision.actions if crash_after is None else decision.actions[:crash_after]
        try:
            for action in actions:
                self.execute(action)
        except Conflict:
            return
        if not decision.of_type(PatchStatus) or decision.of_type(PatchStatus)[0] in actions:
            self.seen_by_vigil |= {pod["metadata"]["uid"] for pod in pods}

    def liveness(self) -> dict[str, Verdict]:
        return {uid: Verdict(state, 0.0, f"said so ({state})", self.now) for uid, state in self.verdicts.items()}

    def deliver_pods(self) -> None:
        self.cached_pods = {uid: len(p.versions) - 1 for uid, p in self.pods.items() if not p.deleted}

    def restart(self) -> None:
        self.cached_job = copy.deepcopy(self.job)
        self.deliver_pods()

    # -------------------------------------------------------------- the API server's side

    def execute(self, action: Any) -> None:
        if isinstance(action, PatchStatus):
            self.patch_status(action)
        elif isinstance(action, CreatePod):
            self.create_pod(action.manifest)
        elif isinstance(action, DeletePod):
            stored = self.pods.get(action.uid)
            if stored and not stored.deleted and stored.current["metadata"]["name"] == action.name:
                attempt = stored.attempt
                lost = self.outcomes.get(attempt) == "Lost" and self.reasons.get(attempt) == "HeartbeatLost"
                if lost and not stored.finished:  # a finished pod has nothing left to stop
                    annotations = stored.current["metadata"].get("annotations") or {}
                    assert api.ANNOTATION_SUPERSEDED in annotations, "a lost attempt's pod deleted unmarked"
                if not stored.deleting:  # it terminates until a step (or the end) lets it go
                    pod = self.new_version(stored)
                    pod["metadata"]["deletionTimestamp"] = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
                    stored.versions.append(pod)
        elif isinstance(action, AnnotatePod):
            stored = self.pods.get(action.uid)
            if stored and not stored.deleted and stored.current["metadata"]["name"] == action.name:
                pod = self.new_version(stored)
                pod["metadata"]["annotations"] = merge_patch(
                    pod["metadata"].get("annotations") or {}, action.annotations
                )
                stored.versions.append(pod)
        elif isinstance(action, SetDeadLetterLabel):
            labels = self.job["metadata"]["labels"]
            if action.dead_lettered:
                labels[api.LABEL_DEAD_LETTER] = "true"
            else:
                labels.pop(api.LABEL_DEAD_LETTER, None)
            self.bump_job()
        elif isinstance(action, DeleteJob):
            assert self.status["phase"] in api.TERMINAL_PHASES
            ttl = timedelta(seconds=self.spec["ttlSecondsAfterFinished"])
            assert self.now >= datetime.fromisoformat(self.status["finishedAt"]) + ttl
            self.job_deleted = True
        elif isinstance(action, RequeueAfter):
            assert action.seconds >= 0
            self.requeue_at = self.now + timedelta(seconds=action.seconds)
        else:
            assert isinstance(action, EmitEvent)
            if action.reason == "CheckpointRejected":  # once per distinct value, not on every look
                conditions = self.status_before.get("conditions", [])
                refused = next((c for c in conditions if c["type"] == "CheckpointAccepted"), {})
                assert (refused.get("status"), refused.get("message")) != ("False", action.message)

    def new_version(self, stored: StoredPod) -> dict[str, Any]:
        pod = copy.deepcopy(stored.current)
        pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
        return pod

    def bump_job(self) -> None:
        metadata = self.job["metadata"]
        metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + 1)

    def patch_status(self, action: PatchStatus) -> None:
        if action.resource_version != self.job["metadata"]["resourceVersion"]:
            raise Conflict
        old = self.status
        self.status_before = old
        new = merge_patch(old, action.status)
        if new != old:
            self.check_status_transition(old, new)
            self.job["status"] = new
            self.bump_job()

    def create_pod(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        if any(p.current["metadata"]["name"] == name for p in self.pods.values() if not p.deleted):
            return  # AlreadyExists, and the pod is the job's: done
        attempt = int(manifest["metadata"]["labels"][api.LABEL_ATTEMPT])
        # Status first: the stored status already names this attempt as its current one.
        assert self.status["currentAttempt"]["number"] == attempt
        assert self.status["phase"] not in api.TERMINAL_PHASES | {"Suspended"}
        if self.spec.get("guarantee") == "NoOverlap":
            # A finished pod can run nothing any more; any other pod may, even while terminating.
            others = [
                p.current["metadata"]["name"]
                for p in self.pods.values()
                if not p.deleted and (p.current.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            assert not others, f"NoOverlap: {name} created while {others} may still run"
        self.uids += 1
        pod = copy.deepcopy(manifest)
        pod["metadata"].update(uid=f"uid-{self.uids}", resourceVersion=str(self.uids * 1000))
        pod["status"] = {"phase": "Pending"}
        self.pods[pod["metadata"]["uid"]] = StoredPod([pod])
        self.pod_uids_by_attempt.setdefault(attempt, []).append(pod["metadata"]["uid"])
        assert len(self.pod_uids_by_attempt[attempt]) == 1, f"two pods for attempt {attempt}"
        if self.spec.get("guarantee") == "NoOverlap":  # the shell's write-through (module docstring)
            self.cached_pods[pod["metadata"]["uid"]] = 0

    # ----------------------------------------------------------------------- the pods' side

    def live_pods(self) -> list[StoredPod]:
        """Pods that can still make progress: neither finished, gone nor being deleted."""
        return sorted(
            (p for p in self.pods.values() if not (p.deleted or p.finished or p.deleting)), key=lambda p: p.uid
        )

    def progress_pod(self, index: int, fate: str) -> None:
        pods = self.live_pods()
        if not pods:
            return
        stored = pods[index % len(pods)]
        if fate == "Deleted":
            if self.may_delete_externally(stored):
                stored.deleted = True
            return
        pod = self.new_version(stored)
        pod["spec"]["nodeName"] = "node-a"
        if fate == "Running":
            pod["status"] = {"phase": "Running"}
        elif fate == "Evicted":
            pod["status"] = {"phase": "Failed", "reason": "Evicted"}
        elif fate == "Draining":  # an eviction in progress: DisruptionTarget, then gone
            pod["metadata"]["deletionTimestamp"] = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
            pod["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
        else:
            code = {"Succeeded": 0, "Failed1": 1, "Failed3": 3}[fate]
            pod["status"] = {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": code}}}],
            }
        stored.versions.append(pod)

    def end_termination(self, index: int, end: str) -> None:
        """A terminating pod goes, or its process ends first (a late success, or a failure)."""
        pods = sorted((p for p in self.pods.values() if p.deleting and not p.deleted), key=lambda p: p.uid)
        if not pods:
            return
        stored = pods[index % len(pods)]
        if end == "gone" or stored.finished:
            stored.deleted = stored.deleted or self.may_delete_externally(stored)
            return
        pod = self.new_version(stored)
        code = 0 if end == "Succeeded" else 1
        pod["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": code}}}],
        }
        stored.versions.append(pod)

    def write_checkpoint(self, index: int, value: str) -> None:
        pods = self.live_pods()
        if pods:
            stored = pods[index % len(pods)]
            pod = self.new_version(stored)
            annotations = pod["metadata"].get("annotations") or {}
            pod["metadata"]["annotations"] = {**annotations, api.ANNOTATION_CHECKPOINT: value}
            stored.versions.append(pod)

    def set_verdict(self, index: int, state: str) -> None:
        pods = self.live_pods()
        if pods:
            self.verdicts[pods[index % len(pods)].uid] = state

    def may_delete_externally(self, stored: StoredPod) -> bool:
        """Whether someone else may delete this pod in this world (see the module docstring)."""
        current = self.status.get("currentAttempt") or {}
        return stored.attempt != current.get("number") or stored.uid in self.seen_by_vigil

    # ----------------------------------------------------------------------- invariants

    def counts(self, outcome: str) -> bool:
        return (
            outcome in FAILURES
            or outcome == "Succeeded"
            or (outcome == "Disrupted" and self.spec["retry"]["countDisruptions"])
        )

    def check_status_transition(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        retry = self.spec["retry"]
        if old.get("phase") in api.TERMINAL_PHASES and new["phase"] not in api.TERMINAL_PHASES:
            assert old["phase"] == "DeadLettered", "a succeeded job came back"
            assert new["redrives"] == old["redrives"] + 1, "a dead-lettered job came back without a redrive"
        assert new["attempts"] >= old.get("attempts", 0)
        assert 0 <= new["roundAttempts"] <= retry["maxAttempts"]
        assert new.get("lastCheckpoint") in (None, *CHECKPOINTS[:2]), "a bad checkpoint reached status"
        if old.get("phase") == "Succeeded":
            assert new["attempts"] == old["attempts"] and not new.get("currentAttempt"), "a succeeded job went on"

        before = dict(self.outcomes)
        for record in new.get("history", []):
            if record["number"] not in self.outcomes and record.get("exitCode") in retry["nonRetryableExitCodes"]:
                assert new["phase"] == "DeadLettered" and new["reason"] == "NonRetryableExitCode"
            previous = before.get(record["number"], record["outcome"])
            if previous != record["outcome"]:  # only a late success rewrites an outcome
                assert previous in LATE_SUCCESS_OUTCOMES and record["outcome"] == "Succeeded", (previous, record)
                assert new["phase"] == "Succeeded" and new["reason"] == "LateSuccess"
            self.outcomes[record["number"]] = record["outcome"]
            self.reasons[record["number"]] = record.get("reason")
        if "Succeeded" in self.outcomes.values():
            assert new["phase"] == "Succeeded", "an attempt succeeded but the job went on"
        if new.get("reason") == "LateSuccess" and old.get("phase") != "Succeeded":
            replaced = (old.get("currentAttempt") or {}).get("number")
            if replaced is not None:  # the replacement is cancelled
                assert self.outcomes[replaced] == "Cancelled", "the replacement of a late success went on"

        old_number = (old.get("currentAttempt") or {}).get("number")
        number = (new.get("currentAttempt") or {}).get("number")
        if number is not None and number != old_number:
            assert number == new["attempts"] == old.get("attempts", 0) + 1
            self.round_of[number] = new["redrives"]
            self.check_backoff_was_waited(new, number)
        if new.get("nextAttemptAt") and new.get("nextAttemptAt") != old.get("nextAttemptAt"):
            delay = (datetime.fromisoformat(new["nextAttemptAt"]) - self.now).total_seconds()
            low, high = self.backoff_bounds(new["roundAttempts"])
            assert low - 1e-3 <= delay <= high + 1e-3, (delay, low, high)

        this_round = [n for n, r in self.round_of.items() if r == new["redrives"]]
        counted = sum(1 for n in this_round if n != number and self.counts(self.outcomes.get(n, "")))
        assert counted + (number is not None) <= retry["maxAttempts"]
        if new["phase"] == "DeadLettered" and new.get("reason") == "AttemptsExhausted":
            assert counted == retry["maxAttempts"], "dead-lettered before the attempts were used"

    def backoff_bounds(self, failures: int) -> tuple[float, float]:
        backoff = self.spec["retry"]["backoff"]
        base = min(backoff["maxSeconds"], backoff["initialSeconds"] * backoff["factor"] ** (failures - 1))
        return base * (1 - backoff["jitter"]), base

    def check_backoff_was_waited(self, new: dict[str, Any], number: int) -> None:
        previous = next((h for h in new.get("history", []) if h["number"] == number - 1), None)
        if previous is None or self.round_of.get(number - 1) != new["redrives"]:
            return  # a new round starts at once
        if self.counts(previous["outcome"]) and previous["outcome"] != "Succeeded":
            waited = (self.now - datetime.fromisoformat(previous["finishedAt"])).total_seconds()
            low, _ = self.backoff_bounds(new["roundAttempts"] - 1)
            assert waited >= low - 1e-3, f"attempt {number} started {waited}s after a failure, not {low}s"

    def check_at_rest(self) -> None:
        """After a fresh, complete reconcile: what status says matches the world."""
        if self.job_deleted:
            return
        dead = self.status["phase"] == "DeadLettered"
        assert (self.job["metadata"]["labels"].get(api.LABEL_DEAD_LETTER) == "true") == dead
        conditions = {c["type"]: c["status"] for c in self.status["conditions"]}
        expected = {"Succeeded": "True", "DeadLettered": "False"}.get(self.status["phase"], "Unknown")
        assert conditions["Succeeded"] == expected
        assert conditions["DeadLettered"] == ("True" if dead else "False")
        assert conditions["Running"] == ("True" if self.status["phase"] == "Running" else "False")
        if self.spec["heartbeat"]["required"]:
            expected = {"Running": "True", "Uncertain": "Unknown"}.get(self.status["phase"])
            assert expected is None or conditions["HeartbeatHealthy"] == expected
            assert conditions["HeartbeatHealthy"] in ("True", "False", "Unknown")
        else:
            assert "HeartbeatHealthy" not in conditions
        current = (self.status.get("currentAttempt") or {}).get("number")
        for stored in self.live_pods():
            assert stored.attempt == current, f"a pod of attempt {stored.attempt} still runs"

    def settle(self, fates: list[str]) -> None:
        """Unsuspend, then run the operator undisturbed; each new pod runs and then meets
        fates[attempt % len(fates)]."""
        if self.job["spec"].get("suspend"):
            self.job["spec"]["suspend"] = False
            self.job["metadata"]["generation"] += 1
            self.bump_job()
        self.verdicts.clear()  # the agents beat again
        for _ in range(100):
            self.restart()
            self.reconcile()
            self.check_at_rest()
            if self.job_deleted or self.status["phase"] in api.TERMINAL_PHASES:
                return
            for stored in self.pods.values():  # pods being drained go
                stored.deleted = stored.deleted or stored.deleting
            while self.live_pods():
                attempt = self.live_pods()[0].attempt
                self.progress_pod(0, "Running")
                self.progress_pod(0, fates[attempt % len(fates)])
            self.restart()
            self.reconcile()
            if self.live_pods():
                continue  # a pod was just created (say, once a NoOverlap wait ended): it runs first
            if self.requeue_at is not None and self.requeue_at > self.now:
                self.now = self.requeue_at
            else:
                self.now += timedelta(seconds=1)
        raise AssertionError(f"the job never finished: {self.status}")


# ------------------------------------------------------------------------------ strategies


@st.composite
def job_specs(draw: st.DrawFn) -> dict[str, Any]:
    initial = draw(st.integers(0, 30))
    return {
        "retry": {
            "maxAttempts": draw(st.integers(1, 4)),
            "backoff": {
                "initialSeconds": initial,
                "factor": draw(st.sampled_from([1.0, 1.5, 2.0, 3.0])),
                "maxSeconds": initial + draw(st.integers(0, 300)),
                "jitter": draw(st.sampled_from([0.0, 0.3, 0.5, 1.0])),
            },
            "nonRetryableExitCodes": draw(st.sampled_from([[], [3]])),
            "countDisruptions": draw(st.booleans()),
        },
        "attemptDeadlineSeconds": draw(st.none() | st.integers(20, 200)),
        "activeDeadlineSeconds": draw(st.none() | st.integers(100, 2000)),
        "ttlSecondsAfterFinished": draw(st.none() | st.integers(0, 100)),
        "suspend": draw(st.booleans()) and draw(st.booleans()),
        "heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 60, "required": draw(st.booleans())},
        "guarantee": draw(st.sampled_from(["AtLeastOnce", "NoOverlap"])),
    }


CHECKPOINTS = ['{"offset": 1}', '{"offset": 2}', "not json", "[" * 3000]

RECONCILE = st.tuples(
    st.just("reconcile"),
    st.sampled_from(["fresh", "fresh", "cached", "old_leader"]),  # the job view
    st.sampled_from([True, True, False]),  # whether pod events were all delivered first
    st.booleans(),  # stale duplicate pod snapshots
    st.integers(0, 1000),  # order of the pod snapshots
    st.none() | st.integers(0, 4),  # crash after this many actions
    st.sampled_from([True, True, True, False]),  # may start
)
STEP_KINDS = {  # kind: (weight, strategy of the step)
    "reconcile": (8, RECONCILE),
    "pod": (
        6,
        st.tuples(
            st.just("pod"),
            st.integers(0, 3),
            st.sampled_from(
                ["Running", "Running", "Succeeded", "Failed1", "Failed3", "Evicted", "Draining", "Deleted"]
            ),
        ),
    ),
    "advance": (3, st.tuples(st.just("advance"), st.integers(1, 700))),
    "verdict": (4, st.tuples(st.just("verdict"), st.integers(0, 3), st.sampled_from(["Healthy", "Uncertain", "Lost"]))),
    "terminating": (
        3,
        st.tuples(st.just("terminating"), st.integers(0, 3), st.sampled_from(["gone", "Succeeded", "Failed1"])),
    ),
    "checkpoint": (1, st.tuples(st.just("checkpoint"), st.integers(0, 3), st.sampled_from(CHECKPOINTS))),
    "deliver_pods": (1, st.tuples(st.just("deliver_pods"))),
    "restart": (1, st.tuples(st.just("restart"))),
    "remember_old_leader_view": (1, st.tuples(st.just("remember_old_leader_view"))),
    "toggle_suspend": (1, st.tuples(st.just("toggle_suspend"))),
    "redrive": (1, st.tuples(st.just("redrive"))),
}
STEPS = st.sampled_from([kind for kind, (weight, _) in STEP_KINDS.items() for _ in range(weight)]).flatmap(
    lambda kind: STEP_KINDS[kind][1]
)


def play(world: World, step: tuple[Any, ...]) -> None:
    match step:
        case ("reconcile", view, fresh_pods, duplicates, order, crash_after, may_start):
            world.reconcile(
                view=view,
                fresh_pods=fresh_pods,
                stale_duplicates=duplicates,
                shuffle_seed=order,
                crash_after=crash_after,
                may_start=may_start,
            )
        case ("deliver_pods",):
            world.deliver_pods()
        case ("restart",):
            world.restart()
        case ("remember_old_leader_view",):
            world.old_leader_job = copy.deepcopy(world.job)
        case ("pod", index, fate):
            world.progress_pod(index, fate)
        case ("advance", seconds):
            world.now += timedelta(seconds=seconds)
        case ("verdict", index, state):
            world.set_verdict(index, state)
        case ("terminating", index, end):
            world.end_termination(index, end)
        case ("checkpoint", index, value):
            world.write_checkpoint(index, value)
        case ("toggle_suspend",):
            world.job["spec"]["suspend"] = not world.job["spec"].get("suspend", False)
            world.job["metadata"]["generation"] += 1
            world.bump_job()
        case ("redrive",):
            world.job["metadata"]["annotations"][api.ANNOTATION_REDRIVE] = world.job["metadata"]["resourceVersion"]
            world.bump_job()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=job_specs(), steps=st.lists(STEPS, min_size=10, max_size=80), seed=st.integers(0, 2**32), succeed=st.booleans()
)
def test_doubtful_histories_keep_every_invariant_and_end_terminal(
    spec: dict[str, Any], steps: list[tuple[Any, ...]], seed: int, succeed: bool
) -> None:
    world = World(spec, random.Random(seed))
    for step in steps:
        play(world, step)
    attempts_before = world.status.get("attempts", 0)
    world.settle(["Succeeded"] if succeed else ["Failed1"])
    if not world.job_deleted:
        assert world.status["phase"] in api.TERMINAL_PHASES
    # Every attempt started once the pods behave is recorded with what its pod did.
    settled = {n: outcome for n, outcome in world.outcomes.items() if n > attempts_before}
    assert set(settled.values()) <= {"Succeeded" if succeed else "Failed"}


def test_a_deposed_leaders_stale_view_cannot_create_a_cancelled_attempts_pod_again() -> None:
    backoff = {"initialSeconds": 10, "factor": 2.0, "maxSeconds": 10, "jitter": 0.0}
    retry = {"maxAttempts": 3, "backoff": backoff, "nonRetryableExitCodes": [], "countDisruptions": False}
    world = World({"retry": retry}, random.Random(0))
    world.reconcile()  # attempt 1 reserved, its pod created
    play(world, ("remember_old_leader_view",))  # a leader that will lose its lease sees that
    play(world, ("toggle_suspend",))
    world.deliver_pods()
    world.reconcile()  # the new leader cancels attempt 1 and deletes its pod
    world.deliver_pods()
    play(world, ("toggle_suspend",))

    world.reconcile(view="old_leader")  # its PatchStatus is refused, so no CreatePod follows

    assert world.pod_uids_by_attempt == {1: ["uid-1"]}
    assert world.pods["uid-1"].deleting


@settings(max_examples=100, deadline=None)
@given(
    spec=job_specs(),
    fates=st.lists(st.sampled_from(["Failed1", "Evicted", "Draining"]), min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
)
def test_failing_and_disrupted_pods_use_exactly_max_attempts_then_dead_letter(
    spec: dict[str, Any], fates: list[str], seed: int
) -> None:
    spec = spec | {"suspend": False, "activeDeadlineSeconds": None, "ttlSecondsAfterFinished": None}
    if not spec["retry"]["countDisruptions"]:
        fates = [*fates, "Failed1"]  # so that the job can end
    world = World(spec, random.Random(seed))
    world.settle(fates)
    assert world.status["phase"] == "DeadLettered"
    assert world.status["reason"] == "AttemptsExhausted"
    counted = [n for n, outcome in world.outcomes.items() if world.counts(outcome)]
    assert len(counted) == spec["retry"]["maxAttempts"]
    assert world.status["roundAttempts"] == spec["retry"]["maxAttempts"]


@settings(max_examples=60, deadline=None)
@given(spec=job_specs(), steps=st.lists(STEPS, max_size=30), seed=st.integers(0, 2**32))
def test_decide_is_deterministic_for_the_same_view_and_seed(
    spec: dict[str, Any], steps: list[tuple[Any, ...]], seed: int
) -> None:
    world = World(spec, random.Random(seed))
    for step in steps:
        play(world, step)
    view = [p.current for p in world.pods.values() if not p.deleted]
    liveness = world.liveness()
    first = decide(world.job, view, world.now, rng=random.Random(seed), liveness=liveness)
    second = decide(copy.deepcopy(world.job), view[::-1], world.now, rng=random.Random(seed), liveness=liveness)
    assert first == second


@settings(max_examples=100, deadline=None)
@given(spec=job_specs(), steps=st.lists(STEPS, max_size=30), seed=st.integers(0, 2**32))
def test_a_late_success_of_a_lost_attempt_ends_the_job_and_no_attempt_follows(
    spec: dict[str, Any], steps: list[tuple[Any, ...]], seed: int
) -> None:
    spec = spec | {"suspend": False, "activeDeadlineSeconds": None, "ttlSecondsAfterFinished": None}
    spec["heartbeat"]["required"] = True
    spec["retry"]["maxAttempts"] = max(2, spec["retry"]["maxAttempts"])
    world = World(spec, random.Random(seed))
    world.reconcile()
    world.progress_pod(0, "Running")
    (lost,) = world.live_pods()
    world.verdicts[lost.uid] = "Lost"
    world.reconcile()
    assert world.outcomes[1] == "Lost" and lost.deleting
    world.verdicts.clear()
    for step in steps:  # anything may happen meanwhile, but the lost pod lingers
        if step[0] not in ("terminating", "toggle_suspend", "redrive"):
            play(world, step)
    if world.job_deleted or world.status["phase"] in api.TERMINAL_PHASES:
        return
    attempts = world.status["attempts"]
    lost.versions.append(world.new_version(lost) | {"status": {"phase": "Succeeded"}})

    world.restart()
    world.reconcile()

    assert world.status["phase"] == "Succeeded"
    if world.status["reason"] == "LateSuccess":
        assert world.outcomes[1] == "Succeeded"
    else:  # the replacement had succeeded too, unseen, and both show in one look: its own success wins
        assert world.status["reason"] == "AttemptSucceeded"
        assert world.outcomes[world.status["attempts"]] == "Succeeded"
    world.settle(["Failed1"])
    assert world.status["phase"] == "Succeeded"
    assert world.status["attempts"] == attempts
    assert all(p.deleting or p.deleted or p.finished for p in world.pods.values() if p.attempt > 1)


# Stories centred on liveness: pods that run, verdicts that flap, lost attempts whose pods linger
# and may still succeed, and the NoOverlap wait, with the same doubt about views as above.
LIVENESS_STEP_KINDS = {
    "reconcile": (8, RECONCILE),
    "run": (3, st.tuples(st.just("pod"), st.integers(0, 3), st.just("Running"))),
    "end": (1, st.tuples(st.just("pod"), st.integers(0, 3), st.sampled_from(["Succeeded", "Failed1", "Draining"]))),
    "verdict": STEP_KINDS["verdict"],
    "terminating": STEP_KINDS["terminating"],
    "advance": (2, st.tuples(st.just("advance"), st.integers(1, 100))),
    "restart": (1, st.tuples(st.just("restart"))),
    "deliver_pods": (1, st.tuples(st.just("deliver_pods"))),
}
LIVENESS_STEPS = st.sampled_from(
    [kind for kind, (weight, _) in LIVENESS_STEP_KINDS.items() for _ in range(weight)]
).flatmap(lambda kind: LIVENESS_STEP_KINDS[kind][1])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=job_specs(), steps=st.lists(LIVENESS_STEPS, min_size=10, max_size=80), seed=st.integers(0, 2**32))
def test_flapping_heartbeats_lost_attempts_and_late_successes_keep_every_invariant(
    spec: dict[str, Any], steps: list[tuple[Any, ...]], seed: int
) -> None:
    spec = spec | {"suspend": False}
    spec["heartbeat"]["required"] = True
    world = World(spec, random.Random(seed))
    for step in steps:
        play(world, step)
    world.settle(["Failed1"])
    if not world.job_deleted:
        assert world.status["phase"] in api.TERMINAL_PHASES
