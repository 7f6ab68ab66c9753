"""The bytes of an AdmissionReview down to the few fields the webhook reads (`skim`).

A review's body can be megabytes of JSON, and decoding it builds every object in it: on the
2-core bed a 3 MiB body of `[{},{},...]` takes 0.5 s of CPU in `json.loads` (orjson is no
better), all of it holding the GIL. The webhook therefore runs `skim` in a child process for any
body that is not small (`vigil.servers.webhook`), and hands back only what `skim` keeps: a few
short fields, so that sending the answer back costs nothing either.

An array's `spec.tasks.items` (up to 100,000 JSON values, 512 KiB of them) is read for its
length alone: `skim` keeps that number, under ITEMS_COUNT, never the items, so what comes back
from the child stays a few hundred bytes whatever the array holds.

This module imports nothing but `json`: the child process that runs it imports it alone, not
pydantic, not the rest of Vigil (a few MiB of memory rather than tens). The shape of what it
keeps is checked afterwards, on the small result, by `vigil.core.admission.read`.
"""

from __future__ import annotations

import json
from typing import Any


class Length:
    """In READ: a list read for its length alone, kept as `key: len(list)` (the list dropped).
    Anything else found there is kept as evidence of its kind, under the list's own key."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


# The key `skim` writes for the length of spec.tasks.items. It is not in READ, so a body that
# carries a key of that name itself has it dropped like any other unread field.
ITEMS_COUNT = "itemsCount"

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
        "object": {
            "metadata": {"name": None, "namespace": None, "uid": None},
            "spec": {"queue": None, "tasks": {"count": None, "items": Length(ITEMS_COUNT)}},
        },
    },
}


class NotJson(ValueError):
    """The body does not decode as JSON; the message says why, for the 400 the caller sends."""


def skim(body: bytes) -> Any:
    """The fields of READ found in `body` (whatever `body` holds: its shape is checked later).
    Raises NotJson, saying what is wrong, when it does not decode; nothing else.

    A value of the wrong kind is kept as evidence of its kind only: a container where a scalar or
    another container is expected becomes an empty one of its type, so the check that follows can
    say "request.resource: expected an object, got an array" without the array coming along. A
    list read for its length (spec.tasks.items) is kept as that length alone (ITEMS_COUNT).
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
        kept: dict[str, Any] = {}
        for key, sub in shape.items():
            if key not in value:
                continue
            if isinstance(sub, Length):
                if isinstance(value[key], list):
                    kept[sub.key] = len(value[key])  # the items themselves are not kept
                else:
                    kept[key] = _pick(value[key], None)
            else:
                kept[key] = _pick(value[key], sub)
        return kept
    if isinstance(value, list):
        return []
    return value
