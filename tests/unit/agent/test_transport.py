"""The agent's one blocking transport (vigil.agent.transport) under the pod's patch
(vigil.agent.heart.PodHeartbeat), against a scripted server on 127.0.0.1, plain and TLS."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.scripted_http import server
from vigil.agent import heart, transport
from vigil.agent.heart import PodHeartbeat, Settings
from vigil.agent.transport import AnswerTooLarge, KeepAlive
from vigil.api import ANNOTATION_HEARTBEAT, ANNOTATION_SUPERSEDED
from vigil.core.fencing import Observed
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.unit

PATH = "/api/v1/namespaces/n/pods/p"


def answer(status: int, body: bytes, *extra: str) -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{line}\r\n" for line in extra) + "\r\n").encode() + body


POD = answer(200, json.dumps({"metadata": {"name": "p", "annotations": {}}}).encode())
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
    b"%x\r\n%s\r\n" % (len(piece), piece) for piece in (b'{"me', b'tadata": {"name": "p"}}', b"")
)
SILENT = b""  # the script's answer for "read the request, answer nothing, keep the connection"


class Credentials:
    """What PodHeartbeat asks of vigil.kube.config.Credentials; the token changes as the kubelet's would."""

    def __init__(self, host: str, ca: Path | None = None) -> None:
        self.host, self.ca, self.token = host, ca, "token-one"
        self.asked = 0

    def auth_headers(self) -> dict[str, str]:
        self.asked += 1
        return {"Authorization": f"Bearer {self.token}"}

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.host.startswith("https"):
            return False
        return ssl.create_default_context(cafile=str(self.ca) if self.ca else None)


def pod_heartbeat(host: str, timeout: float = 5.0, ca: Path | None = None) -> PodHeartbeat:
    settings = Settings(pod_name="p", namespace="n")
    return PodHeartbeat(settings, timeout, Credentials(host, ca))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    make_self_signed(directory)
    return directory


def test_the_patch_is_a_merge_patch_of_the_pods_annotations_with_its_headers_on_one_connection():
    with server(lambda n: (POD, False)) as s:
        pod = pod_heartbeat(s.host)
        try:
            assert pod.patch({ANNOTATION_HEARTBEAT: "1:ab"}) == (Observed.RENEWED, "")
            pod.credentials.token = "token-two"  # type: ignore[attr-defined]  # rotated
            assert pod.patch({ANNOTATION_HEARTBEAT: "2:ab"}) == (Observed.RENEWED, "")
        finally:
            pod.close()
    first, second = s.requests
    assert first.line == f"PATCH {PATH} HTTP/1.1"
    assert first.headers["content-type"] == "application/merge-patch+json"
    assert first.headers["accept"] == "application/json"
    assert first.headers["user-agent"].startswith("vigil/") and first.headers["user-agent"].endswith("(p; agent)")
    assert first.headers["host"] == f"127.0.0.1:{s.port}"
    assert first.headers["authorization"] == "Bearer token-one"
    assert second.headers["authorization"] == "Bearer token-two"
    assert json.loads(first.body) == {"metadata": {"annotations": {ANNOTATION_HEARTBEAT: "1:ab"}}}
    assert s.connections == 1, "the second patch reuses the kept-alive connection"


def test_a_path_in_the_servers_url_comes_before_the_pods():
    with server(lambda n: (POD, False)) as s:
        pod = pod_heartbeat(s.host + "/k8s/clusters/c-1/")
        try:
            assert pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})[0] is Observed.RENEWED
        finally:
            pod.close()
    assert s.requests[0].line == f"PATCH /k8s/clusters/c-1{PATH} HTTP/1.1"


@pytest.mark.parametrize(
    ("reply", "observed", "detail"),
    [
        (answer(200, json.dumps({"metadata": {"annotations": {ANNOTATION_SUPERSEDED: "2"}}}).encode()),
         Observed.SUPERSEDED, ""),
        (answer(200, b'{"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}'), Observed.DELETING, ""),
        (answer(200, b""), Observed.RENEWED, ""),
        (answer(404, b'{"kind":"Status","reason":"NotFound","message":"pods \\"p\\" not found"}'),
         Observed.GONE, '404 NotFound: pods "p" not found'),
        (answer(401, b'{"kind":"Status","reason":"Unauthorized","message":"Unauthorized"}'),
         Observed.UNAUTHORIZED, "401 Unauthorized: Unauthorized"),
        (answer(403, b'{"reason":"Forbidden","message":"no patch"}'), Observed.API_ERROR, "403 Forbidden: no patch"),
        (answer(503, b"busy", "Retry-After: 1"), Observed.API_ERROR, "503 ServiceUnavailable: busy"),
        (answer(200, b"{half"), Observed.API_ERROR, "the answer is not JSON"),
        (CHUNKED, Observed.RENEWED, ""),
    ],
    ids=["superseded", "deleting", "empty", "404", "401", "403", "503", "not json", "chunked"],
)  # fmt: skip
def test_what_the_api_server_answers_is_the_beats_outcome(reply, observed, detail):
    with server(lambda n: (reply, False)) as s:
        pod = pod_heartbeat(s.host)
        try:
            got, why = pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})
        finally:
            pod.close()
    assert got is observed and detail in why and (why == "") == (detail == "")


def test_an_api_server_that_does_not_answer_in_time_is_an_api_error_within_the_timeout():
    with server(lambda n: (SILENT, False)) as s:
        pod = pod_heartbeat(s.host, timeout=0.3)
        began = time.monotonic()
        try:
            got, why = pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})
        finally:
            pod.close()
    assert time.monotonic() - began < 2.0
    assert got is Observed.API_ERROR and why == f"PATCH {PATH}: no answer within 0.3s"


def test_a_refused_connection_is_an_api_error():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        pod = pod_heartbeat(f"http://127.0.0.1:{unused.getsockname()[1]}")
        try:
            got, why = pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})
        finally:
            pod.close()
    assert got is Observed.API_ERROR and "ConnectionRefusedError" in why


def test_a_kept_connection_the_server_closed_while_idle_is_made_again_before_the_patch():
    with server(lambda n: (POD, True)) as s:  # answers, then closes
        pod = pod_heartbeat(s.host)
        try:
            assert pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})[0] is Observed.RENEWED
            ((client, _),) = pod._made
            deadline = time.monotonic() + 5
            while not transport._readable(client._local.sock) and time.monotonic() < deadline:
                time.sleep(0.01)  # until the server's close has reached the agent's socket
            assert pod.patch({ANNOTATION_HEARTBEAT: "2:ab"}) == (Observed.RENEWED, "")
        finally:
            pod.close()
    assert len(s.requests) == 2 and s.connections == 2


def test_a_patch_whose_reused_connection_drops_unanswered_is_an_error_and_not_sent_twice():
    # A PATCH is not idempotent as HTTP sees it: the agent's next beat is the retry.
    with server(lambda n: (POD, False) if n == 1 else (SILENT, True)) as s:
        pod = pod_heartbeat(s.host)
        try:
            assert pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})[0] is Observed.RENEWED
            got, why = pod.patch({ANNOTATION_HEARTBEAT: "2:ab"})
        finally:
            pod.close()
    assert got is Observed.API_ERROR and "the API server closed the connection unanswered" in why
    assert len(s.requests) == 2 and s.connections == 1


def test_a_connection_idle_past_the_limit_is_not_reused(monkeypatch):
    now = [1000.0]  # the idle clock, moved by the test
    monkeypatch.setattr(transport, "IDLE_CLOCK", lambda: now[0])
    with server(lambda n: (POD, False)) as s:
        pod = pod_heartbeat(s.host)
        try:
            pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})
            now[0] += heart.API_IDLE_SECONDS  # idle for the limit exactly: still kept
            pod.patch({ANNOTATION_HEARTBEAT: "2:ab"})
            now[0] += heart.API_IDLE_SECONDS + 0.1
            pod.patch({ANNOTATION_HEARTBEAT: "3:ab"})
        finally:
            pod.close()
    assert [r.connection for r in s.requests] == [1, 1, 2]


def test_each_thread_patches_on_its_own_connection_and_close_ends_them_all():
    with server(lambda n: (POD, False)) as s:
        pod = pod_heartbeat(s.host)
        outcomes: list[Observed] = []
        threads = [threading.Thread(target=lambda: outcomes.append(pod.patch({"a": "b"})[0])) for _ in range(2)]
        for t in threads:
            t.start()
            t.join()
        outcomes.append(pod.patch({"a": "b"})[0])
        pod.close()
        ((client, _),) = pod._made
        assert client._open == set()
    assert outcomes == [Observed.RENEWED] * 3 and s.connections == 3


def test_over_tls_the_patch_trusts_the_clusters_ca_and_nothing_else(certs: Path):
    with server(lambda n: (POD, False), certs) as s:
        pod = pod_heartbeat(s.host, ca=certs / "ca.crt")
        try:
            assert pod.patch({ANNOTATION_HEARTBEAT: "1:ab"}) == (Observed.RENEWED, "")
            assert pod.patch({ANNOTATION_HEARTBEAT: "2:ab"}) == (Observed.RENEWED, "")
        finally:
            pod.close()
        assert s.connections == 1
        untrusted = pod_heartbeat(s.host)  # the system's store does not know the test CA
        try:
            got, why = untrusted.patch({ANNOTATION_HEARTBEAT: "3:ab"})
        finally:
            untrusted.close()
    assert got is Observed.API_ERROR and "TLS" in why
    assert len(s.requests) == 2, "nothing, and so no token, sent to a server that is not trusted"


def test_a_token_with_a_line_break_is_never_sent():
    with server(lambda n: (POD, False)) as s:
        pod = pod_heartbeat(s.host)
        pod.credentials.token = "one\r\nX-Evil: 1"  # type: ignore[attr-defined]
        try:
            with pytest.raises(ValueError, match="line break"):
                pod.patch({ANNOTATION_HEARTBEAT: "1:ab"})
        finally:
            pod.close()
    assert s.requests == []


def test_the_transport_reads_a_bounded_answer_no_further_and_resends_an_unanswered_request_once():
    big = answer(200, b"x" * 100)
    with server(lambda n: (big, False) if n == 3 else (POD, n == 1)) as s:
        client = KeepAlive("127.0.0.1", s.port, None, peer="the test", max_answer=64)
        try:
            assert client.request("POST", "/", "", b"{}", 5.0).status == 200  # then closed by the server
            assert client.request("POST", "/", "", b"{}", 5.0).status == 200  # sent again on a new connection
            with pytest.raises(AnswerTooLarge, match="larger than 64 bytes"):
                client.request("POST", "/", "", b"{}", 5.0)
        finally:
            client.close()
    assert s.connections == 2 and len(s.requests) == 3


def test_the_agents_entry_points_import_no_aiohttp():
    code = (
        "import sys; import vigil.agent.runner, vigil.agent.sidecar, vigil.agent.heart, vigil.kube.config; "
        "sys.exit(int(any(m == 'aiohttp' or m.startswith('aiohttp.') for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
