"""A job's pod template is kept in memory only while it is small (`objects.strip_job`,
`TEMPLATE_KEPT_BYTES`): the estimate of its size (`objects.json_size`), the rule, and that a
decision that creates no pod is the same on the job kept as on the whole one.

Run as a script, the micro-benchmark of the estimate (docs/capacity-planning.md, "A tenant's
templates"): `.venv/bin/python -m tests.unit.core.test_template_budget`.
"""

from __future__ import annotations

import copy
import json
import random
import timeit
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.builders import T0, apply_to_job, at, make_job, make_pod
from tests.support.templates import TYPICAL_TEMPLATE, env_template
from vigil.core import actions
from vigil.core.lifecycle import decide
from vigil.core.objects import (
    TEMPLATE_DROPPED,
    TEMPLATE_KEPT_BYTES,
    json_size,
    kept_copy,
    strip_job,
    template_dropped,
)

pytestmark = pytest.mark.unit


# A typical template, 1.5 KiB of JSON: one container with its command, a dozen settings and a
# secret in its environment, resources, a config volume.
def compact(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def test_the_typical_template_is_about_1_5_kib_and_its_estimate_within_3_percent() -> None:
    exact = compact(TYPICAL_TEMPLATE)
    assert 1400 <= exact <= 1700
    assert exact <= json_size(TYPICAL_TEMPLATE, 10**9) <= exact * 1.03


# JSON without numbers (templates are strings almost throughout), of strings JSON writes as they
# are: the estimate is exact but for one character per non-empty container.
texts = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=20)
documents = st.recursive(
    texts, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(texts, inner, max_size=5), max_leaves=40
)


def containers(value: Any) -> int:
    if isinstance(value, dict):
        return bool(value) + sum(containers(v) for v in value.values())
    if isinstance(value, list):
        return bool(value) + sum(containers(v) for v in value)
    return 0


@given(documents)
def test_the_estimate_is_the_json_length_give_or_take_a_character_a_container(value: Any) -> None:
    exact = compact(value)
    assert exact <= json_size(value, 10**9) <= exact + containers(value)


@given(documents, st.integers(min_value=0, max_value=200))
def test_past_the_limit_it_says_so_and_within_it_it_counts_all(value: Any, limit: int) -> None:
    whole = json_size(value, 10**9)
    assert (json_size(value, limit) > limit) == (whole > limit)
    if whole <= limit:
        assert json_size(value, limit) == whole


def test_the_walk_stops_soon_after_the_limit_whatever_the_size() -> None:
    """A 900 KiB template is counted only until it passes the limit: its estimate is far below
    its size (the walk did not go on), and its cost is that of a template of the limit's size."""
    huge = env_template(30_000)
    assert compact(huge) > 900 * 1024
    assert TEMPLATE_KEPT_BYTES < json_size(huge, TEMPLATE_KEPT_BYTES) < 40_000  # the env list's length, counted first
    nested = {"spec": {"containers": [{"env": [{"name": "x" * 100, "value": "v"} for _ in range(1000)]}]}}
    assert TEMPLATE_KEPT_BYTES < json_size(nested, TEMPLATE_KEPT_BYTES) < TEMPLATE_KEPT_BYTES + 200


@pytest.mark.parametrize("phase", [None, "Queued", "Starting", "Running", "BackingOff", "Suspended", "DeadLettered"])
def test_a_large_template_is_not_kept_whatever_the_phase_and_a_small_one_is(phase: str | None) -> None:
    small, large = make_job(), make_job()
    small["spec"]["template"] = copy.deepcopy(TYPICAL_TEMPLATE)
    large["spec"]["template"] = env_template(1_000)  # 26 KiB
    for job in (small, large):
        job["status"] = {"phase": phase} if phase else {}
    assert strip_job(copy.deepcopy(small))["spec"]["template"] == TYPICAL_TEMPLATE
    kept = strip_job(copy.deepcopy(large))
    assert kept["spec"]["template"] == {TEMPLATE_DROPPED: True} and template_dropped(kept)
    assert strip_job(copy.deepcopy(kept)) == kept  # a second trim (a write's answer) keeps the marker
    assert not template_dropped(small) and not template_dropped(make_job(spec={"template": {}}))


def test_the_threshold_is_the_estimate_of_the_template() -> None:
    """Kept up to TEMPLATE_KEPT_BYTES of estimated JSON, dropped past it."""
    job = make_job()
    for entries, kept in ((0, True), (1, True), (400, False)):
        template = env_template(entries)
        size = json_size(template, 10**9)
        if kept:
            assert size <= TEMPLATE_KEPT_BYTES
        job["spec"]["template"] = template
        assert template_dropped(strip_job(copy.deepcopy(job))) is (size > TEMPLATE_KEPT_BYTES) is (not kept)
    # The edge: grow one value until the estimate passes the limit.
    template = env_template(1)
    base = json_size(template, 10**9)
    template["spec"]["containers"][0]["env"][0]["value"] += "v" * (TEMPLATE_KEPT_BYTES - base)
    job["spec"]["template"] = template
    assert json_size(template, 10**9) == TEMPLATE_KEPT_BYTES
    assert not template_dropped(strip_job(copy.deepcopy(job)))
    template["spec"]["containers"][0]["env"][0]["value"] += "v"
    assert template_dropped(strip_job(copy.deepcopy(job)))


def test_the_whole_read_keeps_it_and_the_views_copy_leaves_that_read_whole() -> None:
    job = make_job(labels={"team": "payments"}, annotations={"blob": "x" * 1000})
    job["spec"]["template"] = env_template(1_000)
    job["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    whole = strip_job(copy.deepcopy(job), whole_template=True)
    assert whole["spec"]["template"] == job["spec"]["template"]
    assert "managedFields" not in whole["metadata"] and whole["metadata"]["labels"] == {}
    kept = kept_copy(whole)
    assert template_dropped(kept) and whole["spec"]["template"] == job["spec"]["template"]
    assert {k: v for k, v in kept["spec"].items() if k != "template"} == {
        k: v for k, v in whole["spec"].items() if k != "template"
    }


def step(job: dict[str, Any], pods: list[dict[str, Any]], now=T0) -> dict[str, Any]:
    return apply_to_job(job, decide(job, pods, now, rng=random.Random(0)))


def test_a_decision_that_creates_no_pod_is_the_same_on_the_job_kept() -> None:
    """The decisions of a running job's life (no pod made) read nothing of the template; the one
    that starts the next attempt is the one the reconciler takes again on the whole job."""
    job = make_job(spec={"retry": {"maxAttempts": 3, "backoff": {"initialSeconds": 10, "jitter": 0}}})
    job["spec"]["template"] = env_template(1_000)
    job = step(job, [])  # starts attempt 1 (its pod first)
    running = [make_pod(1, phase="Running", tracked=True)]
    job = step(job, running, at(1))
    failed = [make_pod(1, phase="Failed", exit_code=1, finished_at=at(5), tracked=True)]
    for pods, now in ((running, at(2)), (failed, at(6))):
        kept = strip_job(copy.deepcopy(job))
        assert template_dropped(kept)
        whole, trimmed = decide(job, pods, now, rng=random.Random(0)), decide(kept, pods, now, rng=random.Random(0))
        assert not whole.of_type(actions.CreatePod)
        assert trimmed == whole
    job = step(job, failed, at(6))
    assert job["status"]["phase"] == "BackingOff"
    due = decide(job, [], at(20), rng=random.Random(0))
    assert due.of_type(actions.CreatePod)  # the next attempt: the reconciler reads the job whole for it
    assert decide(strip_job(copy.deepcopy(job)), [], at(20), rng=random.Random(0)).of_type(actions.CreatePod)


def waiting_job(template: dict[str, Any]) -> dict[str, Any]:
    """A job as the API server has it while it waits in a paused queue (its status written)."""
    job = make_job(spec={"queue": "held"})
    job["spec"]["template"] = copy.deepcopy(template)
    waiting = ("QueuePaused", "queue held is paused")
    return apply_to_job(job, decide(job, [], T0, rng=random.Random(0), may_start=False, waiting=waiting))


def benchmark() -> None:
    """Microseconds per estimate (the typical template, and the 900 KiB one, stopped at the
    limit), and bytes of Python objects per waiting job, as the API server sends it and as the
    view keeps it (bench/kept_objects.py's measure: orjson and tracemalloc)."""
    from bench.kept_objects import held

    hostile = env_template(26_000)
    for name, template in (("typical (1.5 KiB)", TYPICAL_TEMPLATE), ("hostile (900 KiB)", hostile)):
        number = 20_000
        best = min(timeit.repeat(lambda t=template: json_size(t, TEMPLATE_KEPT_BYTES), number=number, repeat=7))
        dumps = min(timeit.repeat(lambda t=template: json.dumps(t), number=max(1, number // 1000), repeat=3))
        print(
            f"{name}: JSON {compact(template)} bytes; json_size {best / number * 1e6:.2f} us"
            f" (json.dumps {dumps / max(1, number // 1000) * 1e6:.1f} us)"
        )
    for name, template, copies in (("typical", TYPICAL_TEMPLATE, 200), ("hostile", hostile, 3)):
        raw = orjson.dumps(waiting_job(template))
        whole, kept = held(raw, None, copies), held(raw, strip_job, copies)
        sizes = f"JSON {len(raw) / 1024:.1f} KiB, whole {whole / 1024:.1f} KiB, kept {kept / 1024:.1f} KiB"
        print(f"a waiting job, {name} template: {sizes}")


if __name__ == "__main__":
    benchmark()
