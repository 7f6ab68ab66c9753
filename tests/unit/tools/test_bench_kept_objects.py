"""A smoke of bench.kept_objects (no cluster), so the script cannot rot: the hostile pod of the
hostile-tenant suite weighs about half a MiB parsed and costs nothing kept; a job's pod is kept
in a few KiB."""

from __future__ import annotations

import orjson
import pytest

from bench import kept_objects
from tests.support.builders import make_pod
from vigil.core.podstate import keep_job_pod

pytestmark = pytest.mark.unit


def test_the_hostile_pod_weighs_half_a_mib_whole_and_nothing_kept():
    raw = orjson.dumps(kept_objects.hostile_pod())
    assert kept_objects.held(raw, None, 5) > 400 * 1024
    assert kept_objects.held(raw, keep_job_pod, 100) < 2048


def test_a_jobs_pod_is_kept_whatever_its_template_adds():
    pod = make_pod(1, phase="Running")
    pod["metadata"]["labels"].update({f"team.example/l{i}": "v" * 60 for i in range(2500)})
    raw = orjson.dumps(pod)
    assert kept_objects.held(raw, keep_job_pod, 100) < 4 * 1024 < kept_objects.held(raw, None, 5) / 50
