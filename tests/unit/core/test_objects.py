"""What Vigil keeps of a VigilJob (`objects.strip_job`): every decision on the kept job is the
decision on the whole one, and a finished job costs less than a running one."""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from tests.support.builders import T0, apply_to_job, at, make_job, make_pod
from vigil import api
from vigil.core.lifecycle import decide
from vigil.core.objects import LAST_APPLIED, strip_job, template_dropped

pytestmark = pytest.mark.unit

BIG_TEMPLATE = {
    "metadata": {"labels": {"app": "ledger"}},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/ledger:1",
                "env": [{"name": f"V{i}", "value": "x" * 200} for i in range(50)],
            }
        ]
    },
}


def step(job: dict[str, Any], pods: list[dict[str, Any]], now=T0) -> dict[str, Any]:
    return apply_to_job(job, decide(job, pods, now, rng=random.Random(0)))


def succeeded_job(**spec: Any) -> dict[str, Any]:
    job = make_job(spec=spec, labels={"team": "payments"}, annotations={"team.example/owner": "x" * 10_000})
    job["spec"]["template"] = copy.deepcopy(BIG_TEMPLATE)
    job = step(job, [])
    job = step(job, [make_pod(1, phase="Running")])
    job = step(job, [make_pod(1, phase="Succeeded", exit_code=0, finished_at=at(29))], at(30))
    assert job["status"]["phase"] == "Succeeded"
    return job


def decisions(job: dict[str, Any], pods: list[dict[str, Any]], now) -> Any:
    return decide(job, pods, now, rng=random.Random(0))


@pytest.mark.parametrize("ttl", [None, 60])
def test_a_succeeded_job_is_kept_without_its_template_and_decides_the_same(ttl: int | None) -> None:
    job = succeeded_job(**({"ttlSecondsAfterFinished": ttl} if ttl is not None else {}))
    kept = strip_job(copy.deepcopy(job))
    assert template_dropped(kept)
    pods = [make_pod(1, phase="Succeeded", exit_code=0, finished_at=at(29), tracked=True)]
    for now in (at(31), at(120)):  # before and after its TTL: release, then delete
        assert decisions(kept, pods, now) == decisions(job, pods, now)
    assert len(orjson.dumps(kept)) < len(orjson.dumps(job)) / 4


def test_a_job_that_has_not_succeeded_keeps_its_template_while_it_is_small() -> None:
    """Any later look may start a pod from it: a dead-lettered job too, since it can be redriven.
    (A large one is not kept whatever the phase: tests/unit/core/test_template_budget.py.)"""
    job = make_job()
    template = copy.deepcopy(job["spec"]["template"])
    for phase in ("Queued", "Running", "BackingOff", "DeadLettered"):
        job["status"] = {"phase": phase}
        assert strip_job(copy.deepcopy(job))["spec"]["template"] == template


def test_of_a_jobs_labels_and_annotations_only_vigils_are_kept() -> None:
    job = make_job(
        labels={"team": "payments", api.LABEL_DEAD_LETTER: "true", **{f"l{i}": "v" for i in range(2500)}},
        annotations={api.ANNOTATION_REDRIVE: "1", LAST_APPLIED: "{}", "blob": "x" * 150_000},
    )
    job["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    kept = strip_job(job)["metadata"]
    assert kept["labels"] == {api.LABEL_DEAD_LETTER: "true"}
    assert kept["annotations"] == {api.ANNOTATION_REDRIVE: "1"}
    assert "managedFields" not in kept
