"""A list+watch's deltas: every object that exists is reported, every disappearance exactly
once, whether the watch said DELETED or a relist found the object missing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.kube.seen import SeenObjects

pytestmark = pytest.mark.unit


def obj(name: str, uid: str, version: int, **labels: str) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid, "resourceVersion": str(version), "labels": labels}
    }


def kinds(deltas) -> list[tuple[str, str, str]]:
    return [(d.kind, d.obj["metadata"]["name"], d.obj["metadata"]["uid"]) for d in deltas]


def test_a_relist_reports_what_vanished_while_the_watch_was_down_once():
    seen = SeenObjects()
    seen.event("ADDED", obj("a", "u1", 1, job="x"))
    seen.event("ADDED", obj("b", "u2", 2))
    deltas = seen.relist([obj("b", "u2", 2)])
    assert kinds(deltas) == [("delete", "a", "u1")]
    assert deltas[0].obj["metadata"]["labels"] == {"job": "x"}, "a tombstone says what the object was filed under"
    assert seen.event("DELETED", obj("a", "u1", 3)) == [], "the late DELETED is not reported again"
    assert seen.relist([obj("b", "u2", 2)]) == [], "an unchanged object is quiet"


def test_duplicates_and_older_versions_are_dropped():
    seen = SeenObjects()
    assert kinds(seen.event("ADDED", obj("a", "u1", 5))) == [("upsert", "a", "u1")]
    assert seen.event("MODIFIED", obj("a", "u1", 5)) == []
    assert seen.event("MODIFIED", obj("a", "u1", 4)) == []
    assert kinds(seen.event("MODIFIED", obj("a", "u1", 6))) == [("upsert", "a", "u1")]


def test_a_new_uid_under_a_known_name_is_the_old_ones_deletion_first():
    seen = SeenObjects()
    seen.event("ADDED", obj("a", "u1", 1))
    assert kinds(seen.event("ADDED", obj("a", "u2", 9))) == [("delete", "a", "u1"), ("upsert", "a", "u2")]
    assert kinds(seen.relist([obj("a", "u3", 12)])) == [("delete", "a", "u2"), ("upsert", "a", "u3")]
    assert seen.event("DELETED", obj("a", "u2", 13)) == [], "the old one's DELETED comes too late to matter"


# A world of a few names, each object with a UID per incarnation; the watch may drop any event.
names = st.sampled_from(["a", "b", "c"])
steps = st.lists(
    st.one_of(
        st.tuples(st.just("create"), names),
        st.tuples(st.just("update"), names),
        st.tuples(st.just("delete"), names),
        st.tuples(st.just("relist"), st.just("")),
    ),
    max_size=40,
)


class World:
    """The API server's truth for a few names: each object a UID per incarnation, and the names
    whose current version the consumer's transform refuses ("disown"). `step` applies one
    operation and returns the watch event it makes, if any."""

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.refused: set[str] = set()
        self.incarnation = self.version = 0

    def step(self, op: str, name: str) -> tuple[str, dict] | None:
        self.version += 1
        if op == "create" and name not in self.objects:
            self.incarnation += 1
            self.objects[name] = obj(name, f"{name}{self.incarnation}", self.version)
            self.refused.discard(name)
            return "ADDED", self.objects[name]
        if op in ("update", "disown") and name in self.objects:
            self.objects[name] = obj(name, self.objects[name]["metadata"]["uid"], self.version)
            (self.refused.add if op == "disown" else self.refused.discard)(name)
            return "MODIFIED", self.objects[name]
        if op == "delete" and name in self.objects:
            return "DELETED", obj(name, self.objects.pop(name)["metadata"]["uid"], self.version)
        return None

    def kept(self) -> list[dict]:
        return [o for n, o in self.objects.items() if n not in self.refused]


def uids(objects) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["uid"] for o in objects}


@settings(max_examples=300, deadline=None)
@given(steps, st.lists(st.booleans(), min_size=40, max_size=40))
def test_deltas_track_the_truth_whatever_the_watch_drops(script, delivered):
    world, seen, view, deleted_uids = World(), SeenObjects(), {}, set()

    def apply(deltas):
        for delta in deltas:
            meta = delta.obj["metadata"]
            if delta.kind == "delete":
                assert view.pop(meta["name"])["metadata"]["uid"] == meta["uid"], "a delete names what was shown"
                assert meta["uid"] not in deleted_uids, "each disappearance is reported once"
                deleted_uids.add(meta["uid"])
            else:
                assert meta["uid"] not in deleted_uids, "nothing comes back from the dead"
                view[meta["name"]] = delta.obj

    for (op, name), heard in zip(script, delivered, strict=False):
        if op == "relist":
            apply(seen.relist(world.kept()))
            assert uids(view.values()) == uids(world.kept())
        elif (event := world.step(op, name)) is not None and heard:
            apply(seen.event(*event))
    apply(seen.relist(world.kept()))
    assert uids(view.values()) == uids(world.kept())


ops_with_refusals = st.lists(
    st.one_of(
        st.tuples(st.just("create"), names),
        st.tuples(st.just("update"), names),
        st.tuples(st.just("disown"), names),  # an update the consumer's transform refuses
        st.tuples(st.just("delete"), names),
        st.tuples(st.just("relist"), st.just("")),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops_with_refusals, st.lists(st.booleans(), min_size=40, max_size=40))
def test_objects_a_transform_refuses_are_reported_gone_once_whatever_the_watch_drops(script, delivered):
    """The informer hands a refused version to `dropped` and a relist only what it keeps: the
    consumer's view is then the kept part of the world after every relist, every delete names
    what it was shown, and a refused object is deleted once until it is shown again."""
    world, seen, view = World(), SeenObjects(), {}

    def apply(deltas):
        for delta in deltas:
            meta = delta.obj["metadata"]
            if delta.kind == "delete":
                assert view.pop(meta["name"])["metadata"]["uid"] == meta["uid"], "a delete names what was shown"
            else:
                view[meta["name"]] = delta.obj

    for (op, name), heard in zip(script, delivered, strict=False):
        if op == "relist":
            apply(seen.relist(world.kept()))
            assert uids(view.values()) == uids(world.kept())
        elif (event := world.step(op, name)) is not None and heard:
            apply(seen.dropped(event[1]) if name in world.refused else seen.event(*event))
    apply(seen.relist(world.kept()))
    assert uids(view.values()) == uids(world.kept())


def test_a_tombstone_keeps_the_owner_and_the_labels_and_costs_a_few_hundred_bytes_an_object():
    """A pod watch remembers every pod of every job (100,000 tasks of one array, say): what it
    keeps per pod must be its identity and what files it, not a copy of the pod."""
    import json
    import tracemalloc

    owner = {"apiVersion": "vigil.dev/v1beta1", "kind": "VigilJob", "name": "a", "uid": "j" * 36, "controller": True}

    def pod(i: int) -> dict:
        labels = {"vigil.dev/job-uid": "j" * 36, "vigil.dev/attempt": "1", "vigil.dev/task-index": str(i)}
        made = obj(f"a-{i}-1", f"{i:036d}", 1000 + i, **labels)
        made["metadata"]["ownerReferences"] = [dict(owner)]
        return json.loads(json.dumps(made))  # as the watch decodes it: every string its own

    seen = SeenObjects()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(10_000):
        seen.event("ADDED", pod(i))
    per_object = (tracemalloc.get_traced_memory()[0] - before) / 10_000
    tracemalloc.stop()
    (gone,) = seen.relist([pod(i) for i in range(1, 10_000)])
    assert gone.kind == "delete" and gone.obj == pod(0), "the tombstone is the identity, labels and owners"
    print(f"bytes a seen object: {per_object:.0f}")
    assert per_object < 1000, per_object
