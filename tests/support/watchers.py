"""What a test sees of the cluster on its own, independently of the operator: list+watches in a
thread that record every pod (or job) the API server ever showed, in the order it showed them,
on the test's monotonic clock.

`Watch` is the machinery: it lists, then watches from the list's resourceVersion; a watch that
ends is resumed where it was, a 410 Gone lists again (counted in `relists`: the order of what
changed meanwhile is then unknown), any other failure (an API server restarting) is recorded in
`errors` and retried after 0.2 s. Objects created and deleted while the watch is down (at most
those ~0.2 s after an API server is back, as nothing can be written while it is away) go unseen.

- `PodLog`: every pod UID ever seen per (job uid, attempt): a duplicate attempt cannot hide,
  even one whose pod was deleted again.
- `JobLog`: each job's phase, and when each write to a job was seen (the operator's progress).
- `PodWatch`: the attempts that count against a queue's maxRunning at each instant, the most
  there ever were, and the order in which pods appeared.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kubernetes import client, watch

from tests.support.cluster import Kube
from tests.support.jobs import GROUP, PLURAL, VERSION
from tests.support.waits import deadline, wait_until

TERMINAL_POD_PHASES = ("Succeeded", "Failed")
TERMINAL_JOB_PHASES = ("Succeeded", "DeadLettered")


class Watch:
    """A list+watch of one collection, from the test's side (see the module's docstring).
    Subclasses say what they keep in `on_object`, called under `lock` in the order the API
    server delivered the objects (normalized to dicts, as the API server sends them)."""

    def __init__(self, kube: Kube, list_fn: Callable, *args: str, watch_seconds: int = 5) -> None:
        self.kube, self.list_fn, self.args, self.watch_seconds = kube, list_fn, args, watch_seconds
        self.newest = 0  # the newest resourceVersion delivered
        self.relists = 0  # lists after a 410 Gone
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self._listed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{'-'.join(args)}", daemon=True)

    def __enter__(self):
        self._thread.start()
        if not self._listed.wait(deadline(30)):
            raise AssertionError(f"the test's watch of {self.args} did not list")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()  # the thread ends at its next event, or when the watch's timeout ends it

    def on_object(self, obj: dict, now: float, deleted: bool) -> None:
        raise NotImplementedError

    def _normal(self, obj) -> dict:
        return obj if isinstance(obj, dict) else self.kube.api.sanitize_for_serialization(obj)

    def _deliver(self, obj: dict, deleted: bool = False) -> str:
        version = obj["metadata"].get("resourceVersion") or "0"
        with self.lock:
            self.newest = max(self.newest, int(version))
            self.on_object(obj, time.monotonic(), deleted)
        return version

    def _run(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self._normal(self.list_fn(*self.args))
                    if self._listed.is_set():
                        self.relists += 1
                    for item in listed["items"]:
                        self._deliver(item)
                    version = listed["metadata"]["resourceVersion"]
                    self._listed.set()
                for event in watch.Watch().stream(
                    self.list_fn, *self.args, resource_version=version, timeout_seconds=self.watch_seconds
                ):
                    version = self._deliver(self._normal(event["object"]), deleted=event["type"] == "DELETED")
                    if self._stop.is_set():
                        return
            except client.ApiException as err:
                if err.status == 410:
                    version = None  # too old: list again
                else:
                    self.errors.append(f"{err.status} {err.reason}")
                    time.sleep(0.2)  # the API server is away (restarting): try again shortly
            except Exception as err:  # noqa: BLE001 - recorded, and retried
                self.errors.append(repr(err))
                time.sleep(0.2)  # likewise: the retry's pace


class PodLog(Watch):
    """Every pod UID ever seen per (job uid, attempt)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, client.CoreV1Api(kube.api).list_namespaced_pod, namespace)
        self.namespace = namespace
        self.seen: dict[tuple[str, str], set[str]] = defaultdict(set)

    def on_object(self, obj: dict, now: float, deleted: bool) -> None:
        labels = obj["metadata"].get("labels") or {}
        if "vigil.dev/job-uid" in labels:
            self.seen[labels["vigil.dev/job-uid"], labels["vigil.dev/attempt"]].add(obj["metadata"]["uid"])

    def caught_up(self) -> None:
        """Waits until the watch has delivered the newest version of every pod that exists."""
        listed = self.kube.core.list_namespaced_pod(self.namespace).items
        newest = max((int(p.metadata.resource_version) for p in listed), default=0)
        wait_until(lambda: self.newest >= newest, 30, "the test's pod watch to catch up with the API server")


class JobLog(Watch):
    """Each job's phase, and when each write to a job was seen (only the operator writes jobs
    once the test has created them): the operator's progress, on the test's clock."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        custom = client.CustomObjectsApi(kube.api)
        super().__init__(kube, custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)
        self.phase: dict[str, str | None] = {}
        self._versions: dict[str, int] = {}
        self.writes: list[tuple[float, int]] = []  # (seen at, resourceVersion) of each change

    def on_object(self, obj: dict, now: float, deleted: bool) -> None:
        name, version = obj["metadata"]["name"], int(obj["metadata"].get("resourceVersion") or 0)
        if deleted:
            self.phase.pop(name, None)
            self._versions.pop(name, None)
            return
        known = self._versions.get(name)
        if known is not None and version > known:
            self.writes.append((now, version))
        if known is None or version > known:
            self._versions[name] = version
            self.phase[name] = (obj.get("status") or {}).get("phase")

    def terminal(self, names: Iterable[str]) -> int:
        """How many of the jobs named are Succeeded or DeadLettered."""
        with self.lock:
            return sum(self.phase.get(name) in TERMINAL_JOB_PHASES for name in names)

    def recovered(self, since: float, after_version: int, until: float = float("inf")) -> float | None:
        """Seconds from `since` to the first write to a job newer than `after_version` (made after
        the fault ended) seen before `until`; None if there was none."""
        with self.lock:
            times = [t for t, version in self.writes if version > after_version and since <= t < until]
        return min(times) - since if times else None


@dataclass
class PodRecord:
    name: str
    job: str
    attempt: int
    uid: str
    added: float  # monotonic, when the watch first showed it
    seq: int  # its place in the order the watch showed pods
    ended: float | None = None  # when it finished or began to be deleted


class PodWatch(Watch):
    """The attempts' pods of a namespace. `active` is the set of pods that are neither finished
    (Succeeded/Failed) nor being deleted: the attempts that count against maxRunning, as the
    cluster shows them. `max_active` is the most it ever held, checked after every event the API
    server delivered, in the order it delivered them (one watch delivers events in
    resourceVersion order, so a pod created after another finished is always seen after it)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, client.CoreV1Api(kube.api).list_namespaced_pod, namespace, watch_seconds=10)
        self.namespace = namespace
        self.pods: dict[str, PodRecord] = {}  # uid -> record
        self.active: set[str] = set()
        self.max_active = 0
        self.events: list[tuple[float, str, str, int]] = []  # (t, start|end, pod, active after)

    def on_object(self, obj: dict, now: float, deleted: bool) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if "vigil.dev/job-uid" not in labels:
            return
        uid, name = meta["uid"], meta["name"]
        record = self.pods.get(uid)
        if record is None:
            owner = (meta.get("ownerReferences") or [None])[0]
            record = PodRecord(
                name=name,
                job=owner["name"] if owner is not None else "?",
                attempt=int(labels.get("vigil.dev/attempt", "0")),
                uid=uid,
                added=now,
                seq=len(self.pods),
            )
            self.pods[uid] = record
            self.active.add(uid)
            self.max_active = max(self.max_active, len(self.active))
            self.events.append((now, "start", name, len(self.active)))
        phase = (obj.get("status") or {}).get("phase")
        ended = deleted or meta.get("deletionTimestamp") is not None or phase in TERMINAL_POD_PHASES
        if ended and uid in self.active:
            self.active.discard(uid)
            record.ended = now
            self.events.append((now, "end", name, len(self.active)))

    def in_order(self) -> list[PodRecord]:
        with self.lock:
            return sorted(self.pods.values(), key=lambda r: r.seq)

    def active_count(self) -> int:
        with self.lock:
            return len(self.active)

    def started(self) -> int:
        with self.lock:
            return len(self.pods)

    def caught_up(self) -> None:
        """Waits until the watch has shown every pod that exists and its latest phase."""
        listed = self.kube.core.list_namespaced_pod(self.namespace).items

        def shown() -> bool:
            with self.lock:
                return all(
                    p.metadata.uid in self.pods
                    and (p.status.phase not in TERMINAL_POD_PHASES or p.metadata.uid not in self.active)
                    for p in listed
                )

        wait_until(shown, 30, "the test's pod watch to catch up with the API server")

    def duplicates(self) -> list[str]:
        """(job, attempt) pairs that had more than one pod: an attempt started twice."""
        with self.lock:
            counts = Counter((r.job, r.attempt) for r in self.pods.values())
        return [f"{job} attempt {attempt}: {n} pods" for (job, attempt), n in counts.items() if n > 1]

    def assert_healthy(self) -> None:
        assert not self.relists, f"the pod watch had to list again {self.relists} times: the order is unknown"
        # A dropped connection is resumed from the last version seen (nothing missed); many
        # errors mean something else, a bug in `on_object` say, which would repeat for ever.
        assert len(self.errors) <= 3, f"the pod watch failed {len(self.errors)} times: {self.errors[:5]}"
