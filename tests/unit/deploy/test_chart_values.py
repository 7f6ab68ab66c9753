"""The chart's values, its schema and its README agree, so that the docs cannot rot.

Every leaf of values.yaml (a key whose value is a scalar, a list, an empty map, or a map the
schema leaves free-form, such as resources.requests or podSecurityContext) must have a row in the
README's values table (rendered by helm-docs from values.yaml's `# --` comments: a leaf without
one would be missing, or split into rows of its own keys) with the same default and a type the
schema agrees with, and a typed entry in values.schema.json. The chart's
CRDs must be the repository's, and its default image the one `make image` builds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "vigil"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
JSON_TYPES = {"string", "integer", "number", "boolean", "object", "array", "null"}


def structured(node: dict[str, Any]) -> bool:
    """A block of named values the chart reads one by one (not a Kubernetes object passed through)."""
    return "properties" in node and node.get("additionalProperties") is False


def leaves(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any, dict]]:
    """(dotted key, default, schema) for every leaf of values.yaml. A key missing from the schema
    fails here, since additionalProperties: false would refuse its own default."""
    for key, value in values.items():
        dotted = prefix + key
        assert key in schema.get("properties", {}), f"{dotted} is in values.yaml but not in values.schema.json"
        node = schema["properties"][key]
        if isinstance(value, dict) and value and structured(node):
            yield from leaves(value, node, dotted + ".")
        else:
            yield dotted, value, node


LEAVES = {key: (value, node) for key, value, node in leaves(VALUES, SCHEMA)}


# helm-docs' names of types (inferred from the default, or given as `# -- (int or null)`), as
# JSON schema's; a percentage is a string.
HELM_DOCS_TYPES = {
    "int": "integer", "float": "number", "bool": "boolean", "list": "array", "object": "object",
    "string": "string", "null": "null", "percentage": "string",
}  # fmt: skip


def readme_table() -> dict[str, tuple[set[str], Any, str]]:
    """The README's values table, as helm-docs renders it: key -> (JSON types, default, description)."""
    text = (CHART / "README.md").read_text()
    section = text.split("\n## Values\n", 1)[1]
    rows = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| ([\w.\[\]-]+) \| ([^|]+) \| `(.*?)` \| (.*) \|", line)
        if match:
            key, type_, default, description = match.groups()
            assert key not in rows, f"{key} is listed twice in the README"
            names = type_.strip().split(" or ")
            assert set(names) <= set(HELM_DOCS_TYPES), f"{key}: unknown type {type_!r} in the README"
            value = None if default == "nil" else json.loads(default)  # helm-docs writes defaults as JSON
            rows[key] = ({HELM_DOCS_TYPES[name] for name in names}, value, description.strip())
    return rows


README = readme_table()


def types(node: dict[str, Any]) -> set[str]:
    if "oneOf" in node:
        return set().union(*(types(option) for option in node["oneOf"]))
    declared = node.get("type")
    return {declared} if isinstance(declared, str) else set(declared or ())


def test_the_walk_finds_the_values_the_chart_reads():
    # A guard on the walk itself: nested blocks are entered, free-form objects are not.
    for key in ("replicas", "operator.logLevel", "metrics.serviceMonitor.labels", "webhook.certManager.issuerRef",
                "prometheusRule.enabled", "prometheusRule.labels", "grafanaDashboard.enabled",
                "grafanaDashboard.labels", "grafanaDashboard.annotations", "resources.requests",
                "podSecurityContext", "podDisruptionBudget.minAvailable"):  # fmt: skip
        assert key in LEAVES, key
    assert "podSecurityContext.runAsUser" not in LEAVES
    assert len(LEAVES) > 50


@pytest.mark.parametrize("key", sorted(LEAVES))
def test_every_value_is_typed_in_the_schema(key: str):
    value, node = LEAVES[key]
    declared = types(node)
    assert declared and declared <= JSON_TYPES, f"{key}: no JSON type in values.schema.json"
    python_type = {
        bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
        type(None): "null",
    }[type(value)]  # fmt: skip
    assert python_type in declared or (python_type == "integer" and "number" in declared), (
        f"{key}: its default {value!r} is a {python_type}, the schema says {sorted(declared)}"
    )


@pytest.mark.parametrize("key", sorted(LEAVES))
def test_every_value_is_in_the_readme_with_its_default(key: str):
    assert key in README, f"{key} is missing from the values table of charts/vigil/README.md"
    type_, default, description = README[key]
    value, node = LEAVES[key]
    assert default == value, f"README says {key} defaults to {default!r}; values.yaml has {value!r}"
    assert description, f"{key} has no description in the README"
    declared = types(node)
    # An integer default of a value the schema calls a number reads as int: the one allowance.
    named = type_ | ({"number"} if "integer" in type_ else set())
    assert declared <= named, f"README types {key} as {sorted(type_)}; the schema says {sorted(declared)}"


def test_the_readme_lists_no_value_that_does_not_exist():
    assert not set(README) - set(LEAVES), (
        f"README rows for values that are not in values.yaml: {set(README) - set(LEAVES)}"
    )


def test_the_schema_is_draft_07_and_closed():
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"

    def blocks(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict]]:
        if node.get("type") == "object" and "properties" in node:
            yield path, node
            for key, child in node["properties"].items():
                yield from blocks(child, f"{path}.{key}" if path else key)

    for path, node in blocks(SCHEMA, ""):
        assert node.get("additionalProperties") is False, f"{path or 'the top level'} accepts misspelt keys"
    assert SCHEMA["properties"]["operator"]["properties"]["logLevel"]["enum"] == ["debug", "info", "warning", "error"]
    assert SCHEMA["properties"]["webhook"]["properties"]["failurePolicy"]["enum"] == ["Ignore", "Fail"]


def test_the_values_of_the_other_templates_are_as_agreed():
    """prometheusrule.yaml and grafana-dashboard.yaml read exactly these."""
    assert VALUES["prometheusRule"] == {"enabled": False, "labels": {}}
    assert VALUES["grafanaDashboard"] == {"enabled": False, "labels": {"grafana_dashboard": "1"}, "annotations": {}}


# The chart's CRDs and its version: tests/unit/deploy/test_release.py.
