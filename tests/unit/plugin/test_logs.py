"""`kubectl vigil logs` (vigil.plugin.cli.logs) against a job whose life is scripted on a fake
clock: `-f` streams an attempt's log as it comes, waits out the backoff, goes on with the retry's
pod after a line naming it, and ends when the job ends; `--attempt N -f` follows that attempt
alone; `--all-attempts` prints each attempt's log in order. No test waits for real time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from kubernetes import client

from tests.support.clock import FakeClock
from tests.support.plugin import KeptOut as Out
from tests.support.plugin import sample_job
from vigil.kube.client import ApiClient
from vigil.kube.config import Credentials
from vigil.kube.errors import Refused, Unreachable, from_status
from vigil.plugin import cli, render

pytestmark = pytest.mark.unit


def pod(job: str, number: int, phase: str = "Running", node: str = "node-a") -> dict:
    return {
        "metadata": {
            "name": f"{job}-{number}",
            "labels": {"vigil.dev/job-uid": f"uid-{job}", "vigil.dev/attempt": str(number)},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }


class Timeline:
    """A job, its pods and their logs, each as it is from a time on (seconds after the start)."""

    def __init__(self, clock: FakeClock, name: str = "j") -> None:
        self.clock, self.name, self.start = clock, name, clock.monotonic()
        self.states: list[tuple[float, dict]] = []  # (from, job status)
        self.pods_: list[tuple[float, float, dict]] = []  # (from, until, pod)
        self.logs: dict[str, list[tuple[float, bytes]]] = {}  # pod -> (after waiting, chunk)
        self.streams: list[tuple[str, str | None, int | None]] = []
        self.refused: set[str] = set()

    def at(self) -> float:
        return self.clock.monotonic() - self.start

    def status(self, since: float, **status) -> None:
        self.states.append((since, status))

    def pod(self, since: float, until: float, found: dict) -> None:
        self.pods_.append((since, until, found))

    async def job(self, namespace, name):
        current = [status for since, status in self.states if since <= self.at()]
        return sample_job(self.name, **current[-1]) if name == self.name and current else None

    async def pods(self, namespace, selector):
        wanted = dict(part.split("=") for part in selector.split(","))
        now = self.at()
        return [
            found
            for since, until, found in self.pods_
            if since <= now < until and all(found["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]

    async def log(self, namespace, name, container, tail):
        return b"".join(chunk for _, chunk in self.logs.get(name, []))

    async def follow_log(self, namespace, name, container, tail) -> AsyncIterator[bytes]:
        self.streams.append((name, container, tail))
        if name in self.refused:
            raise from_status(500, {"message": "dial tcp 10.0.0.1:10250: connect: connection refused"})
        for wait, chunk in self.logs.get(name, []):
            await self.clock.sleep(wait)
            yield chunk


def follow(api: Timeline, clock: FakeClock, *argv: str, within: float = 120) -> tuple[tuple[int, str], Out, float]:
    """Runs `logs ARGV` to its end on the clock; what it returned and wrote, and when it ended."""
    out = Out()
    parsed = cli.parser().parse_args(["logs", *argv])
    parsed.output = render.parse_output("table")

    async def scenario():
        task = asyncio.create_task(cli.run(api, parsed, "ns", clock, out))  # type: ignore[arg-type]
        assert await clock.until(task.done, within), f"still following after {within}s: {out.written!r}"
        return task.result()

    result = asyncio.run(scenario())
    return result, out, api.at()


def a_retried_job(clock: FakeClock) -> Timeline:
    """Attempt 1 runs from 0 s, writes two lines and fails at 4 s; the retry's pod is created at
    10 s, Pending until 12 s, writes a line and the job Succeeds at 14 s."""
    api = Timeline(clock)
    running_1 = {"number": 1, "podName": "j-1", "phase": "Running"}
    api.status(0, phase="Running", attempts=1, currentAttempt=running_1)
    api.status(4, phase="BackingOff", attempts=1, reason="AttemptFailed")
    api.status(10, phase="Starting", attempts=2, currentAttempt={"number": 2, "podName": "j-2", "phase": "Starting"})
    api.status(12, phase="Running", attempts=2, currentAttempt={"number": 2, "podName": "j-2", "phase": "Running"})
    api.status(14, phase="Succeeded", attempts=2)
    api.pod(0, 1000, pod("j", 1, "Failed"))
    api.pod(10, 12, pod("j", 2, "Pending", node="node-b"))
    api.pod(12, 1000, pod("j", 2, "Running", node="node-b"))
    api.logs["j-1"] = [(0, b"one\n"), (2, b"two\n"), (2, b"")]
    api.logs["j-2"] = [(0, b"three\n"), (2, b"")]
    return api


def test_follow_goes_on_with_the_retrys_pod_after_a_line_naming_it_and_ends_with_the_job():
    clock = FakeClock()
    api = a_retried_job(clock)
    result, out, ended = follow(api, clock, "j", "-f")
    assert result == (cli.EXIT_OK, "")
    assert out.written == b"one\ntwo\n--- attempt 2: pod j-2 on node-b ---\nthree\n"
    assert out.notes == ["waiting for pod j-2 (attempt 2) to start"]
    assert [name for name, _, _ in api.streams] == ["j-1", "j-2"]  # each pod's log streamed once
    assert api.streams[0][1] == "main"  # the pod's first container, as kubectl picks it
    assert 14 <= ended <= 14 + 2 * cli.FOLLOW_POLL_SECONDS  # ended with the job, not long after


def test_follow_of_one_attempt_ends_with_it_and_tail_is_for_the_first_attempt_shown():
    clock = FakeClock()
    api = a_retried_job(clock)
    result, out, ended = follow(api, clock, "j", "-f", "--attempt", "1", "--tail", "5")
    assert (result, out.written) == ((cli.EXIT_OK, ""), b"one\ntwo\n")
    assert api.streams == [("j-1", "main", 5)] and ended == 4
    clock = FakeClock()
    api = a_retried_job(clock)
    follow(api, clock, "j", "-f", "--tail", "5")
    assert api.streams == [("j-1", "main", 5), ("j-2", "main", None)]


def test_follow_from_before_the_first_attempt_and_all_attempts_names_each():
    clock = FakeClock()
    api = a_retried_job(clock)
    api.states.insert(0, (-5, {"phase": "Queued", "reason": "QueueSaturated"}))
    api.start -= 5  # the job is Queued for 5 s before attempt 1
    api.pods_ = [(since + 5, until + 5, found) for since, until, found in api.pods_]
    api.states = [(since + 5, status) for since, status in api.states]
    result, out, _ = follow(api, clock, "j", "-f", "--all-attempts")
    assert out.written == (
        b"--- attempt 1: pod j-1 on node-a ---\none\ntwo\n--- attempt 2: pod j-2 on node-b ---\nthree\n"
    )


def test_a_pod_gone_or_a_log_refused_is_said_and_the_next_attempt_followed():
    clock = FakeClock()
    api = a_retried_job(clock)
    api.refused.add("j-1")  # a node that cannot give the log: the retry's is still shown
    result, out, _ = follow(api, clock, "j", "-f")
    assert out.written == b"--- attempt 2: pod j-2 on node-b ---\nthree\n"
    assert result == (cli.EXIT_FAILED, "")  # as kubectl logs exits when a log cannot be had
    assert out.notes[0].startswith("no log for pod j-1 (attempt 1): the API server answered")
    clock = FakeClock()
    api = a_retried_job(clock)
    api.pods_ = api.pods_[1:]  # attempt 1's pod deleted (its attempt Lost, say)
    api.states[0] = (0, {"phase": "BackingOff", "attempts": 1})
    result, out, _ = follow(api, clock, "j", "-f", "--attempt", "1", "--all-attempts")
    assert result == (cli.EXIT_OK, "")  # a pod gone is said, not an error: its attempt was deleted with it
    assert out.notes[0] == "attempt 1 of vigiljob j: no log (its pod is gone, or it never started)"
    assert out.written.endswith(b"--- attempt 2: pod j-2 on node-b ---\nthree\n")


def test_follow_of_a_job_already_ended_prints_its_log_and_ends_at_once():
    clock = FakeClock()
    api = Timeline(clock)
    api.status(0, phase="DeadLettered", attempts=1, reason="NonRetryableExitCode")
    api.pod(0, 1000, pod("j", 1, "Failed"))
    api.logs["j-1"] = [(0, b"exit 7\n")]
    result, out, ended = follow(api, clock, "j", "-f")
    assert (result, out.written, ended) == ((cli.EXIT_OK, ""), b"exit 7\n", 0)


def test_all_attempts_without_follow_prints_each_pod_still_there_in_order():
    clock = FakeClock()
    api = a_retried_job(clock)
    clock.tick(20)
    result, out, _ = follow(api, clock, "j", "--all-attempts")
    assert result == (cli.EXIT_OK, "")
    assert out.written == (
        b"--- attempt 1: pod j-1 on node-a ---\none\ntwo\n--- attempt 2: pod j-2 on node-b ---\nthree\n"
    )
    api.pods_ = []
    with pytest.raises(cli.Failed, match="vigiljob j has no pod left"):
        follow(api, clock, "j", "--all-attempts")


def test_the_followed_log_comes_as_it_is_written_over_the_plugins_client_with_no_read_timeout():
    """The real Api.follow_log against a local server that streams a log with pauses longer than
    the client's read timeout (as a quiet job does): every byte, in order, and the request kubectl
    logs -f makes."""
    seen: list[web.Request] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        if request.match_info["pod"] == "pending":
            body = {"kind": "Status", "code": 400, "message": 'container "main" is waiting to start'}
            return web.json_response(body, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for line in (b"one\n", b"two\n"):
            await response.write(line)
            await asyncio.sleep(0.6)  # three times the client's read timeout
        await response.write_eof()
        return response

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ns/pods/{pod}/log", handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{port}"
        configuration.api_key = {"BearerToken": "Bearer s3cret"}
        http = ApiClient(Credentials(configuration), "kubectl-vigil", read_timeout=0.2)
        api = cli.Api(http)
        try:
            chunks = [chunk async for chunk in api.follow_log("ns", "j-1", "main", 3)]
            assert b"".join(chunks) == b"one\ntwo\n"
            assert dict(seen[0].query) == {"container": "main", "tailLines": "3", "follow": "true"}
            assert seen[0].headers["Authorization"] == "Bearer s3cret"
            with pytest.raises(Refused, match="waiting to start"):
                [chunk async for chunk in api.follow_log("ns", "pending", None, None)]
        finally:
            await http.close()
            await runner.cleanup()
        with pytest.raises(Unreachable, match="the log of pod j-1"):
            [
                chunk
                async for chunk in cli.Api(ApiClient(Credentials(configuration))).follow_log("ns", "j-1", None, None)
            ]

    asyncio.run(asyncio.wait_for(scenario(), 20))  # bounds only a hang


def test_a_pod_running_on_its_sidecar_alone_is_waited_for_until_the_jobs_container_runs():
    clock = FakeClock()
    api = a_retried_job(clock)
    sidecar_only = pod("j", 1, "Running")
    sidecar_only["status"]["containerStatuses"] = [
        {"name": "main", "state": {"waiting": {"reason": "PodInitializing"}}}
    ]
    api.pods_[0] = (0, 1, sidecar_only)
    api.pod(1, 1000, pod("j", 1, "Running"))
    result, out, _ = follow(api, clock, "j", "-f", "--attempt", "1")
    assert out.notes == ["waiting for pod j-1 (attempt 1) to start"]
    assert (result, out.written) == ((cli.EXIT_OK, ""), b"one\ntwo\n")
    assert len(api.streams) == 1  # asked once its container ran, not refused as "waiting to start"


def test_a_pod_that_never_started_is_left_once_the_job_has_moved_on():
    clock = FakeClock()
    api = a_retried_job(clock)
    api.pods_[0] = (0, 1000, pod("j", 1, "Pending"))  # stuck, the operator's deadline gave up on it
    api.states[1] = (4, {"phase": "BackingOff", "attempts": 1})
    result, out, _ = follow(api, clock, "j", "-f")
    assert out.notes[:2] == [
        "waiting for pod j-1 (attempt 1) to start",
        "attempt 1 of vigiljob j: no log (its pod is gone, or it never started)",
    ]
    assert out.written == b"--- attempt 2: pod j-2 on node-b ---\nthree\n" and result == (cli.EXIT_OK, "")
