"""What the decision core asks the shell to do, as plain data.

The shell executes a decision's actions in order and stops at the first one that fails: the
first mutating action is always a fence carrying the resourceVersion the decision was based on
(a PatchStatus when the decision changes status, else a ConfirmVersion), so a decision made on
a stale view of the job fails there, before it touches a pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar


@dataclass(frozen=True)
class PatchStatus:
    """Write the job's status through the status subresource.

    `status` is a JSON merge patch of `.status` naming every field Vigil owns (null clears one).
    Send it with `metadata.resourceVersion = resource_version`: the API server then refuses it
    with 409 Conflict if the job changed since the decision read it, which makes the decision
    void. A patch that changes nothing still checks the version.
    """

    status: dict[str, Any]
    resource_version: str | None


@dataclass(frozen=True)
class ConfirmVersion:
    """The fence of a decision that writes no status: read the job from the API server and fail
    with a conflict, as a PatchStatus would, unless its resourceVersion is still this one. A
    read costs the API server a fraction of a write (bench/README.md, "One write at a time")."""

    resource_version: str | None


@dataclass(frozen=True)
class CreatePod:
    """Create an attempt's pod. Its name is deterministic: AlreadyExists with a pod owned by the
    job means done; a pod of that name owned by anyone else is shown to the next decide() (in
    its `pods`), which reports the conflict instead of adopting it."""

    manifest: dict[str, Any]


@dataclass(frozen=True)
class DeletePod:
    """Delete a pod, with a UID precondition so a newer pod of the same name is never hit.
    NotFound and a failed precondition mean done."""

    name: str
    uid: str


@dataclass(frozen=True)
class AnnotatePod:
    """Merge `annotations` into a pod's annotations (None removes one), with a UID precondition
    like DeletePod; NotFound and a failed precondition mean done (the pod is gone).

    Used to mark a replaced attempt's pod `vigil.dev/superseded` before deleting it, so that its
    agent stops (and exits non-zero) even if the deletion itself is slow to reach the kubelet.
    """

    name: str
    uid: str
    annotations: dict[str, str | None]


@dataclass(frozen=True)
class ReleasePod:
    """Remove the `vigil.dev/attempt-tracking` finalizer from a pod whose outcome the job's status
    now holds (the PatchStatus before it in the same decision wrote it, or an earlier one did),
    with a UID precondition like DeletePod; NotFound and a failed precondition mean done."""

    name: str
    uid: str


@dataclass(frozen=True)
class SetDeadLetterLabel:
    """Set (True) or remove (False) the job's `vigil.dev/dead-letter: "true"` label; and for a
    task array, its `vigil.dev/dead-tasks: "true"` label (some of its tasks are dead-lettered,
    whatever its phase), in the same write (None: left as it is)."""

    dead_lettered: bool
    dead_tasks: bool | None = None


@dataclass(frozen=True)
class EmitEvent:
    """Post a Kubernetes Event about the job."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class DeleteJob:
    """Delete the job (ttlSecondsAfterFinished), with a UID precondition."""

    uid: str


@dataclass(frozen=True)
class RequeueAfter:
    """Call decide() again after this many seconds, even if nothing is observed to change."""

    seconds: float


Action = (
    PatchStatus
    | ConfirmVersion
    | CreatePod
    | DeletePod
    | AnnotatePod
    | ReleasePod
    | SetDeadLetterLabel
    | EmitEvent
    | DeleteJob
    | RequeueAfter
)
ActionT = TypeVar("ActionT", bound=Action)


@dataclass(frozen=True)
class Decision:
    """The actions for one look at a job, in the order they must be executed."""

    actions: tuple[Action, ...] = ()
    # A task's decision (vigil.core.tasks.array projects each task onto a job): the status the
    # task goes to, as a model, so that the array neither writes nor reads it as JSON. None for a
    # job's decision, whose status is its PatchStatus.
    status: Any = field(default=None, compare=False)

    def of_type(self, kind: type[ActionT]) -> list[ActionT]:
        """The actions of one kind, in order."""
        return [action for action in self.actions if isinstance(action, kind)]
