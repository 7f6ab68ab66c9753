"""The webhook's server on loopback (real TLS sockets, no cluster): what it answers to malformed,
oversized, slow and too many reviews, and that a large body is decoded in its child process.

No assertion here is on elapsed time: "at once" is checked by order (the refusal arrives while
the requests holding the slots are still unfinished), and the read deadline is made short.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from vigil.core.queueing.book import QueueSpec
from vigil.servers.webhook import (
    INLINE_BYTES,
    MAX_LARGE_IN_FLIGHT,
    MAX_REQUEST_BYTES,
    PATH,
    Skimmer,
    WebhookServer,
)

pytestmark = pytest.mark.unit


def review(name: str = "job", queue: str = "batch", padding: int = 0, tasks: object = None) -> dict:
    """A VigilJob create's review; `padding` bytes of an annotation make it as large as wanted;
    `tasks`: its spec.tasks (an array), None for a plain job."""
    metadata: dict = {"name": name, "namespace": "etl", "uid": f"uid-{name}"}
    if padding:
        metadata["annotations"] = {"pad": "x" * padding}
    spec: dict = {"queue": queue}
    if tasks is not None:
        spec["tasks"] = tasks
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"r-{name}",
            "resource": {"group": "vigil.dev", "version": "v1beta1", "resource": "vigiljobs"},
            "name": name,
            "namespace": "etl",
            "operation": "CREATE",
            "dryRun": False,
            "object": {"metadata": metadata, "spec": spec},
        },
    }


def full_batch(namespace: str, queue: str) -> tuple[QueueSpec | None, int]:
    return (QueueSpec(max_queued=5), 5) if queue == "batch" else (QueueSpec(max_queued=5), 0)


Test = Callable[[WebhookServer, "Client"], Awaitable[None]]


class Client:
    def __init__(self, port: int, certs: Path) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    async def post(self, data: bytes, **headers: str) -> tuple[int, str]:
        url = f"https://127.0.0.1:{self.port}{PATH}"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=data, ssl=self.context, headers=headers) as response,
        ):
            return response.status, await response.text()

    async def held(self, length: int, sent: bytes = b"{") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A request that states `length` bytes of body and sends only `sent` of them."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.context)
        head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        writer.write(head.encode() + sent)
        await writer.drain()
        return reader, writer


def run(certs: Path, test: Test, **options) -> WebhookServer:
    server = WebhookServer(full_batch, **options)

    async def main() -> None:
        await server.start("127.0.0.1:0", certs / "tls.crt", certs / "tls.key")
        try:
            await test(server, Client(server.port, certs))
        finally:
            await server.stop()

    asyncio.run(main())
    return server


def answer(text: str) -> dict:
    return json.loads(text)["response"]


# ------------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    "body, why",
    [
        (b"{", "the body is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"[" * 5000 + b"]" * 5000, "the body's JSON is nested too deeply for an AdmissionReview"),
        (b"[" * 100_000 + b"]" * 100_000, "the body's JSON is nested too deeply for an AdmissionReview"),  # child
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"resource": "x"}}),
            "expected an AdmissionReview admission.k8s.io/v1: request.uid is missing; "
            "request.resource must be an object, not the string 'x'",
        ),
        (json.dumps({"kind": "Pod"}), "kind must be 'AdmissionReview', not 'Pod'"),
        (b'{"a": 1}' + b" " * INLINE_BYTES, "apiVersion is missing"),  # the same check after the child
        (
            json.dumps(review(tasks={"items": "a.csv"}, padding=INLINE_BYTES)),  # in the child
            "request.object.spec.tasks.items must be an array, not the string 'a.csv'",
        ),
        (
            json.dumps(review(tasks={"items": []})),
            "request.object.spec.tasks.items must hold from 1 to 100000 entries, not 0",
        ),
    ],
)
def test_a_malformed_review_is_a_400_that_says_what_is_wrong(certs: Path, body, why):
    got: list[tuple[int, str]] = []

    async def test(server: WebhookServer, client: Client) -> None:
        got.append(await client.post(body.encode() if isinstance(body, str) else body))

    run(certs, test)
    status, text = got[0]
    assert status == 400 and why in text, (status, text)


# ------------------------------------------------------------------- small and large verdicts


def test_a_large_review_is_decoded_in_the_child_and_answered_as_a_small_one(certs: Path):
    got: list[tuple[int, str]] = []

    async def test(server: WebhookServer, client: Client) -> None:
        for padding in (0, 2 * 1024 * 1024):
            got.append(await client.post(json.dumps(review("j", "batch", padding)).encode()))
            got.append(await client.post(json.dumps(review("k", "roomy", padding)).encode()))

    server = run(certs, test)
    small_full, small_roomy, large_full, large_roomy = ((status, answer(text)) for status, text in got)
    assert small_full == large_full and small_roomy == large_roomy
    assert small_full[0] == 200 and small_full[1]["status"]["code"] == 429
    assert small_roomy == (200, {"uid": "r-k", "allowed": True})
    assert server.skimmer.started == 1 and (server.reviews, server.refusals) == (4, 2)


def test_arrays_are_judged_by_their_tasks_whether_decoded_on_the_loop_or_in_the_child(certs: Path):
    """The same arrays, small and (their items padded past INLINE_BYTES) large, to queues of
    maxQueued 5: "roomy" with none waiting, "batch" with 5."""
    got: list[list[tuple[int, dict]]] = []

    def items(n: int, large: bool) -> list[str]:
        return ["x" * (INLINE_BYTES // n + 1) if large else f"part-{i}" for i in range(n)]

    async def test(server: WebhookServer, client: Client) -> None:
        for large in (False, True):
            bodies = [
                review("fits", "roomy", tasks={"items": items(5, large)}),
                review("never", "roomy", tasks={"items": items(6, large)}),
                review("full", "batch", tasks={"items": items(1, large)}),
                review("count", "roomy", padding=INLINE_BYTES if large else 0, tasks={"count": 6}),
            ]
            answers = []
            for body in bodies:
                data = json.dumps(body).encode()
                assert (len(data) > INLINE_BYTES) == large
                status, text = await client.post(data)
                answers.append((status, answer(text)))
            got.append(answers)

    server = run(certs, test)
    small, large = got
    assert small == large and server.skimmer.started == 1
    fits, never, full, count = small
    assert fits == (200, {"uid": "r-fits", "allowed": True})
    assert never[1]["status"]["code"] == 429 and never[1]["status"]["message"] == (
        'an array of 6 tasks can never fit in queue "roomy" in namespace "etl" (maxQueued 5): split it into '
        "arrays of at most 5 tasks, or raise spec.maxQueued of VigilQueue etl/roomy"
    )
    assert full[1]["status"]["code"] == 429 and full[1]["status"]["message"].startswith(
        'queue "batch" in namespace "etl" has no room for an array of 1 task: 5 tasks wait to start (maxQueued 5)'
    )
    assert count[1]["status"]["message"] == never[1]["status"]["message"]
    assert (server.reviews, server.refusals) == (8, 6)


def test_the_child_sends_back_an_arrays_number_of_items_not_the_items():
    """100,000 items of 20 bytes (2.1 MiB of review): what crosses the pipe back is the count."""

    async def main() -> None:
        skimmer = Skimmer()
        try:
            body = json.dumps(review(tasks={"items": ["s3://b/part-000000.csv"] * 100_000})).encode()
            assert INLINE_BYTES < 2 * 1024 * 1024 < len(body) <= MAX_REQUEST_BYTES
            fields = await skimmer.skim(body)
            assert fields["request"]["object"]["spec"] == {"queue": "batch", "tasks": {"itemsCount": 100_000}}
            assert len(json.dumps(fields)) < 600
        finally:
            await skimmer.close()

    asyncio.run(main())


def test_a_dead_child_is_started_again_and_an_overrun_is_a_503(certs: Path):
    got: list[tuple[int, str]] = []
    large = json.dumps(review("j", "roomy", 200_000)).encode()

    async def test(server: WebhookServer, client: Client) -> None:
        got.append(await client.post(large))
        assert server.skimmer._proc is not None
        server.skimmer._proc.kill()  # as the kernel's OOM killer would
        await server.skimmer._proc.wait()
        got.append(await client.post(large))
        server.skimmer.timeout = 1e-6  # no 200 kB can cross a pipe and come back decoded in that
        got.append(await client.post(large))
        server.skimmer.timeout = 5
        got.append(await client.post(large))

    server = run(certs, test)
    assert [status for status, _ in got] == [200, 200, 503, 200], got
    assert "decoding the review took over 1e-06 s; retry" in got[2][1]
    assert server.skimmer.started == 3  # the first, after the kill, after the overrun


# ----------------------------------------------------------------------------------- limits


def test_a_body_over_the_cap_is_a_413_whether_its_length_is_stated_or_not(certs: Path):
    got: list[tuple[int, str]] = []

    async def test(server: WebhookServer, client: Client) -> None:
        got.append(await client.post(b" " * (MAX_REQUEST_BYTES + 1)))

        async def chunks():
            for _ in range(MAX_REQUEST_BYTES // 65536 + 2):
                yield b" " * 65536

        url = f"https://127.0.0.1:{client.port}{PATH}"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=chunks(), ssl=client.context) as response,  # chunked: no length stated
        ):
            got.append((response.status, await response.text()))
        got.append(await client.post(json.dumps(review()).encode()))  # and the server still answers

    run(certs, test)
    assert got[0] == (413, f"a review of {MAX_REQUEST_BYTES + 1} bytes is over this webhook's limit of 3145728\n")
    assert got[1] == (413, "the review is over this webhook's limit of 3145728 bytes\n")
    assert got[2][0] == 200


def test_reviews_over_the_in_flight_cap_are_a_503_at_once_and_a_slow_body_a_408(certs: Path):
    got: dict[str, tuple[int, str]] = {}

    async def test(server: WebhookServer, client: Client) -> None:
        held = [await client.held(1024 * 1024) for _ in range(MAX_LARGE_IN_FLIGHT)]
        while server.in_flight["large"] < MAX_LARGE_IN_FLIGHT:
            await asyncio.sleep(0.01)  # until the server has taken both (a poll, not a wait for time)
        got["large"] = await client.post(json.dumps(review("j", "roomy", INLINE_BYTES)).encode())
        got["small"] = await client.post(json.dumps(review("k", "roomy")).encode())
        assert server.in_flight["large"] == MAX_LARGE_IN_FLIGHT  # both still held: the 503 came at once
        for reader, writer in held:
            head = (await reader.read(65536)).decode()
            got.setdefault("held", (int(head.split()[1]), head.rsplit("\r\n\r\n", 1)[1]))
            writer.close()

    server = run(certs, test, read_seconds=0.5)
    assert got["large"] == (
        503,
        f"this webhook is answering {MAX_LARGE_IN_FLIGHT} reviews of over {INLINE_BYTES} bytes (or unstated) "
        "already; retry\n",
    )
    assert got["small"][0] == 200 and answer(got["small"][1])["allowed"]
    assert got["held"] == (408, "the review's body did not arrive within 0.5 s\n")
    assert server.turned_away == 1


def test_the_skimmer_ends_its_child_when_closed():
    async def main() -> None:
        skimmer = Skimmer()
        assert await skimmer.skim(b'{"kind": "AdmissionReview", "junk": [1, 2]}') == {"kind": "AdmissionReview"}
        proc = skimmer._proc
        assert proc is not None
        await skimmer.close()
        assert proc.returncode == 0

    asyncio.run(main())


def test_a_decode_cancelled_midway_leaves_no_child_out_of_step():
    async def main() -> None:
        skimmer = Skimmer()
        task = asyncio.create_task(skimmer.skim(b'{"kind": "AdmissionReview", "pad": "' + b"x" * 8_000_000 + b'"}'))
        while skimmer._proc is None:
            await asyncio.sleep(0)  # until the child is started and the body on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await skimmer.skim(b'{"kind": "AdmissionReview"}') == {"kind": "AdmissionReview"}
        assert skimmer.started == 2
        await skimmer.close()

    asyncio.run(main())
