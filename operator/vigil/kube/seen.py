"""What one list+watch has delivered so far: the identity and version of every object, and
nothing else.

A watch is a stream of changes that can break at any point: a connection that ends, a 410 Gone
that forces a new list, a stall that is only noticed later. Between the last event before the
break and the list after it, objects may be created, changed and deleted unseen. `SeenObjects`
turns both kinds of input, single watch events and whole lists, into one stream of `Delta`s in
which every object that existed is reported as it is now, and every object that disappeared is
reported deleted exactly once, whether its DELETED event arrived or it was simply missing
from the next list. It is pure: no I/O, no clock.

It remembers, per object key (namespace, name), the UID and resourceVersion last delivered, and
the labels and owners a consumer needs to file a delete found by a relist (`_tombstone`), in
tuples of shared strings: a few hundred bytes an object (`tests/unit/kube/test_seen.py` bounds
it), not the object. The objects themselves are kept by whoever consumes the deltas, in the
types they need.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from vigil.core import fields
from vigil.core.fields import Obj
from vigil.core.objects import Key, is_older_version, key_of


@dataclass(frozen=True, slots=True)
class Delta:
    """One change to hand on: an object as it is now (`upsert`), or gone (`delete`, carrying the
    last version delivered, or the final state the DELETED event brought)."""

    kind: Literal["upsert", "delete"]
    obj: Obj


@dataclass(frozen=True, slots=True)
class _Version:
    uid: str
    resource_version: str


def _version(obj: Obj) -> _Version:
    return _Version(fields.uid(obj), fields.metadata(obj).get("resourceVersion", ""))


class SeenObjects:
    """Per key, the UID and resourceVersion last delivered; turns watch events and relists into
    deltas, with every disappearance reported exactly once."""

    def __init__(self) -> None:
        self._seen: dict[Key, _Version] = {}
        self._last: dict[Key, _Last] = {}  # only for deletes found by a relist: their last state
        self._shared: dict[Any, Any] = {}  # canonical label pairs and owner lists, shared by objects

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, key: object) -> bool:
        return key in self._seen

    def event(self, type_: str, obj: Obj) -> list[Delta]:
        """One watch event (ADDED, MODIFIED, DELETED). Duplicates and versions older than the one
        delivered are dropped; a new UID under a known name is the old object's deletion first."""
        key, version = key_of(obj), _version(obj)
        known = self._seen.get(key)
        if type_ == "DELETED":
            if known is None or known.uid != version.uid:
                return []  # already reported gone (a relist found it missing first)
            self._forget(key)
            return [Delta("delete", obj)]
        deltas: list[Delta] = []
        if known is not None:
            if known.uid == version.uid:
                if known.resource_version == version.resource_version or is_older_version(
                    version.resource_version, known.resource_version
                ):
                    return []
            else:
                deltas.append(Delta("delete", self._tombstone(key, known)))
        self._remember(key, version, obj)
        deltas.append(Delta("upsert", obj))
        return deltas

    def dropped(self, obj: Obj) -> list[Delta]:
        """An object the consumer no longer keeps although it still exists (a transform refused
        this version of it): reported deleted once, with the last version delivered, if one was;
        a later version that is kept again comes as new."""
        key = key_of(obj)
        if key not in self._seen:
            return []
        last = self._tombstone(key, self._seen[key])
        self._forget(key)
        return [Delta("delete", last)]

    def relist(self, items: Iterable[Obj]) -> list[Delta]:
        """A complete list, as of one resourceVersion: what changed since the last delivery is
        upserted, what is no longer there is deleted, each once; unchanged objects are quiet."""
        listed: dict[Key, Obj] = {key_of(obj): obj for obj in items}
        deltas = [
            Delta("delete", self._tombstone(key, known))
            for key, known in list(self._seen.items())
            if key not in listed or _version(listed[key]).uid != known.uid
        ]
        for delta in deltas:
            self._forget(key_of(delta.obj))
        for key, obj in listed.items():
            version, known = _version(obj), self._seen.get(key)
            if known == version:
                continue
            self._remember(key, version, obj)
            deltas.append(Delta("upsert", obj))
        return deltas

    def _remember(self, key: Key, version: _Version, obj: Obj) -> None:
        self._seen[key] = version
        metadata = fields.metadata(obj)
        labels = tuple(self._share((sys.intern(k), sys.intern(v))) for k, v in (metadata.get("labels") or {}).items())
        owners = self._share(
            tuple(
                tuple((sys.intern(k), sys.intern(v) if isinstance(v, str) else v) for k, v in ref.items())
                for ref in metadata.get("ownerReferences") or ()
            )
        )
        self._last[key] = (labels, owners)

    def _forget(self, key: Key) -> None:
        del self._seen[key]
        del self._last[key]

    def _share(self, value: Any) -> Any:
        """The one copy of `value` held (an owner list is the same for every pod of a job). The
        table is emptied when full: what was shared stays shared, new values start a new table."""
        shared = self._shared.get(value)
        if shared is None:
            if len(self._shared) >= _SHARED_MAX:
                self._shared.clear()
            shared = self._shared[value] = value
        return shared

    def _tombstone(self, key: Key, version: _Version) -> Obj:
        """What a delete found by a relist carries: the object's identity and its labels and
        owners, enough for a consumer to find what it filed the object under (its job, its index)."""
        labels, owners = self._last[key]
        metadata: dict[str, Any] = {"name": key[1], "uid": version.uid, "resourceVersion": version.resource_version}
        if key[0]:
            metadata["namespace"] = key[0]
        if labels:
            metadata["labels"] = dict(labels)
        if owners:
            metadata["ownerReferences"] = [dict(ref) for ref in owners]
        return {"metadata": metadata}


_Last = tuple[tuple[tuple[str, str], ...], tuple[tuple[tuple[str, Any], ...], ...]]
_SHARED_MAX = 65_536
