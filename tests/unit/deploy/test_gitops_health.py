"""The Argo CD health checks (Lua, in gitops/argocd/) run against VigilJobs and VigilQueues in
each phase, as the decision core writes them, with a real Lua interpreter (lupa)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.support.builders import apply_to_job, at, make_job, make_pod
from tests.support.gitops import EXPECTED, RECORDINGS, health
from vigil.core.lifecycle import decide

pytestmark = pytest.mark.unit


def after(job: dict[str, Any], pods: list, seconds: float, **kwargs: Any) -> dict[str, Any]:
    return apply_to_job(job, decide(job, pods, at(seconds), rng=random.Random(0), **kwargs))


def test_a_job_in_each_phase():
    new = make_job()
    assert health("VigilJob", {**new, "status": None})[0] == "Progressing"
    queued = after(new, [], 0, may_start=False)
    assert health("VigilJob", queued) == ("Progressing", f"Queued: {queued['status']['message']}")
    running = after(after(new, [], 0), [make_pod(1, phase="Running")], 1)
    assert health("VigilJob", running)[0] == "Progressing"
    succeeded = after(running, [make_pod(1, phase="Succeeded", exit_code=0)], 30)
    assert health("VigilJob", succeeded)[0] == "Healthy"
    poison = make_job(spec={"retry": {"nonRetryableExitCodes": [4]}})
    started = after(after(poison, [], 0), [make_pod(1, phase="Running")], 1)
    dead = after(started, [make_pod(1, phase="Failed", exit_code=4)], 30)
    status, message = health("VigilJob", dead)
    assert status == "Degraded" and "nonRetryableExitCodes" in message
    suspended = after(make_job(spec={"suspend": True}), [], 0)
    assert health("VigilJob", suspended)[0] == "Suspended"
    edited = {**succeeded, "metadata": {**succeeded["metadata"], "generation": 2}}
    assert health("VigilJob", edited)[0] == "Progressing", "a spec Vigil has not observed yet"


def queue(paused: bool = False, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "vigil.dev/v1beta1",
        "kind": "VigilQueue",
        "metadata": {"name": "batch", "namespace": "etl", "generation": 1},
        "spec": {"maxRunning": 10, "paused": paused},
        "status": status,
    }


def test_a_queue_in_each_state():
    assert health("VigilQueue", queue())[0] == "Progressing"
    saturated = {
        "observedGeneration": 1,
        "queued": 40,
        "running": 10,
        "conditions": [{"type": "Saturated", "status": "True", "message": "10 attempts run, maxRunning is 10"}],
    }
    status, message = health("VigilQueue", queue(status=saturated))
    assert status == "Healthy" and "40 queued, 10 running" in message and "Saturated" in message
    assert health("VigilQueue", queue(paused=True, status=saturated))[0] == "Suspended"
    behind = queue(status={**saturated, "observedGeneration": 0})
    assert health("VigilQueue", behind)[0] == "Progressing"


def test_the_recordings_cover_every_expected_phase():
    assert {path.stem for path in RECORDINGS.glob("*.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_objects_read_as_expected(name: str):
    recording = json.loads((RECORDINGS / f"{name}.json").read_text())
    obj = recording["object"]
    argo, kstatus = EXPECTED[name]
    assert health(obj["kind"], obj)[0] == argo
    assert recording["argocd"] == argo and recording["kstatus"] == kstatus
