"""The decision being built (`Draft`): the job's new status and the actions beside it, which the
steps of `vigil.core.lifecycle.decide` fill in, and which `Draft.decision()` turns into a
`Decision` (the fence first, then the pods, the events and the requeue)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from vigil import api
from vigil.api import Phase, VigilJob, VigilJobStatus
from vigil.core import fields
from vigil.core.actions import (
    Action,
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
from vigil.core.jobconditions import job_conditions
from vigil.core.liveness import Liveness, beat_stamp_due
from vigil.core.manifest import BeatChannel, TaskRef, attempt_pod_manifest

_NOT_REQUIRED = Liveness("Healthy", 0.0, "heartbeat not required: liveness is the pod phase alone")
_NO_VERDICT = Liveness("Healthy", 0.0, "no heartbeat verdict yet; silence counts from the operator's first look")


@dataclass
class Draft:
    """The decision being built: the new status and the actions beside it."""

    job: VigilJob
    now: datetime
    liveness: Mapping[str, Liveness] = field(default_factory=dict)
    beat_channel: BeatChannel | None = None  # where new pods beat besides their annotation
    agent_image: str | None = None  # the injected agent's image (heartbeat.agent: Sidecar)
    stamp_floor: float = 0.0  # liveness.stamp_floor of the attempts the leader tracks
    status: VigilJobStatus = field(init=False)
    pod_actions: list[CreatePod | DeletePod | AnnotatePod] = field(default_factory=list)
    releases: list[ReleasePod] = field(default_factory=list)
    events: list[EmitEvent] = field(default_factory=list)
    requeue_after: list[float] = field(default_factory=list)
    delete_job: bool = False
    # conditions beyond the five derived from the phase: type -> (status, reason, message)
    conditions_to_set: dict[str, tuple[api.ConditionStatus, str, str]] = field(default_factory=dict)
    beat: tuple[str, datetime] | None = None  # (pod UID, wall time of its last beat) of the current attempt
    # Status just after this decision reserved an attempt, if nothing had changed it before.
    start_alone: VigilJobStatus | None = None
    # The array's task this decision is about (vigil.core.tasks.array), else None. A task's
    # reservation is written with its array's status, not left to the look that finds its pod.
    task: TaskRef | None = None

    def __post_init__(self) -> None:
        self.status = self.job.status

    @property
    def spec(self) -> api.VigilJobSpec:
        return self.job.spec

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def update_attempt(self, **fields: Any) -> None:
        assert self.status.current_attempt is not None
        self.update(current_attempt=self.status.current_attempt.model_copy(update=fields))

    def set_phase(self, phase: Phase, reason: str, message: str) -> None:
        self.update(phase=phase, reason=reason, message=message)

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(EmitEvent("Warning" if warning else "Normal", reason, message))

    def say_more(self, reason: str, message: str, *, warning: bool = False) -> None:
        """Gives the event of `reason` this decision already posts the longer `message`, or posts
        one: one event per happening, since every event is a write to the API server."""
        for i in range(len(self.events) - 1, -1, -1):
            if self.events[i].reason == reason:
                self.events[i] = replace(self.events[i], message=message)
                return
        self.event(reason, message, warning=warning)

    def requeue_at(self, moment: datetime) -> None:
        self.requeue_after.append(max(0.0, (moment - self.now).total_seconds()))

    def create_pod(self, attempt: int) -> None:
        manifest = attempt_pod_manifest(
            self.job, attempt, self.status.last_checkpoint, self.now, self.beat_channel, self.agent_image, self.task
        )
        self.pod_actions.append(CreatePod(manifest))

    def delete_pod(self, pod: fields.Pod) -> None:
        self.pod_actions.append(DeletePod(fields.name(pod), fields.uid(pod)))

    def annotate_pod(self, pod: fields.Pod, annotations: dict[str, str | None]) -> None:
        self.pod_actions.append(AnnotatePod(fields.name(pod), fields.uid(pod), annotations))

    def release_pod(self, pod: fields.Pod) -> None:
        self.releases.append(ReleasePod(fields.name(pod), fields.uid(pod)))

    def set_condition_later(self, type_: str, status: api.ConditionStatus, reason: str, message: str) -> None:
        self.conditions_to_set[type_] = (status, reason, message)

    def verdict_for(self, pod: fields.Pod) -> Liveness:
        if not self.spec.heartbeat.required:
            return _NOT_REQUIRED
        return self.liveness.get(fields.uid(pod)) or _NO_VERDICT

    def decision(self) -> Decision:
        if self.task is not None:
            return self._task_decision()
        if self._only_starts():
            self.status = self.job.status  # the next look records the attempt, on finding its pod
        self._refresh_conditions()
        dead_lettered = self.status.phase == "DeadLettered"
        label_is_set = self.job.metadata.labels.get(api.LABEL_DEAD_LETTER) == "true"
        # Old pods are stopped before a new one starts (an annotation stays before the deletion
        # of its pod), and released before it too: a creation the API server refuses must not
        # keep finished pods held.
        stops = [action for action in self.pod_actions if not isinstance(action, CreatePod)]
        creations = [action for action in self.pod_actions if isinstance(action, CreatePod)]
        mutations: list[Action] = [*stops, *self.releases, *creations]
        if dead_lettered != label_is_set:
            mutations.append(SetDeadLetterLabel(dead_lettered))
        if self.delete_job:
            mutations.append(DeleteJob(self.job.metadata.uid))
        self._stamp_last_beat(written_anyway=bool(mutations or self.events) or self._status_changed())

        new_status = wire(self.status)
        actions: list[Action] = []
        # The fence: it fails if the snapshot was stale. A status write if there is one to make,
        # else a read, which costs the API server a fraction of a write that changes nothing.
        changed = new_status != wire(self.job.status)
        if changed:
            actions.append(PatchStatus(new_status, self.job.metadata.resource_version))
        elif mutations or self.events:
            actions.append(ConfirmVersion(self.job.metadata.resource_version))
        actions += mutations
        actions += self.events
        if self.requeue_after and not self.delete_job:
            actions.append(RequeueAfter(min(self.requeue_after)))
        return Decision(tuple(actions))

    def _task_decision(self) -> Decision:
        """A task's decision, for its array (`core.tasks.array`): the status it goes to as a model
        (the array keeps some of its fields in its own status, and no condition), the pods'
        actions, and the events; no fence of its own (the array's write is the fence)."""
        mutations = [
            *(action for action in self.pod_actions if not isinstance(action, CreatePod)),
            *self.releases,
            *(action for action in self.pod_actions if isinstance(action, CreatePod)),
        ]
        self._stamp_last_beat(written_anyway=bool(mutations or self.events) or self.status != self.job.status)
        actions: list[Action] = [*mutations, *self.events]
        if self.requeue_after:
            actions.append(RequeueAfter(min(self.requeue_after)))
        return Decision(tuple(actions), status=self.status)

    def _only_starts(self) -> bool:
        """Whether this decision does nothing but start the attempt it reserved: then it creates
        the pod alone, and the reservation is left to the look that finds the pod."""
        if self.task is not None or self.start_alone is None or wire(self.status) != wire(self.start_alone):
            return False
        creations = [action for action in self.pod_actions if isinstance(action, CreatePod)]
        only_its_pod = len(self.pod_actions) == 1 and len(creations) == 1 and not self.releases
        only_its_event = [event.reason for event in self.events] == ["AttemptStarting"]
        label_stays = self.job.metadata.labels.get(api.LABEL_DEAD_LETTER) != "true"
        return only_its_pod and only_its_event and label_stays and not self.delete_job and not self.conditions_to_set

    def _status_changed(self) -> bool:
        return wire(self.status) != wire(self.job.status)

    def _stamp_last_beat(self, *, written_anyway: bool) -> None:
        """lastHeartbeatAt rides along with other writes, and is written alone only when stale
        by liveness.stamp_period: a beat must not cost an API write, and the stamps of all jobs
        together stay within liveness.STAMP_WRITES_PER_SECOND."""
        current = self.status.current_attempt
        if self.beat is None or current is None or current.pod_uid != self.beat[0]:
            return
        beat_at = self.beat[1].replace(microsecond=0)
        if beat_at == current.last_heartbeat_at:
            return
        if written_anyway or beat_stamp_due(current.last_heartbeat_at, beat_at, self.spec.heartbeat, self.stamp_floor):
            self.update_attempt(last_heartbeat_at=beat_at)

    def _refresh_conditions(self) -> None:
        conditions = job_conditions(
            self.status,
            self.conditions_to_set,
            heartbeat_required=self.spec.heartbeat.required,
            now=self.now,
            generation=self.job.metadata.generation,
        )
        if conditions is not None:
            self.update(conditions=conditions, observed_generation=self.job.metadata.generation)


def wire(status: VigilJobStatus) -> dict[str, Any]:
    # Every field, None included: as a merge patch, null clears what the new status dropped.
    return status.model_dump(mode="json", by_alias=True)
