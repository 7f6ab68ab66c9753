"""`make up`'s examples (testbed.demo): the files in examples/ name no node, so the demo places
their pods on the bed's kwok nodes itself, changing nothing else; the examples it runs are the
ones kwok can finish (their sim.vigil.dev annotations), whose table the README shows."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from testbed import demo

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def as_written() -> list[dict]:
    return [
        body
        for name in demo.DEMO_EXAMPLES
        for body in yaml.safe_load_all((ROOT / "examples" / f"{name}.yaml").read_text())
        if body
    ]


def test_the_demo_places_the_jobs_pods_on_kwok_nodes_and_changes_nothing_else():
    written, applied = as_written(), demo.demo_manifests()
    assert [(b["kind"], b["metadata"]["name"]) for b in applied] == [
        (b["kind"], b["metadata"]["name"]) for b in written
    ]
    for before, after in zip(written, applied, strict=True):
        if not before["spec"].get("template"):  # a queue, or a pulled array (its pool's pods run it)
            assert after == before
            continue
        pod = after["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"type": "kwok"}
        assert {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        unplaced = copy.deepcopy(after)
        for key in ("nodeSelector", "tolerations"):
            del unplaced["spec"]["template"]["spec"][key]
        assert unplaced == before


def test_the_demo_runs_only_examples_kwok_can_finish():
    jobs = [body for body in as_written() if body["kind"] == "VigilJob" and "pool" not in body["spec"]]
    assert {job["metadata"]["name"] for job in jobs} == {
        "hello",
        "flaky",
        "poison",
        "report-a",
        "report-b",
        "urgent-fix",
        "array",
    }
    for job in jobs:
        annotations = job["spec"]["template"]["metadata"]["annotations"]
        assert "sim.vigil.dev/exit-code" in annotations and "sim.vigil.dev/run-for" in annotations, job
        assert job["spec"]["heartbeat"]["required"] is False  # kwok runs no agent


def test_the_demo_runs_a_task_array_whose_tasks_kwok_finishes():
    (array,) = [
        body
        for body in as_written()
        if body["kind"] == "VigilJob" and "template" in body["spec"] and "tasks" in body["spec"]
    ]
    tasks = array["spec"]["tasks"]
    assert tasks["count"] == 50 and tasks["parallelism"] == 10  # the README's TASKS 50/50
    assert array["spec"]["template"]["metadata"]["annotations"]["sim.vigil.dev/exit-code"] == "0"
    command = " ".join(array["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "$VIGIL_TASK_INDEX" in command and "$VIGIL_IDEMPOTENCY_KEY" in command


def test_the_demo_runs_a_pulled_array_on_a_pool_whose_workers_it_starts():
    pools = [body for body in as_written() if body["kind"] == "VigilWorkerPool"]
    (pulled,) = [body for body in as_written() if body["kind"] == "VigilJob" and "pool" in body["spec"]]
    assert [pool["metadata"]["name"] for pool in pools] == [pulled["spec"]["pool"]]
    assert pulled["spec"]["tasks"]["count"] == 100  # the README's TASKS 100/100
    assert pools[0]["spec"]["template"]["spec"]["containers"][0]["command"][0] == "vigil-worker"
    assert "VIGIL_TASK_INDEX" in demo.POOL_TASK
