"""`vigil release-finalizers`, without a cluster: the operator is stopped before anything is
released, every pod that carries Vigil's finalizer in the namespaces given is released (labelled
by Vigil or not), nothing else is touched, and an operator that will not stop releases nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.clock import FakeClock
from vigil import finalizers
from vigil.manager import watch_scopes

pytestmark = pytest.mark.unit

FINALIZER = "vigil.dev/attempt-tracking"


def pod(namespace: str, name: str, *held: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}", "finalizers": list(held)}}


class Api:
    """Pods by namespace, listed two a page; the operator's Deployment and its pods."""

    def __init__(self, pods: list[dict[str, Any]], operator_pods: int = 0, operator_leaves_after: int = 0):
        self.pods, self.calls = pods, []
        self.operator_pods, self.leaves_after, self.lists_of_operator = operator_pods, operator_leaves_after, 0

    async def deployment_selector(self, namespace, name):
        self.calls.append(("get deployment", namespace, name))
        return "app=vigil" if name == "vigil" else None

    async def scale_deployment(self, namespace, name, replicas):
        self.calls.append(("scale", namespace, name, replicas))
        return True

    async def list_pods(self, namespace, label_selector=None, limit=100):
        if label_selector == "app=vigil":
            self.lists_of_operator += 1
            left = self.operator_pods if self.lists_of_operator <= self.leaves_after else 0
            yield [pod(namespace, f"vigil-{i}") for i in range(left)]
            return
        self.calls.append(("list", namespace))
        mine = [p for p in self.pods if namespace is None or p["metadata"]["namespace"] == namespace]
        for start in range(0, len(mine), 2):
            yield mine[start : start + 2]

    async def release_pod(self, namespace, name, uid):
        self.calls.append(("release", namespace, name))


PODS = [
    pod("team-a", "a-1", FINALIZER),
    pod("team-a", "a-2", "example.com/theirs", FINALIZER),
    pod("team-a", "a-3", "example.com/theirs"),
    pod("team-b", "b-1", FINALIZER),
    pod("other", "o-1", FINALIZER),
]


def released(api: Api) -> list[str]:
    return [call[2] for call in api.calls if call[0] == "release"]


@pytest.mark.parametrize(
    ("namespaces", "expected"),
    [
        ([], ["a-1", "a-2", "b-1", "o-1"]),
        (["team-a", "team-b"], ["a-1", "a-2", "b-1"]),
        (["team-*"], ["a-1", "a-2", "b-1"]),
    ],
)
def test_every_pod_that_carries_the_finalizer_in_the_namespaces_given_is_released(namespaces, expected):
    api = Api(PODS)
    scopes, accept = watch_scopes(namespaces)
    done = asyncio.run(finalizers.release_all(api, scopes, accept))  # type: ignore[arg-type]
    assert released(api) == expected
    assert done.pods == len(expected)


def test_a_dry_run_changes_nothing():
    api = Api(PODS)
    done = asyncio.run(finalizers.release_all(api, [None], lambda pod: True, dry_run=True))  # type: ignore[arg-type]
    assert released(api) == [] and done.pods == 4


def test_the_operator_is_stopped_and_gone_before_anything_is_released():
    clock = FakeClock()
    api = Api(PODS, operator_pods=2, operator_leaves_after=3)

    async def stop() -> bool:
        task = asyncio.ensure_future(finalizers.stop_operator(api, "vigil-system", "vigil", 120, clock))  # type: ignore[arg-type]
        assert await clock.until(task.done, 120)
        return task.result()

    assert asyncio.run(stop()) is True
    assert api.calls[:2] == [("get deployment", "vigil-system", "vigil"), ("scale", "vigil-system", "vigil", 0)]
    assert api.lists_of_operator == 4, "polled until its pods were gone"


def test_an_operator_that_will_not_stop_is_named_and_nothing_is_released():
    clock = FakeClock()
    api = Api(PODS, operator_pods=1, operator_leaves_after=10**6)

    async def stop() -> None:
        task = asyncio.ensure_future(finalizers.stop_operator(api, "vigil-system", "vigil", 30, clock))  # type: ignore[arg-type]
        await clock.until(task.done, 60)
        task.result()

    with pytest.raises(finalizers.OperatorStillRunning, match=r"vigil-0\) were still there after 30s"):
        asyncio.run(stop())
    assert released(api) == []


def test_no_deployment_is_nothing_to_stop():
    api = Api(PODS)
    assert asyncio.run(finalizers.stop_operator(api, "vigil-system", "gone", 30, FakeClock())) is False  # type: ignore[arg-type]
    assert ("scale", "vigil-system", "gone", 0) not in api.calls


def test_the_hooks_own_pod_is_not_waited_for(monkeypatch):
    # The chart's pre-delete hook pod carries the release's labels, which the Deployment's selector
    # matches: on a real cluster every uninstall waited for the hook itself, then failed.
    monkeypatch.setattr(finalizers.socket, "gethostname", lambda: "vigil-0")
    api = Api(PODS, operator_pods=1, operator_leaves_after=10**6)
    assert asyncio.run(finalizers.stop_operator(api, "vigil-system", "vigil", 30, FakeClock())) is True  # type: ignore[arg-type]
