"""The API models: DESIGN.md's defaults, camelCase on the wire, and the validation rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.unit.factories import TEMPLATE
from vigil import api

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
        "heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 60, "startupGraceSeconds": 120, "required": True},
        "guarantee": "AtLeastOnce",
        "attemptDeadlineSeconds": None,
        "activeDeadlineSeconds": None,
        "ttlSecondsAfterFinished": None,
        "suspend": False,
    }


def test_the_template_is_required() -> None:
    with pytest.raises(ValidationError, match="template"):
        api.VigilJobSpec.model_validate({})


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
}


@pytest.mark.parametrize("fields", VALID_EDGES.values(), ids=VALID_EDGES.keys())
def test_the_edges_of_each_rule_are_allowed(fields: dict[str, Any]) -> None:
    spec(**fields)


def test_every_rule_has_a_message_that_names_its_field() -> None:
    rules = [rule for model in (api.Backoff, api.Retry, api.Heartbeat) for rule in model.cel_rules]
    assert len(rules) == 5
    for rule in rules:
        assert rule.message.split(" ")[0].startswith(("retry.", "heartbeat."))


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
