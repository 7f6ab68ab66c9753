"""The bytes of an AdmissionReview down to the few fields the webhook reads (`skim`).

A review's body can be megabytes of JSON, and decoding it builds every object in it: on the
2-core bed a 3 MiB body of `[{},{},...]` takes 0.5 s of CPU in `json.loads` (orjson is no
better), all of it holding the GIL. The webhook therefore runs `skim` in a child process for any
body that is not small (`vigil.servers.webhook`), and hands back only what `skim` keeps: a few
short fields, so that sending the answer back costs nothing either.

This module imports nothing but `json`: the child process that runs it imports it alone, not
pydantic, not the rest of Vigil (a few MiB of memory rather than tens). The shape of what it
keeps is checked afterwards, on the small result, by `vigil.core.admission.read`.
"""

from __future__ import annotations

import json
from typing import Any

# The fields read, as nested keys; None marks a leaf (a scalar is expected there).
READ: dict[str, Any] = {
    "apiVersion": None,
    "kind": None,
    "request": {
        "uid": None,
        "name": None,
        "namespace": None,
        "operation": None,
        "dryRun": None,
        "resource": {"group": None, "version": None, "resource": None},
        "object": {"metadata": {"name": None, "namespace": None, "uid": None}, "spec": {"queue": None}},
    },
}


class NotJson(ValueError):
    """The body does not decode as JSON; the message says why, for the 400 the caller sends."""


def skim(body: bytes) -> Any:
    """The fields of READ found in `body` (whatever `body` holds: its shape is checked later).
    Raises NotJson, saying what is wrong, when it does not decode; nothing else.

    A value of the wrong kind is kept as evidence of its kind only: a container where a scalar or
    another container is expected becomes an empty one of its type, so the check that follows can
    say "request.resource: expected an object, got an array" without the array coming along.
    """
    try:
        value = json.loads(body)
    except RecursionError:
        raise NotJson("the body's JSON is nested too deeply for an AdmissionReview") from None
    except UnicodeDecodeError as err:
        raise NotJson(f"the body is not UTF-8 JSON: {err.reason} at byte {err.start}") from None
    except ValueError as err:  # json.JSONDecodeError says where: "Expecting value: line 1 column 2 (char 1)"
        raise NotJson(f"the body is not JSON: {err}") from None
    return keep(value)


def keep(value: Any) -> Any:
    """The fields of READ in a decoded review, each container of the wrong kind left empty."""
    return _pick(value, READ)


def _pick(value: Any, shape: dict[str, Any] | None) -> Any:
    if isinstance(value, dict):
        if shape is None:
            return {}
        return {key: _pick(value[key], sub) for key, sub in shape.items() if key in value}
    if isinstance(value, list):
        return []
    return value
