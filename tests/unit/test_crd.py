"""The generated CRD: in step with the models on disk, structural, with defaults and CEL rules."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field

from vigil import api, crd

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("relative", crd.CRD_PATHS, ids=str)
def test_the_crd_files_on_disk_are_what_the_models_generate(relative: Path) -> None:
    on_disk = (REPO / relative).read_text()
    assert on_disk == crd.render(), f"{relative} is stale: run `python -m vigil.crd` from the repository root"


def test_python_m_vigil_crd_writes_both_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "vigil.crd", str(tmp_path)], check=True, capture_output=True)
    for relative in crd.CRD_PATHS:
        assert (tmp_path / relative).read_text() == crd.render()


CRD = crd.vigiljob_crd()
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]
STATUS = SCHEMA["properties"]["status"]


def test_names_scope_and_subresources() -> None:
    assert CRD["metadata"]["name"] == "vigiljobs.vigil.dev"
    assert CRD["spec"]["group"] == "vigil.dev"
    assert CRD["spec"]["scope"] == "Namespaced"
    assert CRD["spec"]["names"] == {
        "kind": "VigilJob",
        "listKind": "VigilJobList",
        "plural": "vigiljobs",
        "singular": "vigiljob",
        "shortNames": ["vj", "vjob"],
    }
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)
    assert VERSION["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = [(c["name"].upper(), c["type"], c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]]
    assert columns == [
        ("QUEUE", "string", ".spec.queue"),
        ("PHASE", "string", ".status.phase"),
        ("ATTEMPTS", "integer", ".status.attempts"),
        ("LAST-BEAT", "date", ".status.currentAttempt.lastHeartbeatAt"),
        ("REASON", "string", ".status.reason"),
        ("AGE", "date", ".metadata.creationTimestamp"),
    ]
    for column in VERSION["additionalPrinterColumns"][:-1]:  # each path exists in the schema
        node = SCHEMA
        for part in column["jsonPath"].strip(".").split("."):
            node = node["properties"][part]


def test_the_schema_defaults_are_the_designs() -> None:
    def default(*path: str) -> Any:
        node = SPEC
        for part in path:
            node = node["properties"][part]
        return node["default"]

    assert default("queue") == "default"
    assert default("priority") == 0
    # A left-out sub-object gets every nested default (spelled out: see vigil.api._nested).
    assert default("retry") == api.Retry().model_dump(by_alias=True, mode="json")
    assert default("retry", "maxAttempts") == 6
    assert default("retry", "backoff") == {"initialSeconds": 10, "factor": 2.0, "maxSeconds": 600, "jitter": 0.5}
    assert [default("retry", "backoff", f) for f in ("initialSeconds", "factor", "maxSeconds", "jitter")] == [
        10,
        2.0,
        600,
        0.5,
    ]
    assert default("retry", "nonRetryableExitCodes") == []
    assert default("retry", "countDisruptions") is False
    assert default("heartbeat") == api.Heartbeat().model_dump(by_alias=True, mode="json")
    assert [default("heartbeat", f) for f in ("intervalSeconds", "timeoutSeconds", "startupGraceSeconds")] == [
        10,
        60,
        120,
    ]
    assert default("heartbeat", "required") is True
    assert default("guarantee") == "AtLeastOnce"
    assert default("suspend") is False
    assert SPEC["properties"]["attemptDeadlineSeconds"] == {
        "type": "integer",
        "description": "One attempt's time limit; the attempt is then retried.",
        "nullable": True,
        "minimum": 1,
    }
    assert SPEC["required"] == ["template"]
    assert SCHEMA["required"] == ["spec"]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def test_the_schema_is_structural() -> None:
    for path, node in walk(SCHEMA):
        assert "type" in node, f"{path} has no type"
        assert not {"$ref", "anyOf", "allOf", "oneOf", "title", "$defs"} & set(node), path
        if node["type"] == "object" and path not in ("", ".metadata"):
            assert "properties" in node or node.get("x-kubernetes-preserve-unknown-fields"), path


def test_status_carries_no_defaults() -> None:
    assert [path for path, node in walk(STATUS) if "default" in node] == []


def test_the_template_is_free_form_and_immutable() -> None:
    assert SPEC["properties"]["template"] == {
        "type": "object",
        "description": SPEC["properties"]["template"]["description"],
        "x-kubernetes-preserve-unknown-fields": True,
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "spec.template is immutable: create a new VigilJob instead"}
        ],
    }


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = STATUS["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def cel_rules() -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    return [(path, node, rule) for path, node in walk(SPEC) for rule in node.get("x-kubernetes-validations", [])]


def test_every_rule_of_the_models_is_in_the_crd_with_its_message() -> None:
    in_crd = {(rule["rule"], rule["message"]) for _, _, rule in cel_rules()}
    in_models = {(r.cel, r.message) for m in (api.Backoff, api.Retry, api.Heartbeat) for r in m.cel_rules}
    assert in_models < in_crd
    assert len(in_crd - in_models) == 1  # the template's immutability, a transition rule


def test_cel_rules_read_only_scalars_or_bounded_values() -> None:
    """The API server refuses a CRD whose rules could cost too much: a rule may read a field
    only if it is a number, or a string or list with a bound."""
    for path, node, rule in cel_rules():
        for field_name in re.findall(r"self\.(\w+)", rule["rule"]):
            field_schema = node["properties"][field_name]
            bounded = field_schema["type"] in ("integer", "number", "boolean") or (
                "maxLength" in field_schema or "maxItems" in field_schema
            )
            assert bounded, f"{path}.{field_name} is read by {rule['rule']!r} but has no bound"


def test_an_unmappable_model_fails_generation_instead_of_reaching_the_api_server() -> None:
    class Strict(api.WireModel):
        count: int = Field(1, gt=0)  # exclusiveMinimum has no structural-schema form here

    with pytest.raises(ValueError, match="exclusiveMinimum"):
        crd.structural_schema(Strict, with_defaults=True)


def test_the_yaml_round_trips() -> None:
    text = crd.render()
    assert text.startswith("# Generated by `python -m vigil.crd`")
    assert yaml.safe_load(text) == CRD
