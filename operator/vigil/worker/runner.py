"""`vigil-worker [--slots N] [--grace S] -- CMD ARGS...`: a worker of a VigilWorkerPool.

The worker claims tasks from the leading operator over the pull protocol (docs/pull.md) and runs
CMD once per claimed task, as a child process, up to its slots at once. Each child gets the
worker's environment with the lease's env on top (VIGIL_TASK_INDEX, VIGIL_TASK_ITEM,
VIGIL_IDEMPOTENCY_KEY, VIGIL_ATTEMPT, VIGIL_CHECKPOINT, ...) and VIGIL_CHECKPOINT_FILE: a file of
its own whose content, when it changes (valid JSON of at most 2 KiB, as `vigil.agent.checkpoint()`
writes it), is sent as the task's checkpoint. Its exit code is the task's result (killed by
signal N: 128 + N).

Two requests go side by side, each on its own connection: a long poll claiming tasks while a
slot is free, and the beats, every `beatSeconds` and at once when a task ends (its result is
reported within a moment of its end, and sent again with every request until acknowledged). A
503's Retry-After is honoured, but never past the point where the worker would fence itself.

With no 200 for `leaseSeconds`, the worker stops every task it runs (SIGTERM, then SIGKILL after
the lease's graceSeconds) and forgets their leases: the leader has declared them Lost. A task the
leader cancels is stopped so too, and its exit code reported.

On SIGTERM (or SIGINT) the worker stops claiming, lets its tasks run up to --grace seconds
(default 30), then stops them, reports their results, and exits 0. Give the pod a
terminationGracePeriodSeconds longer than the grace plus the tasks' graceSeconds.

Environment (set by the pool, docs/pull.md): VIGIL_PULL_URL, VIGIL_PULL_CA, VIGIL_PULL_TOKEN_FILE,
VIGIL_POD_NAME, VIGIL_POD_NAMESPACE, VIGIL_POD_UID, VIGIL_POOL_SLOTS (--slots overrides it).

Exit status: 0 after a SIGTERM's drain; 2 for a usage or configuration error.

The pure bookkeeping is vigil.worker.state; this module is the thin part: threads, sockets,
processes. Tasks that are a function call: vigil.worker.serve (vigil.worker.handlers).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from vigil.agent import CheckpointTooLarge, InvalidCheckpoint, validate_checkpoint
from vigil.agent.heart import exit_status
from vigil.agent.runner import Child, _die_with_parent
from vigil.api import ENV_CHECKPOINT_FILE
from vigil.core.fencing import request_timeout, retry_delay
from vigil.worker.client import ConfigError, PullClient, PullFailed, Settings
from vigil.worker.state import MAX_WAIT_SECONDS, Forget, Grant, Lease, Start, Stop, Verdict, WorkerState, lease_text

log = logging.getLogger("vigil.worker")

EXIT_USAGE = 2
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127
DEFAULT_GRACE_SECONDS = 30.0  # --grace: how long running tasks may finish after the worker's SIGTERM
CHECKPOINT_POLL_SECONDS = 1.0  # how often the tasks' checkpoint files are read
FINAL_REPORT_SECONDS = 10.0  # after a drain, how long the worker waits for its last results' acks
MIN_CLAIM_GAP_SECONDS = 1.0  # a claim answered empty sooner than this is not sent again before it
LOOP_SECONDS = 1.0  # the main loop looks at its clocks at least this often

OnExit = Callable[[Lease, int, str], None]
OnCheckpoint = Callable[[Lease, str], None]


class StartFailed(Exception):
    """A task could not be started: `exit_code` is its result (126, 127), the message says why."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TaskRunner(Protocol):
    """How the worker's tasks run: a child process each (`ProcessRunner`) or a function call
    (vigil.worker.handlers.HandlerRunner)."""

    def bind(self, on_exit: OnExit, on_checkpoint: OnCheckpoint) -> None:
        """Called once before any start: how the runner reports a task's end (from any thread)."""
        ...

    def start(self, grant: Grant) -> None:
        """Starts the task, or raises StartFailed."""
        ...

    def stop(self, lease: Lease) -> None:
        """Asks the task to stop (SIGTERM; a function call's `cancelled`)."""
        ...

    def kill(self, lease: Lease) -> bool:
        """Ends the task at once (SIGKILL); False when that cannot be done."""
        ...

    def checkpoints(self) -> list[tuple[Lease, str]]:
        """Checkpoints that changed since last asked (the files' contents)."""
        ...

    def ended(self, lease: Lease) -> str | None:
        """The task has ended: its last checkpoint if not yet given, and its leftovers cleaned."""
        ...

    def close(self) -> None: ...


# --- tasks as child processes --------------------------------------------------------------------


class TaskProcess(Child):
    """A task's process (vigil.agent.runner.Child's signalling): in a process group of its own, so
    SIGTERM and SIGKILL reach what it starts too, with no stdin (tasks run side by side), and
    SIGKILLed if the worker dies."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:  # not Child's: no terminal, no stdin
        self.group = True
        self.proc = subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            process_group=0,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


class ProcessRunner:
    """Runs `argv` once per task, with the worker's `env` and the lease's over it, and a
    checkpoint file of its own in `workdir`."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], workdir: Path) -> None:
        self.argv, self.env, self.workdir = list(argv), env, workdir
        self.procs: dict[Lease, TaskProcess] = {}
        self.files: dict[Lease, Path] = {}
        self.read: dict[Lease, bytes] = {}  # the last content given (or refused) per task
        self.lock = threading.Lock()
        self.numbers = 0
        self.on_exit: OnExit = lambda lease, code, message: None

    def bind(self, on_exit: OnExit, on_checkpoint: OnCheckpoint) -> None:
        self.on_exit = on_exit

    def start(self, grant: Grant) -> None:
        self.numbers += 1
        path = self.workdir / f"task-{self.numbers}.checkpoint"
        env = {**self.env, **grant.env, ENV_CHECKPOINT_FILE: str(path)}
        try:
            proc = TaskProcess(self.argv, env)
        except FileNotFoundError:
            raise StartFailed(EXIT_NOT_FOUND, f"command not found: {self.argv[0]}") from None
        except PermissionError:
            raise StartFailed(EXIT_CANNOT_RUN, f"cannot run {self.argv[0]}: permission denied") from None
        except OSError as err:
            raise StartFailed(EXIT_CANNOT_RUN, f"cannot run {self.argv[0]}: {err.strerror or err}") from None
        with self.lock:
            self.procs[grant.lease] = proc
            self.files[grant.lease] = path
        threading.Thread(target=self._wait, args=(grant.lease, proc), name="vigil-task", daemon=True).start()

    def _wait(self, lease: Lease, proc: TaskProcess) -> None:
        code = proc.wait()
        message = ""
        if code < 0:
            with contextlib.suppress(ValueError):
                message = f"killed by {signal.Signals(-code).name}"
            message = message or f"killed by signal {-code}"
        elif code:
            message = f"exit code {code}"
        self.on_exit(lease, exit_status(code), message)

    def stop(self, lease: Lease) -> None:
        with self.lock:
            proc = self.procs.get(lease)
        if proc is not None:
            proc.signal(signal.SIGTERM)

    def kill(self, lease: Lease) -> bool:
        with self.lock:
            proc = self.procs.get(lease)
        if proc is not None:
            proc.signal(signal.SIGKILL)
        return True

    def _changed(self, lease: Lease, path: Path) -> str | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("cannot read the checkpoint file of task %s: %s", lease_text(lease), err)
            return None
        if raw == self.read.get(lease):
            return None
        self.read[lease] = raw
        try:
            return validate_checkpoint(raw)
        except (CheckpointTooLarge, InvalidCheckpoint) as err:
            log.warning("checkpoint of task %s not sent: %s", lease_text(lease), err)
            return None

    def checkpoints(self) -> list[tuple[Lease, str]]:
        with self.lock:
            files = list(self.files.items())
        changed = [(lease, self._changed(lease, path)) for lease, path in files]
        return [(lease, value) for lease, value in changed if value is not None]

    def ended(self, lease: Lease) -> str | None:
        with self.lock:
            self.procs.pop(lease, None)
            path = self.files.pop(lease, None)
        if path is None:
            return None
        value = self._changed(lease, path)
        self.read.pop(lease, None)
        with contextlib.suppress(OSError):
            path.unlink()
        return value

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


# --- the worker ----------------------------------------------------------------------------------------


class Worker:
    """Claims, runs and reports tasks with `runner` until drained (`drain`, or SIGTERM from
    `main`), on the pure bookkeeping of vigil.worker.state: the main thread owns the tasks, and
    two threads post requests, the long poll claiming tasks and the beats."""

    def __init__(
        self,
        settings: Settings,
        runner: TaskRunner,
        *,
        grace: float = DEFAULT_GRACE_SECONDS,
        wait_seconds: float = MAX_WAIT_SECONDS,
        client: PullClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.runner, self.grace, self.clock = settings, runner, grace, clock
        self.wait_seconds = wait_seconds
        self.client = client if client is not None else PullClient(settings)
        self.state = WorkerState(pod=settings.pod, boot=secrets.token_hex(8), slots=settings.slots)
        self.lock = threading.Lock()  # the state's: every thread goes through it
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # put is reentrant: a signal handler may call drain
        self.halt = threading.Event()
        self.wake_beat = threading.Event()
        self.wake_claim = threading.Event()
        self.kill_at: dict[Lease, float] = {}
        self.started_at: dict[Lease, float] = {}
        self.unkillable: set[Lease] = set()
        self.drain_deadline: float | None = None
        self.report_deadline: float | None = None
        self.failing = 0  # requests failed in a row (logged at the first and every tenth)
        self.runner.bind(self._exited, self._checkpointed)

    # --- from other threads -----------------------------------------------------------------

    def drain(self) -> None:
        """Stops claiming; tasks run on up to the grace, then are stopped; `run` then returns.
        Safe from a signal handler."""
        self.events.put(("drain",))

    def _exited(self, lease: Lease, code: int, message: str) -> None:
        self.events.put(("exited", lease, code, message))

    def _checkpointed(self, lease: Lease, value: str) -> None:
        self.events.put(("checkpoint", lease, value))

    # --- the main loop ----------------------------------------------------------------------------

    def run(self) -> int:
        threads = [
            threading.Thread(target=self._guarded(self._beat_loop), name="vigil-worker-beat", daemon=True),
            threading.Thread(target=self._guarded(self._claim_loop), name="vigil-worker-claim", daemon=True),
        ]
        log.info(
            "worker of pool %s started: pod %s/%s, %d slot(s), leader at %s",
            self.settings.pool or "?",
            self.settings.namespace,
            self.settings.pod_name,
            self.settings.slots,
            self.settings.url,
        )
        for thread in threads:
            thread.start()
        next_poll = self.clock() + CHECKPOINT_POLL_SECONDS
        try:
            while True:
                now = self.clock()
                try:
                    event = self.events.get(timeout=max(0.0, self._next_wake(now, next_poll) - now))
                except queue.Empty:
                    event = None
                while event is not None:
                    self._handle(event)
                    try:
                        event = self.events.get_nowait()
                    except queue.Empty:
                        event = None
                now = self.clock()
                if now >= next_poll:
                    next_poll = now + CHECKPOINT_POLL_SECONDS
                    for lease, value in self.runner.checkpoints():
                        with self.lock:
                            self.state.checkpoint(lease, value)
                with self.lock:
                    actions = self.state.tick(now)
                self._carry_out(actions)
                self._kill_overdue(now)
                if self._done(now):
                    return 0
        finally:
            self.halt.set()
            self.wake_beat.set()
            self.wake_claim.set()
            self.client.close()
            self.runner.close()

    def _next_wake(self, now: float, next_poll: float) -> float:
        times = [now + LOOP_SECONDS, next_poll, *self.kill_at.values()]
        with self.lock:
            fence = self.state.fence_deadline()
        times += [t for t in (fence, self.drain_deadline, self.report_deadline) if t is not None]
        return min(times)

    def _handle(self, event: tuple) -> None:
        kind = event[0]
        if kind == "actions":
            self._carry_out(event[1])
        elif kind == "exited":
            _, lease, code, message = event
            self._ended(lease, code, message)
        elif kind == "checkpoint":
            _, lease, value = event
            with self.lock:
                self.state.checkpoint(lease, value)
        elif kind == "drain" and self.drain_deadline is None:
            with self.lock:
                self.state.drain()
                running = len(self.state.held())
            self.drain_deadline = self.clock() + self.grace
            log.info("stopping: no more claims; %d task(s) may run for %gs more", running, self.grace)
            self.wake_claim.set()

    def _carry_out(self, actions: Sequence[Start | Stop | Forget]) -> None:
        for action in actions:
            if isinstance(action, Start):
                self._start(action.grant)
            elif isinstance(action, Stop):
                self._stop(action.lease, action.grace_seconds, action.reason)
            else:
                log.info("lease %s forgotten: %s", lease_text(action.lease), action.reason)

    def _start(self, grant: Grant) -> None:
        lease = grant.lease
        with self.lock:
            if not self.state.runs(lease):  # fenced before it could start: never run
                self.state.finished(lease, 0)
                return
        self.started_at[lease] = self.clock()
        log.info("task started: %s/%s index %d attempt %d (%s)", grant.namespace, grant.job, grant.index,
                 grant.attempt, lease_text(lease))  # fmt: skip
        try:
            self.runner.start(grant)
        except StartFailed as err:
            log.error("task %s not started: %s", lease_text(lease), err)
            self._ended(lease, err.exit_code, str(err))
        except Exception as err:
            log.exception("task %s not started", lease_text(lease))
            self._ended(lease, EXIT_CANNOT_RUN, f"not started: {type(err).__name__}: {err}")

    def _stop(self, lease: Lease, grace: float, reason: str) -> None:
        if lease in self.kill_at or lease not in self.started_at:
            return
        log.info("stopping task %s (%s): SIGTERM now, SIGKILL after %gs", lease_text(lease), reason, grace)
        self.kill_at[lease] = self.clock() + grace
        self.runner.stop(lease)

    def _kill_overdue(self, now: float) -> None:
        for lease, at in list(self.kill_at.items()):
            if now >= at:
                del self.kill_at[lease]
                if self.runner.kill(lease):
                    log.warning("task %s did not stop within its grace: SIGKILL", lease_text(lease))
                else:
                    self.unkillable.add(lease)
                    log.warning("task %s did not stop within its grace, and a function call cannot be killed",
                                lease_text(lease))  # fmt: skip

    def _ended(self, lease: Lease, code: int, message: str) -> None:
        value = self.runner.ended(lease)
        with self.lock:
            grant = self.state.grant(lease)
            if value is not None:
                self.state.checkpoint(lease, value)
            report = self.state.finished(lease, code, message)
        self.kill_at.pop(lease, None)
        self.unkillable.discard(lease)
        began = self.started_at.pop(lease, None)
        took = f" after {self.clock() - began:.1f}s" if began is not None else ""
        about = f"{grant.namespace}/{grant.job} index {grant.index} attempt {grant.attempt} " if grant else ""
        log.info("task ended: %s(%s) exit code %d%s%s", about, lease_text(lease), code, took,
                 "" if report else ", not reported (its lease was given up)")  # fmt: skip
        self.wake_beat.set()
        self.wake_claim.set()

    def _done(self, now: float) -> bool:
        if self.drain_deadline is None:
            return False
        with self.lock:
            held = [(lease, self.state.grant(lease)) for lease in self.state.held()]
            live = set(self.state.tasks)
        if now >= self.drain_deadline:
            for lease, grant in held:
                self._stop(lease, grant.grace_seconds if grant else 0.0, "the worker is stopping")
        if live - self.unkillable:
            return False
        if self.report_deadline is None:
            self.report_deadline = now + FINAL_REPORT_SECONDS
            self.wake_beat.set()
        with self.lock:
            left = len(self.state.results)
        if left and now < self.report_deadline:
            return False
        if left:
            log.warning("exiting with %d result(s) not acknowledged by the leader", left)
        log.info("stopped")
        return True

    # --- the requests -----------------------------------------------------------------------------

    def _exchange(self, *, claim: bool) -> tuple[Verdict, int]:
        """One request and its answer taken; the verdict, and how many leases it granted."""
        with self.lock:
            out = self.state.request(self.clock(), claim=claim, wait_seconds=self.wait_seconds)
            timeout = request_timeout(self.state.lease_seconds) + out.wait_seconds
        try:
            reply = self.client.post(out.body, timeout)
        except Exception as err:  # a bug too: the request must leave the flight, or `seen` would stall
            if not isinstance(err, PullFailed):
                log.exception("request %d failed unexpectedly", out.seq)
            with self.lock:
                verdict = self.state.failed(out.seq, self.clock(), str(err) or type(err).__name__)
        else:
            with self.lock:
                verdict = self.state.answered(
                    out.seq, reply.status, reply.body, self.clock(), retry_after=reply.retry_after
                )
            if not verdict.ok and reply.status != 200:
                verdict = Verdict(False, verdict.actions, reply.why(), verdict.rest_seconds)
        if verdict.actions:
            self.events.put(("actions", verdict.actions))
        if verdict.ok:
            if self.failing:
                log.info("the leader answers again after %d failed request(s)", self.failing)
            self.failing = 0
        else:
            self.failing += 1
            if self.failing == 1 or self.failing % 10 == 0:
                rest = f"; asked to come back in {verdict.rest_seconds:g}s" if verdict.rest_seconds else ""
                log.warning("request %d to the leader failed (%d in a row): %s%s", out.seq, self.failing,
                            verdict.why, rest)  # fmt: skip
        return verdict, sum(isinstance(a, Start) for a in verdict.actions)

    def _retry_delay(self, failures: int) -> float:
        with self.lock:
            beat, lease = self.state.beat_seconds, self.state.lease_seconds
        return retry_delay(failures, beat, lease, random.random())

    def _guarded(self, loop: Callable[[], None]) -> Callable[[], None]:
        """`loop`, started again after a delay if a bug ends it: a thread that died would leave the
        worker silent, and its tasks fenced for nothing."""

        def run() -> None:
            while not self.halt.is_set():
                try:
                    loop()
                    return
                except Exception:
                    log.exception("the %s failed unexpectedly: starting it again", loop.__name__.strip("_"))
                    self.halt.wait(LOOP_SECONDS)

        return run

    def _beat_loop(self) -> None:
        failures, retry_at = 0, -1.0
        while not self.halt.is_set():
            self.wake_beat.clear()
            now = self.clock()
            with self.lock:
                due = self.state.beat_due_at()
                if self.state.has_unsent_results() or (self.report_deadline is not None and self.state.results):
                    due = min(due, max(now, self.state.rest_until))
            due = max(due, retry_at)
            if now < due:
                self.wake_beat.wait(min(due - now, LOOP_SECONDS))
                continue
            verdict, _ = self._exchange(claim=False)
            failures = 0 if verdict.ok else failures + 1
            retry_at = -1.0 if verdict.ok else self.clock() + self._retry_delay(failures)
            if verdict.ok and self.report_deadline is not None:
                retry_at = self.clock() + min(0.5, self.state.beat_seconds)  # the drain's last reports

    def _claim_loop(self) -> None:
        failures, retry_at = 0, -1.0
        while not self.halt.is_set():
            self.wake_claim.clear()
            now = self.clock()
            with self.lock:
                if self.state.draining:
                    return
                free, rest = self.state.free, self.state.rest_until
            due = max(retry_at, rest)
            if not free or now < due:
                self.wake_claim.wait(LOOP_SECONDS if not free else min(due - now, LOOP_SECONDS))
                continue
            began = now
            verdict, granted = self._exchange(claim=True)
            failures = 0 if verdict.ok else failures + 1
            if not verdict.ok:
                retry_at = self.clock() + self._retry_delay(failures)
            elif not granted and self.clock() - began < MIN_CLAIM_GAP_SECONDS:
                retry_at = began + MIN_CLAIM_GAP_SECONDS  # answered empty at once: no busy loop
            else:
                retry_at = -1.0


# --- main ------------------------------------------------------------------------------------------------


def setup_logging() -> None:
    """One line a message on stderr, unless the program set up logging itself."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s vigil-worker %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def on_signals(worker: Worker) -> None:
    """SIGTERM and SIGINT drain the worker (from the main thread only)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda _signum, _frame: worker.drain())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vigil-worker",
        usage="vigil-worker [--slots N] [--grace SECONDS] -- CMD [ARGS...]",
        description="Claims tasks of a VigilWorkerPool and runs CMD once per task (docs/pull.md, 'The worker').",
    )
    p.add_argument("--slots", type=int, help="tasks run at once (default: $VIGIL_POOL_SLOTS)")
    p.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        help=f"after SIGTERM, seconds the tasks may run before they are stopped (default {DEFAULT_GRACE_SECONDS:g})",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command run once per task")
    return p


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        at = args.index("--")
        opts, cmd = args[:at], args[at + 1 :]
    else:
        opts, cmd = args, []
    p = parser()
    try:
        parsed = p.parse_args(opts)
    except SystemExit as exit:
        return int(exit.code or 0)
    cmd = cmd or [a for a in parsed.cmd if a != "--"]
    if not cmd:
        p.print_usage(sys.stderr)
        print("vigil-worker: error: no command to run (give it after --)", file=sys.stderr)
        return EXIT_USAGE
    if parsed.grace < 0:
        print("vigil-worker: error: --grace must be at least 0", file=sys.stderr)
        return EXIT_USAGE
    setup_logging()
    env = dict(os.environ)
    try:
        settings = Settings.from_env(env, parsed.slots)
        client = PullClient(settings)
    except ConfigError as err:
        log.error("%s", err)
        return EXIT_USAGE
    workdir = Path(tempfile.mkdtemp(prefix="vigil-worker-"))  # private (0700): the tasks' checkpoint files
    worker = Worker(settings, ProcessRunner(cmd, env, workdir), grace=parsed.grace, client=client)
    on_signals(worker)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
