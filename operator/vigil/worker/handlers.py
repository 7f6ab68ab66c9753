"""Tasks that are a function call: `vigil.worker.serve(handler)` runs the worker of
vigil.worker.runner with `handler(task)` in place of a child process, in a pool of `slots`
threads.

    import vigil.worker

    def handle(task: vigil.worker.Task) -> None:
        start = task.previous_checkpoint or 0
        for row in range(start, 1000):
            if task.cancelled.is_set():
                raise vigil.worker.TaskFailed(143, "cancelled")
            ...  # the work on task.item, row by row
            task.checkpoint(row + 1)

    vigil.worker.serve(handle)

A return is exit code 0; `raise TaskFailed(code, message)` is that code; any other exception is 1
with its message. A function call cannot be killed: cancelling it (the leader's cancel, the
worker's self-fencing, its SIGTERM's grace run out) sets `task.cancelled`, and the handler is
expected to return soon after.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vigil.agent import encode_checkpoint
from vigil.worker.client import Settings
from vigil.worker.runner import DEFAULT_GRACE_SECONDS, OnCheckpoint, OnExit, Worker, on_signals, setup_logging
from vigil.worker.state import Grant, Lease, lease_text

log = logging.getLogger("vigil.worker")


class TaskFailed(Exception):
    """Raised by a handler: the task failed with `exit_code` (a non-retryable exit code of the
    job's spec.retry works as for a process's) and `message`."""

    def __init__(self, exit_code: int, message: str = "") -> None:
        super().__init__(message)
        self.exit_code, self.message = int(exit_code), message


def _json_or_text(raw: str | None) -> Any:
    if raw is None or not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _int_or_none(raw: str | None) -> int | None:
    return int(raw) if raw is not None and raw.strip().isdigit() else None


@dataclass
class Task:
    """One claimed task, as the handler sees it."""

    lease: Lease
    job: str
    namespace: str
    index: int
    count: int | None
    item: Any  # VIGIL_TASK_ITEM, decoded when it is JSON, else the string; None without one
    attempt: int
    idempotency_key: str
    previous_checkpoint: Any  # the last checkpoint an earlier attempt recorded (decoded JSON), or None
    env: Mapping[str, str]  # the lease's env, as a process would get it
    cancelled: threading.Event = field(default_factory=threading.Event)
    _report: OnCheckpoint = field(default=lambda lease, value: None, repr=False)

    @classmethod
    def from_grant(cls, grant: Grant, report: OnCheckpoint) -> Task:
        env = grant.env
        return cls(
            lease=grant.lease,
            job=grant.job or env.get("VIGIL_JOB", ""),
            namespace=grant.namespace,
            index=grant.index,
            count=_int_or_none(env.get("VIGIL_TASK_COUNT")),
            item=_json_or_text(env.get("VIGIL_TASK_ITEM")),
            attempt=grant.attempt,
            idempotency_key=env.get("VIGIL_IDEMPOTENCY_KEY", ""),
            previous_checkpoint=_json_or_text(env.get("VIGIL_CHECKPOINT")),
            env=dict(env),
            _report=report,
        )

    def checkpoint(self, value: Any) -> None:
        """Records `value` (JSON, at most 2 KiB compact) as this attempt's progress: sent to the
        leader with the worker's next request; the next attempt gets it as `previous_checkpoint`.
        Raises vigil.agent.InvalidCheckpoint or CheckpointTooLarge, keeping the last one."""
        self._report(self.lease, encode_checkpoint(value))


Handler = Callable[[Task], Any]


def outcome(handler: Handler, task: Task) -> tuple[int, str]:
    """The exit code and message of one call."""
    try:
        handler(task)
    except TaskFailed as err:
        return err.exit_code, err.message
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
        return code, "" if isinstance(err.code, int | None) else str(err.code)
    except BaseException as err:  # KeyboardInterrupt too: the task's end is reported, the thread lives on
        log.exception("task %s: the handler raised %s", lease_text(task.lease), type(err).__name__)
        return 1, f"{type(err).__name__}: {err}"
    return 0, ""


class HandlerRunner:
    """Runs `handler` for each task on one of `slots` threads (daemon threads: a handler that
    never returns does not keep the process from exiting once the worker is done)."""

    def __init__(self, handler: Handler, slots: int) -> None:
        self.handler = handler
        self.todo: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self.tasks: dict[Lease, Task] = {}
        self.lock = threading.Lock()
        self.on_exit: OnExit = lambda lease, code, message: None
        self.on_checkpoint: OnCheckpoint = lambda lease, value: None
        for n in range(slots):
            threading.Thread(target=self._serve, name=f"vigil-worker-task-{n}", daemon=True).start()

    def bind(self, on_exit: OnExit, on_checkpoint: OnCheckpoint) -> None:
        self.on_exit, self.on_checkpoint = on_exit, on_checkpoint

    def _serve(self) -> None:
        while True:
            task = self.todo.get()
            code, message = outcome(self.handler, task)
            self.on_exit(task.lease, code, message)

    def start(self, grant: Grant) -> None:
        task = Task.from_grant(grant, lambda lease, value: self.on_checkpoint(lease, value))
        with self.lock:
            self.tasks[grant.lease] = task
        self.todo.put(task)

    def stop(self, lease: Lease) -> None:
        with self.lock:
            task = self.tasks.get(lease)
        if task is not None:
            task.cancelled.set()

    def kill(self, lease: Lease) -> bool:
        return False

    def checkpoints(self) -> list[tuple[Lease, str]]:
        return []  # each comes as the handler records it

    def ended(self, lease: Lease) -> str | None:
        with self.lock:
            self.tasks.pop(lease, None)
        return None

    def close(self) -> None:
        pass


def serve(handler: Handler, *, slots: int | None = None, grace: float = DEFAULT_GRACE_SECONDS) -> None:
    """Runs this process as a worker of its VigilWorkerPool, with `handler(task)` for every task it
    claims, `slots` at once (default: VIGIL_POOL_SLOTS), until SIGTERM or SIGINT: then it claims no
    more, lets the calls run up to `grace` seconds, cancels those left, reports, and returns.
    Raises vigil.worker.ConfigError when the pool's env is missing."""
    setup_logging()
    settings = Settings.from_env(os.environ, slots)
    worker = Worker(settings, HandlerRunner(handler, settings.slots), grace=grace)
    on_signals(worker)
    worker.run()
