"""Vigil's writes over aiohttp (vigil.kube.client, vigil.kube.operations) against a small local HTTP server:
what goes on the wire, what comes back, and the fence."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client

from vigil.core.events import Create, Patch
from vigil.kube import client as apiclient
from vigil.kube.client import ApiClient
from vigil.kube.config import Credentials
from vigil.kube.errors import ApiError, Conflict, NotFound, Refused, Unreachable
from vigil.kube.operations import Kube
from vigil.leaderelection.elector import NotLeading
from vigil.metrics import Metrics

pytestmark = pytest.mark.unit

Answer = tuple[int, Any]  # (status, JSON body)


class Server:
    """Records every request; answers each from `answer(method, path)` (default 200 `{}`)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answer: Callable[[str, str], Answer | Awaitable[Answer]] = lambda method, path: (200, {})

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "headers": dict(request.headers),
                "body": json.loads(raw) if raw else None,
            }
        )
        answer = self.answer(request.method, request.path)
        if asyncio.iscoroutine(answer):
            answer = await answer
        status, body = answer
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def run(scenario: Callable[[Server, Kube], Awaitable[None]], metrics: Metrics | None = None) -> None:
    async def main() -> None:
        server = Server()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", server.handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)  # a handler never answering is cut
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{port}"
        configuration.api_key = {"BearerToken": "s3cret"}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        http = ApiClient(Credentials(configuration), "vigil/test (pod-a)")
        try:
            await scenario(server, Kube(http, metrics))
        finally:
            await http.close()
            await runner.cleanup()

    asyncio.run(main())


JOB = {"metadata": {"name": "ledger", "namespace": "work", "uid": "job-uid", "resourceVersion": "7"}}
FIRST = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
EVENT = Create("ledger.0123456789abcdef", "Normal", "AttemptStarted", "attempt 1", 1, FIRST, FIRST)
REPEAT = Patch(EVENT.name, "Normal", "AttemptStarted", "attempt 1", 2, FIRST, FIRST + timedelta(seconds=30))


def test_a_pod_round_trips_as_the_api_servers_json():
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "ledger-1",
            "uid": "u1",
            "creationTimestamp": "2026-11-30T07:00:00Z",
            "managedFields": [{"manager": "vigil"}],
            "labels": {"a": "b"},
        },
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Pending", "reason": "Unschedulable", "someFutureField": {"x": 1}},
    }

    async def scenario(server: Server, kube: Kube) -> None:
        server.answer = lambda method, path: (201, pod)
        manifest = {"metadata": {"name": "ledger-1", "labels": {"x": None}}, "spec": {"containers": []}}
        created = await kube.create_pod("work", manifest)
        assert created is not None
        assert created["metadata"]["creationTimestamp"] == "2026-11-30T07:00:00Z"  # RFC 3339 as sent
        assert "managedFields" not in created["metadata"]  # as the watch's copies (podstate.strip_pod)
        assert created["spec"] == {}  # of the spec, Vigil keeps only nodeName (it has none yet)
        # what the readings read, as sent; the rest of the status is not kept (podstate.strip_pod)
        assert created["status"] == {"phase": "Pending", "reason": "Unschedulable"}
        request = server.seen[-1]
        assert (request["method"], request["path"]) == ("POST", "/api/v1/namespaces/work/pods")
        assert request["body"] == manifest
        assert request["headers"]["Content-Type"] == "application/json"
        assert request["headers"]["User-Agent"] == "vigil/test (pod-a)"
        assert request["headers"]["Authorization"] == "Bearer s3cret"
        assert request["headers"]["Accept"] == "application/json"

        server.answer = lambda method, path: (200, {"items": [pod, pod]})
        listed = await kube.list_job_pods("work", "job-uid")
        assert [p["metadata"]["name"] for p in listed] == ["ledger-1", "ledger-1"]
        assert server.seen[-1]["query"] == {"labelSelector": "vigil.dev/job-uid=job-uid"}
        assert [p["metadata"]["name"] for p in await kube.list_labelled_pods("work", "x=y")] == ["ledger-1", "ledger-1"]
        assert server.seen[-1]["query"] == {"labelSelector": "x=y"}

    run(scenario)


def test_the_answers_the_operator_keeps_come_without_managed_fields_and_pod_specs():
    """What a write or a direct read answers becomes the operator's cached version of the object
    (the watch's echo of it is then skipped): trimmed as the watch's copies are, so that 10,000
    jobs fit in memory (bench/README.md, "N = 10,000, and memory at 10,000 jobs")."""
    fields = [{"manager": "vigil", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    applied = {  # client-side kubectl apply's copy of the manifest; the redrive annotation stays
        "kubectl.kubernetes.io/last-applied-configuration": '{"spec": {"template": {}}}',
        "vigil.dev/redrive": "1",
    }
    job = {
        "metadata": {**JOB["metadata"], "managedFields": fields, "annotations": applied},
        "spec": {"template": {}},
        "status": {},
    }
    pod = {
        "metadata": {"name": "ledger-1", "uid": "u1", "managedFields": fields},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}], "volumes": []},
        "status": {"phase": "Running"},
    }

    async def scenario(server: Server, kube: Kube) -> None:
        def answer(method: str, path: str) -> Answer:
            if path.endswith("/pods"):
                return 200, {"items": [copy.deepcopy(pod)]}
            return 200, copy.deepcopy(pod if "/pods/" in path else job)

        server.answer = answer
        answers = [
            await kube.patch_job_status("work", "ledger", "7", {"phase": "Running"}),
            await kube.read_job("work", "ledger"),
            await kube.patch_job_labels("work", "ledger", "8", {"vigil.dev/dead-letter": "true"}),
        ]
        assert all("managedFields" not in a["metadata"] and a["spec"] == {"template": {}} for a in answers)
        assert [a["metadata"]["annotations"] for a in answers] == [{"vigil.dev/redrive": "1"}] * 3
        pods = [await kube.read_pod("work", "ledger-1"), *await kube.list_job_pods("work", "job-uid")]
        assert [p["spec"] for p in pods] == [{"nodeName": "node-a"}] * 2
        assert all("managedFields" not in p["metadata"] and p["status"] == {"phase": "Running"} for p in pods)

    run(scenario)


def test_content_types_and_bodies_are_those_the_official_client_sent():
    async def scenario(server: Server, kube: Kube) -> None:
        await kube.release_pod("work", "ledger-1", "u1")
        await kube.annotate_pod("work", "ledger-1", "u1", {"vigil.dev/superseded": "2"})
        await kube.label_pod("work", "ledger-1", "u1", "41", {"vigil.dev/leader": None})
        await kube.patch_job_status("work", "ledger", "7", {"phase": "Running"})
        await kube.patch_queue_status("work", "default", "12", {"queued": 1})
        await kube.patch_job_labels("work", "ledger", "8", {"vigil.dev/dead-letter": "true"})
        await kube.delete_pod("work", "ledger-1", "u1", grace_seconds=0)
        await kube.delete_pod("work", "ledger-2", None)
        await kube.delete_job("work", "ledger", "job-uid")
        await kube.post_event(JOB, EVENT)
        assert await kube.patch_event("work", REPEAT)
        wire = [(r["method"], r["path"], r["headers"].get("Content-Type"), r["body"]) for r in server.seen]
        pods, jobs = "/api/v1/namespaces/work/pods", "/apis/vigil.dev/v1beta1/namespaces/work/vigiljobs"
        smp, mp = "application/strategic-merge-patch+json", "application/merge-patch+json"
        assert wire[:9] == [
            (
                "PATCH",
                f"{pods}/ledger-1",
                smp,
                {"metadata": {"uid": "u1", "$deleteFromPrimitiveList/finalizers": ["vigil.dev/attempt-tracking"]}},
            ),
            (
                "PATCH",
                f"{pods}/ledger-1",
                smp,
                {"metadata": {"uid": "u1", "annotations": {"vigil.dev/superseded": "2"}}},
            ),
            (
                "PATCH",
                f"{pods}/ledger-1",
                smp,
                {"metadata": {"uid": "u1", "resourceVersion": "41", "labels": {"vigil.dev/leader": None}}},
            ),
            (
                "PATCH",
                f"{jobs}/ledger/status",
                mp,
                {"metadata": {"resourceVersion": "7"}, "status": {"phase": "Running"}},
            ),
            (
                "PATCH",
                "/apis/vigil.dev/v1beta1/namespaces/work/vigilqueues/default/status",
                mp,
                {"metadata": {"resourceVersion": "12"}, "status": {"queued": 1}},
            ),
            (
                "PATCH",
                f"{jobs}/ledger",
                mp,
                {"metadata": {"resourceVersion": "8", "labels": {"vigil.dev/dead-letter": "true"}}},
            ),
            (
                "DELETE",
                f"{pods}/ledger-1",
                "application/json",
                {"propagationPolicy": "Background", "preconditions": {"uid": "u1"}, "gracePeriodSeconds": 0},
            ),
            ("DELETE", f"{pods}/ledger-2", "application/json", {"propagationPolicy": "Background"}),
            (
                "DELETE",
                f"{jobs}/ledger",
                "application/json",
                {"preconditions": {"uid": "job-uid"}, "propagationPolicy": "Background"},
            ),
        ]
        method, path, kind, event = wire[9]
        assert (method, path, kind) == ("POST", "/api/v1/namespaces/work/events", "application/json")
        assert event["involvedObject"] == {
            "apiVersion": "vigil.dev/v1beta1",
            "kind": "VigilJob",
            "name": "ledger",
            "namespace": "work",
            "uid": "job-uid",
            "resourceVersion": "7",
        }
        assert event["metadata"] == {"name": "ledger.0123456789abcdef", "namespace": "work"}
        assert (event["type"], event["reason"], event["message"], event["count"]) == (
            "Normal",
            "AttemptStarted",
            "attempt 1",
            1,
        )
        assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-03-01T12:00:00+00:00"
        assert event["source"] == {"component": "vigil"} and "eventTime" not in event
        # A repeat: the count, the last time and the message of the Event, merged.
        assert wire[10] == (
            "PATCH",
            "/api/v1/namespaces/work/events/ledger.0123456789abcdef",
            mp,
            {"count": 2, "lastTimestamp": "2026-03-01T12:00:30+00:00", "message": "attempt 1"},
        )

    run(scenario)


def test_error_statuses_become_the_outcomes_callers_tell_apart():
    metrics = Metrics()

    async def scenario(server: Server, kube: Kube) -> None:
        status = {"kind": "Status", "reason": "Invalid", "message": "spec.containers: Required value"}
        server.answer = lambda method, path: (404, {"kind": "Status", "reason": "NotFound"})
        assert await kube.read_pod("work", "gone") is None
        assert await kube.read_job("work", "gone") is None
        assert await kube.patch_queue_status("work", "gone", "1", {}) is None
        await kube.delete_pod("work", "gone", "u1")  # already gone: done
        assert await kube.patch_event("work", REPEAT) is False, "the Event is gone: the recorder creates it again"
        with pytest.raises(NotFound):
            await kube.patch_job_status("work", "gone", "1", {})
        server.answer = lambda method, path: (409, {"kind": "Status", "reason": "AlreadyExists"})
        assert await kube.create_pod("work", {"metadata": {"name": "p"}}) is None
        with pytest.raises(Conflict):
            await kube.patch_job_status("work", "ledger", "1", {})
        server.answer = lambda method, path: (422, status)
        with pytest.raises(Refused) as refused:
            await kube.create_pod("work", {"metadata": {"name": "p"}})
        assert (refused.value.status, refused.value.reason, refused.value.message) == (
            422,
            "Invalid",
            "spec.containers: Required value",
        )
        server.answer = lambda method, path: (500, {"kind": "Status", "message": "etcd is sad"})
        with pytest.raises(ApiError) as failed:
            await kube.read_pod("work", "p")
        error = failed.value
        assert (error.status, error.reason, error.message) == (500, "InternalServerError", "etcd is sad")
        assert (failed.value.verb, failed.value.resource) == ("get", "pods")  # named by the call
        await kube.post_event(JOB, EVENT)  # best effort: logged, not raised
        assert await kube.patch_event("work", REPEAT), "refused: given up, not created again"

    run(scenario, metrics)
    assert metrics.api_errors.labels("get", "pods", "500")._value.get() == 1
    assert metrics.api_errors.labels("get", "pods", "404")._value.get() == 1
    assert metrics.api_errors.labels("patch", "vigiljobs/status", "409")._value.get() == 1


def test_a_closed_fence_sends_nothing_and_reads_are_not_fenced():
    async def scenario(server: Server, kube: Kube) -> None:
        def closed() -> None:
            raise NotLeading("not leading")

        kube.fence = closed
        for write in (
            kube.create_pod("work", {"metadata": {"name": "p"}}),
            kube.delete_pod("work", "p", "u"),
            kube.release_pod("work", "p", "u"),
            kube.patch_job_status("work", "ledger", "1", {}),
            kube.delete_job("work", "ledger", "u"),
        ):
            with pytest.raises(NotLeading):
                await write
        assert server.seen == []
        assert await kube.read_pod("work", "p") == {}
        assert await kube.read_job("work", "p") == {}
        assert len(server.seen) == 2

    run(scenario)


def test_the_fence_is_checked_again_as_the_request_is_written():
    """A write passes the fence when it is queued, and again as its bytes are written: one that
    waited for a connection (or a turn of the event loop) while the fence closed is never sent."""

    async def scenario(server: Server, kube: Kube) -> None:
        checks: list[int] = []

        def fence() -> None:
            checks.append(1)
            if len(checks) > 1:  # open when queued, closed by the time it is written
                raise NotLeading("the renew deadline passed while the write waited for a connection")

        kube.fence = fence
        with pytest.raises(NotLeading):
            await kube.delete_pod("work", "p", "u")
        assert server.seen == [] and len(checks) == 2
        kube.fence = lambda: None
        await kube.delete_pod("work", "p", "u")  # the connection given back is still usable
        assert len(server.seen) == 1

    run(scenario)


def test_an_answer_that_never_comes_is_unreachable_after_the_read_timeout():
    async def scenario(server: Server, kube: Kube) -> None:
        async def never(method: str, path: str) -> Answer:
            await asyncio.Event().wait()  # until the server's shutdown cancels it
            return 200, {}

        server.answer = never
        kube.http.read_timeout = 0.2
        with pytest.raises(Unreachable):  # the safety net below would raise TimeoutError instead
            await asyncio.wait_for(kube.read_pod("work", "p"), 30)

    run(scenario)


def test_a_fenced_write_is_bounded_by_the_time_left_before_the_fence_closes():
    """Issue 25: a write sent just inside the renew deadline could wait 20 s (the read timeout)
    for its answer, against a margin of 5 s before a standby may take over. The time left is the
    request's bound, and the API server is told the same (its `timeout` parameter)."""

    async def scenario(server: Server, kube: Kube) -> None:
        kube.fence = lambda: 7.25
        await kube.patch_job_status("work", "ledger", "7", {})
        assert server.seen[-1]["query"] == {"timeout": "7250ms"}

        async def never(method: str, path: str) -> Answer:
            await asyncio.Event().wait()  # until the server's shutdown cancels it
            return 200, {}

        server.answer = never
        kube.fence = lambda: 0.2  # the read timeout stays 20 s
        with pytest.raises(Unreachable):  # abandoned as the fence closes; the net below is a hang's
            await asyncio.wait_for(kube.patch_job_status("work", "ledger", "7", {}), 10)
        assert server.seen[-1]["query"] == {"timeout": "200ms"}
        kube.fence = lambda: None  # no election: no bound but the client's own, no parameter
        server.answer = lambda method, path: (200, {})
        await kube.delete_job("work", "ledger", "u")
        assert server.seen[-1]["query"] == {}
        await kube.read_job("work", "ledger")
        assert server.seen[-1]["query"] == {}, "reads are not fenced"

    run(scenario)


def test_the_read_and_connect_timeouts():
    timeout = ApiClient(Credentials(client.Configuration())).timeout()
    assert (timeout.sock_connect, timeout.sock_read, timeout.total) == (5, 20, None)


def test_aiohttps_one_resend_of_a_delete_passes_the_fence_again():
    """aiohttp sends a DELETE (an idempotent method) once more by itself when the connection
    broke without an answer; that resend passes the fence too, so none goes out once it closed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(5)
    accepted: list[int] = []

    def serve() -> None:  # accepts, reads the request, hangs up without an answer
        try:
            while True:
                conn, _ = listener.accept()
                if conn.recv(65536):  # a connection the fence stopped carries no request
                    accepted.append(1)
                conn.close()
        except OSError:
            return

    threading.Thread(target=serve, daemon=True).start()

    async def delete(fence: Callable[[], None]) -> None:
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{listener.getsockname()[1]}"
        http = ApiClient(Credentials(configuration))
        kube = Kube(http)
        kube.fence = fence
        try:
            await kube.delete_pod("ns", "p", "uid")
        finally:
            await http.close()

    try:
        with pytest.raises(Unreachable):  # the fence stays open: aiohttp tries twice
            asyncio.run(delete(lambda: None))
        assert len(accepted) == 2

        accepted.clear()
        checks: list[int] = []

        def fence() -> None:
            checks.append(1)
            if len(checks) > 2:  # open when queued and when sent; closed before the resend
                raise NotLeading("closed")

        with pytest.raises(NotLeading):
            asyncio.run(delete(fence))
        assert len(accepted) == 1
    finally:
        listener.close()


@pytest.mark.parametrize("workers", [4, 16])
def test_the_pool_holds_a_connection_for_every_worker_and_event_sender_at_once(workers: int):
    """Each worker and event sender holds at most one request: with the pool sized by
    pool_size, all of them are at the API server together; none waits for a connection (one
    that waited ran past the connect timeout with 16 workers on a 16-connection pool)."""
    senders = 4
    in_flight = workers + senders
    size = apiclient.pool_size(workers, senders)
    assert size >= in_flight + apiclient.SPARE_CONNECTIONS

    async def main() -> tuple[int, int]:
        arrived, most = 0, 0
        release, release_at = asyncio.Event(), in_flight

        async def handle(request: web.Request) -> web.Response:
            nonlocal arrived, most
            arrived += 1
            most = max(most, arrived)
            if arrived >= release_at:
                release.set()
            await release.wait()  # held until `release_at` requests are at the server together
            arrived -= 1
            return web.json_response({})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        results = []
        # The pool sized by pool_size: every request is at the server at once (were one waiting for
        # a connection, none would be released and the safety deadline below would fail the test).
        # One connection fewer: the server sees at most in_flight - 1 together, and the last
        # request only once a connection is given back.
        for connections, together in ((size, in_flight), (in_flight - 1, in_flight - 1)):
            most, release_at = 0, together
            release.clear()
            http = ApiClient(Credentials(configuration), connections=connections)
            try:
                calls = (http.request("GET", f"/api/v1/x{i}") for i in range(in_flight))
                await asyncio.wait_for(asyncio.gather(*calls), 30)  # a safety deadline, not a measure
            finally:
                await http.close()
            results.append(most)
        await runner.cleanup()
        return results[0], results[1]

    sized, short = asyncio.run(main())
    assert sized == in_flight, "every request was at the API server at once"
    assert short == in_flight - 1, "the check can fail: one connection fewer, and one request waits"


def test_a_list_is_trimmed_page_by_page_as_each_page_arrives():
    """`keep` sees each page before the next one is asked for, and what it refuses is not
    returned: a list of large objects never holds more than one page as the API server sent it
    (a tenant's pods with 2,500 labels each would otherwise be held whole until the last page)."""
    pages = {"": (["a", "b"], "t1"), "t1": (["c", "d"], "t2"), "t2": (["e"], "")}
    kept_before_request: list[list[str]] = []
    kept: list[str] = []

    async def scenario(server: Server, kube: Kube) -> None:
        def answer(method: str, path: str) -> Answer:
            token = server.seen[-1]["query"].get("continue", "")
            kept_before_request.append(list(kept))
            names, following = pages[token]
            items = [{"metadata": {"name": n}, "blob": "x" * 1000} for n in names]
            return 200, {"items": items, "metadata": {"continue": following, "resourceVersion": "9"}}

        def keep(item: dict) -> dict | None:
            kept.append(item["metadata"]["name"])
            return None if item["metadata"]["name"] in ("b", "d") else {"metadata": item["metadata"]}

        server.answer = answer
        items, version = await kube.http.list_all("/api/v1/pods", {"labelSelector": "x"}, page=2, keep=keep)
        assert [i["metadata"]["name"] for i in items] == ["a", "c", "e"] and version == "9"
        assert all("blob" not in i for i in items)
        assert kept_before_request == [[], ["a", "b"], ["a", "b", "c", "d"]], "each page trimmed before the next"
        assert [s["query"]["limit"] for s in server.seen] == ["2"] * 3

    run(scenario)


def test_pages_are_sized_by_bytes_so_large_items_come_a_few_at_a_time():
    """A tenant's objects may be 1.5 MiB each: a page is sized to about PAGE_BYTES of JSON at the
    sizes seen so far, starting small and growing at most fourfold a page; an answer longer than
    twice PAGE_BYTES is not read on, and the same page is asked again with half the limit."""
    sizes = {"small": 1_000, "large": 400_000}
    pages: list[int] = []

    async def scenario(server: Server, kube: Kube) -> None:
        def answer(method: str, path: str) -> Answer:
            query = server.seen[-1]["query"]
            limit, served = int(query["limit"]), int(query.get("continue") or 0)
            pages.append(limit)
            count = min(limit, 200 - served)
            kinds = ["small" if served + i < 60 else "large" for i in range(count)]  # 60 small, then large
            items = [{"metadata": {"name": f"{k}-{served + i}"}, "blob": "x" * sizes[k]} for i, k in enumerate(kinds)]
            following = str(served + count) if served + count < 200 else ""
            return 200, {"items": items, "metadata": {"continue": following, "resourceVersion": "9"}}

        server.answer = answer
        items, _ = await kube.http.list_all("/api/v1/pods", {}, page=500, page_bytes=apiclient.PAGE_BYTES)
        assert sorted(int(i["metadata"]["name"].split("-")[1]) for i in items) == list(range(200))

    run(scenario)
    # 10 and 40 small items; 160 (150 left) is over 8 MiB: asked again with 80, 40, then 20 (10 small and
    # 10 large: 4 MB); after a page of large ones, as many as fit in PAGE_BYTES.
    assert pages[:7] == [10, 40, 160, 80, 40, 20, 20], pages
    assert set(pages[7:]) == {apiclient.PAGE_BYTES // 400_000}, pages
    assert apiclient.next_page_limit(10, 10, 10_000, 500, apiclient.PAGE_BYTES) == 40
    assert apiclient.next_page_limit(40, 40, 40 * 1_500_000, 500, apiclient.PAGE_BYTES) == 2
    assert apiclient.next_page_limit(40, 1, 50_000_000, 500, apiclient.PAGE_BYTES) == 1
    assert apiclient.next_page_limit(400, 400, 4_000, 500, apiclient.PAGE_BYTES) == 500


def test_an_answer_asked_for_as_bytes_comes_as_sent_and_an_error_still_raises():
    async def scenario(server: Server, kube: Kube) -> None:
        server.answer = lambda method, path: (200, "a log line")  # this server sends it JSON-encoded
        body = await kube.http.request("GET", "/api/v1/namespaces/work/pods/p/log", as_bytes=True)
        assert body == b'"a log line"'  # the bytes as sent, not decoded
        assert server.seen[-1]["headers"]["Accept"] == "*/*"  # a log is text/plain
        server.answer = lambda method, path: (404, {"reason": "NotFound", "message": 'pods "p" not found'})
        with pytest.raises(NotFound):
            await kube.http.request("GET", "/api/v1/namespaces/work/pods/p/log", as_bytes=True)

    run(scenario)
