"""The shell's hot path and caches, without a cluster: a heartbeat alone costs no reconcile,
anything else about a pod does, and a pod created here is never forgotten before the watch
shows it."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from tests.support.clock import FakeClock, settle
from tests.support.controllers import job_controller
from vigil.controllers.jobs import JobController

pytestmark = pytest.mark.unit

OWNER = {"apiVersion": "vigil.dev/v1beta1", "kind": "VigilJob", "name": "j", "uid": "job-uid", "controller": True}
WALL = dt.datetime(2026, 11, 29, 10, 0, 5, tzinfo=dt.UTC)  # the job's last beat stamp is 10:00:00


def job(phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "job-uid", "resourceVersion": "5", "generation": 1},
        "spec": {"template": {}, "heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 60}},
        "status": {"phase": phase, "currentAttempt": {"lastHeartbeatAt": "2026-11-29T10:00:00Z"}},
    }


def pod(version: int, beat: str | None = None, phase: str = "Running", **annotations: str) -> dict[str, Any]:
    if beat is not None:
        annotations["vigil.dev/heartbeat"] = beat
    return {
        "metadata": {
            "name": "j-1",
            "namespace": "ns",
            "uid": "pod-uid",
            "resourceVersion": str(version),
            "labels": {"vigil.dev/job-uid": "job-uid", "vigil.dev/attempt": "1"},
            "annotations": annotations,
            "ownerReferences": [OWNER],
        },
        "status": {"phase": phase},
    }


def controller(clock: FakeClock, kube: Any = None) -> JobController:
    """A controller whose pod events make their job worth a look at once: these tests ask
    *whether* an event is worth a look; when (the batch) is tested on its own below."""
    return job_controller(kube, clock, pod_batch_seconds=0)


def drain(c: JobController) -> list:
    async def take():
        keys = []
        while len(c.queue):
            key = await c.queue.get()
            c.queue.done(key)
            keys.append(key)
        return keys

    return asyncio.run(take())


def test_beats_alone_do_not_reconcile_but_other_changes_do():
    clock = FakeClock(wall=WALL)
    c = controller(clock)
    c.handlers.job_seen(job())
    drain(c)
    c.handlers.pod_changed(pod(10, beat="1"))
    assert drain(c) == [("ns", "j")], "first sight of a pod is worth a look"
    for version, beat in [(11, "2"), (12, "3"), (13, "4")]:
        clock.tick(10)
        c.handlers.pod_changed(pod(version, beat=beat))
        assert drain(c) == [], "a heartbeat alone costs no reconcile"
    c.handlers.pod_changed(pod(14, beat="5", phase="Failed"))
    assert drain(c) == [("ns", "j")], "a phase change is"
    c.handlers.pod_changed(pod(15, beat="6", phase="Failed", **{"vigil.dev/checkpoint": '{"a":1}'}))
    assert drain(c) == [("ns", "j")], "so is a new checkpoint"


@pytest.mark.parametrize("required", [True, False])
def test_a_beat_brings_a_look_when_the_last_beat_stamp_is_due(required: bool):
    """lastHeartbeatAt is written on its own once per stamp period (5 minutes here); the beat
    that finds it that stale is worth a look. Not so when beats are not required."""
    clock = FakeClock(wall=WALL)
    c = controller(clock)
    quiet = job()
    quiet["spec"]["heartbeat"]["required"] = required
    c.handlers.job_seen(quiet)
    c.handlers.pod_changed(pod(10, beat="1"))
    drain(c)
    clock.tick(290)
    c.handlers.pod_changed(pod(11, beat="2"))
    assert drain(c) == [], "seen 295 s after the stamp: not due yet"
    clock.tick(10)
    c.handlers.pod_changed(pod(12, beat="3"))
    assert drain(c) == ([("ns", "j")] if required else [])


def test_stamps_come_due_together_and_are_written_at_most_r_a_second():
    """Jobs started together come due together: their beats bring at most R looks a second for
    their stamps (R = 2 here), the rest waiting for a later beat, never all at once."""
    clock = FakeClock(wall=WALL)
    c = job_controller(None, clock, pod_batch_seconds=0, stamp_writes_per_second=2)
    names = [f"j{i}" for i in range(20)]
    for n, name in enumerate(names):
        one = job()
        one["metadata"].update(name=name, uid=f"{name}-uid")
        c.handlers.job_seen(one)
        c.handlers.pod_changed(named_pod(name, 10 + n, beat="1"))
    drain(c)
    clock.tick(300)  # every stamp is due now
    looked: list[tuple[str, str]] = []
    for second in range(12):
        for n, name in enumerate(names):
            if ("ns", name) not in looked:  # the looked-at job's stamp is written: it is due no more
                c.handlers.beat_heard(named_pod(name, 10 + n, beat="1"))
        now = drain(c)
        assert len(now) <= 2, f"second {second}: {len(now)} stamps at once"
        looked += now
        clock.tick(1)
        for key in now:  # as the look's status write would: the stamp is fresh again
            c.view.jobs[key]["status"]["currentAttempt"]["lastHeartbeatAt"] = clock.wall().isoformat()
    assert len(set(looked)) == len(looked) == 20, "every due stamp gets its turn, at 2 a second"


def named_pod(job_name: str, version: int, beat: str) -> dict[str, Any]:
    one = pod(version, beat=beat)
    owner = {**OWNER, "name": job_name, "uid": f"{job_name}-uid"}
    one["metadata"].update(name=f"{job_name}-1", uid=f"{job_name}-pod", ownerReferences=[owner])
    one["metadata"]["labels"] = {"vigil.dev/job-uid": f"{job_name}-uid", "vigil.dev/attempt": "1"}
    return one


def test_a_beat_wakes_an_uncertain_job_at_once():
    clock = FakeClock(wall=WALL)
    c = controller(clock)
    c.handlers.job_seen(job(phase="Uncertain"))
    c.handlers.pod_changed(pod(10, beat="1"))
    drain(c)
    clock.tick(1)
    c.handlers.pod_changed(pod(11, beat="2"))
    assert drain(c) == [("ns", "j")]


def test_a_pods_changes_within_the_batch_cost_one_look_and_a_jobs_own_change_none_of_the_wait():
    async def scenario() -> None:
        clock = FakeClock(wall=WALL)
        c = job_controller(None, clock, pod_batch_seconds=1.0)
        c.handlers.job_seen(job())
        assert await c.queue.get() == ("ns", "j"), "a change of the job itself is looked at at once"
        c.queue.done(("ns", "j"))
        c.handlers.pod_changed(pod(10, phase="Pending"))  # created
        c.handlers.pod_changed(pod(11, phase="Running"))  # running
        c.handlers.pod_changed(pod(12, phase="Succeeded"))  # finished, all within the batch
        look = asyncio.ensure_future(c.queue.get())
        await clock.advance(0.99)
        assert not look.done(), "not before the batch is over"
        await clock.advance(0.01)
        assert look.result() == ("ns", "j")
        c.queue.done(("ns", "j"))
        await clock.advance(10)
        assert len(c.queue) == 0, "three changes, one look"
        assert c.view.pods.of_job(("ns", "job-uid"))[0]["status"]["phase"] == "Succeeded", "the look reads the newest"

    asyncio.run(scenario())


def test_a_pod_event_while_its_job_waits_adds_no_second_look_but_one_while_it_is_processed_does():
    async def scenario() -> None:
        clock = FakeClock(wall=WALL)
        c = job_controller(None, clock, pod_batch_seconds=1.0)
        c.handlers.job_seen(job())  # waiting in the queue
        c.handlers.pod_changed(pod(10))  # the waiting look will read it
        assert await c.queue.get() == ("ns", "j")
        c.queue.done(("ns", "j"))
        await clock.advance(10)
        assert len(c.queue) == 0 and clock.pending() == 0, "one look for both: the pod event left no timer"

        c.queue.add(("ns", "j"))
        assert await c.queue.get() == ("ns", "j")
        c.handlers.pod_changed(pod(11, phase="Failed"))  # while the worker holds the job: it read the older pod
        c.queue.done(("ns", "j"))
        assert len(c.queue) == 0, "not at once"
        await clock.advance(1.0)
        assert len(c.queue) == 1, "looked at again after the batch"

    asyncio.run(scenario())


def test_a_deleted_pod_is_forgotten_by_the_detector():
    clock = FakeClock(wall=WALL)
    c = controller(clock)
    c.handlers.job_seen(job())
    c.handlers.pod_changed(pod(10, beat="1"))
    assert "pod-uid" in c.view.tracker
    c.handlers.pod_changed(pod(11, beat="1"), deleted=True)
    assert "pod-uid" not in c.view.tracker
    assert drain(c) == [("ns", "j")]


def test_a_created_pod_is_kept_until_the_watch_shows_it():
    clock = FakeClock(wall=WALL)
    c = controller(clock)
    c.view.pods.created(pod(10), clock.now)
    assert [p["metadata"]["uid"] for p in c.view.pods.of_job(("ns", "job-uid"))] == ["pod-uid"]
    clock.tick(3600)
    assert c.view.pods.unseen(("ns", "job-uid")), "never forgotten on a timer"
    c.handlers.pod_changed(pod(11))  # the watch caught up
    assert c.view.pods.unseen(("ns", "job-uid")) == []
    assert c.view.pods.of_job(("ns", "job-uid"))[0]["metadata"]["resourceVersion"] == "11"


def test_a_late_watch_event_does_not_undo_a_direct_read():
    clock = FakeClock(wall=WALL)
    c = controller(clock)
    c.handlers.job_seen(job())
    c.view.pods.read(pod(20, beat="9"))
    c.handlers.pod_changed(pod(15, beat="7"))
    assert c.view.pods.of_job(("ns", "job-uid"))[0]["metadata"]["resourceVersion"] == "20"


class Releases:
    """The two calls the release path makes, recorded."""

    def __init__(self, job: dict[str, Any] | None):
        self.job, self.released, self.asked = job, [], []

    async def read_job(self, namespace, name):
        self.asked.append(name)
        return self.job

    async def release_pod(self, namespace, name, uid):
        self.released.append(name)


def tracked_pod(version: int) -> dict[str, Any]:
    held = pod(version)
    held["metadata"]["finalizers"] = ["vigil.dev/attempt-tracking"]
    return held


def test_the_pods_of_a_deleted_job_are_released_at_once_and_once_though_a_late_event_makes_them_orphans():
    """The job's DELETED releases its pods without asking; a late event of one of them, while
    its release waits, makes it an orphan too: one release does for both."""

    async def scenario() -> Releases:
        kube = Releases(None)
        c = job_controller(kube, FakeClock(wall=WALL), workers=0)
        c.handlers.job_seen(job())
        c.handlers.pod_changed(tracked_pod(10))
        await c.start()
        c.handlers.job_gone(job())  # the job's DELETED: its pods can tell nothing more
        c.handlers.pod_changed(tracked_pod(11))  # a late event of one of its pods: an orphan now
        await settle()
        assert not c.releaser.busy()
        assert c.view.pods.of_job(("ns", "job-uid")) == [], "what the late event put back goes with the release"
        await c.stop()
        return kube

    kube = asyncio.run(scenario())
    assert kube.released == ["j-1"] and kube.asked == [], "the job was seen deleted: nothing to confirm"


@pytest.mark.parametrize("stored", ["gone", "the same job", "a new job of that name"])
def test_an_orphan_is_released_only_once_the_api_server_confirms_its_job_is_gone(stored: str):
    """A pod whose job the operator does not know (its DELETED lost, say): the API server is
    asked, never the cache, and the pod is released only if it has no job of that UID."""
    existing = {
        "gone": None,
        "the same job": job(),
        "a new job of that name": {**job(), "metadata": {**job()["metadata"], "uid": "new-job-uid"}},
    }[stored]

    async def scenario() -> Releases:
        kube = Releases(existing)
        c = job_controller(kube, FakeClock(wall=WALL), workers=0)
        await c.start()
        c.handlers.pod_changed(tracked_pod(10))  # its job was never seen
        await settle()
        assert not c.releaser.busy()
        gone_from_view = c.view.pods.of_job(("ns", "job-uid")) == []
        await c.stop()
        assert gone_from_view == (stored != "the same job"), "a released orphan leaves the view"
        return kube

    kube = asyncio.run(scenario())
    assert kube.asked == ["j"]
    assert kube.released == ([] if stored == "the same job" else ["j-1"])


@pytest.mark.parametrize("stored_version", ["9", "3"])
def test_after_a_conflict_the_job_is_read_again_not_awaited_from_a_watch_that_missed_it(stored_version: str):
    """A conflict means the cached job is not the stored one. If the watch missed that version,
    waiting for it would conflict for ever: the job would stand still. The shell reads the job
    directly and decides on that next time, even when its resourceVersion is lower than the
    cached one's (an etcd that went back in time)."""
    from vigil.kube.errors import Conflict

    stored = {**job(), "metadata": {**job()["metadata"], "resourceVersion": stored_version}}
    stored["status"] = {"phase": "Starting", "reason": "AttemptStarting"}

    class Stored:
        reads = 0

        async def read_job(self, namespace, name):
            Stored.reads += 1
            return stored

    async def scenario() -> dict[str, Any]:
        clock = FakeClock(wall=WALL)
        c = job_controller(Stored(), clock, workers=1)
        seen_versions = []

        async def reconcile(key):
            seen_versions.append(c.view.jobs[key]["metadata"]["resourceVersion"])
            if len(seen_versions) == 1:
                raise Conflict("the object has been modified")

        c.reconciler.reconcile = reconcile  # type: ignore[method-assign]
        c.handlers.job_seen(job())  # the cache: version 5; the watch will never bring 9
        await c.start()
        assert await clock.until(lambda: len(seen_versions) >= 2, within=10), "retried after the conflict"
        await c.stop()
        return {"versions": seen_versions, "cached": c.view.jobs[("ns", "j")]["metadata"]["resourceVersion"]}

    result = asyncio.run(scenario())
    assert Stored.reads == 1
    assert result["versions"][:2] == ["5", stored_version], result  # the retry decided on the stored version
    assert result["cached"] == stored_version


def test_a_created_pod_the_watch_never_shows_brings_the_job_back_for_a_direct_read():
    clock = FakeClock(wall=WALL)
    c = controller(clock)
    c.handlers.job_seen(job())
    drain(c)
    c.view.pods.created(pod(10), clock.now)
    c.executor._look_if_unseen(("ns", "j"))  # the timer set at creation rings
    assert drain(c) == [("ns", "j")], "still unseen: the job is looked at, and the pod read directly"
    c.handlers.pod_changed(pod(11))  # the watch caught up
    drain(c)
    c.executor._look_if_unseen(("ns", "j"))
    assert drain(c) == [], "seen: nothing to do"


def test_a_job_left_starting_has_itself_and_its_pods_read_from_the_api_server():
    clock, reads = FakeClock(wall=WALL), []
    # The stored job is at a lower resourceVersion than the cached one (an etcd that lost a write,
    # or one restored from a backup): the direct read still wins over the rumour.
    stored = {**job(phase="Starting"), "metadata": {**job()["metadata"], "resourceVersion": "3"}}

    class Api:
        async def read_job(self, namespace, name):
            reads.append(name)
            return stored

        async def list_job_pods(self, namespace, job_uid):
            reads.append(job_uid)
            return [pod(12, phase="Succeeded")]

    c = controller(clock, Api())
    starting = job(phase="Starting")
    c.handlers.job_seen(starting)

    async def looks() -> None:
        await c.reconciler._recheck_starting(("ns", "j"), starting)  # the first look starts the clock
        clock.tick(29)
        await c.reconciler._recheck_starting(("ns", "j"), starting)
        assert reads == [], "not before STARTING_RECHECK_SECONDS"
        clock.tick(1)
        await c.reconciler._recheck_starting(("ns", "j"), starting)
        c.queue.shutdown()

    asyncio.run(looks())
    assert reads == ["j", "job-uid"]
    assert c.view.jobs[("ns", "j")]["metadata"]["resourceVersion"] == "3", "the stored job replaced the cached one"
    assert c.view.pods.of_job(("ns", "job-uid"))[0]["status"]["phase"] == "Succeeded", "the truth replaced the rumour"


def test_a_job_that_leaves_starting_takes_its_recheck_timer_with_it():
    """Every started job once left a delayed look behind, a period after it ran: a thousand jobs
    started at once cost a thousand reconciles for nothing 30 s later."""

    async def looks() -> tuple[int, int, int]:
        c = controller(FakeClock(wall=WALL))
        starting, running = job(phase="Starting"), job(phase="Running")
        await c.reconciler._recheck_starting(("ns", "j"), starting)
        timers_while_starting = len(c.reconciler.rechecks)
        await c.reconciler._recheck_starting(("ns", "j"), running)
        timers_once_running = len(c.reconciler.rechecks)
        await c.reconciler._recheck_starting(("ns", "j"), starting)
        c.forget(("ns", "j"))
        return timers_while_starting, timers_once_running, len(c.reconciler.rechecks)

    assert asyncio.run(looks()) == (1, 0, 0)


def test_a_job_left_starting_that_the_api_server_no_longer_has_is_forgotten():
    clock = FakeClock(wall=WALL)

    class Api:
        async def read_job(self, namespace, name):
            return None

        async def release_pod(self, namespace, name, uid):
            pass

    c = controller(clock, Api())
    starting = job(phase="Starting")
    c.handlers.job_seen(starting)

    async def looks():
        await c.reconciler._recheck_starting(("ns", "j"), starting)
        clock.tick(30)
        decided_on = await c.reconciler._recheck_starting(("ns", "j"), starting)
        c.queue.shutdown()
        return decided_on

    assert asyncio.run(looks()) is None
    assert ("ns", "j") not in c.view.jobs


@pytest.mark.parametrize("by_name", ["ours", "a stranger's", "absent"])
def test_the_current_attempts_pod_missing_from_a_list_is_read_by_name(by_name: str):
    """Lists come from the API server's watch cache, which can lose an event: before the shell
    takes a list's word that the current attempt's pod is gone (a Lost verdict, a pod created
    again), it reads that pod by name, which the API server answers from etcd."""
    running = job()
    running["status"]["currentAttempt"].update(number=1, podName="j-1", podUID="pod-uid")
    stranger = pod(3)
    stranger["metadata"]["ownerReferences"] = [{"kind": "VigilJob", "uid": "other", "controller": True}]
    named = {"ours": pod(3), "a stranger's": stranger, "absent": None}[by_name]
    reads = []

    class Api:
        async def list_job_pods(self, namespace, job_uid):
            return []  # the cache lost it

        async def read_pod(self, namespace, name):
            reads.append(name)
            return named

    c = controller(FakeClock(wall=WALL), Api())
    truth = asyncio.run(c.reconciler.read_pods(running))
    assert reads == ["j-1"]
    assert [p["metadata"]["uid"] for p in truth] == (["pod-uid"] if by_name == "ours" else [])


def test_a_decision_that_writes_no_status_runs_only_on_the_version_the_api_server_still_has():
    """ConfirmVersion is the fence of a decision without a status write (one that only creates
    its next attempt's pod, say): a job changed since the decision read it voids the decision,
    as a status write's 409 would, and the version read is what the retry decides on."""
    from vigil.core.actions import ConfirmVersion
    from vigil.kube.errors import Conflict, NotFound

    stored: dict[str, Any] | None = None

    class Api:
        async def read_job(self, namespace, name):
            return stored

    c = controller(FakeClock(wall=WALL), Api())
    c.handlers.job_seen(job(), look=False)

    stored = job()  # still version 5: the decision goes on
    assert asyncio.run(c.executor.execute(job(), ConfirmVersion("5"))) == job()

    stored = {**job(), "metadata": {**job()["metadata"], "resourceVersion": "9"}}
    with pytest.raises(Conflict):
        asyncio.run(c.executor.execute(job(), ConfirmVersion("5")))
    assert c.view.jobs[("ns", "j")]["metadata"]["resourceVersion"] == "9"

    stored = {**job(), "metadata": {**job()["metadata"], "uid": "another-job-of-that-name"}}
    with pytest.raises(NotFound):
        asyncio.run(c.executor.execute(job(), ConfirmVersion("5")))
    stored = None
    with pytest.raises(NotFound):
        asyncio.run(c.executor.execute(job(), ConfirmVersion("5")))


@pytest.mark.parametrize("pod_first", [True, False])
def test_a_pod_of_an_attempt_status_does_not_hold_yet_counts_as_a_start_whichever_is_seen_first(pod_first: bool):
    """After a restart the job and pod watches list in any order; either way the queue learns of a
    start whose pod came first before the job's next look records it (maxRunning holds)."""
    c = controller(FakeClock(wall=WALL))
    starts = []
    c.dispatcher.started_unseen = lambda *args: starts.append(args)  # type: ignore[method-assign]
    queued = job(phase="Queued")
    queued["status"] = {"phase": "Queued", "attempts": 0}
    if pod_first:
        c.handlers.pod_changed(pod(10))
        c.handlers.job_seen(queued)
    else:
        c.handlers.job_seen(queued)
        c.handlers.pod_changed(pod(10))
    assert starts == [("ns", "j", 1)]
    recorded = {**queued, "metadata": {**queued["metadata"], "resourceVersion": "6"}, "status": {"attempts": 1}}
    c.handlers.job_seen(recorded)
    c.handlers.pod_changed(pod(11, phase="Succeeded"))
    assert starts == [("ns", "j", 1)], "once status holds the attempt, its pod is no news"


def finished_deleting_pod(version: int) -> dict[str, Any]:
    """A pod that ended and is being deleted: no further event will ever come for it."""
    held = tracked_pod(version)
    held["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:01Z"
    held["status"] = {"phase": "Succeeded"}
    return held


def test_a_job_whose_look_meets_its_404_has_its_pods_released_and_its_late_deleted_event_too():
    """The Gone path: a look's write meets the job's 404 and the job is forgotten; the job's
    DELETED then finds nothing in the view. The pod, finished and Terminating, changes no more:
    without a release on both paths it would keep the finalizer and its namespace's deletion
    would hang."""
    from vigil.controllers.worker import AfterFailure
    from vigil.kube.errors import NotFound

    async def scenario(vanished_first: bool) -> list[str]:
        kube = Releases(None)  # the API server no longer has the job
        c = job_controller(kube, FakeClock(wall=WALL), workers=0)
        c.handlers.job_seen(job())
        c.handlers.pod_changed(finished_deleting_pod(10))
        await c.start()
        if vanished_first:
            after = await c.reconciler.failed(("ns", "j"), NotFound('vigiljobs "j" not found'), 1)
            assert after is AfterFailure.FORGET and ("ns", "j") not in c.view.jobs
        c.handlers.job_gone(job())  # its DELETED, after the look forgot it (or on its own)
        await settle()
        await c.stop()
        return kube.released

    assert "j-1" in asyncio.run(scenario(vanished_first=True))
    assert asyncio.run(scenario(vanished_first=False)) == ["j-1"]


def test_a_404_that_is_not_the_jobs_releases_nothing():
    """A look's 404 may be another object's (a namespace going away): the pods are released only
    once the API server says the job is gone."""
    from vigil.kube.errors import NotFound

    async def scenario() -> list[str]:
        kube = Releases(job())  # the API server still has the job
        c = job_controller(kube, FakeClock(wall=WALL), workers=0)
        c.handlers.job_seen(job())
        c.handlers.pod_changed(finished_deleting_pod(10))
        await c.start()
        await c.reconciler.failed(("ns", "j"), NotFound('namespaces "ns" not found'), 1)
        await settle()
        await c.stop()
        return kube.released

    assert asyncio.run(scenario()) == []


class Sweepable(Releases):
    """The API server's pods, listed a page at a time, and its jobs by name."""

    def __init__(self, pods: list[dict[str, Any]], jobs: dict[str, dict[str, Any]]):
        super().__init__(None)
        self.pods, self.jobs, self.lists, self.reads = pods, jobs, [], []

    async def list_vigil_pods(self, namespace, limit=100):
        self.lists.append(namespace)
        for start in range(0, len(self.pods), 2):
            yield self.pods[start : start + 2]

    async def read_job(self, namespace, name):
        self.reads.append(name)
        return self.jobs.get(name)


def owned_pod(name: str, job_name: str, job_uid: str, namespace: str = "ns") -> dict[str, Any]:
    held = finished_deleting_pod(1)
    held["metadata"].update(name=name, namespace=namespace, uid=f"uid-{name}")
    held["metadata"]["labels"] = {"vigil.dev/job-uid": job_uid}
    held["metadata"]["ownerReferences"] = [{**OWNER, "name": job_name, "uid": job_uid}]
    return held


def test_the_periodic_sweep_releases_orphans_no_event_shows_asking_the_api_server_first():
    """An orphan the watches never show (its job deleted while no operator ran, its last event
    long past) is found by listing the API server's pods every SWEEP_SECONDS; it is released only
    once a read of its job says the job is gone. A known job's pods are not even asked about, and
    pods outside the watched namespaces are not touched."""
    from vigil.core.orphans import SWEEP_JITTER, SWEEP_SECONDS

    api = Sweepable(
        [
            owned_pod("of-a-known-job", "j", "job-uid"),
            owned_pod("of-a-deleted-job", "gone", "gone-uid"),
            owned_pod("of-a-job-that-exists", "exists", "exists-uid"),
            owned_pod("of-a-replaced-job", "replaced", "old-uid"),
            owned_pod("elsewhere", "gone", "gone-uid", namespace="not-watched"),
        ],
        {"exists": {**job(), "metadata": {**job()["metadata"], "name": "exists", "uid": "exists-uid"}},
         "replaced": {**job(), "metadata": {**job()["metadata"], "name": "replaced", "uid": "new-uid"}}},
    )  # fmt: skip
    clock = FakeClock(wall=WALL)

    async def scenario() -> None:
        watched = lambda pod: pod["metadata"]["namespace"] != "not-watched"  # noqa: E731
        c = job_controller(api, clock, workers=0, sweep_scopes=["ns", "other"], accept=watched)
        c.handlers.job_seen(job())
        await c.start()
        await clock.advance(SWEEP_SECONDS * 0.99)
        assert api.lists == [], "no sweep before its period"
        await clock.advance(SWEEP_SECONDS * (SWEEP_JITTER + 0.02))
        assert api.lists == ["ns", "other"]
        await clock.advance(SWEEP_SECONDS * (1 + SWEEP_JITTER))
        assert api.lists == ["ns", "other"] * 2, "and again, every period"
        await c.stop()

    asyncio.run(scenario())
    assert sorted(set(api.released)) == ["of-a-deleted-job", "of-a-replaced-job"]
    assert "j" not in api.reads, "a known job's pods are its looks' business"


def test_a_standby_that_takes_over_counts_silence_from_its_takeover_not_from_its_first_sight():
    """A standby watches pods but beats posted to the leader never reach it: what it saw while
    standing by is no evidence that an attempt went silent (DESIGN: silence counts from takeover)."""
    from vigil import api

    heartbeat = api.Heartbeat(interval_seconds=10, timeout_seconds=60, startup_grace_seconds=0)

    async def scenario() -> tuple[str, str]:
        clock = FakeClock(wall=WALL)
        c = job_controller(Releases(job()), clock, workers=0)
        c.handlers.job_seen(job())
        c.handlers.pod_changed(pod(10, beat="1"))  # standing by: seen once, then only beats to the leader
        clock.tick(600)  # ten minutes later the leader dies and this process takes over
        await c.start()
        at_takeover = c.view.tracker.liveness("pod-uid", heartbeat, clock.monotonic()).state
        clock.tick(60)  # a full timeout with nothing heard since the takeover
        after_timeout = c.view.tracker.liveness("pod-uid", heartbeat, clock.monotonic()).state
        await c.stop()
        return at_takeover, after_timeout

    assert asyncio.run(scenario()) == ("Healthy", "Lost")


def test_a_pods_first_beat_brings_a_look_so_its_silence_alarm_is_armed_from_the_beat():
    """Before its first beat a pod's silence counts from the end of its startup grace; the alarm
    armed then is late for a pod that beats once and dies, unless the first beat brings a look
    (a task array's beats bring no LAST-BEAT stamp that would)."""
    owner = {**OWNER}
    array = {
        "metadata": {"name": "j", "namespace": "ns", "uid": "job-uid", "resourceVersion": "5", "generation": 1},
        "spec": {
            "template": {},
            "tasks": {"count": 2, "parallelism": 2},
            "heartbeat": {"intervalSeconds": 1, "timeoutSeconds": 6, "startupGraceSeconds": 10},
        },
        "status": {"phase": "Running", "tasks": {"total": 2, "active": []}},
    }

    def task_pod(version: int, beat: str | None) -> dict[str, Any]:
        body = pod(version, beat)
        body["metadata"]["labels"]["vigil.dev/task-index"] = "0"
        body["metadata"]["ownerReferences"] = [owner]
        return body

    clock = FakeClock(wall=WALL)
    c = controller(clock)
    c.handlers.job_seen(array)
    c.handlers.pod_changed(task_pod(10, None))
    drain(c)
    c.handlers.pod_changed(task_pod(11, "1"))  # its first beat
    assert drain(c) == [("ns", "j")]
    c.handlers.pod_changed(task_pod(12, "2"))  # a later beat of a task that is not in doubt
    assert drain(c) == []


def test_a_released_pod_is_in_the_view_at_once_so_the_next_look_does_not_release_it_again():
    """A task array looks twice a second; the watch may show a release later than that. The
    pod the API server answered with (finalizer gone) is what the next look sees."""

    class Patches:
        def __init__(self) -> None:
            self.released: list[str] = []

        async def release_pod(self, namespace, name, uid):
            self.released.append(name)
            answered = tracked_pod(12)
            answered["metadata"]["finalizers"] = []
            return answered

    async def scenario() -> tuple[Patches, list]:
        from vigil.core import actions

        kube = Patches()
        c = job_controller(kube, FakeClock(wall=WALL), workers=0)
        c.handlers.job_seen(job())
        c.handlers.pod_changed(tracked_pod(10))
        await c.executor.execute(job(), actions.ReleasePod(name="j-1", uid="pod-uid"))
        return kube, c.view.pods.of_job(("ns", "job-uid"))

    kube, pods = asyncio.run(scenario())
    assert kube.released == ["j-1"]
    assert [p["metadata"].get("finalizers") for p in pods] == [[]], "the view holds the released pod"


def test_a_looks_pod_creations_go_side_by_side_bounded_and_in_order_with_the_rest():
    """A look that starts a hundred tasks must not wait a hundred round trips one after the
    other; nor may more than CONCURRENT_WRITES be in flight, nor may a creation start before
    the status write (the fence) before it has ended."""
    from vigil.controllers.jobs.reconciler import CONCURRENT_WRITES, _batches
    from vigil.core import actions

    status = actions.PatchStatus(status={"phase": "Running"}, resource_version="5")
    creates = [actions.CreatePod(manifest={"metadata": {"name": f"j-{i}-1"}}) for i in range(40)]
    label = actions.SetDeadLetterLabel(dead_lettered=False, dead_tasks=None)
    batches = _batches((status, *creates, label))
    assert [len(b) for b in batches] == [1, 40, 1]

    class Slow:
        def __init__(self) -> None:
            self.in_flight = self.most = 0
            self.order: list[str] = []

        async def execute(self, job, action):
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            self.in_flight -= 1
            self.order.append(action.manifest["metadata"]["name"])
            return job

    async def scenario() -> Slow:
        slow = Slow()
        c = job_controller(None, FakeClock(wall=WALL), workers=0)
        c.reconciler.executor = slow
        await c.reconciler._execute_together(job(), batches[1])
        return slow

    slow = asyncio.run(scenario())
    assert sorted(slow.order) == sorted(f"j-{i}-1" for i in range(40)), "every pod created once"
    assert 1 < slow.most <= CONCURRENT_WRITES


@pytest.mark.parametrize("deleting", [False, True])
def test_a_released_pod_whose_deletion_the_watch_showed_first_is_not_put_back(deleting: bool):
    """The release's answer may come after the watch's DELETED of the same pod (a pod deleted
    with grace 0 goes as soon as its finalizer does): put back, it would be a phantom that no
    event ever removes, and NoOverlap would wait on it for ever."""

    class Patches:
        async def release_pod(self, namespace, name, uid):
            answered = tracked_pod(12)
            answered["metadata"]["finalizers"] = []
            if deleting:
                answered["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:04Z"
            return answered

    async def scenario() -> list:
        from vigil.core import actions

        c = job_controller(Patches(), FakeClock(wall=WALL), workers=0)
        c.handlers.job_seen(job())
        c.handlers.pod_changed(tracked_pod(10))
        if not deleting:
            c.handlers.pod_changed(tracked_pod(11), deleted=True)  # the DELETED came first
        await c.executor.execute(job(), actions.ReleasePod(name="j-1", uid="pod-uid"))
        return c.view.pods.of_job(("ns", "job-uid"))

    pods = asyncio.run(scenario())
    if deleting:  # the view keeps what it had until the watch says the pod is gone
        assert [p["metadata"].get("finalizers") for p in pods] == [["vigil.dev/attempt-tracking"]]
    else:
        assert pods == [], "a pod the watch showed deleted was put back"
