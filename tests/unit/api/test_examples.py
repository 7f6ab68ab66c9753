"""Every example in examples/ is what a user can apply to a real cluster: each object a VigilJob
or VigilQueue of the current API version that Vigil's own models accept (the rules the API server
applies, stated in Python: vigil.api), with a pod template whose every field is one of
Kubernetes' PodTemplateSpec (strict field validation, as `kubectl apply` does it) and no
placement on the test bed's kwok nodes (the demo adds that itself: testbed/demo.py). The README
lists each example. The VigilJobs and VigilQueues in the docs' YAML blocks (the migration guide's
worked example) are held to the same check."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from vigil import api
from vigil.api import template_schema

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
FILES = sorted((ROOT / "examples").rglob("*.yaml"))
OBJECTS = [
    (f"{path.relative_to(ROOT)}:{body['metadata']['name']}", body)
    for path in FILES
    for body in yaml.safe_load_all(path.read_text())
    if body
]
# The docs' YAML blocks that hold Vigil's objects, as more examples.
OBJECTS += [
    (f"{path.relative_to(ROOT)}:{body['metadata']['name']}", body)
    for path in sorted((ROOT / "docs").glob("*.md"))
    for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S)
    for body in yaml.safe_load_all(block)
    if isinstance(body, dict) and body.get("apiVersion", "").startswith(f"{api.GROUP}/") and "spec" in body
]
JOBS = {key: body for key, body in OBJECTS if body["kind"] == api.KIND}


def unknown_fields(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """The paths in `value` that `schema` (a structural schema) has no field for."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, child in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(child, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [p for k, v in value.items() for p in unknown_fields(v, schema["additionalProperties"], f"{path}.{k}")]
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [p for i, v in enumerate(value) for p in unknown_fields(v, schema["items"], f"{path}[{i}]")]
    return []


def test_the_examples_are_found():
    names = {path.name for path in FILES}
    assert {"hello.yaml", "nightly-report.yaml", "etl-step.yaml", "training.yaml", "count.yaml"} <= names
    assert len(JOBS) >= 10
    assert "docs/migrating-from-jobs.md:resize-images" in JOBS


@pytest.mark.parametrize("key", [key for key, _ in OBJECTS])
def test_each_example_is_valid_against_the_api(key: str):
    body = dict(OBJECTS)[key]
    assert body["apiVersion"] == api.API_VERSION, f"{key}: apiVersion {body['apiVersion']}, not {api.API_VERSION}"
    assert body["kind"] in (api.KIND, api.QUEUE_KIND, api.POOL_KIND), f"{key}: {body['kind']} is not Vigil's"
    if body["kind"] == api.QUEUE_KIND:
        api.VigilQueueSpec.model_validate(body.get("spec") or {})
        return
    if body["kind"] == api.POOL_KIND:
        template = api.VigilWorkerPoolSpec.model_validate(body["spec"]).template
    else:
        spec = api.VigilJobSpec.model_validate(body["spec"])
        if spec.pool is not None:
            return  # pulled: the pool's template runs its tasks
        template = spec.template
    assert template is not None
    assert not unknown_fields(template, template_schema.template_schema(), "spec.template"), (
        f"{key}: fields a PodTemplateSpec does not have: "
        f"{unknown_fields(template, template_schema.template_schema(), 'spec.template')}"
    )
    assert template["spec"]["containers"], key


TEMPLATED = {key: body for key, body in OBJECTS if (body.get("spec") or {}).get("template")}


@pytest.mark.parametrize("key", sorted(TEMPLATED))
def test_no_example_is_pinned_to_the_test_beds_kwok_nodes(key: str):
    pod = TEMPLATED[key]["spec"]["template"].get("spec") or {}
    assert "kwok" not in yaml.safe_dump(pod.get("nodeSelector") or {}), f"{key} is placed on kwok nodes"
    assert not any("kwok" in str(t.get("key", "")) for t in pod.get("tolerations") or []), (
        f"{key} tolerates kwok's taint: on a real cluster that means nothing; the demo places its pods"
    )


def test_the_readme_lists_every_example():
    readme = (ROOT / "README.md").read_text()
    for path in FILES:
        if path.parent.name == "any-image":
            continue  # listed as a folder
        assert f"examples/{path.name}" in readme, f"README.md does not list examples/{path.name}"
    assert "examples/any-image/" in readme


def test_the_strict_check_finds_a_misspelt_field():
    # A guard on unknown_fields: a misspelling in a container is named with its path.
    template = {"spec": {"containers": [{"name": "main", "image": "busybox", "comand": ["true"]}]}}
    assert unknown_fields(template, template_schema.template_schema(), "spec.template") == [
        "spec.template.spec.containers[0].comand"
    ]
