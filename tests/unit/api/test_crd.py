"""The generated CRD: in step with the models on disk, structural, with defaults and CEL rules."""

from __future__ import annotations

import copy
import gzip
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field

from vigil import api
from vigil.api import crd, template_schema

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("relative", crd.CRD_PATHS, ids=str)
def test_the_crd_files_on_disk_are_what_the_models_generate(relative: Path) -> None:
    on_disk = (REPO / relative).read_text()
    assert on_disk == crd.render_crd(relative.name), (
        f"{relative} is stale: run `python -m vigil.api.crd` from the repository root"
    )


def test_python_m_vigil_crd_writes_both_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "vigil.api.crd", str(tmp_path)], check=True, capture_output=True)
    for relative in crd.CRD_PATHS:
        assert (tmp_path / relative).read_text() == crd.render_crd(relative.name)


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
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1beta1", True, True)
    assert VERSION["subresources"] == {"status": {}}


def _descriptions_dropped(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            key: (
                {name: _descriptions_dropped(child) for name, child in value.items()}
                if key == "properties"
                else _descriptions_dropped(value)
                if key in ("items", "additionalProperties")
                else value
            )
            for key, value in schema.items()
            if key != "description"
        }
    return schema


@pytest.mark.parametrize("built", [crd.vigiljob_crd, crd.vigilqueue_crd], ids=["VigilJob", "VigilQueue"])
def test_v1alpha1_is_still_served_deprecated_with_the_same_schema(built: Any) -> None:
    """An upgrade from 0.1.0 keeps every object and manifest written as v1alpha1 working: the
    version is served, its schema validates, defaults and prunes as v1beta1's (so `conversion:
    None` loses nothing either way), only v1beta1 is stored, and a request through v1alpha1 is
    answered with a warning that says what to change."""
    made = built()
    kind = made["spec"]["names"]["kind"]
    current, old = made["spec"]["versions"]
    assert made["spec"]["conversion"] == {"strategy": "None"}
    assert (current["name"], current["served"], current["storage"]) == ("v1beta1", True, True)
    assert current.get("deprecated") is None
    assert (old["name"], old["served"], old["storage"], old["deprecated"]) == ("v1alpha1", True, False, True)
    assert f"vigil.dev/v1alpha1 {kind} is deprecated" in old["deprecationWarning"]
    assert "use vigil.dev/v1beta1" in old["deprecationWarning"]
    assert len(old["deprecationWarning"]) <= 256 and old["deprecationWarning"].isascii()
    assert old["schema"]["openAPIV3Schema"] == _descriptions_dropped(current["schema"]["openAPIV3Schema"])
    assert old["additionalPrinterColumns"] == current["additionalPrinterColumns"]
    assert old["subresources"] == current["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = [(c["name"].upper(), c["type"], c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]]
    assert columns == [
        ("QUEUE", "string", ".spec.queue"),
        ("PHASE", "string", ".status.phase"),
        ("ATTEMPTS", "integer", ".status.attempts"),
        ("TASKS", "string", ".status.tasks.progress"),
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
    # A left-out sub-object gets every nested default (spelled out: see vigil.api.wire.nested_field).
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
    # Unset fields stay out of the default (heartbeat.agent unset is the operator's choice).
    assert default("heartbeat") == api.Heartbeat().model_dump(by_alias=True, mode="json", exclude_none=True)
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
        "description": "One attempt's time limit; the attempt is then retried. At most 315360000 (10 years).",
        "nullable": True,
        "minimum": 1,
        "maximum": 315360000,
    }
    assert "required" not in SPEC  # spec.template or spec.pool, by a CEL rule
    assert "has(self.pool) != has(self.template)" in [v["rule"] for v in SPEC["x-kubernetes-validations"]]
    assert SCHEMA["required"] == ["spec"]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def test_the_schema_is_structural() -> None:
    for path, node in walk(SCHEMA):
        if node.get("x-kubernetes-int-or-string"):  # the one node a structural schema leaves untyped
            assert "type" not in node and node["anyOf"] == INT_OR_STRING, path
            continue
        if path == ".spec.tasks.items[]":  # any JSON value: untyped, kept whole (and so out of CEL's reach)
            assert node == {"x-kubernetes-preserve-unknown-fields": True}
            continue
        assert "type" in node, f"{path} has no type"
        assert not {"$ref", "anyOf", "allOf", "oneOf", "title", "$defs"} & set(node), path
        if node["type"] == "object" and path not in ("", ".metadata"):
            assert {"properties", "additionalProperties", "x-kubernetes-preserve-unknown-fields"} & set(node), path
        if node.get("x-kubernetes-list-type") == "map":  # the CRD API wants each key required or defaulted
            items = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in items.get("required", ()) or "default" in items["properties"][key], (path, key)


def test_every_number_of_the_spec_has_both_bounds() -> None:
    """No value the API server admits may make the decision core overflow (see test_api)."""
    numbers = [
        (path, node)
        for path, node in walk(SPEC)
        if node.get("type") in ("integer", "number") and not path.startswith(".template")
    ]
    assert len(numbers) == 17  # 14, and the tasks' count, parallelism and maxDeadLetteredTasks
    for path, node in numbers:
        rules = " ".join(rule["rule"] for rule in rules_above(path))
        field_name = path.rsplit(".", 1)[-1]
        assert "minimum" in node or f"self.{field_name} >=" in rules, path
        assert "maximum" in node or f"self.{field_name} <=" in rules, path


def rules_above(path: str) -> list[dict[str, str]]:
    """The CEL rules on the object that holds the field at `path`."""
    parent = SPEC
    for part in path.strip(".").split(".")[:-1]:
        parent = parent["properties"][part.removesuffix("[]")]
    return parent.get("x-kubernetes-validations", [])


def test_status_defaults_only_to_not_yet_observed() -> None:
    # A new object reads observedGeneration 0 < generation: InProgress to kstatus, not Current.
    assert STATUS["default"] == {"observedGeneration": 0}
    assert [path for path, node in walk(STATUS) if "default" in node and node is not STATUS] == []


TEMPLATE = SPEC["properties"]["template"]


def test_the_template_is_kubernetes_pod_template_spec_and_immutable() -> None:
    pod_template = template_schema.template_schema()
    assert TEMPLATE["type"] == "object"
    assert TEMPLATE["description"].startswith("A PodTemplateSpec")
    assert TEMPLATE["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "spec.template is immutable: create a new VigilJob instead"}
    ]
    assert "x-kubernetes-preserve-unknown-fields" not in TEMPLATE
    pod_spec = copy.deepcopy(TEMPLATE["properties"]["spec"])
    for key in api.TEMPLATE_CONTAINER_LISTS:  # Kubernetes' schema, plus the injected agent's name
        items = pod_spec["properties"][key]["items"]
        assert items.pop("x-kubernetes-validations") == [AGENT_NAME_RULE]
    assert pod_spec == pod_template["properties"]["spec"]
    metadata = TEMPLATE["properties"]["metadata"]
    assert metadata["properties"] == pod_template["properties"]["metadata"]["properties"]
    assert metadata["x-kubernetes-validations"] == [rule.as_validation() for rule in api.TemplateMeta.cel_rules]


AGENT_NAME_RULE = {"rule": f"self.name != '{api.AGENT_CONTAINER}'", "message": api.AGENT_CONTAINER_REFUSAL}


def test_the_template_metadata_is_an_embedded_objects_and_what_vigil_checks_is_in_it() -> None:
    properties = TEMPLATE["properties"]["metadata"]["properties"]
    assert set(properties) == {"annotations", "finalizers", "labels", "name", "namespace"}
    assert properties["labels"]["additionalProperties"] == {"type": "string"}
    assert properties["annotations"]["additionalProperties"] == {"type": "string"}
    assert properties["finalizers"]["items"] == {"type": "string"}
    assert set(api.TemplateMeta.model_fields) <= set(properties)


def test_the_pod_spec_is_checked_where_it_matters() -> None:
    pod_spec = TEMPLATE["properties"]["spec"]
    assert pod_spec["required"] == ["containers"]
    containers = pod_spec["properties"]["containers"]
    assert (containers["type"], containers["x-kubernetes-list-type"], containers["x-kubernetes-list-map-keys"]) == (
        "array",
        "map",
        ["name"],
    )
    container = containers["items"]["properties"]
    assert container["env"]["items"]["properties"]["value"]["type"] == "string"
    assert container["resources"]["properties"]["limits"]["additionalProperties"] == {
        "anyOf": INT_OR_STRING,
        "pattern": template_schema.QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    }
    assert container["readinessProbe"]["properties"]["httpGet"]["properties"]["port"]["anyOf"] == INT_OR_STRING
    assert container["ports"]["items"]["properties"]["protocol"]["default"] == "TCP"  # a list-map key


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = STATUS["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def cel_rules() -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    return [(path, node, rule) for path, node in walk(SPEC) for rule in node.get("x-kubernetes-validations", [])]


MODELS_WITH_RULES = (api.Backoff, api.Retry, api.Heartbeat, api.TemplateMeta, api.VigilJobSpec)


def test_every_rule_of_the_models_is_in_the_crd_with_its_message() -> None:
    in_crd = [json.dumps(rule, sort_keys=True) for _, _, rule in cel_rules()]
    in_models = [json.dumps(r.as_validation(), sort_keys=True) for m in MODELS_WITH_RULES for r in m.cel_rules]
    assert set(in_models) < set(in_crd)
    # the template's immutability, a transition rule, and the injected agent's name on each list;
    # the tasks' count immutable, and never dropped (both transition rules)
    assert len(in_crd) == len(in_models) + 1 + len(api.TEMPLATE_CONTAINER_LISTS) + 2


def test_cel_rules_read_only_scalars_bounded_values_or_names() -> None:
    """The API server refuses a CRD whose rules could cost too much: a rule may read a field if
    it is a number, or a string or list with a bound; or iterate over an unbounded map's keys or
    list of strings with a test of constant cost (startsWith a literal), and then name at most
    one of them (a message that joined them all would be priced far past the budget). The
    integration test that installs the CRD has the API server's own word on it."""
    for path, node, rule in cel_rules():
        if rule["rule"] == "self == oldSelf":
            continue
        if rule == AGENT_NAME_RULE:
            continue  # a comparison with a literal stops at the literal's length
        expressions = [rule["rule"], rule.get("messageExpression", "")]
        # has(self.x) reads nothing of x's value: constant cost, whatever x holds
        expressions = [re.sub(r"has\((?:old)?[sS]elf\.\w+\)", "", text) for text in expressions]
        for field_name in {name for text in expressions for name in re.findall(r"self\.(\w+)", text)}:
            field_schema = node["properties"][field_name]
            bounded = field_schema["type"] in ("integer", "number", "boolean") or (
                "maxLength" in field_schema or "maxItems" in field_schema or "enum" in field_schema
            )
            names = field_schema.get("additionalProperties", field_schema.get("items")) == {"type": "string"}
            assert bounded or names, f"{path}.{field_name} is read by {rule['rule']!r} but has no bound"
            assert ".join(" not in rule.get("messageExpression", ""), path


def test_the_crd_stays_well_within_what_the_api_server_and_etcd_take() -> None:
    """The PodTemplateSpec schema with its descriptions (for `kubectl explain`) makes the CRD big:
    too big for client-side `kubectl apply` (256 KiB annotation), hence --server-side, but far
    below etcd's ~1.5 MiB per object (as JSON, managed fields included: see test_validation)
    and Helm's 1 MiB release, which holds the chart's files compressed."""
    as_json = json.dumps(CRD, separators=(",", ":")).encode()
    assert len(as_json) < 512 * 1024
    assert len(gzip.compress(crd.render_crd().encode())) < 256 * 1024


def test_an_unmappable_model_fails_generation_instead_of_reaching_the_api_server() -> None:
    class Strict(api.WireModel):
        count: int = Field(1, gt=0)  # exclusiveMinimum has no structural-schema form here

    with pytest.raises(ValueError, match="exclusiveMinimum"):
        crd.structural_schema(Strict, with_defaults=True)


def test_the_yaml_round_trips() -> None:
    text = crd.render_crd()
    assert text.startswith("# Generated by `python -m vigil.api.crd`")
    assert yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) == CRD


# ------------------------------------------------------ vigil.api.template_schema: Kubernetes' schema


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def field_of(name: str, description: str | None = None, **extra: Any) -> dict[str, Any]:
    """A field of a named type, as Kubernetes' OpenAPI v3 writes it."""
    return {"allOf": [ref(name)], **({"description": description} if description else {}), **extra}


META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STR = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# A small document in the shape of /openapi/v3/api/v1 (the real one is checked against the
# stored file by tests/integration/test_validation.py).
DOCUMENT = {
    "components": {
        "schemas": {
            template_schema.ROOT_TYPE: {
                "type": "object",
                "description": "PodTemplateSpec describes a pod.",
                "properties": {
                    "metadata": field_of(META, "Standard metadata.", default={}),
                    "spec": field_of("io.k8s.api.core.v1.PodSpec", default={}),
                },
            },
            META: {
                "type": "object",
                "description": "ObjectMeta is metadata.",
                "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
                    "finalizers": {
                        "type": "array",
                        "items": {"type": "string", "default": ""},
                        "x-kubernetes-list-type": "set",
                        "x-kubernetes-patch-strategy": "merge",
                    },
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                    "uid": {"type": "string"},
                    "creationTimestamp": field_of("io.k8s.apimachinery.pkg.apis.meta.v1.Time"),
                },
            },
            "io.k8s.api.core.v1.PodSpec": {
                "type": "object",
                "required": ["containers"],
                "x-kubernetes-unions": [{"discriminator": "x"}],
                "properties": {
                    "containers": {
                        "type": "array",
                        "description": "The containers.",
                        "items": field_of("io.k8s.api.core.v1.Container", default={}),
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "x-kubernetes-patch-merge-key": "name",
                        "x-kubernetes-patch-strategy": "merge",
                    },
                    "restartPolicy": {"type": "string", "enum": ["Always", "Never"], "description": "How."},
                    "overhead": {"type": "object", "additionalProperties": field_of(QUANTITY, default={})},
                },
            },
            "io.k8s.api.core.v1.Container": {
                "type": "object",
                "description": "A container.",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "default": ""},
                    "port": field_of(INT_OR_STR, "A port."),
                    "ports": {
                        "type": "array",
                        "items": field_of("io.k8s.api.core.v1.ContainerPort", default={}),
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                    },
                    "cpu": field_of(QUANTITY, "CPU."),
                },
            },
            "io.k8s.api.core.v1.ContainerPort": {
                "type": "object",
                "required": ["containerPort"],
                "properties": {
                    "containerPort": {"type": "integer", "format": "int32", "default": 0},
                    "protocol": {"type": "string", "default": "TCP", "enum": ["SCTP", "TCP", "UDP"]},
                },
            },
            QUANTITY: {"oneOf": [{"type": "string"}, {"type": "number"}], "description": "Quantity is long."},
            INT_OR_STR: {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
        }
    }
}


def test_podschema_converts_as_controller_gen_does() -> None:
    converted = template_schema.convert(DOCUMENT)
    assert converted["description"] == "PodTemplateSpec describes a pod."
    metadata = converted["properties"]["metadata"]
    assert metadata["description"] == "Standard metadata."  # the field's own description wins
    assert set(metadata["properties"]) == {"annotations", "finalizers", "labels", "name", "namespace"}
    assert metadata["properties"]["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert metadata["properties"]["finalizers"] == {
        "type": "array",
        "x-kubernetes-list-type": "set",
        "items": {"type": "string"},
    }
    spec = converted["properties"]["spec"]
    assert "x-kubernetes-unions" not in spec
    assert spec["properties"]["restartPolicy"] == {"type": "string", "description": "How."}  # no enum
    assert spec["properties"]["overhead"]["additionalProperties"] == {
        "anyOf": INT_OR_STRING,
        "pattern": template_schema.QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    }
    containers = spec["properties"]["containers"]
    assert set(containers) == {"type", "description", "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "items"}
    container = containers["items"]
    assert container["description"] == "A container."  # a type's description where no field's is
    assert container["properties"]["name"] == {"type": "string"}  # defaults go ...
    assert container["properties"]["port"] == {
        "description": "A port.",
        "anyOf": INT_OR_STRING,
        "x-kubernetes-int-or-string": True,
    }
    assert container["properties"]["cpu"]["description"] == "CPU."
    port = container["properties"]["ports"]["items"]["properties"]
    assert port["containerPort"] == {"type": "integer", "format": "int32"}
    assert port["protocol"] == {"type": "string", "default": "TCP"}  # ... but a list-map key's stays


def test_podschema_refuses_what_it_cannot_map() -> None:
    unknown = copy.deepcopy(DOCUMENT)
    unknown["components"]["schemas"][template_schema.ROOT_TYPE]["minProperties"] = 1
    with pytest.raises(ValueError, match="no structural-schema mapping for keyword 'minProperties'"):
        template_schema.convert(unknown)

    recursive = copy.deepcopy(DOCUMENT)
    recursive["components"]["schemas"]["io.k8s.api.core.v1.Container"]["properties"]["sidecar"] = field_of(
        "io.k8s.api.core.v1.Container"
    )
    with pytest.raises(ValueError, match="contains itself"):
        template_schema.convert(recursive)

    keyless = copy.deepcopy(DOCUMENT)
    del keyless["components"]["schemas"]["io.k8s.api.core.v1.ContainerPort"]["properties"]["protocol"]["default"]
    with pytest.raises(ValueError, match="list-map key 'protocol' is neither required nor defaulted"):
        template_schema.convert(keyless)

    untyped = copy.deepcopy(DOCUMENT)
    del untyped["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["type"]
    with pytest.raises(ValueError, match="needs a type"):
        template_schema.convert(untyped)


def test_python_m_vigil_podschema_converts_a_saved_document(tmp_path: Path) -> None:
    saved, output = tmp_path / "api_v1.json", tmp_path / "out.json"
    saved.write_text(json.dumps(DOCUMENT))
    argv = ["--from-file", str(saved), "--kubernetes-version", "v1.99.0", "--output", str(output)]
    subprocess.run([sys.executable, "-m", "vigil.api.template_schema", *argv], check=True, capture_output=True)
    written = json.loads(output.read_text())
    assert written["kubernetesVersion"] == "v1.99.0"
    assert written["schema"] == template_schema.convert(DOCUMENT)
    assert template_schema.schema_path("v1.99.0").name == "podtemplatespec-v1.99.json"


def test_the_stored_pod_schema_says_where_it_came_from() -> None:
    stored = template_schema.stored()
    assert stored["comment"].startswith("Generated by `python -m vigil.api.template_schema`")
    assert stored["kubernetesVersion"].startswith(template_schema.SUPPORTED_KUBERNETES + ".")
    assert stored["source"].endswith(template_schema.ROOT_TYPE)
    assert template_schema.stored() == stored  # each caller gets a copy of its own
    stored["schema"].clear()
    assert template_schema.template_schema()["properties"]
