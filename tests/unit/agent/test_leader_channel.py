"""The agent's leader channel (issue 26): beats posted to the operator, the annotation patch as
fallback, checkpoints rate-limited; on fakes and a fake clock, and on a real HTTPS server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import ssl
import threading
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.scripted_http import Server, server
from vigil.agent import channel
from vigil.agent import heart as agent_heart
from vigil.agent.channel import ChannelError, LeaderAnswer, LeaderBeat, beat_body, leader_outcome, read_token
from vigil.api import ANNOTATION_CHECKPOINT, ANNOTATION_HEARTBEAT
from vigil.core import fencing
from vigil.core.fencing import CHECKPOINT_MIN_SECONDS, Observed, checkpoint_due, leader_timeout
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.unit

ENV = {"POD_NAME": "p", "POD_NAMESPACE": "n"}


# --- the pure decisions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "observed"),
    [("Renewed", Observed.RENEWED), ("Superseded", Observed.SUPERSEDED), ("Deleting", Observed.DELETING)],
)
def test_a_200_with_a_known_state_is_the_operators_verdict(state, observed):
    assert leader_outcome(200, json.dumps({"state": state}).encode()) == LeaderAnswer(observed)


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (401, b'{"message":"token refused"}', "HTTP 401: "),
        (403, b"", "HTTP 403"),
        (404, b"unknown pod", "HTTP 404: unknown pod"),
        (400, b"", "HTTP 400"),
        (413, b"", "HTTP 413"),
        (429, b"", "HTTP 429"),
        (503, b"not the leader", "HTTP 503: not the leader"),
        (500, b"", "HTTP 500"),
        (200, b"", "not JSON"),
        (200, b"{half", "not JSON"),
        (200, b"\xff\xfe", "not JSON"),
        (200, b'["Renewed"]', "without a known state"),
        (200, b'{"state": "renewed"}', "without a known state"),
        (200, b'{"state": 1}', "without a known state"),
        (200, b'{"state": "Gone"}', "without a known state"),  # 404 is the API server's to say
        (200, b"{}", "without a known state"),
    ],
)
def test_every_other_answer_falls_back_to_the_annotation(status, body, why):
    answer = leader_outcome(status, body)
    assert answer.observed is None and why in answer.why, answer


def test_the_beat_body_names_the_pod_and_omits_an_unknown_uid():
    assert beat_body("n", "p", "u-1", "3:ab") == {"namespace": "n", "name": "p", "uid": "u-1", "beat": "3:ab"}
    assert beat_body("n", "p", "", "3:ab") == {"namespace": "n", "name": "p", "beat": "3:ab"}


def test_the_leader_channel_never_eats_more_than_a_quarter_of_the_interval():
    rt = fencing.request_timeout(60.0)  # 10 s
    assert leader_timeout(rt, 10.0) == 2.5
    assert leader_timeout(rt, 60.0) == 10.0  # the request timeout bounds it too
    assert leader_timeout(rt, 1.0) == 1.0  # a floor: a TLS handshake needs some time
    assert leader_timeout(fencing.request_timeout(2.0), 1.0) == 1.0


def test_a_checkpoint_write_is_due_once_per_min_seconds():
    assert CHECKPOINT_MIN_SECONDS == 30.0
    assert not checkpoint_due(100.0, 129.9)
    assert checkpoint_due(100.0, 130.0)
    assert not checkpoint_due(100.0, 50.0)  # a clock that went back: not due


def test_the_token_is_read_bounded_and_checked(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("eyJhbGciOi.payload.sig\n")
    assert read_token(token) == "eyJhbGciOi.payload.sig"
    token.write_bytes(b"x" * channel.MAX_TOKEN_BYTES)
    assert len(read_token(token)) == channel.MAX_TOKEN_BYTES
    token.write_bytes(b"x" * (channel.MAX_TOKEN_BYTES + 1))
    with pytest.raises(ChannelError, match="larger than 16384 bytes"):
        read_token(token)
    for bad in (b"", b"  \n", b"two tokens", b"\xff"):
        token.write_bytes(bad)
        with pytest.raises(ChannelError, match="no single token|not ASCII"):
            read_token(token)
    with pytest.raises(ChannelError, match="cannot read the token file"):
        read_token(tmp_path / "missing")


# --- settings -------------------------------------------------------------------------------------


def test_without_a_url_the_agent_beats_by_annotation_as_before():
    for env in (ENV, {**ENV, "VIGIL_HEARTBEAT_URL": ""}, {**ENV, "VIGIL_HEARTBEAT_URL": "  "}):
        s = agent_heart.Settings.from_env(env)
        assert (s.heartbeat_url, s.leader_problem) == ("", "")
        assert agent_heart.leader_channel(s) is None


def test_the_leader_channel_settings_are_read_from_the_environment(tmp_path: Path):
    env = {
        **ENV,
        "POD_UID": "u-1",
        "VIGIL_HEARTBEAT_URL": "https://vigil-webhook.vigil-system.svc/v1/heartbeat",
        "VIGIL_HEARTBEAT_CA": "",
        "VIGIL_HEARTBEAT_TOKEN_FILE": str(tmp_path / "token"),
    }
    s = agent_heart.Settings.from_env(env)
    assert s.heartbeat_url == env["VIGIL_HEARTBEAT_URL"] and s.token_file == env["VIGIL_HEARTBEAT_TOKEN_FILE"]
    assert (s.pod_uid, s.leader_problem) == ("u-1", "")


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"VIGIL_HEARTBEAT_URL": "http://vigil/v1/heartbeat", "VIGIL_HEARTBEAT_TOKEN_FILE": "/t"}, "not an https"),
        ({"VIGIL_HEARTBEAT_URL": "vigil:8443/v1/heartbeat", "VIGIL_HEARTBEAT_TOKEN_FILE": "/t"}, "not an https"),
        ({"VIGIL_HEARTBEAT_URL": "https:///v1/heartbeat", "VIGIL_HEARTBEAT_TOKEN_FILE": "/t"}, "has no host"),
        ({"VIGIL_HEARTBEAT_URL": "https://vigil/v1/heartbeat"}, "VIGIL_HEARTBEAT_TOKEN_FILE is not"),
    ],
)
def test_a_leader_channel_set_up_wrongly_is_a_warning_and_the_annotation_alone(capsys, extra, problem):
    s = agent_heart.Settings.from_env({**ENV, **extra})
    assert s.heartbeat_url == "" and problem in s.leader_problem
    assert agent_heart.leader_channel(s) is None
    err = capsys.readouterr().err
    assert "warning:" in err and problem in err and "beating by pod annotation" in err


def test_an_unreadable_token_or_a_ca_that_is_not_pem_at_start_is_a_warning_too(capsys, tmp_path: Path):
    base = {**ENV, "VIGIL_HEARTBEAT_URL": "https://vigil/v1/heartbeat"}
    s = agent_heart.Settings.from_env({**base, "VIGIL_HEARTBEAT_TOKEN_FILE": str(tmp_path / "missing")})
    assert agent_heart.leader_channel(s) is None
    assert "cannot read the token file" in capsys.readouterr().err
    (tmp_path / "token").write_text("secret-token")
    s = agent_heart.Settings.from_env(
        {**base, "VIGIL_HEARTBEAT_TOKEN_FILE": str(tmp_path / "token"), "VIGIL_HEARTBEAT_CA": "not a PEM"}
    )
    assert agent_heart.leader_channel(s) is None
    err = capsys.readouterr().err
    assert "VIGIL_HEARTBEAT_CA is not a PEM certificate" in err and "secret-token" not in err
    s = agent_heart.Settings.from_env({**base, "VIGIL_HEARTBEAT_TOKEN_FILE": str(tmp_path / "token")})
    leader = agent_heart.leader_channel(s)
    assert isinstance(leader, LeaderBeat) and leader.timeout == 2.5  # 10 s interval, 60 s timeout
    leader.close()


# --- the channel choice, on fakes -----------------------------------------------------------------


class FakePod:
    """The annotation channel: records each patch, answers what the test scripts."""

    timeout = 10.0

    def __init__(self, answer: Observed = Observed.RENEWED) -> None:
        self.answer = answer
        self.patches: list[dict[str, str]] = []

    def patch(self, annotations: dict[str, str]) -> tuple[Observed, str]:
        self.patches.append(dict(annotations))
        return self.answer, "" if self.answer is Observed.RENEWED else "503 ServiceUnavailable: busy"


class FakeLeader:
    timeout = 2.5

    def __init__(self, answer: LeaderAnswer | Exception) -> None:
        self.answer = answer
        self.beats: list[str] = []

    def post(self, beat: str) -> LeaderAnswer:
        self.beats.append(beat)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        pass


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(agent_heart, "CLOCK", c)
    return c


def heart(tmp_path: Path, pod: FakePod, leader: FakeLeader | None) -> agent_heart.Heart:
    settings = agent_heart.Settings(pod_name="p", namespace="n")
    return agent_heart.Heart(settings, pod, tmp_path / "checkpoint.json", queue.Queue(), leader)  # type: ignore[arg-type]


def test_a_beat_the_leader_renews_writes_nothing_to_the_api_server(tmp_path: Path, clock: Clock):
    pod, leader = FakePod(), FakeLeader(LeaderAnswer(Observed.RENEWED))
    h = heart(tmp_path, pod, leader)
    assert [h.beat(), h.beat()] == [Observed.RENEWED, Observed.RENEWED]
    assert pod.patches == [] and leader.beats == [f"1:{h.boot}", f"2:{h.boot}"]


@pytest.mark.parametrize("verdict", [Observed.SUPERSEDED, Observed.DELETING])
def test_the_leaders_fencing_verdict_is_the_beats_outcome(tmp_path: Path, clock: Clock, verdict):
    pod = FakePod()
    assert heart(tmp_path, pod, FakeLeader(LeaderAnswer(verdict))).beat() is verdict
    assert pod.patches == []


@pytest.mark.parametrize(
    "failure",
    [LeaderAnswer(None, "HTTP 503: not the leader"), LeaderAnswer(None, "no answer within 2.5s"), RuntimeError("bug")],
)
@pytest.mark.parametrize("patched", [Observed.RENEWED, Observed.SUPERSEDED, Observed.API_ERROR])
def test_a_beat_the_leader_does_not_answer_is_patched_at_once_with_the_same_value(
    tmp_path: Path, clock: Clock, failure, patched
):
    pod, leader = FakePod(patched), FakeLeader(failure)
    h = heart(tmp_path, pod, leader)
    assert h.beat() is patched  # the patch's outcome is the beat's
    assert leader.beats == [f"1:{h.boot}"]
    assert pod.patches == [{ANNOTATION_HEARTBEAT: f"1:{h.boot}"}]


def test_the_switch_to_the_fallback_and_back_is_logged_once_each_way_and_never_the_token(
    tmp_path: Path, clock: Clock, capsys
):
    pod, leader = FakePod(), FakeLeader(LeaderAnswer(None, "HTTP 503: not the leader"))
    h = heart(tmp_path, pod, leader)
    for _ in range(5):
        assert h.beat() is Observed.RENEWED
    leader.answer = LeaderAnswer(Observed.RENEWED)
    for _ in range(3):
        h.beat()
    leader.answer = LeaderAnswer(None, "ClientConnectorError: refused")
    h.beat()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "vigil-agent: heartbeat endpoint unavailable (HTTP 503: not the leader): beating by pod annotation",
        "vigil-agent: heartbeat endpoint answering again: beating by the operator",
        "vigil-agent: heartbeat endpoint unavailable (ClientConnectorError: refused): beating by pod annotation",
    ]
    assert len(pod.patches) == 6 and len(leader.beats) == 9  # every beat tried the leader first


def test_on_the_leader_channel_a_checkpoint_is_patched_at_most_every_min_seconds(tmp_path: Path, clock: Clock):
    pod, leader = FakePod(), FakeLeader(LeaderAnswer(Observed.RENEWED))
    h = heart(tmp_path, pod, leader)
    h.checkpoint_file.write_text('{"step":1}')
    clock.now += 10
    h.beat()
    clock.now += CHECKPOINT_MIN_SECONDS - 10 - 0.1
    h.beat()
    assert pod.patches == [] and h.published is None, "the rate limit runs from the agent's start"
    clock.now += 0.1
    assert h.beat() is Observed.RENEWED
    # The checkpoint's patch carries the heartbeat: it is that beat, the leader is not asked.
    assert pod.patches == [{ANNOTATION_HEARTBEAT: f"3:{h.boot}", ANNOTATION_CHECKPOINT: '{"step":1}'}]
    assert len(leader.beats) == 2 and h.published == b'{"step":1}'
    for step in range(2, 8):  # a checkpoint every 5 s: written every 30 s, the newest then
        h.checkpoint_file.write_text(f'{{"step":{step}}}')
        clock.now += 5
        h.beat()
    assert [p.get(ANNOTATION_CHECKPOINT) for p in pod.patches] == ['{"step":1}', '{"step":7}']
    clock.now += 100
    h.beat()  # nothing new: nothing written, however long it has been
    assert len(pod.patches) == 2


def test_the_final_flush_publishes_the_last_checkpoint_at_once(tmp_path: Path, clock: Clock):
    pod, leader = FakePod(), FakeLeader(LeaderAnswer(Observed.RENEWED))
    h = heart(tmp_path, pod, leader)
    h.checkpoint_file.write_text('{"step":1}')
    clock.now += 1
    h.beat()
    assert pod.patches == []
    h.stop()
    h.start()  # as supervise() leaves it: started, and stopped before the child's exit is flushed
    agent_heart.flush_checkpoint(h)
    assert pod.patches == [{ANNOTATION_HEARTBEAT: f"2:{h.boot}", ANNOTATION_CHECKPOINT: '{"step":1}'}]
    assert h.published == b'{"step":1}'
    agent_heart.flush_checkpoint(h)  # published already: no second write
    assert len(pod.patches) == 1


def test_a_failed_checkpoint_patch_still_counts_the_beat_by_the_leader(tmp_path: Path, clock: Clock):
    pod, leader = FakePod(Observed.API_ERROR), FakeLeader(LeaderAnswer(Observed.RENEWED))
    h = heart(tmp_path, pod, leader)
    h.checkpoint_file.write_text('{"step":1}')
    clock.now += CHECKPOINT_MIN_SECONDS
    assert h.beat() is Observed.RENEWED and h.failures == 0
    assert len(pod.patches) == 1 and leader.beats == [f"1:{h.boot}"]
    assert h.published is None, "not published: written again once due"
    clock.now += 1
    h.beat()
    assert len(pod.patches) == 1, "a write that failed counts against the rate limit"
    pod.answer = Observed.RENEWED
    clock.now += CHECKPOINT_MIN_SECONDS
    h.beat()
    assert h.published == b'{"step":1}' and len(pod.patches) == 2


def test_a_fallback_patch_carries_a_new_checkpoint_whatever_the_limit(tmp_path: Path, clock: Clock):
    pod, leader = FakePod(), FakeLeader(LeaderAnswer(None, "HTTP 503"))
    h = heart(tmp_path, pod, leader)
    h.checkpoint_file.write_text('{"step":1}')
    clock.now += 1
    h.beat()
    assert pod.patches == [{ANNOTATION_HEARTBEAT: f"1:{h.boot}", ANNOTATION_CHECKPOINT: '{"step":1}'}]
    assert h.published == b'{"step":1}'


def test_on_the_annotation_channel_alone_a_checkpoint_goes_with_the_next_beat(tmp_path: Path, clock: Clock):
    pod = FakePod()
    h = heart(tmp_path, pod, None)
    h.beat()
    h.checkpoint_file.write_text('{"step":1}')
    h.beat()
    h.beat()
    assert pod.patches == [
        {ANNOTATION_HEARTBEAT: f"1:{h.boot}"},
        {ANNOTATION_HEARTBEAT: f"2:{h.boot}", ANNOTATION_CHECKPOINT: '{"step":1}'},
        {ANNOTATION_HEARTBEAT: f"3:{h.boot}"},
    ]


# --- a real HTTPS server on 127.0.0.1 -------------------------------------------------------------


class Operator:
    """An aiohttp HTTPS server on its own thread, answering what the test sets."""

    def __init__(self, certs: Path) -> None:
        self.status, self.answer, self.delay = 200, {"state": "Renewed"}, 0.0
        self.requests: list[tuple[dict[str, str], bytes, str]] = []
        self.peers: set[tuple[str, int]] = set()
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(certs / "tls.crt", certs / "tls.key")
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read(), request.path))
        if request.transport is not None:
            self.peers.add(request.transport.get_extra_info("peername"))
        if self.delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.released.wait(), self.delay)
        return web.json_response(self.answer, status=self.status)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.released = asyncio.Event()  # set by stop(): a delayed answer goes out at once
        app = web.Application()
        app.router.add_post("/v1/heartbeat", self.handle)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.ctx)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1/heartbeat"

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.released.set)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    make_self_signed(directory)
    return directory


@pytest.fixture
def operator(certs: Path):
    server = Operator(certs)
    yield server
    server.stop()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("token-one\n")
    return path


def leader_beat(url: str, ca: str, token: Path, timeout: float = 5.0) -> LeaderBeat:
    return LeaderBeat(url, ca, str(token), namespace="n", name="p", uid="u-1", timeout=timeout)


def test_over_https_a_beat_carries_the_pods_token_and_names_the_pod(operator: Operator, certs: Path, token: Path):
    leader = leader_beat(operator.url, (certs / "ca.crt").read_text(), token)
    try:
        assert leader.post("1:ab") == LeaderAnswer(Observed.RENEWED)
        token.write_text("token-two")  # the kubelet rotated it
        operator.answer = {"state": "Superseded"}
        assert leader.post("2:ab") == LeaderAnswer(Observed.SUPERSEDED)
        operator.status, operator.answer = 503, {"message": "not the leader"}
        answer = leader.post("3:ab")
        assert answer.observed is None and answer.why.startswith("HTTP 503")
    finally:
        leader.close()
    assert [path for _, _, path in operator.requests] == ["/v1/heartbeat"] * 3
    (h1, b1, _), (h2, b2, _), _ = operator.requests
    assert h1["Authorization"] == "Bearer token-one" and h2["Authorization"] == "Bearer token-two"
    assert h1["Content-Type"].startswith("application/json")
    assert json.loads(b1) == {"namespace": "n", "name": "p", "uid": "u-1", "beat": "1:ab"}
    assert json.loads(b2)["beat"] == "2:ab"
    assert len(operator.peers) == 1, "one keep-alive connection for every beat"


def test_over_https_a_certificate_not_signed_by_the_given_ca_is_a_fallback(operator: Operator, token: Path):
    leader = leader_beat(operator.url, "", token)  # the system's store does not know the test CA
    try:
        answer = leader.post("1:ab")
    finally:
        leader.close()
    assert answer.observed is None and answer.why.startswith("TLS")
    assert operator.requests == [], "no beat, and so no token, sent to a server that is not trusted"


def test_a_refused_connection_or_a_silent_operator_is_a_fallback(operator: Operator, certs: Path, token: Path):
    ca = (certs / "ca.crt").read_text()
    operator.delay = 5.0
    leader = leader_beat(operator.url, ca, token, timeout=0.2)
    try:
        answer = leader.post("1:ab")
        assert answer.observed is None and "no answer within 0.2s" in answer.why
    finally:
        leader.close()
    url = operator.url
    operator.stop()
    leader = leader_beat(url, ca, token)
    try:
        answer = leader.post("2:ab")
        assert answer.observed is None and answer.why
    finally:
        leader.close()


def test_a_token_file_gone_after_the_start_is_a_fallback_and_nothing_is_sent(
    operator: Operator, certs: Path, token: Path
):
    leader = leader_beat(operator.url, (certs / "ca.crt").read_text(), token)
    token.unlink()
    try:
        answer = leader.post("1:ab")
    finally:
        leader.close()
    assert answer.observed is None and "cannot read the token file" in answer.why
    assert operator.requests == []


def test_the_heart_beats_through_a_real_operator_and_falls_back_when_it_is_busy(
    operator: Operator, certs: Path, token: Path, tmp_path: Path, clock: Clock
):
    pod = FakePod()
    leader = leader_beat(operator.url, (certs / "ca.crt").read_text(), token)
    settings = agent_heart.Settings(pod_name="p", namespace="n")
    h = agent_heart.Heart(settings, pod, tmp_path / "cp", queue.Queue(), leader)  # type: ignore[arg-type]
    try:
        assert h.beat() is Observed.RENEWED and pod.patches == []
        operator.status = 503
        assert h.beat() is Observed.RENEWED
        assert pod.patches == [{ANNOTATION_HEARTBEAT: f"2:{h.boot}"}]
        assert json.loads(operator.requests[1][1])["beat"] == f"2:{h.boot}"
    finally:
        leader.close()


def test_a_checkpoint_write_that_fails_is_told_once_until_one_gets_through(tmp_path: Path, clock: Clock, capsys):
    pod, leader = FakePod(Observed.API_ERROR), FakeLeader(LeaderAnswer(Observed.RENEWED))
    h = heart(tmp_path, pod, leader)
    for step in (1, 2, 3):
        h.checkpoint_file.write_text(f'{{"step":{step}}}')
        clock.now += CHECKPOINT_MIN_SECONDS
        assert h.beat() is Observed.RENEWED
    pod.answer = Observed.RENEWED
    clock.now += CHECKPOINT_MIN_SECONDS
    h.beat()
    pod.answer = Observed.API_ERROR
    h.checkpoint_file.write_text('{"step":4}')
    clock.now += CHECKPOINT_MIN_SECONDS
    h.beat()
    told = [line for line in capsys.readouterr().err.splitlines() if "checkpoint not published" in line]
    assert told == ["vigil-agent: checkpoint not published (503 ServiceUnavailable: busy): retrying in 30s"] * 2
    assert h.published == b'{"step":3}'


def test_the_final_flush_asks_no_leader_when_its_patch_fails(tmp_path: Path, clock: Clock):
    pod, leader = FakePod(Observed.API_ERROR), FakeLeader(LeaderAnswer(Observed.RENEWED))
    h = heart(tmp_path, pod, leader)
    h.checkpoint_file.write_text('{"step":1}')
    assert h.beat(flush=True) is Observed.API_ERROR
    assert len(pod.patches) == 1 and leader.beats == [] and h.published is None


# --- a raw TLS server that answers as scripted: the HTTP edges of the agent's own client -----------

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 19\r\n\r\n{"state":"Renewed"}'


@contextlib.contextmanager
def raw_operator(certs: Path, script, pause: float = 0.0):
    """The operator's beat endpoint as a scripted TLS server (tests/support/scripted_http.py)."""
    with server(script, certs, pause) as scripted:
        yield scripted


def beat_url(scripted: Server) -> str:
    return f"{scripted.host}/v1/heartbeat"


def test_a_connection_the_operator_closed_while_idle_is_made_again_and_the_beat_counts(certs: Path, token: Path):
    # aiohttp closes a keep-alive connection idle for 75 s: a beat interval longer than that must
    # not make every beat a fallback.
    with raw_operator(certs, lambda n: (OK, True)) as server:  # answers, then closes without a word
        leader = leader_beat(beat_url(server), (certs / "ca.crt").read_text(), token)
        try:
            assert [leader.post(f"{i}:ab") for i in (1, 2, 3)] == [LeaderAnswer(Observed.RENEWED)] * 3
        finally:
            leader.close()
        assert len(server.requests) == 3 and server.connections == 3


def test_an_answer_saying_connection_close_is_honoured_and_a_kept_one_is_reused(certs: Path, token: Path):
    closing = OK.replace(b"Content-Length", b"Connection: close\r\nContent-Length")
    with raw_operator(certs, lambda n: (closing if n == 2 else OK, False)) as server:
        leader = leader_beat(beat_url(server), (certs / "ca.crt").read_text(), token)
        try:
            assert [leader.post(f"{i}:ab") for i in (1, 2, 3, 4)] == [LeaderAnswer(Observed.RENEWED)] * 4
        finally:
            leader.close()
        assert server.connections == 2, "beats 1-2 on the first connection, 3-4 on a second"


def test_an_operator_that_closes_a_new_connection_unanswered_is_a_fallback_not_a_retry_loop(certs: Path, token: Path):
    with raw_operator(certs, lambda n: (b"", True)) as server:
        leader = leader_beat(beat_url(server), (certs / "ca.crt").read_text(), token)
        try:
            answer = leader.post("1:ab")
        finally:
            leader.close()
        assert answer.observed is None and "unanswered" in answer.why
        assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9000\r\n\r\n" + b"x" * 9000, "larger than 4096 bytes"),
        (b"HTTP/1.1 200 OK\r\nX-Pad: " + b"x" * 30000 + b"\r\nContent-Length: 2\r\n\r\n{}", "larger than 4096 bytes"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not HTTP"),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{"state":', "mid-answer"),
    ],
    ids=["big body", "big head", "not http", "cut short"],
)
def test_an_answer_too_large_malformed_or_cut_short_is_a_fallback(certs: Path, token: Path, answer, why):
    got = one_post(certs, token, answer)
    assert got.observed is None and why in got.why


def one_post(certs: Path, token: Path, answer: bytes) -> LeaderAnswer:
    """One beat posted to an operator that sends `answer` and closes."""
    with raw_operator(certs, lambda n: (answer, True)) as server:
        leader = leader_beat(beat_url(server), (certs / "ca.crt").read_text(), token)
        try:
            return leader.post("1:ab")
        finally:
            leader.close()


def test_the_timeout_bounds_the_whole_exchange_not_each_read(certs: Path, token: Path):
    # An answer trickled a byte every 20 ms never leaves a read waiting 0.5 s, yet takes ~1.8 s in
    # all: the agent must give up at its deadline and fall back, as a silent operator is.
    with raw_operator(certs, lambda n: ([OK[i : i + 1] for i in range(len(OK))], True), pause=0.02) as server:
        leader = leader_beat(beat_url(server), (certs / "ca.crt").read_text(), token, timeout=0.5)
        try:
            answer = leader.post("1:ab")
        finally:
            leader.close()
    assert answer.observed is None and "no answer within 0.5s" in answer.why


# --- a leader at its connection limit ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retry_after", "rest"),
    [(503, "300", 300.0), (503, " 42 ", 42.0), (503, "86400", channel.MAX_REST_SECONDS), (503, None, 0.0),
     (503, "Wed, 21 Oct 2026 07:28:00 GMT", 0.0), (503, "-5", 0.0), (429, "300", 0.0), (200, "300", 0.0)],
)  # fmt: skip
def test_only_a_503s_retry_after_in_seconds_rests_the_leader_and_never_for_long(status, retry_after, rest):
    assert channel.rest_seconds(status, retry_after) == rest


def test_a_leader_at_capacity_is_not_asked_again_until_its_retry_after(tmp_path: Path, clock: Clock, capsys):
    busy = LeaderAnswer(None, "HTTP 503: at capacity", rest_seconds=300.0)
    pod, leader = FakePod(), FakeLeader(busy)
    h = heart(tmp_path, pod, leader)
    assert h.beat() is Observed.RENEWED  # by annotation, at once
    leader.answer = LeaderAnswer(Observed.RENEWED)
    for _ in range(29):  # every 10 s for 290 s: no handshake, no post, each beat patched
        clock.now += 10
        assert h.beat() is Observed.RENEWED
    assert len(leader.beats) == 1 and len(pod.patches) == 30
    clock.now += 10  # 300 s on: the leader is asked again, and beats there
    assert h.beat() is Observed.RENEWED
    assert len(leader.beats) == 2 and len(pod.patches) == 30
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "vigil-agent: heartbeat endpoint at capacity (HTTP 503: at capacity): beating by annotation for 300s",
        "vigil-agent: heartbeat endpoint answering again: beating by the operator",
    ]


def test_over_https_a_503_with_retry_after_is_read_as_a_rest(certs: Path, token: Path):
    body = b'{"error":"at capacity"}'
    busy = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Retry-After: 217\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    answer = one_post(certs, token, busy)
    assert answer.observed is None and answer.rest_seconds == 217.0 and "HTTP 503" in answer.why
