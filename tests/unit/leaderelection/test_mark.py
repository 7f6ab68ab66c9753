"""Which pods carry the leader's mark when a process begins to lead."""

import pytest

from vigil.core.election import mark_changes
from vigil.leaderelection.mark import OwnPod

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
