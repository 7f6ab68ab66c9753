"""`vigil-agent [--] CMD ARGS...`: runs a job's command and keeps its pod's heartbeat.

(`vigil-agent --sidecar` is the agent Vigil injects into a pod whose image has none:
vigil.agent.sidecar. Both run the heart and supervision of vigil.agent.heart.)

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
  VIGIL_LOG_FORMAT                 json: the agent's lines as the operator's --log-format json (with
                                   the job's namespace, name and attempt); else text (default)
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

import contextlib
import ctypes
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from vigil.agent import ENV_CHECKPOINT_FILE, sidecar
from vigil.agent.heart import (
    EXIT_USAGE,
    ConfigError,
    Heart,
    PodHeartbeat,
    Settings,
    leader_channel,
    log,
    supervise,
)
from vigil.core.fencing import request_timeout

EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

USAGE = (
    "usage: vigil-agent [--] CMD [ARGS...] | vigil-agent --sidecar  "
    "(see `pydoc vigil.agent.runner` and `pydoc vigil.agent.sidecar` for the environment)"
)


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


# --- main -------------------------------------------------------------------------------------------


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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if args and args[0] == "--sidecar":  # the injected agent: no command, it watches the pod's
        return sidecar.main(args[1:])
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    return run_agent(args, dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
