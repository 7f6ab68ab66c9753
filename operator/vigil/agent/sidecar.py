"""`vigil-agent --sidecar`: the agent Vigil injects into an attempt's pod (heartbeat.agent: Sidecar).

It runs as a native sidecar (an init container with restartPolicy: Always) from Vigil's own
image, in a pod with shareProcessNamespace: true, so the job's image needs nothing of Vigil.
It beats for the pod exactly as `vigil-agent -- CMD` does (vigil.agent.heart: the same heart,
channels and fencing), but its "child" is the job's processes, found in /proc:

- every process of the pod's PID namespace except the agent's own (its PID and descendants);
- except PID 1 when it is the pod's infrastructure process (argv[0] `/pause`, or podman's
  `catatonit`): in a pod without one (a container that is its own PID namespace's init), PID 1
  is the job and counts;
- except other injected agents (`vigil-agent --sidecar` on their command line).

Another sidecar of the pod (a proxy, a log shipper) counts as the job's: the job ends when the
last of them exits, and fencing stops them too.

Before the first job process appears (native sidecars start before the main containers) the
agent beats and waits, up to VIGIL_STARTUP_GRACE seconds; after that with nothing to watch it
exits 2 (most likely the pod lacks shareProcessNamespace). Once the job's processes are all
gone, the job has ended: the agent stops beating and exits 0 (the kubelet stops native sidecars
once the main containers end, too). SIGTERM or SIGINT (the kubelet stopping the pod) does the
same: the kubelet stops the job's containers itself. When fenced (the pod superseded, deleted or
gone, or under NoOverlap the heartbeat timeout: vigil.core.fencing), it sends SIGTERM to the
job's processes, SIGKILL after VIGIL_STOP_GRACE_SECONDS, and exits 75 once they are gone.

Checkpoints: the job writes its checkpoint's JSON (at most 2 KiB) to VIGIL_CHECKPOINT_FILE
(/var/run/vigil/checkpoint.json, in the emptyDir the pod shares; write a temporary file and
rename it, as vigil.agent.checkpoint() does, so that half a checkpoint is never read), and the
agent publishes it as `vigil-agent -- CMD` does: within 30 s, and at the job's end.

Liveness beyond "the process exists", optional:
  VIGIL_LIVENESS_FILE   a file the job touches: the agent beats only while its mtime is younger
                        than VIGIL_HEARTBEAT_TIMEOUT
  VIGIL_LIVENESS_PORT   the agent listens on 127.0.0.1:PORT; GET or POST /beat counts as a touch
With either set, a job that has not touched yet is given the timeout from its first process.
Signalling another container's process needs the same UID, or CAP_KILL (docs/heartbeats.md).

Environment: as `vigil-agent` (pydoc vigil.agent.runner), plus VIGIL_STARTUP_GRACE (seconds,
default 120) and the two above.
"""

from __future__ import annotations

import http.server
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vigil.agent import ENV_CHECKPOINT_FILE
from vigil.agent.heart import (
    CLOCK,
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

INFRA_NAMES = frozenset({"pause", "catatonit"})  # the pod's PID 1 when it is not the job
POLL_SECONDS = 0.5  # how often /proc is read: the job's end is seen within this
GONE_STATES = frozenset({"Z", "X"})  # a zombie has ended; its parent (outside the pod) reaps it


# --- pure: which processes are the job's, and whether to beat ------------------------------------


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    pid: int
    ppid: int
    state: str  # the one-letter state of /proc/PID/stat (R, S, D, Z, ...)
    argv: tuple[str, ...]


def is_infra(proc: Proc) -> bool:
    """The pod's pause process: PID 1 running /pause (Kubernetes) or catatonit (podman)."""
    return proc.pid == 1 and bool(proc.argv) and os.path.basename(proc.argv[0]) in INFRA_NAMES


def is_injected_agent(proc: Proc) -> bool:
    """`vigil-agent --sidecar`, whether run as a script (python .../vigil-agent --sidecar) or not."""
    return "--sidecar" in proc.argv and any(os.path.basename(arg) == "vigil-agent" for arg in proc.argv)


def is_image_agent(proc: Proc) -> bool:
    """`vigil-agent -- CMD` run by the job's own image: it beats for the pod itself."""
    return "--sidecar" not in proc.argv and any(os.path.basename(arg) == "vigil-agent" for arg in proc.argv[:2])


def image_agent_warning(procs: Iterable[Proc], job: frozenset[int]) -> str | None:
    """What to tell when the job runs its own agent too (an image made for `heartbeat.agent:
    Image`, in a job that left the field unset). Both go on beating: holding this agent's beats
    back would read as silence to its own fencing, which under NoOverlap stops a healthy job."""
    for proc in procs:
        if proc.pid in job and is_image_agent(proc):
            return (
                f"warning: the job runs its own vigil-agent too (pid {proc.pid}): both beat, at twice the cost; "
                "set heartbeat.agent: Image to run without this sidecar"
            )
    return None


def job_processes(procs: Iterable[Proc], own_pid: int) -> frozenset[int]:
    """The PIDs of the job's live processes: all of `procs` but the agent's own (`own_pid` and
    its descendants), the pod's infrastructure process and other injected agents."""
    procs = list(procs)
    children: dict[int, list[int]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc.pid)
    ours, todo = set(), [own_pid]
    while todo:
        pid = todo.pop()
        if pid not in ours:
            ours.add(pid)
            todo.extend(children.get(pid, ()))
    return frozenset(
        p.pid
        for p in procs
        if p.pid not in ours and p.state not in GONE_STATES and not is_infra(p) and not is_injected_agent(p)
    )


class JobState:
    """The job's life as the agent sees it, from one scan of /proc to the next; pure (times
    are a monotonic clock's, handed in)."""

    WAITING, RUNNING, ENDED, NEVER_STARTED = "waiting", "running", "ended", "never-started"

    def __init__(self, started_at: float, startup_grace: float):
        self.started_at, self.startup_grace = started_at, startup_grace
        self.first_seen_at: float | None = None

    def update(self, alive: bool, now: float) -> str:
        if alive:
            if self.first_seen_at is None:
                self.first_seen_at = now
            return self.RUNNING
        if self.first_seen_at is not None:
            return self.ENDED
        return self.NEVER_STARTED if now - self.started_at >= self.startup_grace else self.WAITING


def stale_for(now: float, first_seen_at: float | None, last_touch_at: float | None, timeout: float) -> float | None:
    """How long the job has gone without touching its liveness file or port, when that is at
    least `timeout` (the agent then holds its beats back); None while it is fresh. A job that
    has not touched yet is counted from its first process; before that, nothing is stale."""
    since = last_touch_at if last_touch_at is not None else first_seen_at
    if since is None:
        return None
    silent = now - since
    return silent if silent >= timeout else None


# --- the thin part: /proc, the file, the port, signals ----------------------------------------


def read_procs(root: Path = Path("/proc")) -> list[Proc]:
    """Every process of this PID namespace that can be read (one that exits meanwhile is left out)."""
    found = []
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # comm, in parentheses, may hold spaces and parentheses: the fields follow the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 2:
            continue
        found.append(
            Proc(int(entry.name), int(fields[1]), fields[0], tuple(a.decode(errors="replace") for a in argv if a))
        )
    return found


class Touches:
    """The job's last touch, on the monotonic clock: the liveness file's mtime (a wall time,
    converted by its age) and the last /beat on the liveness port, whichever is younger."""

    def __init__(
        self,
        path: str,
        port: int | None,
        clock: Callable[[], float] = CLOCK,
        wall: Callable[[], float] = time.time,  # only to age the file's mtime, itself a wall time
    ):
        self.path, self.clock, self.wall = Path(path) if path else None, clock, wall
        self.beat_at: float | None = None
        self.server: http.server.ThreadingHTTPServer | None = None
        if port is not None:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler())
            self.server.daemon_threads = True
            threading.Thread(target=self.server.serve_forever, name="vigil-liveness", daemon=True).start()

    @property
    def watched(self) -> bool:
        return self.path is not None or self.server is not None

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        touches = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _touch(self) -> None:
                if self.path.split("?", 1)[0] != "/beat":
                    self.send_error(404, "only /beat")
                    return
                touches.beat_at = touches.clock()
                self.send_response(204)
                self.end_headers()

            do_GET = do_POST = _touch

            def log_message(self, format: str, *args: object) -> None:  # one line per beat would flood
                pass

        return Handler

    def last_at(self) -> float | None:
        now, last = self.clock(), self.beat_at
        if self.path is not None:
            try:
                age = max(0.0, self.wall() - self.path.stat().st_mtime)
            except OSError:
                age = None  # not touched yet
            if age is not None and (last is None or now - age > last):
                last = now - age
        return last

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class JobProcesses:
    """The job's processes in the pod, as `supervise` watches a child: `wait()` returns once
    they have all gone (0), or `release()` was called (0), or none appeared within the startup
    grace (EXIT_USAGE); `signal()` sends a signal to every one of them."""

    def __init__(
        self,
        startup_grace: float,
        scan: Callable[[], list[Proc]] = read_procs,
        own_pid: int | None = None,
        clock: Callable[[], float] = CLOCK,
        poll: float = POLL_SECONDS,
    ):
        self.scan, self.own_pid, self.clock, self.poll = scan, own_pid or os.getpid(), clock, poll
        self.state = JobState(clock(), startup_grace)
        self.released = threading.Event()
        self.refused = False  # a signal was refused (EPERM): logged once
        self.warned = False  # image_agent_warning: told once

    def pids(self) -> frozenset[int]:
        procs = self.scan()
        pids = job_processes(procs, self.own_pid)
        if not self.warned and (warning := image_agent_warning(procs, pids)):
            log(warning)
            self.warned = True
        return pids

    def wait(self) -> int:
        while not self.released.is_set():
            state = self.state.update(bool(self.pids()), self.clock())
            if state == JobState.ENDED:
                log("the job's processes have all exited: the job ended")
                return 0
            if state == JobState.NEVER_STARTED:
                log(
                    f"error: no process of the job appeared within {self.state.startup_grace:g}s: does the pod "
                    "have shareProcessNamespace: true?"
                )
                return EXIT_USAGE
            self.released.wait(self.poll)
        return 0

    def release(self) -> None:
        """The pod is stopping (SIGTERM from the kubelet): stop watching, as if the job ended."""
        self.released.set()

    def signal(self, signum: int) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
            except PermissionError:
                if not self.refused:
                    log(
                        f"error: cannot signal the job's process {pid}: the agent needs the job's UID or "
                        "CAP_KILL (docs/heartbeats.md, 'The injected agent')"
                    )
                    self.refused = True


# --- main -------------------------------------------------------------------------------------------


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must not be negative")
    return value


def _port(env: Mapping[str, str]) -> int | None:
    raw = env.get("VIGIL_LIVENESS_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ConfigError(f"VIGIL_LIVENESS_PORT={raw!r} must be a port number (1-65535)")
    return int(raw)


def run_sidecar(env: dict[str, str]) -> int:
    try:
        settings = Settings.from_env(env)
        grace = _seconds(env, "VIGIL_STARTUP_GRACE", 120.0)
        touches = Touches(env.get("VIGIL_LIVENESS_FILE", "").strip(), _port(env))
        pod = PodHeartbeat(settings, request_timeout(settings.timeout))
    except (ConfigError, OSError) as err:  # OSError: the liveness port is taken
        log(f"error: {err}")
        return EXIT_USAGE
    leader = leader_channel(settings)
    job = JobProcesses(grace)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: job.release())

    def gate() -> str | None:
        if not touches.watched:
            return None
        silent = stale_for(CLOCK(), job.state.first_seen_at, touches.last_at(), settings.timeout)
        return None if silent is None else f"the job has not touched its liveness file or port for {silent:.0f}s"

    events: queue.Queue = queue.Queue()
    checkpoint = env.get(ENV_CHECKPOINT_FILE, "").strip()
    heart = Heart(settings, pod, Path(checkpoint) if checkpoint else None, events, leader, gate=gate)
    log(f"beating for pod {settings.namespace}/{settings.pod_name} while the job's processes run")
    try:
        return supervise(settings, job, heart, events)
    finally:
        touches.close()
        if heart.ident is not None:
            heart.join(timeout=1.0)
        if not heart.is_alive():
            pod.close()
            if leader is not None:
                leader.close()


def main(args: list[str]) -> int:
    if args:
        log(f"error: --sidecar takes no command (got {' '.join(args)!r}): it watches the pod's processes")
        return EXIT_USAGE
    return run_sidecar(dict(os.environ))
