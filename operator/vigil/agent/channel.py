"""The agent's leader channel (issue 26): each beat POSTed over HTTPS to the leading operator.

    POST VIGIL_HEARTBEAT_URL
    Authorization: Bearer <the pod's projected service-account token, re-read on every beat>
    {"namespace": ..., "name": ..., "uid": ..., "beat": "<seq>:<boot>"}
    -> 200 {"state": "Renewed" | "Superseded" | "Deleting"}

The operator verifies the token locally, so a beat costs the API server nothing. Any other
answer (401, 403, 404, 400, 413, 429, 503, a 200 without one of those states) and any failure
to get one (refused, reset, TLS, timeout) is no verdict: the runner then beats by the pod's
annotation, today's channel, at once and with the same beat value, and takes that outcome.

The pure part (`leader_outcome`, `beat_body`, `check_url`, `read_token`) is testable without
sockets; `LeaderBeat` does the I/O.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from vigil.core.fencing import Observed
from vigil.kube.client import user_agent

MAX_TOKEN_BYTES = 16 * 1024  # a projected token is ~1 KiB; a file larger than this is not one
MAX_ANSWER_BYTES = 4 * 1024  # the answer is {"state": "..."}: more is not the operator's
MAX_HEAD_BYTES = 16 * 1024  # its status line and headers, as the operator bounds a request's
STATES = {"Renewed": Observed.RENEWED, "Superseded": Observed.SUPERSEDED, "Deleting": Observed.DELETING}


class ChannelError(Exception):
    """The leader channel cannot be used as configured (or its token cannot be read); the
    message says why, never the token."""


@dataclass(frozen=True)
class LeaderAnswer:
    """One beat's outcome on the leader channel: `observed` when the operator gave a verdict,
    None when the beat must fall back to the annotation (`why` says why, for the log)."""

    observed: Observed | None
    why: str = ""
    # > 0: the operator holds as many connections as it may and asked not to be tried again for
    # this many seconds (a 503's Retry-After): the beats go by annotation meanwhile.
    rest_seconds: float = 0.0


def fallback(why: str, rest_seconds: float = 0.0) -> LeaderAnswer:
    return LeaderAnswer(None, why, rest_seconds)


MAX_REST_SECONDS = 900.0  # a Retry-After longer than this is taken as this: the leader is asked again


def rest_seconds(status: int, retry_after: str | None) -> float:
    """How long a 503's `Retry-After` (delta-seconds; an HTTP date is not honoured) asks the
    agent not to ask the leader, at most MAX_REST_SECONDS; 0 for any other answer."""
    if status != 503 or not retry_after or not retry_after.strip().isdigit():
        return 0.0
    return min(float(retry_after.strip()), MAX_REST_SECONDS)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def leader_outcome(status: int, body: bytes, retry_after: str | None = None) -> LeaderAnswer:
    """What the operator's answer (status, body, its Retry-After header) means: a verdict only for
    a 200 whose body is {"state": one of STATES}; anything else falls back to the annotation."""
    if status != 200:
        why = f"HTTP {status}" + (f": {_short(body.decode('utf-8', 'replace'))}" if body.strip() else "")
        return fallback(why, rest_seconds(status, retry_after))
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return fallback("HTTP 200 whose body is not JSON")
    state = answer.get("state") if isinstance(answer, dict) else None
    observed = STATES.get(state) if isinstance(state, str) else None
    if observed is None:
        return fallback(f"HTTP 200 without a known state ({_short(repr(state), 60)})")
    return LeaderAnswer(observed)


def beat_body(namespace: str, name: str, uid: str, beat: str) -> dict[str, str]:
    """The beat's JSON body; the pod's UID only when the agent knows it."""
    body = {"namespace": namespace, "name": name, "beat": beat}
    if uid:
        body["uid"] = uid
    return body


def check_url(url: str) -> str:
    """The heartbeat URL, checked: https with a host (the token travels in it)."""
    parts = urlsplit(url.strip())
    if parts.scheme != "https":
        raise ChannelError(
            f"VIGIL_HEARTBEAT_URL={url!r} is not an https:// URL (the pod's token would travel in clear)"
        )
    if not parts.hostname:
        raise ChannelError(f"VIGIL_HEARTBEAT_URL={url!r} has no host")
    return url.strip()


def read_token(path: str | Path) -> str:
    """The projected token, read anew (the kubelet rotates it), at most MAX_TOKEN_BYTES."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as err:
        raise ChannelError(f"cannot read the token file {path}: {err.strerror or err}") from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise ChannelError(f"the token file {path} is larger than {MAX_TOKEN_BYTES} bytes: not a token")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ChannelError(f"the token file {path} is not ASCII: not a token") from None
    if not token or any(c.isspace() for c in token):
        raise ChannelError(f"the token file {path} holds no single token")
    return token


def ssl_context(ca_pem: str) -> ssl.SSLContext:
    """Trusts the CA in `ca_pem` (PEM text) alone, or the system's store when it is empty."""
    if not ca_pem.strip():
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as err:
        raise ChannelError(f"VIGIL_HEARTBEAT_CA is not a PEM certificate: {err}") from None


class LeaderChannel(Protocol):
    timeout: float

    def post(self, beat: str) -> LeaderAnswer: ...

    def close(self) -> None: ...


class _Answer:
    """httptools' callbacks for one response: its status, its body (bounded by the caller), and
    whether the server keeps the connection."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.complete = False
        self.keep_alive = False
        self.retry_after: str | None = None
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        # asked here, as uvicorn does: once the message is complete llhttp has reset its state
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()

    def on_body(self, chunk: bytes) -> None:
        self.body += chunk

    def on_message_complete(self) -> None:
        self.complete = True


class _Unanswered(Exception):
    """The connection ended before any byte of an answer: on a reused connection the server may
    have closed it while idle (aiohttp's keep-alive timeout is 75 s), so the beat is sent again,
    once, on a new one."""


# how a connection the operator closed shows before any answer came back
_CLOSED_UNANSWERED = (_Unanswered, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


class LeaderBeat:
    """Posts beats to the leading operator over one keep-alive TLS connection per calling thread,
    on blocking sockets with one deadline for the whole exchange. Never raises for a failed beat:
    it answers a fallback instead.

    A plain socket rather than an HTTP client library: a beat is one fixed-shape request and a
    tiny answer, and an event loop and client session per beat cost the agent ~1.5 ms of CPU where
    this costs a fraction of that (bench/README.md, "the agent's side of a beat"), which is what
    lets one bed process play thousands of agents (bench.heartbeat_load) and keeps the sidecar
    small. The answer is parsed by httptools (llhttp), as the operator parses the request."""

    def __init__(
        self,
        url: str,
        ca_pem: str,
        token_file: str,
        *,
        namespace: str,
        name: str,
        uid: str,
        timeout: float,
    ) -> None:
        self.url = check_url(url)
        parts = urlsplit(self.url)
        self.host, self.port = parts.hostname or "", parts.port or 443
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host_header if self.port == 443 else f"{host_header}:{self.port}"
        self.ssl = ssl_context(ca_pem)
        self.token_file = token_file
        read_token(token_file)  # unreadable at start: the caller warns and uses the annotation alone
        self.namespace, self.name, self.uid, self.timeout = namespace, name, uid, timeout
        self.user_agent = user_agent(name, "agent")
        self._local = threading.local()  # per thread: its connection, or None
        self._lock = threading.Lock()
        self._open: set[ssl.SSLSocket] = set()

    def close(self) -> None:
        """Closes every thread's connection: call once no beat is in flight."""
        with self._lock:
            held, self._open = self._open, set()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()

    def _drop(self, sock: ssl.SSLSocket) -> None:
        self._local.sock = None
        with self._lock:
            self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def _connect(self, deadline: float) -> ssl.SSLSocket:
        raw = socket.create_connection((self.host, self.port), timeout=_left(deadline))
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.settimeout(_left(deadline))
            sock = self.ssl.wrap_socket(raw, server_hostname=self.host)  # handshakes, under the deadline
        except BaseException:
            raw.close()
            raise
        self._local.sock = sock
        with self._lock:
            self._open.add(sock)
        return sock

    def _request(self, token: str, beat: str) -> bytes:
        body = json.dumps(beat_body(self.namespace, self.name, self.uid, beat), separators=(",", ":")).encode()
        head = (
            f"POST {self.target} HTTP/1.1\r\nHost: {self.authority}\r\nAuthorization: Bearer {token}\r\n"
            f"User-Agent: {self.user_agent}\r\nAccept: application/json\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    def _exchange(self, sock: ssl.SSLSocket, request: bytes, deadline: float) -> LeaderAnswer:
        sock.settimeout(_left(deadline))
        sock.sendall(request)
        answer = _Answer()
        parser = answer.parser = httptools.HttpResponseParser(answer)
        read = 0
        while not answer.complete:
            sock.settimeout(_left(deadline))
            chunk = sock.recv(8192)
            if not chunk:
                if read == 0:
                    raise _Unanswered
                raise ConnectionAbortedError("the operator closed the connection mid-answer")  # sent: no retry
            read += len(chunk)
            if read > MAX_HEAD_BYTES + MAX_ANSWER_BYTES or len(answer.body) > MAX_ANSWER_BYTES:
                self._drop(sock)
                return fallback(f"HTTP answer larger than {MAX_ANSWER_BYTES} bytes")
            parser.feed_data(chunk)
        if not answer.keep_alive:
            self._drop(sock)
        status = parser.get_status_code()
        if len(answer.body) > MAX_ANSWER_BYTES:
            return fallback(f"HTTP {status} with an answer larger than {MAX_ANSWER_BYTES} bytes")
        return leader_outcome(status, bytes(answer.body), answer.retry_after)

    def post(self, beat: str) -> LeaderAnswer:
        try:
            token = read_token(self.token_file)
        except ChannelError as err:
            return fallback(str(err))
        deadline = time.monotonic() + self.timeout
        request = self._request(token, beat)
        sock = getattr(self._local, "sock", None)
        try:
            for reused in (sock is not None, False):
                if sock is None:
                    sock = self._connect(deadline)
                try:
                    return self._exchange(sock, request, deadline)
                except (
                    _Unanswered,
                    ConnectionResetError,
                    BrokenPipeError,
                    ssl.SSLEOFError,
                    ssl.SSLZeroReturnError,
                ) as err:
                    self._drop(sock)
                    sock = None
                    if not reused:  # a new connection that fails so is the operator's failure
                        raise ConnectionResetError("the operator closed the connection unanswered") from err
            raise AssertionError("unreachable")  # the second turn returns or raises
        except TimeoutError:
            self._drop_current()
            return fallback(f"no answer within {self.timeout:g}s")
        except ssl.SSLCertVerificationError as err:
            self._drop_current()
            return fallback(f"TLS: {_short(str(err.verify_message or err))}")
        except ssl.SSLError as err:
            self._drop_current()
            return fallback(f"TLS: {_short(str(err))}")
        except httptools.HttpParserError as err:
            self._drop_current()
            return fallback(f"the operator's answer is not HTTP: {_short(str(err))}")
        except OSError as err:
            self._drop_current()
            return fallback(f"{type(err).__name__}: {_short(str(err))}")

    def _drop_current(self) -> None:
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            self._drop(sock)


def _left(deadline: float) -> float:
    """Seconds left before `deadline`; none left is a timeout."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left
