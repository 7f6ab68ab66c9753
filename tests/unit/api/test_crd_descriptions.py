"""`kubectl explain` describes every field of Vigil's resources, spec and status alike: each
property of the CRDs' schemas (of every version that carries descriptions: the deprecated
v1alpha1 is served with the same schema stripped of them, to keep the CRD small) has a
description, down to the conditions' and the history's own fields. The pod template's fields are
Kubernetes' own schema, with Kubernetes' own descriptions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from vigil.api import crd

pytestmark = pytest.mark.unit


def properties(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema) of every property under `node`, items and map values included."""
    for name, child in (node.get("properties") or {}).items():
        yield f"{path}.{name}", child
        yield from properties(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from properties(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from properties(node["additionalProperties"], f"{path}{{}}")


def described_versions() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in (crd.CRD_FILE_NAME, crd.QUEUE_CRD_FILE_NAME, crd.POOL_CRD_FILE_NAME):
        definition = yaml.safe_load(crd.render_crd(name))
        for version in definition["spec"]["versions"]:
            if version.get("deprecated"):
                continue  # served without descriptions (vigil.api.crd._versions)
            yield f"{definition['spec']['names']['kind']} {version['name']}", version["schema"]["openAPIV3Schema"]


VERSIONS = dict(described_versions())


def test_a_current_version_of_each_kind_is_checked():
    assert {key.split()[0] for key in VERSIONS} == {"VigilJob", "VigilQueue", "VigilWorkerPool"}
    for key, schema in VERSIONS.items():
        assert {"spec", "status"} <= set(schema["properties"]), key


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_every_field_of_spec_and_status_has_a_description(version: str):
    schema = VERSIONS[version]
    bare = [
        path
        for part in ("spec", "status")
        for path, node in [(part, schema["properties"][part]), *properties(schema["properties"][part], part)]
        if not (node.get("description") or "").strip()
    ]
    assert not bare, f"{version}: fields `kubectl explain` would show bare (add Field(description=...)): {bare}"


def test_the_walk_reaches_nested_status_fields():
    # A guard on the walk: a list's items and their fields are visited.
    paths = {path for path, _ in properties(VERSIONS[next(iter(sorted(VERSIONS)))]["properties"]["status"], "status")}
    assert "status.history[].exitCode" in paths and "status.conditions[].lastTransitionTime" in paths
