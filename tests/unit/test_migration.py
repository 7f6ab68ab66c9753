"""`vigil migrate-storage`, without a cluster: every object of both kinds is written once,
unchanged and fenced, at a bounded rate, across pages and an expired continue token, a conflict
read again, a deletion skipped; storedVersions is recorded only after the last object, and not
at all when anything failed or when the CRDs do not store v1beta1 yet."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.clock import FakeClock
from vigil import migration
from vigil.core import storage
from vigil.kube.errors import from_status

pytestmark = pytest.mark.unit

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class Api:
    """Objects by plural, listed `page` a page; CRDs; every request recorded with the fake time."""

    def __init__(self, clock: FakeClock, objects: dict[str, list[tuple[str, str]]], storage_version: str = "v1beta1"):
        self.clock, self.calls = clock, []
        self.rv = 100
        self.objects = {
            plural: {(ns, name): self._next_rv() for ns, name in items} for plural, items in objects.items()
        }
        self.crds = {
            crd: {
                "metadata": {"name": crd, "resourceVersion": "7"},
                "spec": {
                    "versions": [
                        {"name": "v1beta1", "served": True, "storage": storage_version == "v1beta1"},
                        {"name": "v1alpha1", "served": True, "storage": storage_version == "v1alpha1"},
                    ]
                },
                "status": {"storedVersions": ["v1alpha1", "v1beta1"]},
            }
            for crd in ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev")
        }
        self.expire_token_once = False
        self.changed_under_first_write: set[tuple[str, str]] = set()  # another writer wins the first write
        self.deleted_before_write: set[tuple[str, str]] = set()
        self.unavailable_once: set[tuple[str, str]] = set()
        self.forbidden: set[tuple[str, str]] = set()

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    async def request(self, method: str, path: str, *, params=None, body=None, content_type=None, accept=None):
        self.calls.append((self.clock.monotonic(), method, path, dict(params or {}), body))
        if path.startswith(CRDS):
            name = path.removeprefix(CRDS + "/").removesuffix("/status")
            if method == "PATCH":
                assert path.endswith("/status") and content_type == "application/merge-patch+json"
                self.crds[name]["status"] = body["status"]
                return self.crds[name]
            return self.crds[name]
        parts = path.strip("/").split("/")
        if method == "GET" and parts[-1] in self.objects:  # a list, all namespaces
            assert accept == migration.METADATA_LIST and parts[2] == "v1beta1"
            items = sorted(self.objects[parts[-1]].items())
            start = int(params.get("continue") or 0)
            if start and self.expire_token_once:
                self.expire_token_once = False
                raise from_status(410, {"reason": "Expired", "message": "continue token too old"})
            end = start + int(params["limit"])
            page = [
                {"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}}
                for (ns, name), rv in items[start:end]
            ]
            return {"items": page, "metadata": {"continue": str(end) if end < len(items) else ""}}
        _, _, version, _, ns, plural, name = parts
        assert version == "v1beta1"
        key = (ns, name)
        if key in self.deleted_before_write:
            self.objects[plural].pop(key, None)
        if key not in self.objects[plural]:
            raise from_status(404, {"reason": "NotFound"})
        if method == "GET":
            return {"metadata": {"namespace": ns, "name": name, "resourceVersion": self.objects[plural][key]}}
        assert method == "PATCH" and content_type == "application/merge-patch+json"
        if key in self.forbidden:
            raise from_status(403, {"reason": "Forbidden"})
        if key in self.unavailable_once:
            self.unavailable_once.discard(key)
            raise from_status(503, {"reason": "ServiceUnavailable"})
        if key in self.changed_under_first_write:
            self.changed_under_first_write.discard(key)
            self.objects[plural][key] = self._next_rv()
        if body["metadata"]["resourceVersion"] != self.objects[plural][key]:
            raise from_status(409, {"reason": "Conflict"})
        self.objects[plural][key] = self._next_rv()
        return {}

    def writes(self) -> list[tuple[str, str, dict]]:
        return [(m, p, b) for _, m, p, _, b in self.calls if m == "PATCH" and not p.startswith(CRDS)]


JOBS = [(f"ns-{i % 3}", f"job-{i:02}") for i in range(25)]
QUEUES = [("ns-0", "default"), ("ns-1", "nightly")]


def run(api: Api, clock: FakeClock, **options: Any) -> migration.Migrated:
    async def main() -> migration.Migrated:
        task = asyncio.ensure_future(migration.Migration(api, clock=clock, **options).run())  # type: ignore[arg-type]
        await clock.until(task.done, 3600)
        return task.result()

    return asyncio.run(main())


def test_every_object_is_written_once_unchanged_then_storedversions_is_recorded() -> None:
    clock = FakeClock()
    api = Api(clock, {"vigiljobs": JOBS, "vigilqueues": QUEUES})
    before = {plural: dict(items) for plural, items in api.objects.items()}
    done = run(api, clock, page=4, rate=10.0)
    assert done.rewritten == {"vigiljobs": 25, "vigilqueues": 2}
    written = api.writes()
    assert len(written) == 27
    for _, path, body in written:  # only the resourceVersion it was read at: nothing else can change
        *_, ns, plural, name = path.strip("/").split("/")
        assert body == {"metadata": {"resourceVersion": before[plural][(ns, name)]}}
    assert {path for _, path, _ in written} == {
        f"/apis/vigil.dev/v1beta1/namespaces/{ns}/{plural}/{name}"
        for plural, items in (("vigiljobs", JOBS), ("vigilqueues", QUEUES))
        for ns, name in items
    }
    # storedVersions last, each CRD after its own objects, fenced by the CRD as first read
    status = [(i, call) for i, call in enumerate(api.calls) if call[1] == "PATCH" and call[2].startswith(CRDS)]
    assert [call[4] for _, call in status] == [
        {"metadata": {"resourceVersion": "7"}, "status": {"storedVersions": ["v1beta1"]}}
    ] * 2
    last_job_write = max(i for i, c in enumerate(api.calls) if c[1] == "PATCH" and "/vigiljobs/" in c[2])
    first_queue_write = min(i for i, c in enumerate(api.calls) if c[1] == "PATCH" and "/vigilqueues/" in c[2])
    assert last_job_write < status[0][0] < first_queue_write
    assert api.crds["vigiljobs.vigil.dev"]["status"]["storedVersions"] == ["v1beta1"]
    # the pace: 27 writes at 10 a second (a burst of 1) take 2.6 s at least
    times = [t for t, m, p, _, _ in api.calls if m == "PATCH" and not p.startswith(CRDS)]
    assert times[-1] - times[0] >= 2.6 - 1e-9
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(times, times[1:], strict=False))


def test_a_conflict_is_read_again_a_deletion_skipped_a_503_retried_an_expired_list_restarted() -> None:
    clock = FakeClock()
    api = Api(clock, {"vigiljobs": JOBS, "vigilqueues": QUEUES})
    api.changed_under_first_write = {("ns-1", "job-04")}
    api.deleted_before_write = {("ns-2", "job-05")}
    api.unavailable_once = {("ns-0", "job-06")}
    api.expire_token_once = True
    done = run(api, clock, page=10, rate=1000.0)
    assert done.gone == {"vigiljobs": 1}
    assert done.rewritten["vigiljobs"] >= 24  # the first page is written again after the restart
    conflicted = [b for _, p, b in api.writes() if p.endswith("/ns-1/vigiljobs/job-04")]
    assert len(conflicted) >= 2 and conflicted[-1] != conflicted[0]  # the second at the fresh version
    rereads = [c for c in api.calls if c[1] == "GET" and c[2].endswith("/ns-1/vigiljobs/job-04")]
    assert rereads
    lists = [c for c in api.calls if c[1] == "GET" and c[2] == "/apis/vigil.dev/v1beta1/vigiljobs"]
    assert [c[3].get("continue", "") for c in lists][:3] == ["", "10", ""]  # 410 on page 2: from the start
    assert api.crds["vigiljobs.vigil.dev"]["status"]["storedVersions"] == ["v1beta1"]


def test_a_write_refused_leaves_storedversions_as_it_was() -> None:
    clock = FakeClock()
    api = Api(clock, {"vigiljobs": JOBS, "vigilqueues": QUEUES})
    api.forbidden = {("ns-2", "job-08")}
    with pytest.raises(migration.MigrationFailed, match=r"rewriting vigiljobs ns-2/job-08 failed: 403"):
        run(api, clock, rate=1000.0)
    assert api.crds["vigiljobs.vigil.dev"]["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
    assert not [c for c in api.calls if c[1] == "PATCH" and c[2].startswith(CRDS)]


def test_before_the_new_crds_are_applied_nothing_is_written() -> None:
    clock = FakeClock()
    api = Api(clock, {"vigiljobs": JOBS, "vigilqueues": QUEUES}, storage_version="v1alpha1")
    with pytest.raises(storage.NotReady, match="apply this release's CRDs first"):
        run(api, clock)
    assert not [c for c in api.calls if c[1] != "GET"]


def test_a_dry_run_writes_nothing_and_a_migrated_cluster_is_left_alone() -> None:
    clock = FakeClock()
    api = Api(clock, {"vigiljobs": JOBS, "vigilqueues": QUEUES})
    assert run(api, clock, dry_run=True).rewritten == {"vigiljobs": 25, "vigilqueues": 2}
    assert not [c for c in api.calls if c[1] != "GET"]
    run(api, clock, rate=1000.0)
    api.calls.clear()
    done = run(api, clock)
    assert done.already == ["vigiljobs.vigil.dev", "vigilqueues.vigil.dev"]
    assert not [c for c in api.calls if c[1] != "GET"]
