"""The API models: docs/design.md's defaults, camelCase on the wire, and the validation rules."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.support.builders import T0, TEMPLATE, apply_to_job, make_job, make_pod
from vigil import api
from vigil.api import MAX_ATTEMPTS, MAX_BACKOFF_FACTOR, MAX_SECONDS
from vigil.core.actions import CreatePod, DeleteJob, DeletePod
from vigil.core.lifecycle import decide
from vigil.core.liveness import Liveness

pytestmark = pytest.mark.unit


def spec(**fields: Any) -> api.VigilJobSpec:
    return api.VigilJobSpec.model_validate({"template": TEMPLATE, **fields})


def test_an_empty_spec_gets_every_default_of_the_design() -> None:
    assert spec().model_dump(by_alias=True) == {
        "queue": "default",
        "priority": 0,
        "template": TEMPLATE,
        "retry": {
            "maxAttempts": 6,
            "backoff": {"initialSeconds": 10, "factor": 2.0, "maxSeconds": 600, "jitter": 0.5},
            "nonRetryableExitCodes": [],
            "countDisruptions": False,
        },
        "heartbeat": {
            "intervalSeconds": 10,
            "timeoutSeconds": 60,
            "startupGraceSeconds": 120,
            "required": True,
            "via": "Leader",
            "agent": None,
            "livenessFile": None,
            "livenessPort": None,
        },
        "guarantee": "AtLeastOnce",
        "attemptDeadlineSeconds": None,
        "activeDeadlineSeconds": None,
        "ttlSecondsAfterFinished": None,
        "suspend": False,
        "pool": None,
        "tasks": None,
    }


def test_the_injected_agents_fields_are_accepted() -> None:
    parsed = spec(heartbeat={"agent": "Sidecar", "livenessFile": "/var/run/vigil/alive", "livenessPort": 8099})
    assert (parsed.heartbeat.agent, parsed.heartbeat.liveness_file, parsed.heartbeat.liveness_port) == (
        "Sidecar",
        "/var/run/vigil/alive",
        8099,
    )
    assert spec(heartbeat={"livenessFile": "/var/run/vigil/x.touch"}).heartbeat.agent is None  # unset: the default


def test_the_template_is_required() -> None:
    with pytest.raises(ValidationError, match="template"):
        api.VigilJobSpec.model_validate({})


def test_a_pool_runs_task_arrays_without_a_template() -> None:
    pulled = api.VigilJobSpec.model_validate({"pool": "etl", "tasks": {"count": 3}})
    assert (pulled.pool, pulled.template) == ("etl", None)
    with pytest.raises(ValidationError, match="spec.pool needs spec.tasks"):
        api.VigilJobSpec.model_validate({"pool": "etl"})
    with pytest.raises(ValidationError, match="not both"):
        spec(pool="etl", tasks={"count": 3})
    with pytest.raises(ValidationError, match="pool"):
        api.VigilJobSpec.model_validate({"pool": "Not_A_Name", "tasks": {"count": 3}})


def test_wire_names_are_camel_case_and_python_names_work_too() -> None:
    parsed = spec(retry={"maxAttempts": 2, "nonRetryableExitCodes": [3]}, attemptDeadlineSeconds=30)
    assert parsed.retry.max_attempts == 2
    assert parsed.retry.non_retryable_exit_codes == [3]
    assert parsed.attempt_deadline_seconds == 30
    assert api.Retry(max_attempts=4).max_attempts == 4


def test_pod_uid_is_spelled_as_kubernetes_spells_it() -> None:
    attempt = api.CurrentAttempt(
        number=1, pod_name="p", pod_uid="u", phase="Starting", started_at="2025-01-01T00:00:00Z"
    )
    assert attempt.model_dump(by_alias=True, mode="json")["podUID"] == "u"


INVALID = {
    "maxSeconds below initialSeconds": (
        {"retry": {"backoff": {"initialSeconds": 60, "maxSeconds": 30}}},
        "retry.backoff.maxSeconds must be >= retry.backoff.initialSeconds",
    ),
    "factor below 1": ({"retry": {"backoff": {"factor": 0.5}}}, "retry.backoff.factor must be >= 1"),
    "negative jitter": ({"retry": {"backoff": {"jitter": -0.1}}}, "retry.backoff.jitter must be between 0"),
    "jitter above 1": ({"retry": {"backoff": {"jitter": 1.5}}}, "retry.backoff.jitter must be between 0"),
    "no attempts": ({"retry": {"maxAttempts": 0}}, "retry.maxAttempts must be at least 1"),
    "timeout equal to interval": (
        {"heartbeat": {"intervalSeconds": 30, "timeoutSeconds": 30}},
        "heartbeat.timeoutSeconds must be greater than heartbeat.intervalSeconds",
    ),
    "exit code out of range": ({"retry": {"nonRetryableExitCodes": [256]}}, "less than or equal to 255"),
    "queue not a label value": ({"queue": "Not_A_Label"}, "should match pattern"),
    "unknown guarantee": ({"guarantee": "ExactlyOnce"}, "AtLeastOnce"),
    # Upper bounds: the message says the bound.
    "too many attempts": ({"retry": {"maxAttempts": MAX_ATTEMPTS + 1}}, "less than or equal to 10000"),
    "a huge job deadline": ({"activeDeadlineSeconds": 3e11}, "less than or equal to 315360000"),
    "a huge attempt deadline": ({"attemptDeadlineSeconds": MAX_SECONDS + 1}, "less than or equal to 315360000"),
    "a huge ttl": ({"ttlSecondsAfterFinished": 10**20}, "less than or equal to 315360000"),
    "a huge backoff": (
        {"retry": {"backoff": {"initialSeconds": 1, "maxSeconds": MAX_SECONDS + 1}}},
        "less than or equal to 315360000",
    ),
    "a huge factor": ({"retry": {"backoff": {"factor": 1e308}}}, "less than or equal to 10"),
    "a huge heartbeat timeout": ({"heartbeat": {"timeoutSeconds": MAX_SECONDS + 1}}, "less than or equal to 315360000"),
    "priority above int32": ({"priority": 2**31}, "less than or equal to 2147483647"),
    "priority below int32": ({"priority": -(2**31) - 1}, "greater than or equal to -2147483648"),
    "a negative deadline": ({"activeDeadlineSeconds": -1}, "greater than or equal to 1"),
    "a negative ttl": ({"ttlSecondsAfterFinished": -5}, "greater than or equal to 0"),
    "a negative grace": ({"heartbeat": {"startupGraceSeconds": -1}}, "greater than or equal to 0"),
    # Vigil's own names in the template.
    "a vigil.dev annotation in the template": (
        {"template": {**TEMPLATE, "metadata": {"annotations": {"vigil.dev/superseded": "x", "team": "ledger"}}}},
        r"spec.template.metadata.annotations must not use the vigil.dev/ prefix \(Vigil sets those on its pods\): "
        r"remove vigil.dev/superseded \(and any other vigil.dev/ key\) from the template \[",
    ),
    "vigil.dev labels in the template": (
        {"template": {**TEMPLATE, "metadata": {"labels": {"vigil.dev/queue": "q", "vigil.dev/attempt": "1"}}}},
        r"spec.template.metadata.labels must not use the vigil.dev/ prefix .*: "
        r"remove vigil.dev/attempt \(and any other",
    ),
    "a vigil.dev finalizer in the template": (
        {"template": {**TEMPLATE, "metadata": {"finalizers": [api.FINALIZER_ATTEMPT_TRACKING]}}},
        "spec.template.metadata.finalizers must not use the vigil.dev/ prefix .*: remove every vigil.dev/ finalizer",
    ),
    # The injected agent's liveness sources.
    "a liveness file outside /var/run/vigil": (
        {"heartbeat": {"livenessFile": "/tmp/alive"}},
        "heartbeat.livenessFile must be a file directly under /var/run/vigil/",
    ),
    "a liveness file that climbs out of /var/run/vigil": (
        {"heartbeat": {"livenessFile": "/var/run/vigil/../etc/x"}},
        "heartbeat.livenessFile must be a file directly under /var/run/vigil/",
    ),
    "a liveness port with the in-image agent": (
        {"heartbeat": {"agent": "Image", "livenessPort": 8080}},
        "heartbeat.livenessFile and heartbeat.livenessPort are read by the injected agent only",
    ),
    "an unknown agent": ({"heartbeat": {"agent": "Daemon"}}, "Input should be 'Image' or 'Sidecar'"),
    "a liveness port beyond 65535": ({"heartbeat": {"livenessPort": 70000}}, "less than or equal to 65535"),
    "a label value that is not a string": (
        {"template": {**TEMPLATE, "metadata": {"labels": {"tier": 1}}}},
        "spec.template.metadata.labels.tier: Input should be a valid string",
    ),
}


@pytest.mark.parametrize(("fields", "message"), INVALID.values(), ids=INVALID.keys())
def test_an_invalid_spec_is_refused_with_an_actionable_message(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(**fields)


VALID_EDGES = {
    "maxSeconds equal to initialSeconds": {"retry": {"backoff": {"initialSeconds": 30, "maxSeconds": 30}}},
    "factor 1": {"retry": {"backoff": {"factor": 1}}},
    "jitter 0": {"retry": {"backoff": {"jitter": 0}}},
    "jitter 1": {"retry": {"backoff": {"jitter": 1}}},
    "one attempt": {"retry": {"maxAttempts": 1}},
    "timeout just above interval": {"heartbeat": {"intervalSeconds": 30, "timeoutSeconds": 31}},
    "every number at its bound": {
        "priority": api.INT32_MAX,
        "retry": {
            "maxAttempts": MAX_ATTEMPTS,
            "backoff": {"initialSeconds": MAX_SECONDS, "factor": MAX_BACKOFF_FACTOR, "maxSeconds": MAX_SECONDS},
        },
        "heartbeat": {
            "intervalSeconds": MAX_SECONDS - 1,
            "timeoutSeconds": MAX_SECONDS,
            "startupGraceSeconds": MAX_SECONDS,
        },
        "attemptDeadlineSeconds": MAX_SECONDS,
        "activeDeadlineSeconds": MAX_SECONDS,
        "ttlSecondsAfterFinished": MAX_SECONDS,
    },
    "the lowest priority": {"priority": api.INT32_MIN},
    "vigil.dev only inside a value or another prefix": {
        "template": {
            **TEMPLATE,
            "metadata": {
                "labels": {"app": "vigil.dev/x"},
                "annotations": {"example.com/vigil.dev": "1", "vigil.dev": "no slash", "sim.vigil.dev/exit-code": "0"},
                "finalizers": ["example.com/vigil.dev"],
            },
        }
    },
}


@pytest.mark.parametrize("fields", VALID_EDGES.values(), ids=VALID_EDGES.keys())
def test_the_edges_of_each_rule_are_allowed(fields: dict[str, Any]) -> None:
    spec(**fields)


def test_every_rule_has_a_message_that_names_its_field() -> None:
    rules = [rule for model in (api.Backoff, api.Retry, api.Heartbeat, api.TemplateMeta) for rule in model.cel_rules]
    assert len(rules) == 12
    for rule in rules:
        assert rule.message.split(" ")[0].startswith(("retry.", "heartbeat.", "spec.template.metadata."))


def test_a_backoff_under_the_floor_is_the_api_servers_to_refuse_and_the_cores_to_read() -> None:
    """New jobs with initialSeconds 0 are refused with a message that says the floor; a job
    stored before the rule still parses (core.backoff puts the floor under its delay)."""
    (floor, *_) = api.Backoff.cel_rules
    assert floor.as_validation()["rule"] == f"self.initialSeconds >= {api.MIN_RETRY_SECONDS}"
    assert floor.message.startswith("retry.backoff.initialSeconds must be at least 1: a job waits at least 1 s")
    assert not floor.on_read and not floor.holds(api.Backoff(initial_seconds=0, max_seconds=0))
    stored = spec(retry={"maxAttempts": 10_000, "backoff": {"initialSeconds": 0, "factor": 1.0, "maxSeconds": 0}})
    assert stored.retry.backoff.initial_seconds == 0


def test_a_rule_that_names_what_it_found_says_so_in_cel_too() -> None:
    (labels, annotations, finalizers) = api.TemplateMeta.cel_rules
    refusal = "spec.template.metadata.annotations must not use the vigil.dev/ prefix (Vigil sets those on its pods)"
    assert annotations.as_validation() == {
        "rule": "!has(self.annotations) || self.annotations.all(n, !n.startsWith('vigil.dev/'))",
        "message": f"{refusal}: remove every vigil.dev/ key from the template",
        # One key, not all: the API server prices a join of them all far past its CEL budget.
        "messageExpression": f"'{refusal}: remove ' + self.annotations.filter(n, n.startsWith('vigil.dev/'))[0]"
        " + ' (and any other vigil.dev/ key) from the template'",
    }
    assert "messageExpression" not in finalizers.as_validation()  # even one item of a list costs too much
    assert api.Retry.cel_rules[0].as_validation().keys() == {"rule", "message"}


# ------------------------------------------------------------- no admitted value overflows


@st.composite
def admitted_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Specs the API server admits, their numbers drawn mostly from the edges of their bounds."""

    def number(low: int, high: int) -> int:
        return draw(st.sampled_from([low, high, max(low, high - 1)]) | st.integers(low, high))

    initial = number(0, MAX_SECONDS)
    interval = number(1, MAX_SECONDS - 1)
    spec = {
        "priority": number(api.INT32_MIN, api.INT32_MAX),
        "retry": {
            "maxAttempts": number(1, MAX_ATTEMPTS),
            "backoff": {
                "initialSeconds": initial,
                "factor": draw(st.sampled_from([1.0, MAX_BACKOFF_FACTOR]) | st.floats(1.0, MAX_BACKOFF_FACTOR)),
                "maxSeconds": number(initial, MAX_SECONDS),
                "jitter": draw(st.sampled_from([0.0, 1.0])),
            },
            "countDisruptions": draw(st.booleans()),
        },
        "heartbeat": {
            "intervalSeconds": interval,
            "timeoutSeconds": number(interval + 1, MAX_SECONDS),
            "startupGraceSeconds": number(0, MAX_SECONDS),
            "required": draw(st.booleans()),
        },
        "guarantee": draw(st.sampled_from(["AtLeastOnce", "NoOverlap"])),
        "attemptDeadlineSeconds": draw(st.none() | st.just(number(1, MAX_SECONDS))),
        "activeDeadlineSeconds": draw(st.none() | st.just(number(1, MAX_SECONDS))),
        "ttlSecondsAfterFinished": draw(st.none() | st.just(number(0, MAX_SECONDS))),
    }
    api.VigilJobSpec.model_validate({"template": TEMPLATE, **spec})  # admitted, or the strategy is wrong
    return spec


FATES = ["Pending", "Running", "Failed", "Succeeded", "Lost", "Uncertain"]
ADVANCES = [0, 1, MAX_SECONDS - 1, MAX_SECONDS, MAX_SECONDS + 1, 3 * MAX_SECONDS]


@settings(max_examples=300, deadline=None)
@given(
    spec=admitted_specs(),
    story=st.lists(st.tuples(st.sampled_from(FATES), st.sampled_from(ADVANCES)), min_size=1, max_size=25),
    seed=st.integers(0, 2**32),
)
def test_no_admitted_value_makes_the_decision_core_raise(
    spec: dict[str, Any], story: list[tuple[str, int]], seed: int
) -> None:
    """The largest (and smallest) numbers the schema admits, through a job's life: attempts that
    run, fail, succeed or are lost, with time jumping by up to three times the largest duration."""
    job, pods, now, rng = make_job(spec=spec), {}, T0, random.Random(seed)
    for fate, advance in story:
        newest = max(pods, default=None)
        liveness = {}
        if newest is not None:
            phase, exit_code = {"Failed": ("Failed", 1), "Succeeded": ("Succeeded", 0)}.get(fate, ("Running", None))
            pods[newest] = make_pod(newest, phase=phase if fate != "Pending" else "Pending", exit_code=exit_code)
            if fate in ("Lost", "Uncertain"):
                liveness[pods[newest]["metadata"]["uid"]] = Liveness(fate, float(MAX_SECONDS), fate)
        decision = decide(job, list(pods.values()), now, rng=rng, liveness=liveness)
        job = apply_to_job(job, decision)
        if decision.of_type(DeleteJob):
            return
        for action in decision.of_type(CreatePod):
            attempt = int(action.manifest["metadata"]["labels"][api.LABEL_ATTEMPT])
            pods[attempt] = make_pod(attempt)
        for action in decision.of_type(DeletePod):
            pods = {n: pod for n, pod in pods.items() if pod["metadata"]["uid"] != action.uid}
        now += timedelta(seconds=advance)


def test_a_status_parses_from_the_wire() -> None:
    status = api.VigilJobStatus.model_validate(
        {
            "phase": "BackingOff",
            "attempts": 2,
            "roundAttempts": 2,
            "nextAttemptAt": "2025-03-01T12:00:00.5Z",
            "history": [
                {
                    "number": 1,
                    "podName": "p-1",
                    "outcome": "Failed",
                    "exitCode": 1,
                    "startedAt": "2025-03-01T11:00:00Z",
                    "finishedAt": "2025-03-01T11:01:00Z",
                }
            ],
            "kopf": {"progress": {}},  # fields of others are ignored
        }
    )
    assert status.round_attempts == 2
    assert status.history[0].exit_code == 1
    assert not status.is_terminal
    assert api.VigilJobStatus(phase="DeadLettered").is_terminal


def test_a_job_stored_with_a_container_named_as_the_injected_agent_still_parses() -> None:
    """The name is the API server's to refuse (a rule added after jobs were stored; see
    test_crd and the integration test_validation): the core reads such a job as it is."""
    template = {"spec": {"containers": [{"name": api.AGENT_CONTAINER, "image": "mine"}]}}
    assert api.VigilJobSpec.model_validate({"template": template}).template == template
