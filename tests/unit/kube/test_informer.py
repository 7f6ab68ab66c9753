"""The informer without a cluster: a scripted API server whose watch breaks in each way a network
can break it. What must hold: every object gone meanwhile is reported deleted once, and
`fresh()` is false from the moment the watch is in doubt until it has listed again."""

from __future__ import annotations

import asyncio
import copy
import random

import pytest

from tests.support.clock import FakeClock
from vigil.core.podstate import strip_pod
from vigil.kube import informer as informer_module
from vigil.kube.errors import Expired, Stalled
from vigil.kube.informer import Freshness, Informer

pytestmark = pytest.mark.unit


def obj(name: str, version: int) -> dict:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": str(version)}}


class ScriptedReader:
    """Lists return the current world; each watch plays the next script entry: a list of events
    then an ending ('end', 'stall', 'gone', or 'hang' to wait until cancelled)."""

    def __init__(self, world: dict[str, dict], watches: list[tuple[list[dict], str]]):
        self.world, self.watches = world, watches
        self.lists = 0
        self.pages: list[int] = []
        self.watch_versions: list[str] = []
        self.done = asyncio.Event()

    async def list_all(self, path, params, page=500, keep=None, page_bytes=None):
        self.lists += 1
        self.pages.append(page)
        items = [copy.deepcopy(o) for o in self.world.values()]
        return [k for item in items if (k := (keep or (lambda o: o))(item)) is not None], "100"

    async def watch(self, path, params, deadline, on_bytes, pace=0.0):
        self.watch_versions.append(params["resourceVersion"])
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()
        events, ending = self.watches.pop(0)
        on_bytes()
        for event in events:
            yield event
        if ending == "stall":
            raise Stalled("scripted")
        if ending == "gone":
            raise Expired("too old")
        if ending == "hang":
            self.done.set()
            await asyncio.Event().wait()


def run(reader: ScriptedReader, deltas: list, check=None, **options) -> Informer:
    """Runs an informer on a fake clock until the script is played out, then `check(informer, clock)`."""

    async def main():
        clock = FakeClock()
        informer = Informer(reader, "/p", deltas.append, name="test", rng=random.Random(1), clock=clock, **options)
        task = asyncio.create_task(informer.run())
        assert await clock.until(reader.done.is_set, within=60), "the informer did not play the script out"
        if check:
            await check(informer, clock)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return informer

    return asyncio.run(main())


def names(deltas) -> list[tuple[str, str]]:
    return [(d.kind, d.obj["metadata"]["name"]) for d in deltas]


def test_a_stalled_watch_is_replaced_by_a_relist_that_reports_what_vanished(monkeypatch):
    world = {"a": obj("a", 1), "b": obj("b", 2)}
    reader = ScriptedReader(world, [([{"type": "MODIFIED", "object": obj("a", 3)}], "stall"), ([], "end")])
    deltas: list = []

    original = reader.list_all

    async def list_all(path, params, **options):
        if reader.lists == 1:  # b was deleted while the watch was stalled: no DELETED ever came
            world.pop("b")
            world["a"] = obj("a", 3)  # as the watch delivered it
        return await original(path, params, **options)

    reader.list_all = list_all
    informer = run(reader, deltas)
    assert names(deltas) == [("upsert", "a"), ("upsert", "b"), ("upsert", "a"), ("delete", "b")]
    assert reader.lists == 2 and informer.relists == 1


def test_410_gone_relists_and_a_normal_end_resumes_without_listing():
    reader = ScriptedReader({"a": obj("a", 1)}, [([], "end"), ([], "gone"), ([], "end")])
    deltas: list = []
    run(reader, deltas)
    assert reader.lists == 2, "one list at start, one after 410; a watch that merely ended resumes"
    assert reader.watch_versions == ["100", "100", "100", "100"]


def pod(name: str, version: int) -> dict:
    whole = obj(name, version)
    whole["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    return {**whole, "spec": {"nodeName": "n", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}


def test_what_is_listed_and_watched_is_delivered_trimmed():
    reader = ScriptedReader({"a": pod("a", 1)}, [([{"type": "MODIFIED", "object": pod("b", 2)}], "end")])
    deltas: list = []
    run(reader, deltas)  # by default, only managedFields go
    assert [d.obj["spec"]["containers"] for d in deltas] == [[{"name": "c"}]] * 2
    assert not any("managedFields" in d.obj["metadata"] for d in deltas)

    reader = ScriptedReader({"a": pod("a", 1)}, [([{"type": "MODIFIED", "object": pod("b", 2)}], "end")])
    deltas = []
    run(reader, deltas, trim=strip_pod)  # the pod watches' choice
    assert [(d.obj["spec"], d.obj["status"]) for d in deltas] == [({"nodeName": "n"}, {"phase": "Running"})] * 2
    assert not any("managedFields" in d.obj["metadata"] for d in deltas)


def owned(name: str, version: int, owner: bool = True) -> dict:
    whole = obj(name, version)
    if owner:
        whole["metadata"]["ownerReferences"] = [{"kind": "VigilJob", "uid": "j", "controller": True}]
    return whole


def keep_owned(o: dict) -> dict | None:
    return o if o["metadata"].get("ownerReferences") else None


def test_an_object_the_transform_refuses_is_never_remembered_nor_delivered():
    """As client-go's SetTransform with a filtering handler: refused objects cost nothing (not
    even an entry in SeenObjects); one that was delivered and is then refused (its owner
    reference removed) is reported deleted once; kept again, it comes back as new."""
    world = {"a": owned("a", 1), "x": owned("x", 1, owner=False)}
    events = [
        {"type": "ADDED", "object": owned("y", 2, owner=False)},
        {"type": "MODIFIED", "object": owned("a", 3, owner=False)},  # no longer kept: gone
        {"type": "MODIFIED", "object": owned("a", 4, owner=False)},  # still not: nothing more
        {"type": "DELETED", "object": owned("y", 5, owner=False)},
        {"type": "MODIFIED", "object": owned("a", 6)},  # kept again
    ]
    reader = ScriptedReader(world, [(events, "end")])
    deltas: list = []
    informer = run(reader, deltas, trim=keep_owned, page=7)
    assert names(deltas) == [("upsert", "a"), ("delete", "a"), ("upsert", "a")]
    assert deltas[1].obj["metadata"]["resourceVersion"] == "1", "the delete carries the last version delivered"
    assert len(informer.seen) == 1 and reader.pages == [7]


def test_a_relist_reports_an_object_refused_meanwhile_as_deleted_once():
    world = {"a": owned("a", 1)}
    reader = ScriptedReader(
        world, [([], "gone"), ([{"type": "MODIFIED", "object": owned("a", 3, owner=False)}], "end")]
    )
    original = reader.list_all

    async def list_all(path, params, **options):
        if reader.lists == 1:
            world["a"] = owned("a", 2, owner=False)  # its owner reference removed while unwatched
        return await original(path, params, **options)

    reader.list_all = list_all
    deltas: list = []
    run(reader, deltas, trim=keep_owned)
    assert names(deltas) == [("upsert", "a"), ("delete", "a")]


def test_bookmarks_move_the_resume_point():
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}}
    reader = ScriptedReader({}, [([bookmark], "end")])
    run(reader, [])
    assert reader.watch_versions == ["100", "150"]


def test_fresh_only_while_the_watch_is_trusted(monkeypatch):
    reader = ScriptedReader({}, [([], "hang")])

    async def check(informer: Informer, clock: FakeClock):
        assert informer.fresh()
        informer.repair("a direct read showed a beat the watch missed")
        assert not informer.fresh(), "in doubt from the moment of repair()"
        assert await clock.until(informer.fresh, within=0), "fresh again once it has listed, with no time passing"
        assert reader.lists == 2, "fresh again after listing"

    reader.watches.append(([], "hang"))
    run(reader, [], check)


def test_freshness_rules():
    freshness = Freshness(deadline=60)
    assert not freshness.fresh(0), "never fresh before the first list"
    freshness.synced = True
    freshness.recovered(10)
    assert freshness.fresh(69.9)
    assert not freshness.fresh(70), "no progress for the whole deadline"
    freshness.progress(65)
    freshness.broken = True
    assert not freshness.fresh(66), "a failure ends freshness at once"


def test_retry_delays_grow_and_are_capped():
    clock = FakeClock()
    informer = Informer(None, "/p", lambda d: None, name="t", rng=random.Random(3), clock=clock)  # type: ignore[arg-type]
    delays = []

    async def pause(failures: int) -> float:
        began = clock.now
        pausing = asyncio.ensure_future(informer._pause(failures, "test"))
        assert await clock.until(pausing.done, within=3600)
        return clock.now - began

    for failures in range(1, 12):
        delays.append(asyncio.run(pause(failures)))
    first, largest = informer_module.RETRY_DELAYS
    assert first / 2 <= delays[0] <= first
    assert all(d <= largest for d in delays) and delays[-1] >= largest / 2
