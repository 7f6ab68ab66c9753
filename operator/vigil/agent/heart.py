"""The agent's heart, shared by its two entry points (`vigil-agent -- CMD`, vigil.agent.runner,
and the injected `vigil-agent --sidecar`, vigil.agent.sidecar): its settings, the beat loop
(`Heart`) on its two channels (the leader's endpoint, vigil.agent.channel, and the pod's
annotation, `PodHeartbeat`), and the supervision that acts on the beats' outcomes
(`supervise`: fencing, vigil.core.fencing). The environment and the channels' rules are told in
`pydoc vigil.agent.runner`.

Both channels go over one blocking transport (vigil.agent.transport): the agent runs no event
loop and needs no aiohttp.
"""

from __future__ import annotations

import json
import math
import os
import queue
import random
import secrets
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import orjson

from vigil.agent import CheckpointTooLarge, InvalidCheckpoint, validate_checkpoint
from vigil.agent.channel import ChannelError, LeaderAnswer, LeaderBeat, LeaderChannel, check_url
from vigil.agent.transport import FAILURES, KeepAlive
from vigil.api import ANNOTATION_CHECKPOINT, ANNOTATION_HEARTBEAT, ANNOTATION_SUPERSEDED, Guarantee
from vigil.core.fencing import (
    CHECKPOINT_MIN_SECONDS,
    EXIT_FENCED,
    Fencer,
    Observed,
    checkpoint_due,
    leader_timeout,
    next_beat_delay,
    request_timeout,
    retry_delay,
)
from vigil.kube.errors import ApiError, NotFound, Unauthorized, Unreachable, from_status
from vigil.kube.useragent import user_agent
from vigil.runtime.clock import SYSTEM
from vigil.runtime.logs import rfc3339

if TYPE_CHECKING:
    from vigil.kube.config import Credentials

EXIT_USAGE = 2
CLOCK: Callable[[], float] = SYSTEM.monotonic  # never the wall clock: it jumps
MERGE_PATCH = "application/merge-patch+json"
# A connection to the API server idle longer than this is made anew rather than reused, as the
# aiohttp client's pool did (its keep-alive timeout): a proxy or load balancer on the way may
# have dropped it silently, and a patch is not sent twice.
API_IDLE_SECONDS = 15.0


def log(message: str) -> None:
    print(log_line(message, os.environ), file=sys.stderr, flush=True)


def log_line(message: str, env: Mapping[str, str]) -> str:
    """`vigil-agent: message`; or, with VIGIL_LOG_FORMAT=json, the operator's JSON line
    (vigil.runtime.logs) about the job: its namespace, name and attempt from the pod's env."""
    if env.get("VIGIL_LOG_FORMAT", "").strip().lower() != "json":
        return f"vigil-agent: {message}"
    level = next((lvl for lvl in ("error", "warning") if message.startswith(lvl + ":")), "info")
    attempt = env.get("VIGIL_ATTEMPT", "")
    about = {
        "namespace": env.get("POD_NAMESPACE") or None,
        "name": env.get("VIGIL_JOB") or None,
        "attempt": int(attempt) if attempt.isdigit() else None,
        "pod": env.get("POD_NAME") or None,
    }
    line = {"time": rfc3339(time.time()), "level": level, "logger": "vigil-agent", "message": message}
    return json.dumps({**line, **{k: v for k, v in about.items() if v is not None}}, ensure_ascii=False)


class ConfigError(Exception):
    """The agent cannot run as configured; the message says what to set."""


@dataclass(frozen=True)
class Settings:
    pod_name: str
    namespace: str
    interval: float = 10.0
    timeout: float = 60.0
    guarantee: Guarantee = "AtLeastOnce"
    grace: float = 10.0
    pod_uid: str = ""
    heartbeat_url: str = ""  # empty: the annotation channel alone
    heartbeat_ca: str = ""
    token_file: str = ""
    leader_problem: str = ""  # why the leader channel is off although VIGIL_HEARTBEAT_URL is set

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Settings:
        missing = [name for name in ("POD_NAME", "POD_NAMESPACE") if not env.get(name)]
        if missing:
            raise ConfigError(
                f"{' and '.join(missing)} not set: give the pod's name and namespace through the downward API"
            )

        def seconds(name: str, default: float) -> float:
            raw = env.get(name, "")
            try:
                value = float(raw) if raw.strip() else default
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
            if not value > 0:
                raise ConfigError(f"{name}={raw!r} must be greater than 0")
            return value

        guarantee = env.get("VIGIL_GUARANTEE", "").strip() or "AtLeastOnce"
        if guarantee != "AtLeastOnce" and guarantee != "NoOverlap":
            raise ConfigError(f"VIGIL_GUARANTEE={guarantee!r} must be AtLeastOnce or NoOverlap")
        url, problem = env.get("VIGIL_HEARTBEAT_URL", "").strip(), ""
        token_file = env.get("VIGIL_HEARTBEAT_TOKEN_FILE", "").strip()
        if url:
            try:
                url = check_url(url)
                if not token_file:
                    raise ChannelError("VIGIL_HEARTBEAT_URL is set but VIGIL_HEARTBEAT_TOKEN_FILE is not")
            except ChannelError as err:  # the annotation channel still works: not worth a crash
                url, problem = "", str(err)
        return cls(
            pod_name=env["POD_NAME"],
            namespace=env["POD_NAMESPACE"],
            interval=seconds("VIGIL_HEARTBEAT_INTERVAL", 10.0),
            timeout=seconds("VIGIL_HEARTBEAT_TIMEOUT", 60.0),
            guarantee=guarantee,  # type: ignore[arg-type]  # checked against both values above
            grace=seconds("VIGIL_STOP_GRACE_SECONDS", 10.0),
            pod_uid=env.get("POD_UID", "").strip(),
            heartbeat_url=url,
            heartbeat_ca=env.get("VIGIL_HEARTBEAT_CA", "") if url else "",
            token_file=token_file if url else "",
            leader_problem=problem,
        )


# --- the pod, as the agent sees it --------------------------------------------------------------


def observe_pod(pod: dict[str, Any]) -> Observed:
    """What the pod returned by a successful patch says about this attempt."""
    meta = pod.get("metadata") or {}
    if ANNOTATION_SUPERSEDED in (meta.get("annotations") or {}):
        return Observed.SUPERSEDED
    if meta.get("deletionTimestamp"):
        return Observed.DELETING
    return Observed.RENEWED


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_error(err: ApiError) -> str:
    """One line for the log: status, reason and the server's message; never headers (no tokens)."""
    return _short(str(err))


class PodHeartbeat:
    """The one API call the agent makes: a merge patch of its pod's annotations, over the agent's
    blocking transport (`vigil.agent.transport.KeepAlive`: one keep-alive connection per calling
    thread, the beat loop's and the main thread's for the last beat after it, one deadline of
    `timeout` seconds for the whole request), with the credentials of `vigil.kube.config` (in a
    pod its service account: the cluster's CA, and the token the kubelet rotates, asked for on
    every patch)."""

    def __init__(self, settings: Settings, timeout: float, credentials: Credentials | None = None):
        if credentials is None:
            from vigil.kube import config  # the official client loads slowly: `vigil-agent --help` stays fast

            try:
                credentials = config.load()
            except config.NoCredentials as err:
                raise ConfigError(str(err)) from None
        self.settings, self.timeout, self.credentials = settings, timeout, credentials
        # The client, made at the first patch (a CA file that cannot be read fails that beat, not
        # the agent's start); held in a list that copies of this object share, with its connections.
        self._made: list[tuple[KeepAlive, str]] = []
        self._making = threading.Lock()

    def _client(self) -> tuple[KeepAlive, str]:
        """The API server's client and the path its URL puts before every request's."""
        with self._making:
            if not self._made:
                parts = urlsplit(self.credentials.host)
                context = self.credentials.ssl_context()
                tls = context if isinstance(context, ssl.SSLContext) else None
                port = parts.port or (443 if tls is not None else 80)
                client = KeepAlive(
                    parts.hostname or "",
                    port,
                    tls,
                    peer="the API server",
                    idle_seconds=API_IDLE_SECONDS,
                    resend_unanswered=False,  # not idempotent as HTTP sees it: never sent twice
                )
                self._made.append((client, parts.path.rstrip("/")))
            return self._made[0]

    def close(self) -> None:
        """Closes every thread's connection: call once no beat is in flight."""
        for client, _ in self._made:
            client.close()

    def patch(self, annotations: dict[str, str]) -> tuple[Observed, str]:
        try:
            pod = self._request(annotations)
            return observe_pod(pod or {}), ""
        except NotFound as err:
            return Observed.GONE, describe_error(err)
        except Unauthorized as err:
            return Observed.UNAUTHORIZED, describe_error(err)
        except ApiError as err:  # timeouts, refused connections, 5xx, 403, 429: never fatal
            return Observed.API_ERROR, describe_error(err)

    def _request(self, annotations: dict[str, str]) -> Any:
        """The patch; the pod the API server answers with (None for an empty answer), or an ApiError."""
        client, prefix = self._client()
        path = f"/api/v1/namespaces/{self.settings.namespace}/pods/{self.settings.pod_name}"
        body = orjson.dumps({"metadata": {"annotations": annotations}})
        headers = {
            "Accept": "application/json",
            "User-Agent": user_agent(self.settings.pod_name, "agent"),
            **self.credentials.auth_headers(),
            "Content-Type": MERGE_PATCH,
        }
        if any("\r" in value or "\n" in value for value in headers.values()):
            raise ValueError("a header value holds a line break")  # never split the request
        fields = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        try:
            answer = client.request("PATCH", prefix + path, fields, body, self.timeout)
        except FAILURES as err:
            raise Unreachable(f"PATCH {path}: {client.failure(err, self.timeout)}") from err
        if answer.status >= 400:
            raise from_status(answer.status, answer.body)
        try:
            return orjson.loads(answer.body) if answer.body else None
        except orjson.JSONDecodeError as err:
            raise ApiError(f"PATCH {path}: the answer is not JSON ({err})") from err


# --- the heartbeat loop (a thread; the main thread owns the child) --------------------------------


class Heart(threading.Thread):
    """Beats until stopped; reports every outcome as ("observed", Observed, sent_at) to `events`.

    With a `leader` channel, each beat is posted there first and patched on the pod only when
    the leader gives no verdict, or when a new checkpoint is due (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        pod: PodHeartbeat,
        checkpoint_file: Path | None,
        events: queue.Queue,
        leader: LeaderChannel | None = None,
        gate: Callable[[], str | None] = lambda: None,
    ):
        super().__init__(name="vigil-heartbeat", daemon=True)
        self.settings, self.pod, self.checkpoint_file, self.events = settings, pod, checkpoint_file, events
        self.leader, self.gate = leader, gate
        self.held_back = ""  # why the gate last held a beat back (logged once per change)
        self.boot = secrets.token_hex(4)  # tells this agent's beats from an earlier one's
        self.sequence = 0
        self.published: bytes | None = None
        self.rejected: bytes | None = None  # warned about once, not on every beat
        self.halt = threading.Event()
        self.failures = 0
        self.checkpoint_sent_at = CLOCK()  # the rate limit runs from the start: short jobs write at exit only
        self.checkpoint_failing = False  # the last checkpoint patch failed (logged once)
        self.falling_back = False  # the leader channel failed on the last beat that tried it (logged once)
        self.leader_rests_until = -math.inf  # CLOCK() before which the leader is not asked (its Retry-After)

    def run(self) -> None:
        while not self.halt.is_set():
            if self.holds_back():  # no beat: the fencer sees silence, as after a failed one
                self.halt.wait(self.settings.interval)
                continue
            sent_at = CLOCK()
            try:
                observed = self.beat()
            except Exception as err:  # a bug here must not silence the heart for good
                log(f"heartbeat failed unexpectedly: {type(err).__name__}: {err}")
                observed = Observed.API_ERROR
            self.events.put(("observed", observed, sent_at))
            if observed is Observed.RENEWED:
                delay = next_beat_delay(self.settings.interval, random.random())
            else:
                delay = retry_delay(self.failures, self.settings.interval, self.settings.timeout, random.random())
            self.halt.wait(delay)

    def holds_back(self) -> bool:
        """Whether the gate (the injected agent's liveness rule) holds this beat back."""
        try:
            why = self.gate() or ""
        except Exception as err:  # a bug in the gate must not silence the heart for good
            why = ""
            log(f"liveness check failed unexpectedly: {type(err).__name__}: {err}")
        if why != self.held_back:
            log(f"not beating: {why}" if why else "beating again")
            self.held_back = why
        return bool(why)

    def longest_beat(self) -> float:
        """How long one beat can take: the leader's limit and then the patch's."""
        return (self.leader.timeout if self.leader is not None else 0.0) + self.pod.timeout

    def beat(self, flush: bool = False) -> Observed:
        """One beat on the channels' rules; `flush` (the last one, after the child exited) patches
        a new checkpoint at once whatever the rate limit."""
        self.sequence += 1
        value = f"{self.sequence}:{self.boot}"
        annotations = {ANNOTATION_HEARTBEAT: value}
        raw, text = self.new_checkpoint()
        detail = ""
        if self.leader is None:  # the annotation channel alone
            if text is not None:
                annotations[ANNOTATION_CHECKPOINT] = text
            observed, detail = self.pod.patch(annotations)
        else:
            now = CLOCK()
            if text is not None and (flush or checkpoint_due(self.checkpoint_sent_at, now)):
                # The checkpoint's patch carries the heartbeat too: it is this beat, and the
                # leader is asked only if it fails (an API server down must not cost the beat;
                # after the child's exit, a last beat is worth nothing without its checkpoint).
                self.checkpoint_sent_at = now
                observed, detail = self.pod.patch({**annotations, ANNOTATION_CHECKPOINT: text})
                if observed in (Observed.API_ERROR, Observed.UNAUTHORIZED) and not flush:
                    verdict = self.ask_leader(value)
                    if verdict is not None:
                        # The beat counts; the checkpoint is written again once due (told once).
                        if not self.checkpoint_failing:
                            log(f"checkpoint not published ({detail}): retrying in {CHECKPOINT_MIN_SECONDS:g}s")
                        self.checkpoint_failing = True
                        observed, raw = verdict, None
            else:
                verdict = self.ask_leader(value)
                if verdict is not None:
                    observed, raw = verdict, None
                else:
                    if text is not None:  # a patch is sent anyway: carrying the checkpoint costs nothing more
                        annotations[ANNOTATION_CHECKPOINT] = text
                        self.checkpoint_sent_at = now
                    observed, detail = self.pod.patch(annotations)
        if observed is Observed.RENEWED:
            if self.failures:
                log(f"heartbeat renewed again after {self.failures} failed attempt(s)")
            self.failures = 0
            if raw is not None:
                self.published, self.checkpoint_failing = raw, False
        elif observed in (Observed.API_ERROR, Observed.UNAUTHORIZED):
            self.failures += 1
            # The first failure and then every tenth: enough to see it, not a flood.
            if self.failures == 1 or self.failures % 10 == 0:
                log(f"heartbeat failed ({self.failures} in a row), retrying: {detail}")
        return observed

    def ask_leader(self, value: str) -> Observed | None:
        """The leader's verdict on this beat, or None to beat by annotation; logs the switch
        between the channels once each way, never per beat."""
        assert self.leader is not None
        if CLOCK() < self.leader_rests_until:  # it asked not to be tried yet: no handshake, no post
            return None
        try:
            answer = self.leader.post(value)
        except Exception as err:  # a bug of the leader channel must not cost the beat: the annotation stays
            answer = LeaderAnswer(None, f"{type(err).__name__}: {err}")
        if answer.rest_seconds > 0:
            self.leader_rests_until = CLOCK() + answer.rest_seconds
            log(f"heartbeat endpoint at capacity ({answer.why}): beating by annotation for {answer.rest_seconds:g}s")
            self.falling_back = True
            return None
        if answer.observed is not None:
            if self.falling_back:
                log("heartbeat endpoint answering again: beating by the operator")
                self.falling_back = False
        elif not self.falling_back:
            log(f"heartbeat endpoint unavailable ({answer.why}): beating by pod annotation")
            self.falling_back = True
        return answer.observed

    def new_checkpoint(self) -> tuple[bytes | None, str | None]:
        """The checkpoint file's contents when they changed since the last published ones and
        are valid; (None, None) otherwise."""
        if self.checkpoint_file is None:  # the injected agent: no checkpoint file of the job's
            return None, None
        try:
            raw = self.checkpoint_file.read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as err:
            log(f"cannot read the checkpoint file: {err}")
            return None, None
        if raw == self.published or raw == self.rejected:
            return None, None
        try:
            return raw, validate_checkpoint(raw)
        except (CheckpointTooLarge, InvalidCheckpoint) as err:
            self.rejected = raw
            log(f"warning: checkpoint not published: {err}")
            return None, None

    def stop(self) -> None:
        self.halt.set()


class Supervised(Protocol):
    """What `supervise` watches and stops: the agent's child, or for the injected agent the
    job's processes in the pod (vigil.agent.sidecar.JobProcesses)."""

    def wait(self) -> int:
        """Blocks until the job has ended; its return code (negative: killed by that signal)."""
        ...

    def signal(self, signum: int) -> None: ...


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# --- the channels and the supervision ---------------------------------------------------------------


def leader_channel(settings: Settings) -> LeaderBeat | None:
    """The leader channel the settings ask for, or None (with a warning when it was asked for
    but cannot work: the annotation channel alone then)."""
    if settings.leader_problem:
        log(f"warning: {settings.leader_problem}: beating by pod annotation")
    if not settings.heartbeat_url:
        return None
    try:
        return LeaderBeat(
            settings.heartbeat_url,
            settings.heartbeat_ca,
            settings.token_file,
            namespace=settings.namespace,
            name=settings.pod_name,
            uid=settings.pod_uid,
            timeout=leader_timeout(request_timeout(settings.timeout), settings.interval),
        )
    except ChannelError as err:
        log(f"warning: {err}: beating by pod annotation")
        return None


def supervise(settings: Settings, child: Supervised, heart: Heart, events: queue.Queue) -> int:
    """Waits for the child while acting on the heartbeat's outcomes; returns the exit status."""
    threading.Thread(target=lambda: events.put(("exited", child.wait(), 0.0)), name="vigil-child", daemon=True).start()
    returncode = 0
    fencer = Fencer(timeout=settings.timeout, guarantee=settings.guarantee, started_at=CLOCK())
    heart.start()
    stopping_at: float | None = None  # when the agent sent SIGTERM to the child itself
    killed = warned = False
    reason = ""
    while True:
        now = CLOCK()
        if stopping_at is not None:
            wake_at: float | None = None if killed else stopping_at + settings.grace
        else:
            wake_at = fencer.deadline() if fencer.deadline() > now else None  # AtLeastOnce overdue: events only
        try:
            kind, value, at = events.get(timeout=None if wake_at is None else max(0.0, wake_at - now))
        except queue.Empty:
            kind = None
        if kind == "exited":
            returncode = value
            break
        if kind == "observed":
            fencer.observe(value, at)
        now = CLOCK()
        if stopping_at is None:
            decision = fencer.assess(now)
            if decision.stop is not None:
                reason = f"{decision.stop.value}: {decision.message}"
                log(f"stopping the job ({reason}); SIGTERM now, SIGKILL after {settings.grace:g}s")
                heart.stop()
                child.signal(signal.SIGTERM)
                stopping_at = now
            elif (decision.overdue or decision.refused) and not warned:
                log(f"warning: {decision.message}")
                warned = True
            elif not (decision.overdue or decision.refused):
                warned = False
        elif not killed and now >= stopping_at + settings.grace:
            log(f"the job did not stop within {settings.grace:g}s: SIGKILL")
            child.signal(signal.SIGKILL)
            killed = True

    heart.stop()
    if stopping_at is not None:
        log(
            f"exit {EXIT_FENCED}: the job was stopped by its agent ({reason}); "
            f"the job's own exit status was {exit_status(returncode)}"
        )
        return EXIT_FENCED
    flush_checkpoint(heart)
    return exit_status(returncode)


def flush_checkpoint(heart: Heart) -> None:
    """One last beat, so a checkpoint written just before the child exited is not lost."""
    if heart.checkpoint_file is None:
        return
    try:
        if heart.checkpoint_file.read_bytes() in (heart.published, heart.rejected):
            return
    except OSError:
        return  # no checkpoint at all
    heart.join(timeout=heart.longest_beat() + 1)
    if not heart.is_alive():  # else still stuck in a request: the job's exit must not wait longer
        heart.beat(flush=True)  # by annotation at once on either channel: the rate limit does not apply
