"""The agent's one HTTP client: blocking HTTP/1.1 on one keep-alive connection per calling
thread (TLS, or plain TCP for an API server at an http:// address), the answer parsed by
httptools (llhttp), one deadline for the whole exchange.

Both of the agent's calls go through it: the beat to the leader (`vigil.agent.channel.LeaderBeat`)
and the patch of its own pod (`vigil.agent.heart.PodHeartbeat`). A blocking socket rather than an
HTTP client library: each call is one small request and one answer, from a thread that has
nothing else to do meanwhile, and an event loop and client session per call cost the agent
several times the CPU of this (bench/README.md, "the agent's side of a beat"; bench.agent_beat).
That is what lets one bed process play thousands of agents (bench.heartbeat_load) and keeps the
sidecar small.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass

import httptools

IDLE_CLOCK = time.monotonic  # how long a kept connection has been idle (a test passes its own)
MAX_HEAD_BYTES = 16 * 1024  # an answer's status line and headers, as the operator bounds a request's


class AnswerTooLarge(Exception):
    """The answer is longer than the caller reads; its connection is dropped, the rest unread."""


@dataclass(slots=True)
class Answer:
    status: int
    body: bytes
    retry_after: str | None = None  # the Retry-After header, as sent


class _Parsed:
    """httptools' callbacks for one response: its body (bounded by the caller), its Retry-After,
    and whether the server keeps the connection."""

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
    have closed it while idle (aiohttp's server closes one idle for 75 s)."""


# how a connection the server closed shows before any answer came back
_CLOSED_UNANSWERED = (_Unanswered, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)

# What `KeepAlive.request` raises for a call that got no usable answer (`failure` says it in a line).
FAILURES = (OSError, AnswerTooLarge, httptools.HttpParserError)


def short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def left(deadline: float) -> float:
    """Seconds left before `deadline` (time.monotonic()); none left is a timeout."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    return remaining


class KeepAlive:
    """Requests to one server (`host`, `port`; TLS with `context`, plain TCP without) over one
    keep-alive connection per calling thread, with one deadline for the whole exchange: connect,
    TLS handshake, request and answer.

    `max_answer`: an answer body longer than this is not read on (AnswerTooLarge); None reads it
    all. `idle_seconds`: a connection idle longer than this is closed rather than reused.
    `resend_unanswered`: a request whose reused connection ends before any byte of an answer is
    sent once more on a new connection; without it (for a request HTTP does not call idempotent,
    a PATCH) that is a failure, and an idle connection the server has closed is never written to.
    `peer` names the server in messages ("the operator")."""

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext | None,
        *,
        peer: str,
        max_answer: int | None = None,
        idle_seconds: float | None = None,
        resend_unanswered: bool = True,
    ) -> None:
        self.host, self.port, self.context, self.peer = host, port, context, peer
        self.max_answer, self.idle_seconds, self.resend_unanswered = max_answer, idle_seconds, resend_unanswered
        host_header = f"[{host}]" if ":" in host else host
        self.authority = host_header if port == (443 if context is not None else 80) else f"{host_header}:{port}"
        self._local = threading.local()  # per thread: its connection (or None) and when it was last used
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def close(self) -> None:
        """Closes every thread's connection: call once no request is in flight."""
        with self._lock:
            held, self._open = self._open, set()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()

    def request(self, method: str, target: str, fields: str, body: bytes, timeout: float) -> Answer:
        """One request; its answer whatever the status. `fields`: header lines, each ending in
        CRLF (Host and Content-Length are added). Raises one of FAILURES when no usable answer
        came within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.authority}\r\n{fields}Content-Length: {len(body)}\r\n\r\n"
        request = head.encode("latin-1") + body
        sock = self._reusable()
        try:
            for reused in (sock is not None, False):
                if sock is None:
                    sock = self._connect(deadline)
                try:
                    return self._exchange(sock, request, deadline)
                except _CLOSED_UNANSWERED as err:
                    self._drop(sock)
                    sock = None
                    if not (reused and self.resend_unanswered):  # a new connection failing so is the server's failure
                        raise ConnectionResetError(f"{self.peer} closed the connection unanswered") from err
            raise AssertionError("unreachable")  # the second turn returns or raises
        except BaseException:
            self._drop_current()  # half an exchange on it: never reused
            raise

    def failure(self, err: BaseException, timeout: float) -> str:
        """One line for the log on a failure `request` raised; never the request's headers."""
        if isinstance(err, TimeoutError):
            return f"no answer within {timeout:g}s"
        if isinstance(err, AnswerTooLarge):
            return str(err)
        if isinstance(err, ssl.SSLCertVerificationError):
            return f"TLS: {short(str(err.verify_message or err))}"
        if isinstance(err, ssl.SSLError):
            return f"TLS: {short(str(err))}"
        if isinstance(err, httptools.HttpParserError):
            return f"{self.peer}'s answer is not HTTP: {short(str(err))}"
        return f"{type(err).__name__}: {short(str(err))}"

    def _reusable(self) -> socket.socket | None:
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is None:
            return None
        if self.idle_seconds is not None and IDLE_CLOCK() - self._local.used_at > self.idle_seconds:
            self._drop(sock)
            return None
        if not self.resend_unanswered and _readable(sock):
            self._drop(sock)  # closed by the server while idle: a request on it could not be sent again
            return None
        return sock

    def _connect(self, deadline: float) -> socket.socket:
        raw = socket.create_connection((self.host, self.port), timeout=left(deadline))
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = raw
            if self.context is not None:
                raw.settimeout(left(deadline))
                sock = self.context.wrap_socket(raw, server_hostname=self.host)  # handshakes, under the deadline
        except BaseException:
            raw.close()
            raise
        self._local.sock = sock
        with self._lock:
            self._open.add(sock)
        return sock

    def _exchange(self, sock: socket.socket, request: bytes, deadline: float) -> Answer:
        sock.settimeout(left(deadline))
        sock.sendall(request)
        parsed = _Parsed()
        parser = parsed.parser = httptools.HttpResponseParser(parsed)
        limit = self.max_answer
        read = 0
        while not parsed.complete:
            sock.settimeout(left(deadline))
            chunk = sock.recv(65536 if limit is None else 8192)
            if not chunk:
                if read == 0:
                    raise _Unanswered
                raise ConnectionAbortedError(f"{self.peer} closed the connection mid-answer")  # sent: no retry
            read += len(chunk)
            if limit is not None and (read > MAX_HEAD_BYTES + limit or len(parsed.body) > limit):
                raise AnswerTooLarge(f"HTTP answer larger than {limit} bytes")
            parser.feed_data(chunk)
        status = parser.get_status_code()
        if limit is not None and len(parsed.body) > limit:
            raise AnswerTooLarge(f"HTTP {status} with an answer larger than {limit} bytes")
        if parsed.keep_alive:
            self._local.used_at = IDLE_CLOCK()
        else:
            self._drop(sock)
        return Answer(status, bytes(parsed.body), parsed.retry_after)

    def _drop(self, sock: socket.socket) -> None:
        self._local.sock = None
        with self._lock:
            self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def _drop_current(self) -> None:
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            self._drop(sock)


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has anything to read: an HTTP/1.1 server sends nothing unasked
    but its close (a FIN, a TLS close_notify, a 408 before them), so such a connection is spent."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()  # not select.select: a bed process of many agents holds fds past FD_SETSIZE
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
