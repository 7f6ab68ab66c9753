"""The agent's decisions, pure: when to beat again, and whether its child may keep running.

No I/O and no clock of its own: every time is a value of a monotonic clock handed in by the
caller, so a wall clock that jumps (NTP, a VM restored from a snapshot) changes nothing, and
tests drive time by hand.

Self-fencing (docs/design.md, "Semantics"): the agent always stops its child when its pod is marked
superseded, is being deleted, or is gone (404). When it cannot renew its heartbeat for
`timeoutSeconds`, the operator may have declared the attempt Lost and started another: under
NoOverlap the agent stops its child; under AtLeastOnce it keeps the child and keeps trying.

A token refused (401) after it worked is what a deleted pod's token gets, but also what every
token gets while the API server cannot authenticate (a restart, an outage of its token
authenticator or webhook). The rule follows the guarantee, as silence does: under NoOverlap a
refusal that lasts `UNAUTHORIZED_GRACE_SECONDS` stops the child (the operator frees the next
attempt as soon as it sees the pod gone, so waiting for the whole timeout could overlap two);
under AtLeastOnce it only warns, and the agent keeps trying: a duplicate is allowed there, a
healthy job stopped by an authentication outage is the harm, and the kubelet stops the
containers of a pod that really was deleted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vigil.api import Guarantee
from vigil.core.backoff import backoff, spread

# Exit code of an agent that stopped its child itself (EX_TEMPFAIL from sysexits.h: the
# attempt did not fail, it was replaced or fenced off; another attempt carries on).
EXIT_FENCED = 75

RETRY_INITIAL_SECONDS = 0.5  # first retry after an API error
RETRIES_PER_TIMEOUT = 4  # retry at least this often within one heartbeat timeout
JITTER = 0.1  # 10% of every delay, so that agents started together do not beat together
# How long the pod's token must be refused (401), with no renewal between, before the agent
# takes it for its pod deleted (under NoOverlap; under AtLeastOnce it warns). A kube-apiserver
# that has just restarted refuses valid pod-bound tokens until it can look their pods up again
# (the test bed saw this for a few seconds after each restart); a deleted pod's, for ever.
UNAUTHORIZED_GRACE_SECONDS = 30.0
# When beats go to the leading operator (issue 26), a new checkpoint is still carried to the next
# attempt by the pod's annotation, but written at most this often (and at once when the child
# exits: the final flush). The next attempt resumes from the last published checkpoint, so the
# limit adds at most this much lost progress when an attempt dies without its flush (its node
# lost, the agent SIGKILLed); the operator waits a whole heartbeat timeout (60 s by default)
# before it replaces such an attempt anyway, so 30 s is the same order as what is lost already.
# Against the API server: one write per 30 s per attempt that checkpoints continuously, a third
# of one write per beat, what an unbounded agent would cost at the default 10 s interval; an
# attempt shorter than 30 s writes only its final flush. It bounds the cost, it does not remove
# it: N attempts checkpointing without pause still write N/30 times a second.
CHECKPOINT_MIN_SECONDS = 30.0


class Observed(enum.Enum):
    """What the last renewal attempt found: the leading operator's answer to a beat posted to it,
    or the pod returned by (or the error of) a PATCH of the pod's heartbeat annotation."""

    RENEWED = "renewed"
    SUPERSEDED = "superseded"  # the pod carries vigil.dev/superseded
    DELETING = "deleting"  # the pod has a deletionTimestamp
    GONE = "gone"  # 404: the pod no longer exists
    UNAUTHORIZED = "unauthorized"  # 401: the credentials are refused
    API_ERROR = "api-error"  # anything else: timeouts, refused connections, 5xx, 403, 429


class Reason(enum.Enum):
    """Why the agent stops its child. Every one exits with EXIT_FENCED."""

    SUPERSEDED = "superseded"
    DELETED = "deleted"
    GONE = "gone"
    FENCED = "fenced"


@dataclass(frozen=True)
class FenceDecision:
    stop: Reason | None = None  # None: let the child run
    overdue: bool = False  # no renewal for the whole timeout (under AtLeastOnce: kept running)
    refused: bool = False  # the token refused past the grace (under AtLeastOnce: kept running)
    message: str = ""


KEEP_GOING = FenceDecision()


@dataclass
class Fencer:
    """The renewal history that decisions need; fed observations, asked for its assessment.

    `started_at` counts as the last renewal: the timeout runs from the agent's start until
    the first beat gets through.
    """

    timeout: float
    guarantee: Guarantee
    started_at: float
    last_renewed_at: float = float("nan")
    ever_renewed: bool = False
    failures: int = 0  # consecutive failed attempts
    last: Observed | None = None
    refused_since: float | None = None  # when the first 401 since the last renewal was sent

    def __post_init__(self) -> None:
        if self.last_renewed_at != self.last_renewed_at:  # NaN: not given
            self.last_renewed_at = self.started_at

    def observe(self, observed: Observed, sent_at: float) -> None:
        """Records the outcome of an attempt sent at `sent_at`. A renewal counts from when
        its request was sent, not answered: the API server stored it no earlier than that, so
        the agent's silence never looks shorter than the operator's."""
        self.last = observed
        if observed is Observed.RENEWED:
            self.last_renewed_at = max(self.last_renewed_at, sent_at)
            self.ever_renewed = True
            self.failures = 0
            self.refused_since = None
        elif observed in (Observed.API_ERROR, Observed.UNAUTHORIZED):
            self.failures += 1
            if observed is Observed.UNAUTHORIZED and self.refused_since is None:
                self.refused_since = sent_at

    def assess(self, now: float) -> FenceDecision:
        refused_for = 0.0 if self.refused_since is None else now - self.refused_since
        return assess(
            self.last, self.last_renewed_at, self.ever_renewed, now, self.timeout, self.guarantee, refused_for
        )

    def deadline(self) -> float:
        """When silence reaches the timeout: the caller must ask assess() again by then."""
        return self.last_renewed_at + self.timeout


def assess(
    last: Observed | None,
    last_renewed_at: float,
    ever_renewed: bool,
    now: float,
    timeout: float,
    guarantee: Guarantee,
    refused_for: float = 0.0,
) -> FenceDecision:
    """Whether the child may keep running, given the last observation, the silence so far, and
    for how long the pod's token has been refused (401) since the last renewal."""
    if last is Observed.SUPERSEDED:
        return FenceDecision(
            Reason.SUPERSEDED, message="the pod is marked vigil.dev/superseded: another attempt replaced it"
        )
    if last is Observed.DELETING:
        return FenceDecision(Reason.DELETED, message="the pod is being deleted")
    if last is Observed.GONE:
        return FenceDecision(Reason.GONE, message="the pod no longer exists (404)")
    refused = last is Observed.UNAUTHORIZED and ever_renewed and refused_for >= UNAUTHORIZED_GRACE_SECONDS
    if refused and guarantee == "NoOverlap":
        # The same credentials worked before, and have been refused for longer than a restarted
        # API server takes to accept them again. A pod-bound token stops working when its pod is
        # deleted, so this may be the pod gone, and its next attempt free to start. A token that
        # never worked is a setup error instead, retried like any API error (and fenced by the
        # timeout under NoOverlap).
        return FenceDecision(
            Reason.GONE,
            message=f"the API server has refused the pod's token (401) for {refused_for:.0f}s: the pod may have "
            "been deleted, and under NoOverlap the attempt must assume it was",
        )
    silence = max(0.0, now - last_renewed_at)  # a monotonic clock never goes back; be safe anyway
    if silence < timeout:
        if refused:
            return FenceDecision(
                refused=True,
                message=f"the API server has refused the pod's token (401) for {refused_for:.0f}s: the pod may "
                "have been deleted, or the API server cannot authenticate; under AtLeastOnce the job keeps "
                "running and the agent keeps trying",
            )
        return KEEP_GOING
    if guarantee == "NoOverlap":
        return FenceDecision(
            Reason.FENCED,
            overdue=True,
            message=f"no heartbeat renewed for {silence:.0f}s (timeout {timeout:g}s): under NoOverlap the "
            "attempt must assume it was replaced",
        )
    return FenceDecision(
        overdue=True,
        message=f"no heartbeat renewed for {silence:.0f}s (timeout {timeout:g}s): the attempt may be replaced; "
        "under AtLeastOnce the job keeps running and the agent keeps trying",
    )


def next_beat_delay(interval: float, rand: float) -> float:
    """Delay before the next beat after a successful one: the interval, +-JITTER."""
    return spread(interval, JITTER, rand)


def retry_delay(failures: int, interval: float, timeout: float, rand: float) -> float:
    """Delay before retrying after `failures` consecutive failed attempts: exponential from
    RETRY_INITIAL_SECONDS, but never longer than the interval nor than a quarter of the
    timeout, so a partition that heals is noticed soon and the agent tries several times
    before it would fence itself."""
    return backoff(failures, RETRY_INITIAL_SECONDS, min(interval, timeout / RETRIES_PER_TIMEOUT), rand, jitter=JITTER)


def request_timeout(timeout: float) -> float:
    """Limit of one API request: a hung API server costs at most this before the next try,
    a quarter of the timeout (1 to 10 s)."""
    return max(1.0, min(10.0, timeout / RETRIES_PER_TIMEOUT))


def leader_timeout(request_timeout: float, interval: float) -> float:
    """Limit of one beat posted to the leading operator, connect included: the request timeout,
    but no more than a quarter of the interval (at least 1 s), so a black-holed operator leaves
    most of the beat's interval to the annotation patch that follows it."""
    return min(request_timeout, max(1.0, interval / 4))


def checkpoint_due(last_written_at: float, now: float, min_seconds: float = CHECKPOINT_MIN_SECONDS) -> bool:
    """Whether a new checkpoint may be written to the pod's annotation now (the leader channel's
    rate limit): `last_written_at` is when the last one was sent, or when the agent started."""
    return now - last_written_at >= min_seconds
