"""The worker's settings (the env a VigilWorkerPool gives its pods, docs/pull.md) and its one
request, `POST /v1/pull`, over the agent's blocking transport (`vigil.agent.transport.KeepAlive`:
one keep-alive TLS connection per calling thread, so the long poll claiming tasks and the beats
reporting results go side by side), with the pod's projected token re-read before each request
(`vigil.agent.channel.read_token`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from vigil.agent.channel import ChannelError, read_token, rest_seconds, ssl_context
from vigil.agent.transport import FAILURES, Answer, KeepAlive, short
from vigil.kube.useragent import user_agent
from vigil.worker.state import MAX_SLOTS

MAX_ANSWER_BYTES = 8 * 1024 * 1024  # leases carry their env (a task's item): more is not the leader's
REQUIRED = (
    "VIGIL_PULL_URL",
    "VIGIL_PULL_CA",
    "VIGIL_PULL_TOKEN_FILE",
    "VIGIL_POD_NAME",
    "VIGIL_POD_NAMESPACE",
    "VIGIL_POD_UID",
)


class ConfigError(Exception):
    """The worker cannot run as configured; the message names what to set (never the token)."""


def parse_slots(raw: str, what: str) -> int:
    try:
        slots = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{what}={raw!r} is not a whole number") from None
    if not 1 <= slots <= MAX_SLOTS:
        raise ConfigError(f"{what}={raw!r} must be from 1 to {MAX_SLOTS}")
    return slots


@dataclass(frozen=True)
class Settings:
    url: str
    ca_pem: str  # empty: the system's trust store
    token_file: str
    pod_name: str
    namespace: str
    pod_uid: str
    slots: int
    pool: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], slots: int | None = None) -> Settings:
        """From the pool's env; `slots` (the --slots flag) over VIGIL_POOL_SLOTS."""
        missing = [name for name in REQUIRED if name not in env or (name != "VIGIL_PULL_CA" and not env[name].strip())]
        if slots is None and not env.get("VIGIL_POOL_SLOTS", "").strip():
            missing.append("VIGIL_POOL_SLOTS (or --slots)")
        if missing:
            raise ConfigError(
                f"{', '.join(missing)} not set: vigil-worker runs in a pod of a VigilWorkerPool, which sets "
                "them (docs/pull.md, 'The pool's pods')"
            )
        url = env["VIGIL_PULL_URL"].strip()
        parts = urlsplit(url)
        if parts.scheme != "https":
            raise ConfigError(f"VIGIL_PULL_URL={url!r} is not an https:// URL (the pod's token would travel in clear)")
        if not parts.hostname:
            raise ConfigError(f"VIGIL_PULL_URL={url!r} has no host")
        if slots is None:
            slots = parse_slots(env["VIGIL_POOL_SLOTS"], "VIGIL_POOL_SLOTS")
        elif not 1 <= slots <= MAX_SLOTS:
            raise ConfigError(f"--slots {slots} must be from 1 to {MAX_SLOTS}")
        return cls(
            url=url,
            ca_pem=env["VIGIL_PULL_CA"],
            token_file=env["VIGIL_PULL_TOKEN_FILE"].strip(),
            pod_name=env["VIGIL_POD_NAME"].strip(),
            namespace=env["VIGIL_POD_NAMESPACE"].strip(),
            pod_uid=env["VIGIL_POD_UID"].strip(),
            slots=slots,
            pool=env.get("VIGIL_POOL", "").strip(),
        )

    @property
    def pod(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.pod_name, "uid": self.pod_uid}


class PullFailed(Exception):
    """A request that got no answer (refused, reset, TLS, timeout, the token unreadable); the
    message says why in a line, never the token."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    retry_after: float | None  # a 503's Retry-After in seconds, when it gave one

    def why(self) -> str:
        """The answer in a line for the log, when it is no verdict."""
        text = short(self.body.decode("utf-8", "replace"))
        return f"HTTP {self.status}" + (f": {text}" if text else "")


class PullClient:
    """Posts the worker's requests to the leader. Thread-safe: each calling thread has its own
    connection (the long poll does not hold up the beats)."""

    def __init__(self, settings: Settings) -> None:
        parts = urlsplit(settings.url)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            context = ssl_context(settings.ca_pem)
        except ChannelError as err:
            raise ConfigError(f"VIGIL_PULL_CA is not a PEM certificate: {str(err).split(': ', 1)[-1]}") from None
        self.token_file = settings.token_file
        self.http = KeepAlive(
            parts.hostname or "", parts.port or 443, context, peer="the leader", max_answer=MAX_ANSWER_BYTES
        )
        self._fields = (
            f"User-Agent: {user_agent(settings.pod_name, 'worker')}\r\n"
            "Accept: application/json\r\nContent-Type: application/json\r\n"
        )

    def post(self, body: bytes, timeout: float) -> Reply:
        """One request; its answer whatever the status, or PullFailed."""
        try:
            token = read_token(self.token_file)
        except ChannelError as err:
            raise PullFailed(str(err)) from None
        try:
            answer: Answer = self.http.request(
                "POST", self.target, f"Authorization: Bearer {token}\r\n{self._fields}", body, timeout
            )
        except FAILURES as err:
            raise PullFailed(self.http.failure(err, timeout)) from None
        rest = rest_seconds(answer.status, answer.retry_after)
        return Reply(answer.status, answer.body, rest if rest > 0 else None)

    def close(self) -> None:
        self.http.close()
