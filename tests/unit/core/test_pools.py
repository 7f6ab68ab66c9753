"""A worker pool's decision (vigil.core.pools): how many workers, which pods to create and which
to delete, the pods' manifest, and the status; with properties over any pods and load: it never
deletes a busy worker, never wants fewer than minReplicas or more than maxReplicas, and keeps
exactly `desired` live pods when it can."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil import api
from vigil.core.manifest import BEAT_TOKEN_DIR, BEAT_TOKEN_VOLUME, BeatChannel
from vigil.core.pools import (
    EMPTY_LOAD,
    PoolLoad,
    ScaleMemory,
    decide_pool,
    keep_pool_pod,
    pool_of,
    pull_url,
    random_suffix,
    removal_candidates,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CHANNEL = BeatChannel("https://vigil.vigil-system.svc:8443/v1/heartbeat", "-----BEGIN CERTIFICATE-----\n...")
UID = "pool-uid-1"
TEMPLATE = {
    "metadata": {"labels": {"app": "etl"}},
    "spec": {
        "containers": [
            {"name": "worker", "image": "etl:1", "command": ["vigil-worker", "--", "python", "task.py"], "env": [
                {"name": "MODE", "value": "fast"},
                {"name": "VIGIL_POOL", "value": "forged"},
            ]}
        ],
        "initContainers": [{"name": "setup", "image": "etl:1"}],
    },
}  # fmt: skip


def pool(
    name: str = "etl",
    status: dict[str, Any] | None = None,
    generation: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {"name": name, "namespace": "team-a", "uid": UID, "generation": generation, "resourceVersion": "7"},
        "spec": {"template": TEMPLATE, **spec},
        "status": status or {},
    }


def pod(
    name: str,
    *,
    phase: str = "Running",
    ready: bool = True,
    ready_since: str = "2026-03-01T11:00:00Z",
    created: str = "2026-03-01T10:00:00Z",
    owner_uid: str = UID,
    deleting: bool = False,
    pool_name: str = "etl",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "team-a",
        "uid": f"uid-{name}",
        "resourceVersion": "3",
        "creationTimestamp": created,
        "labels": {api.LABEL_POOL: pool_name},
        "ownerReferences": [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.POOL_KIND,
                "name": pool_name,
                "uid": owner_uid,
                "controller": True,
            }
        ],
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-03-01T11:59:00Z"
    condition = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_since}
    return {"metadata": metadata, "spec": {}, "status": {"phase": phase, "conditions": [condition]}}


def names() -> Any:
    counter = itertools.count()
    return lambda: f"n{next(counter):04d}"


def decide(p: dict[str, Any], pods: list[dict[str, Any]], load: PoolLoad = EMPTY_LOAD, **options: Any) -> Any:
    options.setdefault("now", NOW)
    options.setdefault("monotonic", 100.0)
    options.setdefault("beat_channel", CHANNEL)
    options.setdefault("suffix", names())
    return decide_pool(p, pods, load, **options)


def created_names(decision: Any) -> list[str]:
    return [c.manifest["metadata"]["name"] for c in decision.create]


def deleted_names(decision: Any) -> list[str]:
    return [d.name for d in decision.delete]


# --------------------------------------------------------------------------------- scaling


def test_a_new_pool_creates_its_minimum_at_once_and_says_so():
    decision = decide(pool(minReplicas=2), [])
    assert created_names(decision) == ["etl-n0000", "etl-n0001"]
    assert decision.delete == ()
    status = decision.status
    assert status["desiredReplicas"] == 2 and status["replicas"] == 0 and status["readyReplicas"] == 0
    assert status["selector"] == "vigil.dev/pool=etl"
    assert status["observedGeneration"] == 1
    assert status["lastScaleTime"] == "2026-03-01T12:00:00Z"
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Ready"]["status"] == "False" and ready["Ready"]["reason"] == "WorkersNotReady"
    assert ready["AtMaximum"]["status"] == "False"
    assert decision.resource_version == "7"


def test_the_backlog_scales_up_at_once_to_ceil_of_work_over_slots_within_the_maximum():
    pods = [pod("etl-a"), pod("etl-b")]
    decision = decide(pool(minReplicas=1, maxReplicas=6, slotsPerWorker=4), pods, PoolLoad(queued=13, running=4))
    assert decision.status["desiredReplicas"] == 5  # ceil(17 / 4)
    assert len(decision.create) == 3
    decision = decide(pool(maxReplicas=6, slotsPerWorker=4), pods, PoolLoad(queued=100, running=8))
    assert decision.status["desiredReplicas"] == 6 and len(decision.create) == 4
    at_max = {c["type"]: c for c in decision.status["conditions"]}["AtMaximum"]
    assert at_max["status"] == "True" and "27 workers" in at_max["message"]


def test_an_idle_pool_keeps_its_minimum_and_zero_minimum_means_no_pods():
    assert decide(pool(minReplicas=0), []).create == ()
    assert decide(pool(minReplicas=0), []).status["desiredReplicas"] == 0
    assert len(decide(pool(minReplicas=3), [pod("etl-a")]).create) == 2


def test_spec_replicas_rules_clamped_to_the_bounds_and_the_backlog_is_ignored():
    pods = [pod(f"etl-{i}") for i in range(3)]
    decision = decide(pool(minReplicas=1, maxReplicas=5, replicas=4), pods, PoolLoad(queued=1000))
    assert decision.status["desiredReplicas"] == 4 and len(decision.create) == 1
    assert decision.memory is None, "no autoscaling, no scale-down window"
    decision = decide(pool(minReplicas=1, maxReplicas=5, replicas=9), pods)
    assert decision.status["desiredReplicas"] == 5
    at_max = {c["type"]: c for c in decision.status["conditions"]}["AtMaximum"]
    assert at_max["status"] == "True" and at_max["message"].startswith("spec.replicas asks for 9")
    decision = decide(pool(minReplicas=2, maxReplicas=5, replicas=0), pods)
    assert decision.status["desiredReplicas"] == 2 and len(decision.delete) == 1


def test_spec_replicas_scales_down_at_once_but_only_idle_workers():
    pods = [pod("etl-a"), pod("etl-b"), pod("etl-c")]
    decision = decide(pool(minReplicas=0, replicas=1), pods, PoolLoad(running=2, busy={"etl-a": 1, "etl-b": 1}))
    assert deleted_names(decision) == ["etl-c"], "the two busy workers stay until idle"
    assert decision.delete[0].uid == "uid-etl-c"


def test_scaling_down_waits_for_the_delay_and_takes_the_windows_highest_figure():
    p = pool(minReplicas=1, maxReplicas=10, scaleDownDelaySeconds=60, status={})
    five = [pod(f"etl-{i}") for i in range(5)]
    first = decide(p, five, PoolLoad(queued=5), monotonic=0.0)
    assert first.status["desiredReplicas"] == 5 and first.delete == ()
    written = pool(minReplicas=1, scaleDownDelaySeconds=60, status=first.status)
    memory = first.memory
    # The backlog falls to 2, then 3: nothing goes before 60 s of wanting fewer.
    second = decide(written, five, PoolLoad(queued=2), monotonic=10.0, memory=memory)
    assert second.status is None or second.status["desiredReplicas"] == 5
    assert second.delete == () and second.requeue_after == pytest.approx(50.0)
    third = decide(written, five, PoolLoad(queued=3), monotonic=30.0, memory=second.memory)
    assert third.delete == ()
    # 60 s after 5 was last wanted: the highest figure of the window (3, wanted at 30 s) rules.
    fourth = decide(written, five, PoolLoad(queued=2), monotonic=60.0, memory=third.memory)
    assert fourth.status["desiredReplicas"] == 3
    assert len(fourth.delete) == 2
    assert fourth.status["lastScaleTime"] == "2026-03-01T12:00:00Z"
    # and 2 once 3 has left the window too
    fifth = decide(written, five, PoolLoad(queued=2), monotonic=90.0, memory=fourth.memory)
    assert fifth.status["desiredReplicas"] == 2


def test_a_new_leader_starts_the_window_from_the_status_desired_figure():
    status = {"desiredReplicas": 4, "lastScaleTime": "2026-03-01T11:00:00Z"}
    four = [pod(f"etl-{i}") for i in range(4)]
    p = pool(scaleDownDelaySeconds=60, status=status)
    decision = decide(p, four, EMPTY_LOAD, monotonic=500.0, memory=None)
    assert decision.status["desiredReplicas"] == 4 and decision.delete == ()
    assert decision.requeue_after == pytest.approx(60.0)
    later = decide(p, four, EMPTY_LOAD, monotonic=560.0, memory=decision.memory)
    assert later.status["desiredReplicas"] == 1 and len(later.delete) == 3


def test_a_zero_delay_scales_down_at_once():
    three = [pod(f"etl-{i}") for i in range(3)]
    p = pool(scaleDownDelaySeconds=0, status={"desiredReplicas": 3, "lastScaleTime": "2026-03-01T11:00:00Z"})
    assert len(decide(p, three, EMPTY_LOAD).delete) == 2


def test_removal_takes_not_ready_workers_first_then_the_most_recently_ready():
    pods = [
        pod("old-ready", ready_since="2026-03-01T08:00:00Z", created="2026-03-01T07:00:00Z"),
        pod("new-ready", ready_since="2026-03-01T11:00:00Z", created="2026-03-01T07:30:00Z"),
        pod("pending", phase="Pending", ready=False, created="2026-03-01T06:00:00Z"),
        pod("unready", ready=False, created="2026-03-01T09:00:00Z"),
    ]
    assert [p["metadata"]["name"] for p in removal_candidates(pods)] == ["unready", "pending", "new-ready", "old-ready"]
    decision = decide(pool(minReplicas=0, replicas=1), pods)
    assert deleted_names(decision) == ["unready", "pending", "new-ready"]


def test_ended_workers_are_deleted_and_replaced_gone_ones_replaced_deleting_ones_not_counted():
    pods = [
        pod("etl-a"),
        pod("etl-failed", phase="Failed", ready=False),
        pod("etl-done", phase="Succeeded", ready=False),
        pod("etl-going", deleting=True),
    ]
    decision = decide(pool(minReplicas=3), pods, PoolLoad(busy={"etl-failed": 1}))
    assert sorted(deleted_names(decision)) == ["etl-done", "etl-failed"], "an ended pod runs nothing, busy or not"
    assert len(decision.create) == 2
    assert decision.status["replicas"] == 1 and decision.status["readyReplicas"] == 1


def test_pods_the_pool_does_not_control_are_ignored_and_their_names_never_reused():
    stranger = pod("etl-n0000", owner_uid="another-pool-of-the-same-name")
    decision = decide(pool(minReplicas=1), [stranger])
    assert decision.delete == ()
    assert created_names(decision) == ["etl-n0001"], "the name in use is skipped"


def test_no_pull_endpoint_means_no_pods_and_a_condition_that_says_why():
    decision = decide(pool(minReplicas=2), [pod("etl-failed", phase="Failed")], beat_channel=None)
    assert decision.create == () and decision.delete == ()
    ready = {c["type"]: c for c in decision.status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "NoPullEndpoint")


def test_a_create_failure_shows_in_the_ready_condition():
    decision = decide(pool(minReplicas=1), [], create_error="pods is forbidden: exceeded quota")
    ready = {c["type"]: c for c in decision.status["conditions"]}["Ready"]
    assert ready["reason"] == "PodCreateFailed" and "exceeded quota" in ready["message"]
    assert len(decision.create) == 1, "and it tries again"


def test_a_pool_being_deleted_is_left_to_the_garbage_collector():
    p = pool(minReplicas=2)
    p["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    decision = decide(p, [pod("etl-failed", phase="Failed")])
    assert decision.create == () and decision.delete == () and decision.status is None


def test_an_unreadable_pool_makes_nothing_and_says_so():
    p = pool(minReplicas=5, maxReplicas=2)  # refused by the API server's rule; written before it, say
    decision = decide(p, [])
    assert decision.create == () and decision.delete == ()
    ready = {c["type"]: c for c in decision.status["conditions"]}["Ready"]
    assert ready["reason"] == "InvalidSpec" and "minReplicas (5)" in ready["message"]


def test_status_is_written_only_when_it_changed_and_ready_counts_slots():
    pods = [pod("etl-a"), pod("etl-b", ready=False)]
    first = decide(pool(minReplicas=2, slotsPerWorker=3), pods, PoolLoad(queued=1, running=2, busy={"etl-a": 2}))
    status = first.status
    assert (status["replicas"], status["readyReplicas"], status["slots"], status["slotsUsed"], status["backlog"]) == (
        2,
        1,
        3,
        2,
        1,
    )
    again = decide(
        pool(minReplicas=2, slotsPerWorker=3, status=status),
        pods,
        PoolLoad(queued=1, running=2, busy={"etl-a": 2}),
        now=NOW + timedelta(seconds=30),
    )
    assert again.status is None, "nothing changed: no write"
    ready = decide(pool(minReplicas=2, slotsPerWorker=3, status=status), [pod("etl-a"), pod("etl-b")])
    conditions = {c["type"]: c for c in ready.status["conditions"]}
    assert conditions["Ready"]["status"] == "True" and ready.status["slots"] == 6
    assert ready.status["lastScaleTime"] == status["lastScaleTime"], "the figure did not change"


# -------------------------------------------------------------------------------- the pods


def test_the_worker_pod_is_the_template_named_labelled_owned_and_given_the_pull_environment():
    decision = decide(pool(minReplicas=1, slotsPerWorker=4), [])
    manifest = decision.create[0].manifest
    meta, spec = manifest["metadata"], manifest["spec"]
    assert meta["name"] == "etl-n0000" and meta["namespace"] == "team-a"
    assert "generateName" not in meta
    assert meta["labels"] == {"app": "etl", "vigil.dev/pool": "etl"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": api.API_VERSION,
            "kind": "VigilWorkerPool",
            "name": "etl",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert not meta.get("finalizers"), "no finalizer: deleting the pool or its namespace never waits on Vigil"
    for container in [*spec["containers"], *spec["initContainers"]]:
        env = {e["name"]: e for e in container["env"]}
        assert env["VIGIL_PULL_URL"]["value"] == "https://vigil.vigil-system.svc:8443/v1/pull"
        assert env["VIGIL_PULL_CA"]["value"] == CHANNEL.ca_pem
        assert env["VIGIL_PULL_TOKEN_FILE"]["value"] == f"{BEAT_TOKEN_DIR}/token"
        assert env["VIGIL_POOL"]["value"] == "etl", "Vigil's value replaces the template's"
        assert env["VIGIL_POOL_SLOTS"]["value"] == "4"
        assert env["VIGIL_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["VIGIL_POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert env["VIGIL_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
        assert [m for m in container["volumeMounts"] if m["name"] == BEAT_TOKEN_VOLUME] == [
            {"name": BEAT_TOKEN_VOLUME, "mountPath": BEAT_TOKEN_DIR, "readOnly": True}
        ]
    assert {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}["MODE"] == "fast"
    [volume] = [v for v in spec["volumes"] if v["name"] == BEAT_TOKEN_VOLUME]
    token = volume["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "vigil.dev" and token["path"] == "token"
    assert TEMPLATE["spec"]["containers"][0]["env"][1]["value"] == "forged", "the pool's template is untouched"


def test_the_pull_url_is_the_beat_channels_with_its_path():
    assert pull_url("https://10.0.0.1:9443/v1/heartbeat?x=1") == "https://10.0.0.1:9443/v1/pull"
    assert pull_url("https://vigil.svc") == "https://vigil.svc/v1/pull"


def test_random_suffixes_are_five_characters_of_kubernetes_alphabet():
    rng = random.Random(0)
    suffixes = {random_suffix(rng) for _ in range(200)}
    assert len(suffixes) == 200
    assert all(len(s) == 5 and s.isalnum() and s.islower() for s in suffixes if not s.isdigit())


def test_the_watch_keeps_only_pool_pods_and_only_what_the_decision_reads():
    whole = pod("etl-a")
    whole["metadata"]["labels"]["other"] = "x" * 100
    whole["metadata"]["annotations"] = {"big": "y" * 10_000}
    whole["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    whole["spec"] = {"containers": [{"name": "worker", "image": "etl:1"}], "nodeName": "n1"}
    whole["status"]["conditions"].append({"type": "PodScheduled", "status": "True"})
    whole["status"]["containerStatuses"] = [{"name": "worker", "ready": True}]
    kept = keep_pool_pod(whole)
    assert kept is not None
    assert kept["metadata"]["labels"] == {"vigil.dev/pool": "etl"}
    assert set(kept["metadata"]) == {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "labels",
        "ownerReferences",
    }
    assert kept["spec"] == {} and kept["status"]["conditions"] == [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T11:00:00Z"}
    ]
    assert pool_of(kept) == ("team-a", "etl")
    relabelled = pod("etl-b")
    relabelled["metadata"]["labels"][api.LABEL_POOL] = "other"  # the label must name the controller
    assert keep_pool_pod(relabelled) is None
    job_owned = pod("etl-c")
    job_owned["metadata"]["ownerReferences"][0]["kind"] = api.KIND
    assert keep_pool_pod(job_owned) is None


def test_the_scale_memory_keeps_one_entry_per_falling_figure():
    memory = ScaleMemory()
    for at, want in [(0, 5), (1, 3), (2, 4), (3, 2), (4, 2)]:
        memory = memory.wanted(float(at), want, 60.0)
    assert memory.wants == ((0.0, 5), (2.0, 4), (4.0, 2))
    assert memory.highest() == 5
    assert memory.wanted(61.0, 1, 60.0).wants == ((2.0, 4), (4.0, 2), (61.0, 1))


# -------------------------------------------------------------------------------- properties

pods_strategy = st.lists(
    st.builds(
        lambda i, phase, ready, deleting, mine: pod(
            f"etl-{i}", phase=phase, ready=ready, deleting=deleting, owner_uid=UID if mine else "other"
        ),
        st.integers(0, 30),
        st.sampled_from(["Pending", "Running", "Running", "Running", "Failed", "Succeeded", "Unknown"]),
        st.booleans(),
        st.booleans(),
        st.booleans(),
    ),
    max_size=25,
    unique_by=lambda p: p["metadata"]["name"],
)


@settings(max_examples=300, deadline=None)
@given(
    pods=pods_strategy,
    bounds=st.tuples(st.integers(0, 8), st.integers(1, 12)).filter(lambda b: b[0] <= b[1]),
    replicas=st.none() | st.integers(0, 20),
    slots=st.integers(1, 5),
    queued=st.integers(0, 60),
    running=st.integers(0, 60),
    busy_share=st.floats(0, 1),
    delay=st.sampled_from([0, 30, 60]),
    previous=st.none() | st.integers(0, 15),
    elapsed=st.floats(0, 200),
)
def test_never_a_busy_worker_deleted_never_outside_the_bounds_and_the_count_kept(
    pods, bounds, replicas, slots, queued, running, busy_share, delay, previous, elapsed
):
    low, high = bounds
    spec: dict[str, Any] = {"minReplicas": low, "maxReplicas": high, "slotsPerWorker": slots}
    spec["scaleDownDelaySeconds"] = delay
    if replicas is not None:
        spec["replicas"] = replicas
    status = {} if previous is None else {"desiredReplicas": previous, "lastScaleTime": "2026-03-01T11:00:00Z"}
    names_of = [p["metadata"]["name"] for p in pods]
    busy = {name: 1 for name in names_of[: int(len(names_of) * busy_share)]}
    load = PoolLoad(queued=queued, running=running, busy=busy)
    first = decide(pool(status=status, **spec), pods, load, monotonic=0.0)
    decision = decide(pool(status=status, **spec), pods, load, monotonic=elapsed, memory=first.memory)

    by_name = {p["metadata"]["name"]: p for p in pods}
    desired = decision.status["desiredReplicas"]
    assert low <= desired <= high
    mine = [p for p in pods if p["metadata"]["ownerReferences"][0]["uid"] == UID]
    live = [
        p
        for p in mine
        if not p["metadata"].get("deletionTimestamp") and p["status"]["phase"] not in ("Failed", "Succeeded")
    ]
    for action in decision.delete:
        target = by_name[action.name]
        assert target in mine, "only the pool's own pods"
        assert not target["metadata"].get("deletionTimestamp")
        assert target["status"]["phase"] in ("Failed", "Succeeded") or busy.get(action.name, 0) == 0, "a busy worker"
        assert action.uid == target["metadata"]["uid"]
    deleted_live = [name for name in deleted_names(decision) if by_name[name] in live]
    after = len(live) - len(deleted_live) + len(decision.create)
    idle_live = [p for p in live if busy.get(p["metadata"]["name"], 0) == 0]
    if len(live) <= desired:
        assert after == desired and not deleted_live
    else:
        assert not decision.create
        assert after == max(desired, len(live) - len(idle_live))
    new_names = created_names(decision)
    assert len(set(new_names)) == len(new_names) and not set(new_names) & set(names_of)
    if replicas is not None:
        assert desired == min(max(replicas, low), high)
    else:
        wanted = min(max(-(-(queued + running) // slots), low), high)
        assert desired >= wanted, "more workers are never delayed"
        if delay == 0:
            assert desired == wanted
