"""The field accessors (`vigil.core.fields`) read each field as the expressions they replaced did:
the required ones raise KeyError as a subscript did, the optional ones give `{}`, `[]` or None
for a field missing or null as `.get(...) or {}` did, and nothing is copied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from vigil.core import fields

pytestmark = pytest.mark.unit

POD: dict[str, Any] = {
    "metadata": {
        "name": "ledger-1",
        "namespace": "payments",
        "uid": "u-1",
        "resourceVersion": "42",
        "labels": {"vigil.dev/attempt": "1"},
        "annotations": {"vigil.dev/heartbeat": "3:boot"},
        "ownerReferences": [{"kind": "VigilJob", "name": "ledger", "uid": "j-1", "controller": True}],
        "finalizers": ["vigil.dev/attempt-tracking"],
        "creationTimestamp": "2026-01-02T03:04:05Z",
        "deletionTimestamp": "2026-01-02T03:05:05Z",
    },
    "spec": {"nodeName": "node-a"},
    "status": {"phase": "Running"},
}

# Each accessor, with the expression it replaced.
REQUIRED: list[tuple[Callable[[Any], Any], Callable[[Any], Any]]] = [
    (fields.metadata, lambda o: o["metadata"]),
    (fields.name, lambda o: o["metadata"]["name"]),
    (fields.namespace, lambda o: o["metadata"]["namespace"]),
    (fields.uid, lambda o: o["metadata"]["uid"]),
    (fields.resource_version, lambda o: o["metadata"]["resourceVersion"]),
]
UNDER_METADATA: list[tuple[Callable[[Any], Any], str, Any]] = [
    (fields.labels, "labels", {}),
    (fields.annotations, "annotations", {}),
    (fields.owner_references, "ownerReferences", []),
    (fields.finalizers, "finalizers", []),
    (fields.creation_timestamp, "creationTimestamp", None),
    (fields.deletion_timestamp, "deletionTimestamp", None),
]
TOP_LEVEL: list[tuple[Callable[[Any], Any], str]] = [(fields.spec, "spec"), (fields.status, "status")]


@pytest.mark.parametrize(("accessor", "old"), REQUIRED)
def test_a_required_field_is_the_subscript_of_old(accessor: Callable[[Any], Any], old: Callable[[Any], Any]) -> None:
    assert accessor(POD) is old(POD)


@pytest.mark.parametrize(("accessor", "old"), REQUIRED)
def test_a_missing_required_field_is_a_key_error_as_the_subscript_was(
    accessor: Callable[[Any], Any], old: Callable[[Any], Any]
) -> None:
    for obj in ({}, {"metadata": {}}, {"status": {"phase": "Running"}}):
        if accessor is fields.metadata and "metadata" in obj:
            continue
        with pytest.raises(KeyError):
            old(obj)
        with pytest.raises(KeyError):
            accessor(obj)


def test_a_null_metadata_fails_as_the_subscript_did() -> None:
    obj = {"metadata": None}
    assert fields.metadata(obj) is None
    for accessor in (fields.name, fields.uid):  # None["uid"]
        with pytest.raises(TypeError):
            accessor(obj)
    for accessor in (fields.labels, fields.deletion_timestamp):  # None.get("labels")
        with pytest.raises(AttributeError):
            accessor(obj)


@pytest.mark.parametrize(("accessor", "key", "empty"), UNDER_METADATA)
def test_a_field_under_metadata_is_the_object_s_own(accessor: Callable[[Any], Any], key: str, empty: Any) -> None:
    assert accessor(POD) is POD["metadata"][key]


@pytest.mark.parametrize(("accessor", "key", "empty"), UNDER_METADATA)
def test_a_field_under_metadata_missing_or_null_is_empty(accessor: Callable[[Any], Any], key: str, empty: Any) -> None:
    for meta in ({}, {key: None}):
        got = accessor({"metadata": meta})
        assert got == empty and type(got) is type(empty)
        assert got == (meta.get(key) or empty)  # the old expression: `metadata.get(key) or {}` (or [], or None)


@pytest.mark.parametrize(("accessor", "key", "empty"), UNDER_METADATA)
def test_a_field_under_metadata_needs_the_metadata(accessor: Callable[[Any], Any], key: str, empty: Any) -> None:
    with pytest.raises(KeyError):
        accessor({"spec": {}})


@pytest.mark.parametrize(("accessor", "key", "empty"), UNDER_METADATA[:4])
def test_an_empty_collection_under_metadata_reads_as_a_new_empty_one(
    accessor: Callable[[Any], Any], key: str, empty: Any
) -> None:
    stored: Any = type(empty)()
    got = accessor({"metadata": {key: stored}})
    assert got == empty and got is not stored  # as `or {}` made: never written back


@pytest.mark.parametrize(("accessor", "key"), TOP_LEVEL)
def test_spec_and_status_are_the_object_s_own(accessor: Callable[[Any], Any], key: str) -> None:
    assert accessor(POD) is POD[key]


@pytest.mark.parametrize(("accessor", "key"), TOP_LEVEL)
def test_spec_and_status_missing_or_null_are_empty(accessor: Callable[[Any], Any], key: str) -> None:
    for obj in ({}, {key: None}, {key: {}}, {"metadata": {"name": "x"}}):
        assert accessor(obj) == {} == (obj.get(key) or {})


def test_phase() -> None:
    assert fields.phase(POD) == "Running"
    for obj in ({}, {"status": None}, {"status": {}}, {"status": {"phase": None}}):
        assert fields.phase(obj) is None
        assert fields.phase(obj) == (obj.get("status") or {}).get("phase")
    assert fields.phase({"status": {"phase": ""}}) == ""


def test_accessors_read_any_mapping() -> None:
    from types import MappingProxyType

    frozen = MappingProxyType({"metadata": MappingProxyType({"name": "n", "uid": "u"}), "status": None})
    assert fields.name(frozen) == "n"
    assert fields.uid(frozen) == "u"
    assert fields.status(frozen) == {}
    assert fields.labels(frozen) == {}


def test_the_kinds_are_one_alias() -> None:
    assert fields.Pod is fields.Obj
    assert fields.Job is fields.Obj
