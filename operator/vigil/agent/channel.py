"""The agent's leader channel (issue 26): each beat POSTed over HTTPS to the leading operator.

    POST VIGIL_HEARTBEAT_URL
    Authorization: Bearer <the pod's projected service-account token, re-read on every beat>
    {"namespace": ..., "name": ..., "uid": ..., "beat": "<seq>:<boot>"}
    -> 200 {"state": "Renewed" | "Superseded" | "Deleting"}

The operator verifies the token locally, so a beat costs the API server nothing. Any other
answer (401, 403, 404, 400, 413, 429, 503, a 200 without one of those states) and any failure
to get one (refused, reset, TLS, timeout) is no verdict: the agent then beats by the pod's
annotation at once, with the same beat value, and takes that outcome.

The pure part (`leader_outcome`, `beat_body`, `check_url`, `read_token`) is testable without
sockets; `LeaderBeat` does the I/O.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from vigil.agent.transport import FAILURES, KeepAlive, short
from vigil.core.fencing import Observed
from vigil.kube.useragent import user_agent

MAX_TOKEN_BYTES = 16 * 1024  # a projected token is ~1 KiB; a file larger than this is not one
MAX_ANSWER_BYTES = 4 * 1024  # the answer is {"state": "..."}: more is not the operator's
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


def leader_outcome(status: int, body: bytes, retry_after: str | None = None) -> LeaderAnswer:
    """What the operator's answer (status, body, its Retry-After header) means: a verdict only for
    a 200 whose body is {"state": one of STATES}; anything else falls back to the annotation."""
    if status != 200:
        why = f"HTTP {status}" + (f": {short(body.decode('utf-8', 'replace'))}" if body.strip() else "")
        return fallback(why, rest_seconds(status, retry_after))
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return fallback("HTTP 200 whose body is not JSON")
    state = answer.get("state") if isinstance(answer, dict) else None
    observed = STATES.get(state) if isinstance(state, str) else None
    if observed is None:
        return fallback(f"HTTP 200 without a known state ({short(repr(state), 60)})")
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


class LeaderBeat:
    """Posts beats to the leading operator over the agent's blocking transport
    (`vigil.agent.transport.KeepAlive`: one keep-alive TLS connection per calling thread, one
    deadline for the whole exchange). Never raises for a failed beat: it answers a fallback
    instead. A beat whose reused connection ends before any answer is sent again, once, on a new
    one: the operator may have closed it while idle."""

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
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.ssl = ssl_context(ca_pem)
        self.token_file = token_file
        read_token(token_file)  # unreadable at start: the caller warns and uses the annotation alone
        self.namespace, self.name, self.uid, self.timeout = namespace, name, uid, timeout
        self.user_agent = user_agent(name, "agent")
        self.http = KeepAlive(
            parts.hostname or "", parts.port or 443, self.ssl, peer="the operator", max_answer=MAX_ANSWER_BYTES
        )
        self._fields = (
            f"User-Agent: {self.user_agent}\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
        )

    def close(self) -> None:
        """Closes every thread's connection: call once no beat is in flight."""
        self.http.close()

    def post(self, beat: str) -> LeaderAnswer:
        try:
            token = read_token(self.token_file)
        except ChannelError as err:
            return fallback(str(err))
        body = json.dumps(beat_body(self.namespace, self.name, self.uid, beat), separators=(",", ":")).encode()
        try:
            fields = f"Authorization: Bearer {token}\r\n{self._fields}"
            answer = self.http.request("POST", self.target, fields, body, self.timeout)
        except FAILURES as err:
            return fallback(self.http.failure(err, self.timeout))
        return leader_outcome(answer.status, answer.body, answer.retry_after)
