"""decide() and the injected agent: a job that asks for it (heartbeat.agent: Sidecar) of an
operator that has none waits, says why, and starts once there is one."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support.builders import T0, apply_to_job, at, make_job
from vigil import api
from vigil.core.actions import CreatePod, Decision, EmitEvent
from vigil.core.lifecycle import decide
from vigil.core.queueing.book import entry_of

pytestmark = pytest.mark.unit

IMAGE = "localhost/vigil:0.1.0"
SIDECAR = {"heartbeat": {"agent": "Sidecar"}}


def step(job: dict[str, Any], now=T0, **kwargs: Any) -> tuple[dict[str, Any], Decision]:
    decision = decide(job, [], now, rng=random.Random(0), may_start=True, **kwargs)
    return apply_to_job(job, decision), decision


def test_a_sidecar_job_without_an_agent_image_waits_and_says_what_to_do() -> None:
    job, decision = step(make_job(spec=SIDECAR), agent_image=None)
    assert decision.of_type(CreatePod) == []  # started, it could never beat and would be Lost
    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Queued", api.REASON_AGENT_IMAGE_MISSING)
    assert "--agent-image" in status["message"] and "heartbeat.agent to Image" in status["message"]
    assert [(e.type, e.reason) for e in decision.of_type(EmitEvent)] == [("Warning", api.REASON_AGENT_IMAGE_MISSING)]
    assert entry_of(job).blocked  # its queue gives its starts to the jobs that can use them

    job, decision = step(job, at(30), agent_image=None)
    assert decision.of_type(EmitEvent) == []  # said once, not on every look

    _, decision = step(job, at(60), agent_image=IMAGE)  # the operator, restarted with an image
    (create,) = decision.of_type(CreatePod)
    names = [c["name"] for c in create.manifest["spec"]["initContainers"]]
    assert names[-1] == api.AGENT_CONTAINER


@pytest.mark.parametrize(
    "spec",
    [
        {},  # unset: the operator's default, here the agent in the job's image
        {"heartbeat": {"agent": "Image"}},
        {"heartbeat": {"agent": "Sidecar", "required": False}},  # nothing beats, nothing to inject
    ],
    ids=["unset", "image", "not-required"],
)
def test_jobs_that_need_no_injected_agent_start_without_an_agent_image(spec: dict[str, Any]) -> None:
    job, decision = step(make_job(spec=spec), agent_image=None)
    (create,) = decision.of_type(CreatePod)
    containers = create.manifest["spec"].get("initContainers") or []
    assert api.AGENT_CONTAINER not in [c["name"] for c in containers]
    assert job["status"].get("reason") != api.REASON_AGENT_IMAGE_MISSING
