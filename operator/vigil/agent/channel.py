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

import asyncio
import json
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from vigil.core.fencing import Observed
from vigil.kube.client import user_agent

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


def fallback(why: str) -> LeaderAnswer:
    return LeaderAnswer(None, why)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def leader_outcome(status: int, body: bytes) -> LeaderAnswer:
    """What the operator's answer (status, body) means: a verdict only for a 200 whose body is
    {"state": one of STATES}; anything else falls back to the annotation."""
    if status != 200:
        return fallback(f"HTTP {status}" + (f": {_short(body.decode('utf-8', 'replace'))}" if body.strip() else ""))
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


class LeaderBeat:
    """Posts beats to the leading operator through aiohttp, on an event loop of the calling
    thread's own (as `PodHeartbeat` does with the API client), over one keep-alive connection
    per thread. Never raises for a failed beat: it answers a fallback instead."""

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
        self.ssl = ssl_context(ca_pem)
        self.token_file = token_file
        read_token(token_file)  # unreadable at start: the caller warns and uses the annotation alone
        self.namespace, self.name, self.uid, self.timeout = namespace, name, uid, timeout
        self.user_agent = user_agent(name, "agent")
        self._local = threading.local()  # per thread: (event loop, session holder)
        self._held: list[tuple[asyncio.AbstractEventLoop, list[aiohttp.ClientSession]]] = []

    def _new_loop(self) -> asyncio.AbstractEventLoop:
        """The calling thread's loop for this channel (bench.heartbeat_load shares one among many)."""
        return asyncio.new_event_loop()

    def _close_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.close()

    def _loop(self) -> tuple[asyncio.AbstractEventLoop, list[aiohttp.ClientSession]]:
        held = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = (self._new_loop(), [])
            self._held.append(held)
        return held

    def close(self) -> None:
        """Closes every thread's session and loop: call once no beat is in flight."""
        while self._held:
            loop, sessions = self._held.pop()
            for session in sessions:
                loop.run_until_complete(session.close())
            self._close_loop(loop)

    async def _post(self, sessions: list[aiohttp.ClientSession], body: dict[str, str], token: str) -> LeaderAnswer:
        if not sessions:  # made inside the loop that uses it, as aiohttp wants
            sessions.append(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=self.ssl, limit=1),
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                )
            )
        headers = {"Authorization": f"Bearer {token}", "User-Agent": self.user_agent, "Accept": "application/json"}
        async with sessions[0].post(self.url, json=body, headers=headers) as resp:
            answer = b""
            while len(answer) <= MAX_ANSWER_BYTES:
                chunk = await resp.content.read(MAX_ANSWER_BYTES + 1 - len(answer))
                if not chunk:
                    break
                answer += chunk
            if len(answer) > MAX_ANSWER_BYTES:
                return fallback(f"HTTP {resp.status} with an answer larger than {MAX_ANSWER_BYTES} bytes")
            return leader_outcome(resp.status, answer)

    def post(self, beat: str) -> LeaderAnswer:
        try:
            token = read_token(self.token_file)
        except ChannelError as err:
            return fallback(str(err))
        loop, sessions = self._loop()
        body = beat_body(self.namespace, self.name, self.uid, beat)
        try:
            return loop.run_until_complete(asyncio.wait_for(self._post(sessions, body, token), self.timeout))
        except TimeoutError:
            return fallback(f"no answer within {self.timeout:g}s")
        except aiohttp.ClientConnectorCertificateError as err:
            return fallback(f"TLS: {_short(str(err.certificate_error))}")
        except aiohttp.ClientSSLError as err:
            return fallback(f"TLS: {_short(str(err))}")
        except aiohttp.ClientError as err:
            return fallback(f"{type(err).__name__}: {_short(str(err))}")
        except (OSError, ssl.SSLError) as err:
            return fallback(f"{type(err).__name__}: {_short(str(err))}")
