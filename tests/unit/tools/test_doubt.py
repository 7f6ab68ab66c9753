"""testbed.doubt, the real-node part of `make up REAL_NODE=1`, without a cluster: the examples as
it applies them, and `problems`, which says what of the story it did not see."""

from __future__ import annotations

import dataclasses

import pytest

from testbed import doubt
from testbed.node import POD_PLACEMENT

pytestmark = pytest.mark.unit


def seen(states: list[str], **pods: doubt.Pod) -> doubt.Seen:
    return doubt.Seen([(float(i), s) for i, s in enumerate(states)], {int(k[1:]): p for k, p in pods.items()})


def the_story() -> dict[str, doubt.Seen]:
    """What a run on the real node saw (e2e/test_real_node.py), as testbed.doubt records it."""
    stall = seen(["Pending, attempt 0", "Running, attempt 1", "Uncertain, attempt 1", "Running, attempt 1"])
    stall.timeline.append((60.0, "Succeeded, attempt 1"))
    hang = seen(
        ["Running, attempt 1", "Uncertain, attempt 1", "BackingOff, attempt 1", "Running, attempt 2"],
        a1=doubt.Pod("hang-1", "2026-12-03T16:45:44Z", "HeartbeatLost", 143, "2026-12-03T16:46:41Z", "hanging at 32"),
        a2=doubt.Pod("hang-2", "2026-12-03T16:46:42Z", None, 0, "2026-12-03T16:46:51Z", "attempt 2 starts at 32\n"),
    )
    hang.timeline.append((67.0, "Succeeded, attempt 2"))
    hang.status = {"phase": "Succeeded", "history": [{"number": 1, "outcome": "Lost"}, {"number": 2}]}
    return {"stall": stall, "hang": hang}


def test_the_whole_story_has_no_problem():
    assert doubt.problems(the_story()) == []


def test_a_stall_that_never_went_uncertain_or_never_came_back_is_named():
    story = the_story()
    story["stall"].timeline = [(0.0, "Running, attempt 1"), (60.0, "Succeeded, attempt 1")]
    assert [p for p in doubt.problems(story) if p.startswith("stall:")]
    story = the_story()
    lost = ["Running, attempt 1", "Uncertain, attempt 1", "BackingOff, attempt 1"]
    story["stall"].timeline = list(enumerate(lost))
    assert [p for p in doubt.problems(story) if p.startswith("stall:")]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"superseded": None}, "never marked vigil.dev/superseded"),
        ({"exit_code": 0}, "not stopped by its agent"),
        ({"finished": "2026-12-03T16:46:43Z"}, "before attempt 1's ended"),
    ],
)
def test_an_attempt_not_fenced_before_the_next_one_starts_is_named(change, words):
    story = the_story()
    story["hang"].pods[1] = dataclasses.replace(story["hang"].pods[1], **change)
    assert any(words in p for p in doubt.problems(story)), doubt.problems(story)


@pytest.mark.parametrize("log", ["attempt 2 starts at 0\n", "", "attempt 1 starts at 32\n"])
def test_a_next_attempt_that_did_not_resume_from_the_checkpoint_is_named(log):
    story = the_story()
    story["hang"].pods[2] = dataclasses.replace(story["hang"].pods[2], log=log)
    assert any("checkpoint" in p for p in doubt.problems(story))


def test_an_attempt_that_was_not_lost_is_named():
    story = the_story()
    story["hang"].status["history"][0]["outcome"] = "Failed"
    assert any("was not Lost" in p for p in doubt.problems(story))


def test_the_examples_are_applied_as_written_but_for_their_image_and_placement():
    jobs = doubt.manifests("localhost/plain:1", POD_PLACEMENT)
    assert [job["metadata"]["name"] for job in jobs] == list(doubt.EXAMPLES)
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == POD_PLACEMENT["nodeSelector"] and pod["tolerations"]
        assert pod["serviceAccountName"] == "vigil-job"  # the chart's job account
        assert [(c["image"], c["imagePullPolicy"]) for c in pod["containers"]] == [("localhost/plain:1", "Never")]
        assert job["spec"]["heartbeat"]["livenessFile"] == "/var/run/vigil/alive"
        assert "agent" not in job["spec"]["heartbeat"] and "required" not in job["spec"]["heartbeat"]  # the defaults
    assert jobs[1]["spec"]["guarantee"] == "NoOverlap"
