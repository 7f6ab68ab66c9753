"""Property tests: decide() driven through a small simulated cluster full of doubt.

The world keeps the truth (the job with its resourceVersion, every version of every pod) and
the operator's views of it, which lag: a job view read at the last reconcile, or one kept by a
deposed leader long ago, and a pod cache refreshed only when events are delivered. Hypothesis
draws a story: reconciles on those views with stale duplicate pod snapshots mixed in, crashes
that drop the rest of a decision, restarts, pods that run, fail, succeed, get evicted or deleted,
suspends, redrives, heartbeat verdicts that flap between Healthy, Uncertain and Lost, pods that
take their time to terminate (and may succeed meanwhile: a late success), and time passing. The
world executes actions as the API server would (resourceVersion preconditions, AlreadyExists,
UID preconditions, finalizers) and checks the invariants on every write. At the end the pods
are let finish and the job must reach a terminal phase, with no pod left held by Vigil.

Deletion goes as in a real cluster. A pod that is finished or not on a node is deleted at once
(grace period 0); any other gets a grace period, and its kubelet (a step, or the end) then
reports a terminal phase (exit 143, or 0 for a process that exits 0 on SIGTERM, or a late report
of an end before the deletion) and deletes it with grace 0, which moves deletionTimestamp to
that moment as the API server does. A node can also vanish (the pod garbage collector marks the
pod Failed and force-deletes it), and a person can force-delete a pod whose node is dead. The
object goes once it is deleted with grace 0 and carries no finalizer: Vigil's attempt-tracking
finalizer holds it until Vigil releases it, so Vigil sees every pod it made, however soon it is
deleted (nobody removes that finalizer by hand: the one assumption about others).

One assumption is stated here rather than tested:
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

from tests.support.builders import T0, make_job, merge_patch, stamp
from vigil import api
from vigil.core import fields, podstate
from vigil.core.actions import (
    AnnotatePod,
    ConfirmVersion,
    CreatePod,
    Decision,
    DeleteJob,
    DeletePod,
    EmitEvent,
    PatchStatus,
    ReleasePod,
    RequeueAfter,
    SetDeadLetterLabel,
)
from vigil.core.lifecycle import LATE_SUCCESS_OUTCOMES, decide
from vigil.core.liveness import Liveness

pytestmark = pytest.mark.unit

FAILURES = {"Failed", "Lost", "DeadlineExceeded"}
GRACE = 30  # the pods' terminationGracePeriodSeconds


class Conflict(Exception):
    """The API server refused a write: the shell drops the rest of the decision."""


@dataclass
class StoredPod:
    versions: list[dict[str, Any]]  # every version the API server stored; the last is current
    deleted: bool = False  # the object is gone
    requested_at: datetime | None = None  # when its deletion was first asked for: the truth

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

    @property
    def tracked(self) -> bool:
        return podstate.is_tracked(self.current)

    def ended_before_deletion(self) -> bool:
        """The truth the pod's timestamps can only hint at: whether it ended before anyone asked
        for its deletion."""
        ends = [
            datetime.fromisoformat(c["state"]["terminated"]["finishedAt"])
            for c in self.current["status"].get("containerStatuses") or []
        ]
        return self.requested_at is None or (bool(ends) and max(ends) < self.requested_at)


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
    last_view: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> what decide() read last
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
        self.last_view = {fields.uid(pod): pod for pod in podstate.freshest_by_uid(pods)}
        decision = decide(
            copy.deepcopy(job),
            copy.deepcopy(pods),
            self.now,
            rng=self.rng,
            may_start=may_start,
            liveness=self.liveness(),
        )
        actions = decision.actions if crash_after is None else decision.actions[:crash_after]
        version = self.job["metadata"]["resourceVersion"]
        try:
            for action in actions:
                self.execute(action)
        except Conflict:
            return
        if view == "fresh" and fresh_pods and crash_after is None:
            self.check_released_within_one_decision()
            if self.job["metadata"]["resourceVersion"] != version and not self.job_deleted:
                self.check_own_write_needs_no_look(decision, pods, may_start)

    def liveness(self) -> dict[str, Liveness]:
        return {uid: Liveness(state, 0.0, f"said so ({state})", self.now) for uid, state in self.verdicts.items()}

    def deliver_pods(self) -> None:
        self.cached_pods = {uid: len(p.versions) - 1 for uid, p in self.pods.items() if not p.deleted}

    def check_released_within_one_decision(self) -> None:
        """After a complete decision on fresh views: no pod it saw finished (or force-deleted)
        is still held, whatever it was (an attempt it closed just now included)."""
        for uid, seen in self.last_view.items():
            stored = self.pods[uid]
            if podstate.is_finished(seen) or podstate.is_force_deleted(seen):
                assert stored.deleted or not stored.tracked, f"pod {uid} can say nothing more, yet is held"

    def check_own_write_needs_no_look(self, decision: Decision, pods: list[dict[str, Any]], may_start: bool) -> None:
        """A complete decision leaves nothing for a look at its own status write: decided again on
        the job it wrote and the same pods, it changes no status and does nothing it did not do
        already (at most the same steps again, on a pod view that has not caught up). So the
        shell takes its own write into the cache without a look (Controller._execute); what
        comes next arrives as a watch event, a timer or a pod's change, each a look of its own."""
        again = decide(
            copy.deepcopy(self.job),
            copy.deepcopy(pods),
            self.now,
            rng=random.Random(0),
            may_start=may_start,
            liveness=self.liveness(),
        )
        timers = [action.seconds for action in decision.of_type(RequeueAfter)]
        for action in again.actions:
            if isinstance(action, PatchStatus):
                assert merge_patch(self.status, action.status) == self.status, "a look at its own write changes status"
            elif isinstance(action, ConfirmVersion):  # a fence that writes nothing
                pass
            elif isinstance(action, RequeueAfter):  # the decision's own timer comes no later
                assert timers and min(timers) <= action.seconds, f"a look at its own write sets a timer: {action}"
            else:
                assert action in decision.actions, f"a look at its own write does more: {action}"

    def restart(self) -> None:
        self.cached_job = copy.deepcopy(self.job)
        self.deliver_pods()

    # -------------------------------------------------------------- the API server's side

    def execute(self, action: Any) -> None:
        if isinstance(action, PatchStatus):
            self.patch_status(action)
        elif isinstance(action, ConfirmVersion):  # the shell reads the job and compares
            if action.resource_version != self.job["metadata"]["resourceVersion"]:
                raise Conflict
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
                self.request_deletion(stored)
        elif isinstance(action, ReleasePod):
            stored = self.pods.get(action.uid)
            if stored and not stored.deleted and stored.current["metadata"]["name"] == action.name:
                self.check_release(stored)
                pod = self.new_version(stored)
                pod["metadata"]["finalizers"] = [
                    f for f in pod["metadata"].get("finalizers") or [] if f != api.FINALIZER_ATTEMPT_TRACKING
                ]
                stored.versions.append(pod)
                self.remove_if_done(stored)
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

    def request_deletion(self, stored: StoredPod, *, force: bool = False) -> None:
        """DELETE, as the API server takes it: a finished or unscheduled pod (or a forced delete)
        gets grace 0, any other the grace period its kubelet must honour."""
        if stored.deleting and not force:
            return
        pod = self.new_version(stored)
        immediate = force or stored.finished or not pod["spec"].get("nodeName")
        grace = 0 if immediate else GRACE
        if stored.requested_at is None:
            stored.requested_at = self.now
        # A later, shorter deletion moves the time to now (never into the past), as kube-apiserver does.
        pod["metadata"]["deletionTimestamp"] = stamp(self.now + timedelta(seconds=grace))
        pod["metadata"]["deletionGracePeriodSeconds"] = grace
        stored.versions.append(pod)
        self.remove_if_done(stored)

    def remove_if_done(self, stored: StoredPod) -> None:
        """The object goes once deleted with grace 0 and free of finalizers."""
        metadata = stored.current["metadata"]
        if metadata.get("deletionGracePeriodSeconds") == 0 and not metadata.get("finalizers"):
            stored.deleted = True

    def report_end(self, stored: StoredPod, code: int, finished_at: datetime | None = None) -> None:
        """The kubelet reports the pod's containers ended with `code` (at `finished_at`, now by default)."""
        pod = self.new_version(stored)
        pod["spec"]["nodeName"] = "node-a"
        terminated = {"exitCode": code, "finishedAt": stamp(finished_at or self.now)}
        pod["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": (pod.get("status") or {}).get("conditions") or [],
            "containerStatuses": [{"name": "main", "state": {"terminated": terminated}}],
        }
        stored.versions.append(pod)

    def kubelet_terminates(self, stored: StoredPod, code: int = 143) -> None:
        """A deleted pod's kubelet stops it (unless it has ended), then deletes it with grace 0.
        A pod on no node has no kubelet: it was deleted with grace 0 at once."""
        if not stored.current["spec"].get("nodeName"):
            return
        if not stored.finished:
            self.report_end(stored, code)
        self.request_deletion(stored, force=True)

    def check_release(self, stored: StoredPod) -> None:
        """Vigil lets a pod go only once the status it just wrote holds the pod's attempt closed,
        with what the pod said in the view it decided on."""
        status = self.status  # the PatchStatus before this action has landed
        attempt = stored.attempt
        current = status.get("currentAttempt") or {}
        assert not (current.get("number") == attempt and current.get("podUID") in (None, stored.uid)), (
            "the current attempt's pod was released"
        )
        records = {record["number"]: record for record in status.get("history", [])}
        record = records.get(attempt)
        if record is None:  # only an attempt older than the kept history has no record to write to
            assert records and attempt < min(records), f"attempt {attempt} released without a record"
            return
        seen = self.last_view[stored.uid]
        assert podstate.is_finished(seen) or podstate.is_force_deleted(seen), "released while it may still report"
        report = podstate.read_pod(seen)
        if report.exit_code is not None and podstate.is_finished(seen):
            assert record.get("exitCode") == report.exit_code, "released before its exit code was recorded"
        if report.state == "Succeeded" and record["outcome"] in LATE_SUCCESS_OUTCOMES:
            assert status["phase"] in api.TERMINAL_PHASES, "a late success released unrecorded"

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
        # The stored status names this attempt as its current one (reserved, or adopted from its
        # pod), or it is the next attempt, whose pod comes first: never a number status has used.
        current = self.status.get("currentAttempt")
        if current is None:
            assert attempt == self.status.get("attempts", 0) + 1, f"pod of attempt {attempt} after {self.status}"
            if attempt not in self.round_of:  # the attempt starts now, recorded by the next look
                self.round_of[attempt] = self.status.get("redrives", 0)
                self.check_backoff_was_waited(self.status, attempt, self.status.get("roundAttempts", 0))
        else:
            assert current["number"] == attempt
        assert self.status.get("phase") not in api.TERMINAL_PHASES | {"Suspended"}
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
        assert api.FINALIZER_ATTEMPT_TRACKING in pod["metadata"]["finalizers"]
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
        if fate == "Deleted":  # by someone else: the finalizer keeps the object for Vigil to see
            self.request_deletion(stored)
            return
        if fate in ("Succeeded", "Failed1", "Failed3"):
            self.report_end(stored, {"Succeeded": 0, "Failed1": 1, "Failed3": 3}[fate])
            return
        pod = self.new_version(stored)
        pod["spec"]["nodeName"] = "node-a"
        if fate == "Running":
            pod["status"] = {"phase": "Running"}
        elif fate == "Evicted":
            pod["status"] = {"phase": "Failed", "reason": "Evicted"}
        else:  # Draining: an eviction in progress, DisruptionTarget, then the kubelet stops it
            pod["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
        stored.versions.append(pod)
        if fate == "Draining":
            self.request_deletion(stored)

    def end_termination(self, index: int, end: str) -> None:
        """A deleted pod's kubelet (or the lack of one) ends its termination: `stopped` (exit
        143), `exit0` (a process that exits 0 on SIGTERM), `late` (a report, late, of a success
        before the deletion), `node_gone` (the pod garbage collector), `force` (a person
        force-deletes a pod whose node is dead). Once it has reported, its final deletion."""
        pods = sorted((p for p in self.pods.values() if p.deleting and not p.deleted), key=lambda p: p.uid)
        if not pods:
            return
        stored = pods[index % len(pods)]
        if not stored.current["spec"].get("nodeName"):
            return  # deleted with grace 0 at once: only Vigil's release lets it go
        if stored.finished or end == "stopped":
            self.kubelet_terminates(stored)
        elif end in ("exit0", "Failed1"):
            self.report_end(stored, 0 if end == "exit0" else 1)  # its final deletion is another step
        elif end == "late":
            self.report_end(stored, 0, (stored.requested_at or self.now) - timedelta(seconds=30))
        elif end == "node_gone":
            pod = self.new_version(stored)
            pod["status"] = {
                "phase": "Failed",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}],
            }
            stored.versions.append(pod)
            self.request_deletion(stored, force=True)
        else:
            assert end == "force"
            self.request_deletion(stored, force=True)

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
            if record["outcome"] == "Succeeded" and before.get(record["number"]) != "Succeeded":
                (uid,) = self.pod_uids_by_attempt[record["number"]]
                assert self.pods[uid].ended_before_deletion(), "a pod stopped by its deletion counted as a success"
            if record["number"] not in self.outcomes and record.get("exitCode") in retry["nonRetryableExitCodes"]:
                # poison dead-letters the job, unless a late success seen in the same look ends it
                expected = ("Succeeded", "LateSuccess") if new.get("reason") == "LateSuccess" else None
                assert (new["phase"], new["reason"]) in (("DeadLettered", "NonRetryableExitCode"), expected)
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
            assert number == new["attempts"]
        # Attempts recorded by this write: each one's pod came first (and its start was checked
        # then), or it is the current one, reserved now before its pod. One write can record both:
        # the pod-first attempt that just ended, and the next one.
        for started in range(old.get("attempts", 0) + 1, new["attempts"] + 1):
            if started not in self.round_of:
                assert started == number, f"attempt {started} recorded with neither a pod nor a reservation"
                self.round_of[started] = new["redrives"]
                self.check_backoff_was_waited(new, started, new["roundAttempts"] - 1)
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
        # Never under the floor, not even for initialSeconds 0 (a job stored before the floor).
        return max(api.MIN_RETRY_SECONDS, base * (1 - backoff["jitter"])), max(api.MIN_RETRY_SECONDS, base)

    def check_backoff_was_waited(self, status: dict[str, Any], number: int, failures: int) -> None:
        """Attempt `number` starts now, after `failures` attempts of its round: a failure before
        it was waited out."""
        previous = next((h for h in status.get("history", []) if h["number"] == number - 1), None)
        if previous is None or self.round_of.get(number - 1) != status.get("redrives", 0):
            return  # a new round starts at once
        if self.counts(previous["outcome"]) and previous["outcome"] != "Succeeded":
            waited = (self.now - datetime.fromisoformat(previous["finishedAt"])).total_seconds()
            low, _ = self.backoff_bounds(failures)
            assert waited >= low - 1e-3, f"attempt {number} started {waited}s after a failure, not {low}s"

    def check_at_rest(self) -> None:
        """After a fresh, complete reconcile: what status says matches the world."""
        if self.job_deleted:
            return
        if "phase" not in self.status:  # nothing written yet: the first attempt's pod comes first
            assert {stored.attempt for stored in self.live_pods()} <= {1}
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
        # The current attempt's pod, or the next attempt's, created first and recorded by the next look.
        allowed = {current} if current is not None else {self.status.get("attempts", 0) + 1}
        for stored in self.live_pods():
            assert stored.attempt in allowed, f"a pod of attempt {stored.attempt} still runs"

    def check_nothing_held(self) -> None:
        """Once every deleted pod's kubelet has done its part, Vigil holds none of them."""
        for _ in range(3):  # stray pods are deleted, then stopped, then released
            for stored in [p for p in self.pods.values() if p.deleting and not p.deleted]:
                self.kubelet_terminates(stored)
            self.restart()
            self.reconcile()
        for stored in self.pods.values():
            assert stored.deleted or not stored.deleting, f"pod {stored.uid} is held after its deletion"
            assert not (stored.tracked and stored.finished), f"finished pod {stored.uid} is still held"

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
            if self.job_deleted:  # the shell releases the pods of a job that is gone
                return
            if self.status.get("phase") in api.TERMINAL_PHASES:
                self.check_nothing_held()
                return
            for stored in [p for p in self.pods.values() if p.deleting and not p.deleted]:
                self.kubelet_terminates(stored)  # pods being deleted go, or wait for Vigil
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
        4,
        st.tuples(
            st.just("terminating"),
            st.integers(0, 3),
            st.sampled_from(["stopped", "stopped", "exit0", "late", "Failed1", "node_gone", "force"]),
        ),
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
    # Attempts begun so far: those in status, and one whose pod came first and is not recorded yet.
    attempts_before = max([world.status.get("attempts", 0), *world.pod_uids_by_attempt])
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
    attempts = max([world.status["attempts"], *world.pod_uids_by_attempt])  # a replacement's pod may come first
    # It had ended before Vigil deleted it; the report of that comes late.
    assert lost.requested_at is not None
    world.report_end(lost, 0, lost.requested_at - timedelta(seconds=30))

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


# Stories centred on deletion and the attempt-tracking finalizer: pods deleted by others while
# they run, kubelets that stop them (exit 143, or 0 on SIGTERM), report late an end that came
# before the deletion, or never come back (a vanished node, a force delete), lost attempts whose
# pods linger, and views that lag behind all of it. Every release is checked as it happens
# (World.check_release), every complete look on fresh views must release what can say nothing
# more, and at the end no pod may be held.
DELETION_STEP_KINDS = {
    "reconcile": (8, RECONCILE),
    "run": (4, st.tuples(st.just("pod"), st.integers(0, 3), st.just("Running"))),
    "end": (2, st.tuples(st.just("pod"), st.integers(0, 3), st.sampled_from(["Succeeded", "Failed1", "Deleted"]))),
    "delete": (2, st.tuples(st.just("pod"), st.integers(0, 3), st.just("Deleted"))),
    "verdict": (2, st.tuples(st.just("verdict"), st.integers(0, 3), st.sampled_from(["Healthy", "Lost"]))),
    "terminating": (
        6,
        st.tuples(
            st.just("terminating"),
            st.integers(0, 3),
            st.sampled_from(["stopped", "exit0", "late", "late", "Failed1", "node_gone", "force"]),
        ),
    ),
    "advance": (2, st.tuples(st.just("advance"), st.integers(1, 100))),
    "restart": (1, st.tuples(st.just("restart"))),
    "deliver_pods": (1, st.tuples(st.just("deliver_pods"))),
    "toggle_suspend": STEP_KINDS["toggle_suspend"],
}
DELETION_STEPS = st.sampled_from(
    [kind for kind, (weight, _) in DELETION_STEP_KINDS.items() for _ in range(weight)]
).flatmap(lambda kind: DELETION_STEP_KINDS[kind][1])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=job_specs(),
    steps=st.lists(DELETION_STEPS, min_size=10, max_size=80),
    seed=st.integers(0, 2**32),
    succeed=st.booleans(),
)
def test_deleted_pods_are_held_until_their_end_is_recorded_and_never_longer(
    spec: dict[str, Any], steps: list[tuple[Any, ...]], seed: int, succeed: bool
) -> None:
    spec = spec | {"ttlSecondsAfterFinished": None}  # a deleted job's pods are the shell's to release
    world = World(spec, random.Random(seed))
    for step in steps:
        play(world, step)
    world.settle(["Succeeded"] if succeed else ["Failed1"])
    assert world.status["phase"] in api.TERMINAL_PHASES
