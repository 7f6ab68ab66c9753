"""Which pods carry the leader's mark when a process begins to lead, and that each label write
lands only on the pod as it was read."""

import asyncio
import copy

import pytest

from tests.support.clock import FakeClock
from vigil.core.election import mark_changes
from vigil.core.podstate import strip_pod
from vigil.kube.errors import Conflict
from vigil.leaderelection.mark import LEADER_LABEL, LeaderMark, OwnPod

pytestmark = pytest.mark.unit


def test_the_new_leader_marks_itself_first_and_unmarks_every_other():
    changes = mark_changes("op-b", "vigil", ["op-a", "op-c", "op-b"])
    assert list(changes.items()) == [("op-b", "vigil"), ("op-a", None), ("op-c", None)]


def test_a_leader_already_marked_alone_only_marks_itself_again():
    assert mark_changes("op-a", "vigil", ["op-a"]) == {"op-a": "vigil"}
    assert mark_changes("op-a", "vigil", []) == {"op-a": "vigil"}


def test_the_own_pod_comes_from_the_downward_api_or_is_none():
    assert OwnPod.from_environment({"POD_NAME": "vigil-7d9-x", "POD_NAMESPACE": "vigil-system"}) == OwnPod(
        "vigil-system", "vigil-7d9-x"
    )
    assert OwnPod.from_environment({"POD_NAME": "vigil-7d9-x"}) is None  # outside a pod, or half told
    assert OwnPod.from_environment({}) is None


class MarkApi:
    """Pods by name with a resourceVersion each; a label write refused (409) unless it names the
    pod's current uid and version, as the API server refuses a patch carrying stale ones. Reads
    answer as Kube's do: stripped to what Vigil keeps of a pod (no leader mark among it)."""

    def __init__(self, pods: dict[str, dict]) -> None:
        self.pods = pods
        self.writes: list[tuple[str, str, str, dict]] = []
        self.conflicts = 0

    async def list_labelled_pods(self, namespace: str, selector: str) -> list[dict]:
        key, _, value = selector.partition("=")
        return [strip_pod(copy.deepcopy(p)) for p in self.pods.values() if p["metadata"]["labels"].get(key) == value]

    async def read_pod(self, namespace: str, name: str) -> dict | None:
        return strip_pod(copy.deepcopy(self.pods[name])) if name in self.pods else None

    async def label_pod(self, namespace: str, name: str, uid: str, rv: str, labels: dict) -> None:
        meta = self.pods[name]["metadata"]
        self.writes.append((name, uid, rv, labels))
        if (meta["uid"], meta["resourceVersion"]) != (uid, rv):
            self.conflicts += 1
            raise Conflict("the object has been modified")
        for key, value in labels.items():
            if value is None:
                meta["labels"].pop(key, None)
            else:
                meta["labels"][key] = value
        meta["resourceVersion"] = str(int(rv) + 1)


def pod(name: str, rv: int, **labels: str) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv), "labels": dict(labels)}}


def test_the_mark_is_written_only_on_pods_as_read_and_a_conflict_is_read_again():
    async def scenario() -> MarkApi:
        clock = FakeClock()
        api = MarkApi({"op-a": pod("op-a", 10, **{LEADER_LABEL: "vigil"}), "op-b": pod("op-b", 20)})
        mark = LeaderMark(api, OwnPod("ns", "op-b"), "vigil", clock)  # type: ignore[arg-type]
        real_read = api.read_pod

        async def read_then_changed(namespace: str, name: str) -> dict | None:
            read = await real_read(namespace, name)
            if not api.conflicts and not api.writes:  # the kubelet updates the pod right after the read
                api.pods[name]["metadata"]["resourceVersion"] = "21"
            return read

        api.read_pod = read_then_changed  # type: ignore[method-assign]
        await mark.start()
        assert await clock.until(lambda: api.pods["op-b"]["metadata"]["labels"].get(LEADER_LABEL) == "vigil", 30)
        await clock.until(lambda: LEADER_LABEL not in api.pods["op-a"]["metadata"]["labels"], 30)
        await mark.stop()
        return api

    api = asyncio.run(scenario())
    assert api.conflicts == 1, "the write on the version read before the kubelet's update was refused"
    assert all(uid == f"uid-{name}" for name, uid, _, _ in api.writes)
    assert LEADER_LABEL not in api.pods["op-a"]["metadata"]["labels"]
    assert LEADER_LABEL not in api.pods["op-b"]["metadata"]["labels"], "stopping removes its own mark"
