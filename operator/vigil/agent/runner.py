"""`vigil-agent [--] CMD ARGS...`: runs a job's command and keeps its pod's heartbeat.

(`vigil-agent --sidecar` is the agent Vigil injects into a pod whose image has none:
vigil.agent.sidecar. It shares this module's heart and supervision.)

The agent starts CMD as its child (same stdin, stdout and stderr), and beats every
VIGIL_HEARTBEAT_INTERVAL seconds (with +-10% jitter) with a value that changes on every beat
(`<sequence>:<boot>`). The answer to a beat is also how the agent learns it must stop (see
vigil.core.fencing). Two channels (issue 26):

- The leader channel, when VIGIL_HEARTBEAT_URL is set: the beat is POSTed over HTTPS to the
  leading operator, authenticated by the pod's projected service-account token (re-read on
  every beat), and costs the API server nothing (see vigil.agent.channel). Every beat tries it
  first, so agents find a new leader within one interval.
- The annotation channel: a JSON merge patch of the agent's own pod (POD_NAME, POD_NAMESPACE)
  setting `vigil.dev/heartbeat`. It is the only channel when VIGIL_HEARTBEAT_URL is unset or
  empty, and the fallback of the other: a beat the operator does not answer with a verdict
  (an error status, not the leader, unreachable, a TLS error, a timeout) is sent as a patch at
  once, so an agent cut off from the operator but not from the API server keeps beating.

A new checkpoint from the child goes into `vigil.dev/checkpoint`: with the next beat on the
annotation channel alone; on the leader channel by a patch (with the heartbeat, so it counts
as that beat) at most every CHECKPOINT_MIN_SECONDS (vigil.core.fencing). The last one is
published at once when the child exits either way.

Environment:
  POD_NAME, POD_NAMESPACE          the pod the agent runs in (required)
  POD_UID                          the pod's UID (downward API metadata.uid), sent to the leader
  VIGIL_HEARTBEAT_INTERVAL         seconds between beats (default 10)
  VIGIL_HEARTBEAT_TIMEOUT          seconds without a renewal after which the attempt may have
                                   been replaced (default 60)
  VIGIL_HEARTBEAT_URL              https:// URL of the operator's heartbeat endpoint (unset:
                                   beats by annotation only)
  VIGIL_HEARTBEAT_CA               PEM of the CA of that endpoint's certificate (empty: the
                                   system's trust store)
  VIGIL_HEARTBEAT_TOKEN_FILE       the projected service-account token (required with the URL)
  VIGIL_GUARANTEE                  AtLeastOnce (default) or NoOverlap
  VIGIL_STOP_GRACE_SECONDS         SIGTERM -> SIGKILL grace when the agent stops its child (default 10)
  KUBECONFIG                       used when not in a cluster (else the pod's service account)
A leader channel set up wrongly (an URL that is not https, no or an unreadable token file, a
CA that is not PEM) is a warning, not an error: the agent then beats by annotation alone.
Given to the child: VIGIL_CHECKPOINT_FILE, where `vigil.agent.checkpoint()` writes.

Exit status: the child's (128+N when signal N killed it, as shells report it); 75 when the
agent stopped the child itself (pod superseded, deleted or gone (404), or, under NoOverlap,
fenced by the timeout or by its token refused (401) for 30 s after it had worked);
2 for a usage or configuration error; 126/127 when CMD cannot be run / is not found.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import os
import queue
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vigil.agent import ENV_CHECKPOINT_FILE, CheckpointTooLarge, InvalidCheckpoint, validate_checkpoint
from vigil.agent.channel import ChannelError, LeaderAnswer, LeaderBeat, LeaderChannel, check_url
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
from vigil.kube.client import MERGE_PATCH, ApiClient, user_agent
from vigil.kube.errors import ApiError, NotFound, Unauthorized
from vigil.runtime.clock import SYSTEM

if TYPE_CHECKING:
    from vigil.kube.config import Credentials

EXIT_USAGE = 2
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
CLOCK: Callable[[], float] = SYSTEM.monotonic  # never the wall clock: it jumps
USAGE = (
    "usage: vigil-agent [--] CMD [ARGS...] | vigil-agent --sidecar  "
    "(see `pydoc vigil.agent.runner` and `pydoc vigil.agent.sidecar` for the environment)"
)


def log(message: str) -> None:
    print(f"vigil-agent: {message}", file=sys.stderr, flush=True)


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
    """The one API call the agent makes: a merge patch of its pod's annotations, through
    Vigil's client (`vigil.kube.client`) on an event loop of the calling thread's own (the beat
    loop's thread, and the main thread for the last beat after it)."""

    def __init__(self, settings: Settings, timeout: float, credentials: Credentials | None = None):
        if credentials is None:
            from vigil.kube import config  # the official client loads slowly: `vigil-agent --help` stays fast

            try:
                credentials = config.load()
            except config.NoCredentials as err:
                raise ConfigError(str(err)) from None
        self.settings, self.timeout, self.credentials = settings, timeout, credentials
        self._local = threading.local()  # per thread: (event loop, client)
        self._held: list[tuple[asyncio.AbstractEventLoop, ApiClient]] = []  # every thread's, to close

    def _client(self) -> tuple[asyncio.AbstractEventLoop, ApiClient]:
        held = getattr(self._local, "held", None)
        if held is None:
            agent = user_agent(self.settings.pod_name, "agent")
            client = ApiClient(self.credentials, agent, connections=1, connect_timeout=self.timeout)
            held = self._local.held = (asyncio.new_event_loop(), client)
            self._held.append(held)
        return held

    def close(self) -> None:
        """Closes every thread's client and loop: call once no beat is in flight."""
        while self._held:
            loop, client = self._held.pop()
            loop.run_until_complete(client.close())
            loop.close()

    def patch(self, annotations: dict[str, str]) -> tuple[Observed, str]:
        loop, client = self._client()
        path = f"/api/v1/namespaces/{self.settings.namespace}/pods/{self.settings.pod_name}"
        body = {"metadata": {"annotations": annotations}}
        try:
            pod = loop.run_until_complete(
                client.request("PATCH", path, body=body, content_type=MERGE_PATCH, timeout=self.timeout)
            )
            return observe_pod(pod or {}), ""
        except NotFound as err:
            return Observed.GONE, describe_error(err)
        except Unauthorized as err:
            return Observed.UNAUTHORIZED, describe_error(err)
        except ApiError as err:  # timeouts, refused connections, 5xx, 403, 429: never fatal
            return Observed.API_ERROR, describe_error(err)


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
        if self.leader is None:  # the annotation channel alone: as before issue 26
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


# --- the child ------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the agent dies, so a SIGKILLed agent never leaves
    a job running unwatched (Linux; elsewhere a no-op)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Child:
    """The job's process. In its own process group when there is no terminal, so signals reach
    what it starts too (a shell's children); with a terminal it stays in the foreground group."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.group = not os.isatty(0)
        self.proc = subprocess.Popen(
            argv,
            env=env,
            process_group=0 if self.group else None,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.group:
                os.killpg(self.proc.pid, signum)
            else:
                self.proc.send_signal(signum)

    def wait(self) -> int:
        """Blocks until the child exits; its return code."""
        return self.proc.wait()


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


# --- main -------------------------------------------------------------------------------------------


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


def run_agent(argv: list[str], env: dict[str, str]) -> int:
    try:
        settings = Settings.from_env(env)
        pod = PodHeartbeat(settings, request_timeout(settings.timeout))
    except ConfigError as err:
        log(f"error: {err}")
        return EXIT_USAGE
    leader = leader_channel(settings)

    events: queue.Queue = queue.Queue()
    pending: list[int] = []
    child: Child | None = None

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            pending.append(signum)  # arrived before the child exists: delivered once it does
        else:
            child.signal(signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)

    workdir = Path(tempfile.mkdtemp(prefix="vigil-agent-"))  # private (0700): only this job writes here
    checkpoint_file = workdir / "checkpoint.json"
    try:
        try:
            child = Child(argv, {**env, ENV_CHECKPOINT_FILE: str(checkpoint_file)})
        except FileNotFoundError:
            log(f"error: command not found: {argv[0]}")
            return EXIT_NOT_FOUND
        except PermissionError:
            log(f"error: cannot run {argv[0]}: permission denied")
            return EXIT_CANNOT_RUN
        for early in pending:
            child.signal(early)
        heart = Heart(settings, pod, checkpoint_file, events, leader)
        try:
            return supervise(settings, child, heart, events)
        finally:
            if heart.ident is not None:  # started: stopped already, back from its wait at once
                heart.join(timeout=1.0)
            if not heart.is_alive():
                pod.close()
                if leader is not None:
                    leader.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if args and args[0] == "--sidecar":  # the injected agent: no command, it watches the pod's
        from vigil.agent import sidecar

        return sidecar.main(args[1:])
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    return run_agent(args, dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
