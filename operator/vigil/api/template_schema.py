"""The schema of spec.template: Kubernetes' own PodTemplateSpec, as a CRD structural schema.

Generated, never written by hand, and stored in the package (schemas/) so that `vigil.api.crd`
needs no cluster:

    python -m vigil.api.template_schema --from-cluster KUBECONFIG
    python -m vigil.api.template_schema --from-file api_v1.json --kubernetes-version v1.36.3

reads /openapi/v3/api/v1 of a kube-apiserver (or a saved copy of it), takes
io.k8s.api.core.v1.PodTemplateSpec and converts it as controller-gen converts the Go types:

- $refs are inlined (Kubernetes writes a field of a named type as `allOf: [{$ref}]`); the
  field's own description wins over the type's.
- Quantity and IntOrString become `x-kubernetes-int-or-string` with `anyOf: [integer, string]`
  (Quantity also with controller-gen's pattern).
- ObjectMeta becomes the small schema of an embedded object's metadata: labels, annotations,
  finalizers, name, namespace. (An empty `type: object` would prune every label.)
- Defaults are dropped, so the template is stored as given and the pod's API server defaults
  the pod as it defaults any other; a list-map key that is not required keeps its default, as
  the CRD API demands (ports' `protocol: TCP`).
- Enums are dropped too: Kubernetes accepts values outside them (`imagePullPolicy: ""` is
  defaulted), and the pod's API server checks the values when the pod is created.
- Patch-strategy, union and group-version-kind extensions, which a CRD schema refuses, go.

Any other keyword fails the generation rather than reach the API server unexamined.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

ROOT_TYPE = "io.k8s.api.core.v1.PodTemplateSpec"
SUPPORTED_KUBERNETES = "v1.36"  # the minor version whose schema the CRD carries
SCHEMAS_DIR = Path(__file__).parent / "schemas"

_REF_PREFIX = "#/components/schemas/"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_EMBEDDED_META_FIELDS = ("annotations", "finalizers", "labels", "name", "namespace")  # as controller-gen
# controller-gen's pattern for a Quantity written as a string.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_INT_OR_STRING_SCHEMA = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}

# Keywords kept, in the order they are written (`type` first, for a person reading the YAML).
_KEYWORD_ORDER = (
    "type",
    "format",
    "description",
    "default",
    "anyOf",
    "pattern",
    "x-kubernetes-int-or-string",
    "x-kubernetes-map-type",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "required",
    "items",
    "additionalProperties",
    "properties",
)
_DROPPED = frozenset(
    {
        "default",  # kept only for list-map keys, see _keep_list_map_key_defaults
        "enum",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-unions",
        "x-kubernetes-group-version-kind",
    }
)


def convert(document: dict[str, Any], root: str = ROOT_TYPE) -> dict[str, Any]:
    """The structural schema of `root`, a type of the OpenAPI v3 `document`."""
    schemas = document["components"]["schemas"]
    return _convert({"$ref": _REF_PREFIX + root}, schemas, ())


def _convert(node: dict[str, Any], schemas: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
    """`node` converted; `seen` is the chain of types being inlined (a type within itself could
    never be inlined, and no type of a pod is one)."""
    node = dict(node)
    name = _referenced_type(node)
    if name is not None:
        if name in seen:
            raise ValueError(f"{name} contains itself: {' > '.join((*seen, name))}")
        own = {key: value for key, value in node.items() if key not in ("$ref", "allOf")}
        if name in (_QUANTITY, _INT_OR_STRING):
            converted = dict(_INT_OR_STRING_SCHEMA)
            if name == _QUANTITY:
                converted["pattern"] = QUANTITY_PATTERN
            description = own.get("description")
            return _ordered({**converted, **({"description": description} if description else {})})
        referenced = schemas[name]
        if name == _OBJECT_META:
            properties = referenced["properties"]
            referenced = {**referenced, "properties": {f: properties[f] for f in _EMBEDDED_META_FIELDS}}
        return _convert({**referenced, **own}, schemas, (*seen, name))

    result: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            result[key] = {field: _convert(sub, schemas, seen) for field, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            result[key] = _convert(value, schemas, seen)
        elif key in _DROPPED:
            continue
        elif key in _KEYWORD_ORDER:
            result[key] = value
        else:
            raise ValueError(f"no structural-schema mapping for keyword {key!r} in {node}")
    if result.get("x-kubernetes-list-type") == "map":
        _keep_list_map_key_defaults(result, node, schemas)
    if "type" not in result and not result.get("x-kubernetes-int-or-string"):
        raise ValueError(f"a structural schema needs a type: {node}")
    return _ordered(result)


def _referenced_type(node: dict[str, Any]) -> str | None:
    """The type a node names: a bare $ref, or Kubernetes' `allOf: [{$ref}]` wrapper."""
    if "$ref" in node:
        ref = node["$ref"]
    elif "allOf" in node:
        (only,) = node["allOf"]
        ref = only["$ref"]
    else:
        return None
    if not ref.startswith(_REF_PREFIX):
        raise ValueError(f"a $ref outside the document: {ref}")
    return ref.removeprefix(_REF_PREFIX)


def _keep_list_map_key_defaults(converted: dict[str, Any], source: dict[str, Any], schemas: dict[str, Any]) -> None:
    """The CRD API demands that each key of a list-map be required or have a default; the
    source's default of such a key survives the dropping of defaults."""
    items = converted["items"]
    name = _referenced_type(source["items"])
    source_items = schemas[name] if name is not None else source["items"]
    for key in converted["x-kubernetes-list-map-keys"]:
        if key in items.get("required", ()):
            continue
        default = source_items["properties"][key].get("default")
        if default is None:
            raise ValueError(f"list-map key {key!r} is neither required nor defaulted in {source}")
        items["properties"][key] = _ordered({**items["properties"][key], "default": default})


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    return {key: node[key] for key in _KEYWORD_ORDER if key in node}


# ---------------------------------------------------------------------------------- the file


def schema_path(kubernetes_version: str) -> Path:
    """Where the schema of a Kubernetes version is stored: one file per minor version."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(\.\d+)?(\S*)", kubernetes_version)
    if match is None:
        raise ValueError(f"not a Kubernetes version: {kubernetes_version!r}")
    return SCHEMAS_DIR / f"podtemplatespec-v{match[1]}.{match[2]}.json"


def render_schema(schema: dict[str, Any], kubernetes_version: str, source: str) -> str:
    """The stored file's text: JSON, with where it came from in its first keys."""
    document = {
        "comment": "Generated by `python -m vigil.api.template_schema` from Kubernetes' OpenAPI: do not edit.",
        "kubernetesVersion": kubernetes_version,
        "source": f"{source}, {ROOT_TYPE}",
        "schema": schema,
    }
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


@cache
def _stored(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def stored(kubernetes_version: str = SUPPORTED_KUBERNETES) -> dict[str, Any]:
    """The stored file of a version, parsed (a fresh copy: callers may change it)."""
    return copy.deepcopy(_stored(schema_path(kubernetes_version)))


def template_schema(kubernetes_version: str = SUPPORTED_KUBERNETES) -> dict[str, Any]:
    """The structural schema of a PodTemplateSpec (a fresh copy)."""
    return stored(kubernetes_version)["schema"]


# ------------------------------------------------------------------------------ the sources


def fetch(kubeconfig: Path) -> tuple[dict[str, Any], str]:
    """The OpenAPI v3 document of the core group, and the version of the API server serving it."""
    from kubernetes import client, config  # only the generator needs a client

    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        version = client.VersionApi(api).get_code(_request_timeout=30).git_version
        method, url, headers, _, _ = api.param_serialize(
            "GET", "/openapi/v3/api/v1", header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = api.call_api(method, url, header_params=headers, _request_timeout=120)
        response.read()
        if response.status != 200:
            raise RuntimeError(f"GET /openapi/v3/api/v1 answered {response.status}: {response.data[:500]!r}")
        return json.loads(response.data), version
    finally:
        api.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vigil.api.template_schema", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-cluster", metavar="KUBECONFIG", type=Path, help="a kube-apiserver to read from")
    source.add_argument("--from-file", metavar="DOC", type=Path, help="a saved /openapi/v3/api/v1 document")
    parser.add_argument("--kubernetes-version", help="the version the saved document came from (with --from-file)")
    parser.add_argument("--output", type=Path, help="where to write (default: schemas/ in the package)")
    args = parser.parse_args(argv)

    if args.from_cluster:
        document, version = fetch(args.from_cluster)
        origin = f"/openapi/v3/api/v1 of kube-apiserver {version}"
    else:
        if not args.kubernetes_version:
            parser.error("--from-file needs --kubernetes-version (the document does not say it)")
        document, version = json.loads(args.from_file.read_text()), args.kubernetes_version
        origin = f"/openapi/v3/api/v1 of Kubernetes {version}"
    output = args.output or schema_path(version)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_schema(convert(document), version, origin))
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
