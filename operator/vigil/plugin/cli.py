"""`kubectl vigil COMMAND`: the thin part of the plugin. Each command reads through `Api` (the
one client, `vigil.kube.client.ApiClient`), asks `report` what it means, and returns its exit
code and what to print (`render`); writes are few: a redrive's annotation, paced by a token bucket
on the one clock, and a queue's `spec.paused`.

Exit codes: 0 done; 1 what was asked is not there or was refused (a job or queue not found, an
attempt's pod gone, its log unavailable, a redrive refused, a request forbidden); 2 nothing could
be asked (bad usage, no usable kubeconfig, the API server unreachable or refusing the credentials).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from vigil.api import (
    GROUP,
    LABEL_ATTEMPT,
    LABEL_DEAD_LETTER,
    LABEL_DEAD_TASKS,
    LABEL_JOB_UID,
    PLURAL,
    POOL_PLURAL,
    QUEUE_PLURAL,
    VERSION,
)
from vigil.core import fields
from vigil.core.manifest import DEFAULT_CONTAINER  # the annotation kubectl logs reads
from vigil.core.ratelimit import TokenBucket
from vigil.kube.client import MERGE_PATCH, ApiClient, resource_path, user_agent
from vigil.kube.errors import ApiError, Conflict, NotFound, Refused, Unauthorized, Unreachable, from_status
from vigil.plugin import completion, render, report
from vigil.plugin.args import MAX_RATE, parser
from vigil.runtime.clock import SYSTEM, Clock

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_ASK = 0, 1, 2


class Failed(Exception):
    """The command cannot do what was asked: `code` and a message saying what to fix."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class Api:
    """The plugin's reads and writes of VigilJobs, VigilQueues and pods, and its reads of
    VigilWorkerPools, through the one client."""

    def __init__(self, http: ApiClient) -> None:
        self.http = http

    async def _get(self, path: str) -> dict | None:
        try:
            return await self.http.request("GET", path)
        except NotFound:
            return None

    async def job(self, namespace: str, name: str) -> dict | None:
        return await self._get(f"{resource_path(GROUP, VERSION, PLURAL, namespace)}/{name}")

    async def jobs(
        self, namespace: str | None, selector: str, keep: Callable[[dict], bool] | None = None
    ) -> list[dict]:
        """The jobs the label selector picks; with `keep`, only those it keeps, each dropped as
        its page arrives (a namespace's jobs are never all held at once)."""
        items, _ = await self.http.list_all(
            resource_path(GROUP, VERSION, PLURAL, namespace),
            {"labelSelector": selector},
            keep=None if keep is None else (lambda item: item if keep(item) else None),
        )
        return items

    async def queue(self, namespace: str, name: str) -> dict | None:
        return await self._get(f"{resource_path(GROUP, VERSION, QUEUE_PLURAL, namespace)}/{name}")

    async def queues(self, namespace: str | None) -> list[dict]:
        items, _ = await self.http.list_all(resource_path(GROUP, VERSION, QUEUE_PLURAL, namespace), {})
        return items

    async def pools(self, namespace: str | None) -> list[dict]:
        items, _ = await self.http.list_all(resource_path(GROUP, VERSION, POOL_PLURAL, namespace), {})
        return items

    async def patch_job(self, namespace: str, name: str, patch: dict) -> dict:
        path = f"{resource_path(GROUP, VERSION, PLURAL, namespace)}/{name}"
        return await self.http.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def patch_queue(self, namespace: str, name: str, patch: dict) -> dict:
        path = f"{resource_path(GROUP, VERSION, QUEUE_PLURAL, namespace)}/{name}"
        return await self.http.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def pods(self, namespace: str, selector: str) -> list[dict]:
        items, _ = await self.http.list_all(resource_path("", "v1", "pods", namespace), {"labelSelector": selector})
        return items

    async def pod(self, namespace: str, name: str) -> dict | None:
        return await self._get(f"{resource_path('', 'v1', 'pods', namespace)}/{name}")

    async def log(self, namespace: str, pod: str, container: str | None, tail: int | None) -> bytes:
        params = _log_params(container, tail)
        path = f"{resource_path('', 'v1', 'pods', namespace)}/{pod}/log"
        return await self.http.request("GET", path, params=params, as_bytes=True)

    async def follow_log(
        self, namespace: str, pod: str, container: str | None, tail: int | None
    ) -> AsyncIterator[bytes]:
        """The log as `kubectl logs -f` streams it (`follow=true`): its bytes as they come, until
        the container ends (the kubelet then ends the answer). Opening it is bounded as any
        request; its reads are not: a quiet job may write nothing for hours."""
        url = f"{self.http.base}{resource_path('', 'v1', 'pods', namespace)}/{pod}/log"
        headers = {"Accept": "*/*", "User-Agent": self.http.user_agent, **self.http.credentials.auth_headers()}
        params = {**_log_params(container, tail), "follow": "true"}
        async with contextlib.AsyncExitStack() as stack:
            try:
                async with asyncio.timeout(self.http.connect_timeout + self.http.read_timeout):
                    # timeout=None: no per-read timeout on this one request (the client's is 20 s)
                    response = await stack.enter_async_context(
                        self.http.session.get(url, params=params, headers=headers, timeout=None)
                    )
                if response.status >= 400:
                    raise from_status(response.status, await response.read())
                while chunk := await response.content.readany():
                    yield chunk
            except ApiError:
                raise
            except Exception as err:  # the client's transport errors, whichever library raises them
                raise Unreachable(f"the log of pod {pod}: {type(err).__name__}: {err}") from err


def _log_params(container: str | None, tail: int | None) -> dict[str, str]:
    params = {"container": container} if container else {}
    if tail is not None:
        params["tailLines"] = str(tail)
    return params


def _not_found(kind: str, name: str, namespace: str) -> Failed:
    return Failed(EXIT_FAILED, f"{kind} {name} not found in namespace {namespace}")


async def _read_job(api: Api, namespace: str, name: str) -> dict:
    job = await api.job(namespace, name)
    if job is None:
        raise _not_found("vigiljob", name, namespace)
    return job


# --- the commands: each (exit code, what to print) -------------------------------------------


async def status(api: Api, namespace: str, args: argparse.Namespace, clock: Clock) -> tuple[int, str]:
    job = await _read_job(api, namespace, args.job)
    current = fields.status(job).get("currentAttempt") or {}
    pod = None
    if current.get("podName"):
        # The beats the agent sent are a detail: one who may not read pods sees the rest.
        with contextlib.suppress(Refused):
            pod = await api.pod(namespace, current["podName"])
    now = clock.wall()
    return EXIT_OK, render.job_status(report.job_status(job, now, pod), now, args.output)


async def dlq(api: Api, namespace: str | None, args: argparse.Namespace, clock: Clock) -> tuple[int, str]:
    # Two label-selected lists: the dead-lettered jobs, and the arrays with a dead-lettered task
    # (vigil.dev/dead-tasks, set whatever the array's phase); an array in both is shown once.
    found: dict[tuple[str, str], dict] = {}
    for label in (LABEL_DEAD_LETTER, LABEL_DEAD_TASKS):
        selector = ",".join(filter(None, [f"{label}=true", args.selector]))
        for job in await api.jobs(namespace, selector, keep=report.in_dead_letter_queue):
            found[(fields.namespace(job), fields.name(job))] = job
    jobs = list(found.values())
    rows = report.dead_letters(jobs, clock.wall())
    return EXIT_OK, render.dead_letters(rows, args.output, namespaces=namespace is None)


async def top(api: Api, namespace: str | None, args: argparse.Namespace, clock: Clock) -> tuple[int, str]:
    rows = report.queue_rows(await api.queues(namespace))
    # The worker pools beside the queues; a Vigil without them (the CRD not served: no pools to
    # show) or a user who may not list them still sees the queues.
    pools: list[dict[str, Any]] | None = None
    unread = None
    try:
        pools = report.pool_rows(await api.pools(namespace))
    except NotFound:
        pools = []
    except Refused as err:
        unread = f"{'forbidden' if err.status == 403 else 'refused'}: {err.message}"
    return EXIT_OK, render.top(rows, args.output, namespaces=namespace is None, pools=pools, pools_unread=unread)


async def redrive(api: Api, namespace: str, args: argparse.Namespace, clock: Clock) -> tuple[int, str]:
    if args.tasks is not None:
        return await redrive_tasks(api, namespace, args, clock)
    if args.all_dead_letters:
        selector = ",".join(filter(None, [f"{LABEL_DEAD_LETTER}=true", args.selector]))
        jobs = {fields.name(job): job for job in await api.jobs(namespace, selector)}
        listed = report.dead_letters(jobs.values(), clock.wall())  # the longest dead first
        requested: list[tuple[str, Mapping[str, Any] | None]] = [(row["name"], jobs[row["name"]]) for row in listed]
    else:
        requested = [(name, await api.job(namespace, name)) for name in args.jobs]
    steps = report.plan_redrive(requested, namespace, clock.wall(), args.max)
    done: dict[str, str] = {}
    code = EXIT_OK
    if not args.dry_run:
        code = await apply_redrive(api, steps, TokenBucket(args.rate, 1), clock, done)
    if any(step.value is None or done.get(step.name, "") for step in steps) and code == EXIT_OK:
        code = EXIT_FAILED
    return code, render.redrive(steps, done, args.output, args.dry_run)


async def apply_redrive(
    api: Api, steps: list[report.RedriveStep], bucket: TokenBucket, clock: Clock, done: dict[str, str]
) -> int:
    """Writes each planned redrive, no faster than `bucket` lets one go, recording in `done`
    "" or why it failed; stops at the first write that cannot reach the API server
    (EXIT_CANNOT_ASK: the rest are not reached), else EXIT_OK."""
    for step in steps:
        if step.value is None:
            continue
        await _paced(bucket, clock)
        try:
            done[step.name], code = await _write_redrive(api, step)
        except Conflict:
            done[step.name] = "the job changed since it was read (redriven by someone else?): run again"
            continue
        if code != EXIT_OK:
            return code
    return EXIT_OK


REDRIVE_TASKS_TRIES = 5  # an array's status changes twice a second: a conflict is read again, so often


async def redrive_tasks(api: Api, namespace: str, args: argparse.Namespace, clock: Clock) -> tuple[int, str]:
    """`redrive JOB --tasks RANGES`: the array read, the indexes checked against it, and the
    annotation written on the array as read; on a conflict (its status changes as its tasks
    run) read again, checked again and written again, up to REDRIVE_TASKS_TRIES writes, each
    paced as a bulk redrive's."""
    wanted = report.parse_tasks(args.tasks)
    name = args.jobs[0]
    bucket = TokenBucket(args.rate, 1)
    done: dict[str, str] = {}
    code = EXIT_OK
    for tries in range(1, REDRIVE_TASKS_TRIES + 1):
        step = report.plan_task_redrive(name, await api.job(namespace, name), namespace, wanted, clock.wall())
        if step.value is None or args.dry_run:
            break
        await _paced(bucket, clock)
        try:
            done[name], code = await _write_redrive(api, step)
            break
        except Conflict:
            done[name] = f"the job changed each time it was read ({tries} tries): run again"
    if (step.value is None or done.get(name, "")) and code == EXIT_OK:
        code = EXIT_FAILED
    return code, render.redrive([step], done, args.output, args.dry_run)


async def _paced(bucket: TokenBucket, clock: Clock) -> None:
    """Waits, on the clock, until the bucket lets the next redrive go."""
    while not bucket.take(clock.monotonic()):
        await clock.sleep(bucket.delay(clock.monotonic()))


async def _write_redrive(api: Api, step: report.RedriveStep) -> tuple[str, int]:
    """Writes one redrive's annotation: "" once written, else why not, with EXIT_CANNOT_ASK when
    the API server could not be reached (nothing more should be tried); Conflict is raised."""
    try:
        await api.patch_job(step.namespace, step.name, report.redrive_patch(step))
        return "", EXIT_OK
    except Conflict:
        raise
    except NotFound:
        return "the job was deleted since it was read", EXIT_OK
    except (Unreachable, Unauthorized) as err:
        return f"not written: {err}", EXIT_CANNOT_ASK
    except ApiError as err:
        return f"refused by the API server: {err}", EXIT_OK


async def pause(api: Api, namespace: str, args: argparse.Namespace, clock: Clock) -> tuple[int, str]:
    paused = args.command == "pause"
    queue = await api.queue(namespace, args.queue)
    if queue is None:
        raise _not_found("vigilqueue", args.queue, namespace)
    changed = bool(fields.spec(queue).get("paused", False)) != paused
    if changed:
        await api.patch_queue(namespace, args.queue, {"spec": {"paused": paused}})
    row = {"name": args.queue, "namespace": namespace, "paused": paused, "changed": changed}
    out = render.as_output(args.output)
    if out.kind == "name":
        return EXIT_OK, render.names([row], render.QUEUE_RESOURCE)
    if not out.tabular:
        return EXIT_OK, render.dump(render.with_metadata(row), out)
    what = "paused: no new attempt starts, running ones finish" if paused else "resumed: attempts start again"
    return EXIT_OK, f"vigilqueue {namespace}/{args.queue} {what}" + ("" if changed else " (it already was)")


class Out:
    """Where `logs` writes as it goes: the log's bytes (stdout, flushed at once, so that `-f`
    shows each line as it comes) and notes about the wait (stderr)."""

    def data(self, chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    def note(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)


TERMINAL = ("Succeeded", "DeadLettered")  # phases after which no attempt starts (until a redrive)
FOLLOW_POLL_SECONDS = 1.0  # how often `logs -f` looks for the next attempt or its pod's start


def latest_attempt(job: Mapping[str, Any]) -> int:
    """The number of the job's latest attempt, 0 before the first."""
    status_ = fields.status(job)
    return int((status_.get("currentAttempt") or {}).get("number") or status_.get("attempts") or 0)


def attempt_of(pod: Mapping[str, Any]) -> int:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT, "")
    return int(value) if str(value).isdigit() else 0


def separator(number: int, pod: Mapping[str, Any]) -> bytes:
    """The line between two attempts' logs, naming the attempt, its pod and node."""
    node = fields.spec(pod).get("nodeName") or "no node"
    return f"--- attempt {number}: pod {fields.name(pod)} on {node} ---\n".encode()


def started(pod: Mapping[str, Any], container: str | None) -> bool:
    """Whether the pod's container has a log to give: running or ended, by its own status (a
    pod Running on its sidecar alone, or Pending, answers a log request with 400 "waiting to
    start"); a pod that has ended has nothing more to wait for."""
    status_ = fields.status(pod)
    if status_.get("phase") in ("Succeeded", "Failed"):
        return True
    for item in status_.get("containerStatuses") or []:
        if item.get("name") == container:
            return bool(set(item.get("state") or {}) & {"running", "terminated"})
    return status_.get("phase") == "Running"


async def logs(
    api: Api, namespace: str, args: argparse.Namespace, clock: Clock, out: Out | None = None
) -> tuple[int, str]:
    """The log of an attempt's pod; --all-attempts every attempt's whose pod is there, each after
    a separator line; -f follows it and then each next attempt's, until the job ends."""
    out = out or Out()
    job = await _read_job(api, namespace, args.job)
    latest = latest_attempt(job)
    number = args.attempt or latest
    if not number and not args.follow:
        raise Failed(EXIT_FAILED, f"vigiljob {args.job} has started no attempt yet: no log to show")
    if args.all_attempts:
        pods = sorted(await api.pods(namespace, f"{LABEL_JOB_UID}={fields.uid(job)}"), key=attempt_of)
        # Followed, the latest (or the one asked) is streamed below; the ones before it in full here.
        earlier = [pod for pod in pods if not args.follow or attempt_of(pod) < (number or 1)]
        if not earlier and not args.follow:
            raise Failed(EXIT_FAILED, _gone(args.job, None))
        for pod in earlier:
            out.data(separator(attempt_of(pod), pod))
            out.data(await _log(api, namespace, pod, attempt_of(pod), args.container, args.tail))
        if not args.follow:
            return EXIT_OK, ""
    if not args.follow:
        pods = await api.pods(namespace, f"{LABEL_JOB_UID}={fields.uid(job)},{LABEL_ATTEMPT}={number}")
        if not pods:
            raise Failed(EXIT_FAILED, _gone(args.job, number))
        out.data(await _log(api, namespace, pods[0], number, args.container, args.tail))
        return EXIT_OK, ""
    return await follow(api, namespace, args, clock, out, job, number or 1)


async def follow(
    api: Api, namespace: str, args: argparse.Namespace, clock: Clock, out: Out, job: Mapping[str, Any], number: int
) -> tuple[int, str]:
    """`logs -f`: attempt `number`'s log as it is written, then, once it ends and a retry starts,
    the next attempt's after a separator line, until the job is Succeeded or DeadLettered (with
    --attempt N: that attempt's alone, as `kubectl logs -f` follows one pod). Exit 1 if a log the
    API server was asked for could not be given (the others are shown all the same)."""
    uid, tail, announce = fields.uid(job), args.tail, bool(args.all_attempts)
    code = EXIT_OK
    while True:
        pod = await _wait_for_attempt(api, namespace, args.job, uid, number, args.container, clock, out)
        if pod is None:  # the attempt's pod is gone and the job has moved on, or the job is over
            job = await _read_job(api, namespace, args.job)
            if latest_attempt(job) <= number and fields.status(job).get("phase") in TERMINAL:
                return code, ""
            out.note(f"attempt {number} of vigiljob {args.job}: no log (its pod is gone, or it never started)")
        else:
            if announce:
                out.data(separator(number, pod))
            container = args.container or _default_container(pod)
            try:
                async for chunk in api.follow_log(namespace, fields.name(pod), container, tail):
                    out.data(chunk)
            except (Unreachable, Unauthorized):
                raise
            except ApiError as err:
                out.note(f"no log for pod {fields.name(pod)} (attempt {number}): the API server answered {err}")
                code = EXIT_FAILED
        if args.attempt and not args.all_attempts:
            return code, ""
        if not await _wait_for_next(api, namespace, args.job, number, clock):
            return code, ""
        number, tail, announce = number + 1, None, True  # --tail is for the first attempt shown


async def _wait_for_attempt(
    api: Api, namespace: str, name: str, uid: str, number: int, container: str | None, clock: Clock, out: Out
) -> dict | None:
    """Attempt `number`'s pod once its container has started; None when it is not there and the
    job has gone past that attempt or ended."""
    told = False
    while True:
        pods = await api.pods(namespace, f"{LABEL_JOB_UID}={uid},{LABEL_ATTEMPT}={number}")
        if pods and started(pods[0], container or _default_container(pods[0])):
            return pods[0]
        if pods and not told:
            out.note(f"waiting for pod {fields.name(pods[0])} (attempt {number}) to start")
            told = True
        # A pod not there, or one that never started (stopped while Pending): on once the job is.
        job = await _read_job(api, namespace, name)
        if latest_attempt(job) > number or fields.status(job).get("phase") in TERMINAL:
            return None
        await clock.sleep(FOLLOW_POLL_SECONDS)


async def _wait_for_next(api: Api, namespace: str, name: str, number: int, clock: Clock) -> bool:
    """Whether an attempt after `number` starts (True) before the job ends (False)."""
    while True:
        job = await _read_job(api, namespace, name)
        if latest_attempt(job) > number:
            return True
        if fields.status(job).get("phase") in TERMINAL:
            return False
        await clock.sleep(FOLLOW_POLL_SECONDS)


def _gone(job: str, number: int | None) -> str:
    which = f"the pod of attempt {number} of vigiljob {job} is gone" if number else f"vigiljob {job} has no pod left"
    return (
        f"{which} (deleted with its attempt, or never created): its log went with it; "
        f"`kubectl vigil status {job}` lists the attempts"
    )


async def _log(
    api: Api, namespace: str, pod: Mapping[str, Any], number: int, container: str | None, tail: int | None
) -> bytes:
    name, node = fields.name(pod), fields.spec(pod).get("nodeName") or "no node"
    try:
        return await api.log(namespace, name, container or _default_container(pod), tail)
    except (Unreachable, Unauthorized):
        raise
    except ApiError as err:
        raise Failed(
            EXIT_FAILED,
            f"no log for pod {name} (attempt {number}) on {node}: the API server answered {err} "
            "(the node's kubelet keeps the log: a node gone, or one that runs no containers, has none)",
        ) from None


def _default_container(pod: Mapping[str, Any]) -> str | None:
    """As kubectl logs picks one: the pod's default-container annotation, else its first."""
    named = ((pod.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CONTAINER)
    containers = fields.spec(pod).get("containers") or []
    return named or (containers[0].get("name") if containers else None)


COMMANDS = {"status": status, "dlq": dlq, "top": top, "redrive": redrive, "pause": pause, "resume": pause, "logs": logs}


# --- the process ------------------------------------------------------------------------------


def explain(err: ApiError, server: str) -> tuple[int, str]:
    """The exit code and message of an API error no command handled itself."""
    if isinstance(err, Unreachable):
        return EXIT_CANNOT_ASK, (
            f"cannot reach the API server at {server} ({err}): is the cluster up, and are --kubeconfig "
            "and --context the ones you meant?"
        )
    if isinstance(err, Unauthorized):
        return EXIT_CANNOT_ASK, f"the API server at {server} refused the credentials ({err}): log in again"
    if isinstance(err, Refused) and err.status == 403:
        return EXIT_FAILED, f"forbidden: {err.message}"
    if isinstance(err, NotFound):  # a collection, not an object: the resource is not served
        return EXIT_FAILED, f"{err.message}: are Vigil's CRDs installed (kubectl apply -f crds/)?"
    return EXIT_FAILED, str(err)


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with flags argparse cannot check alone, before anything is asked."""
    if args.command != "redrive":
        return None
    if args.all_dead_letters == bool(args.jobs):
        return "redrive takes job names or --all-dead-letters, not both nor neither"
    if args.tasks is not None:
        if len(args.jobs) != 1:
            return "--tasks goes with one job, an array: redrive JOB --tasks 5,7-9"
        try:
            report.parse_tasks(args.tasks)
        except ValueError as err:
            return str(err)
    if args.selector and not args.all_dead_letters:
        return "-l/--selector goes with --all-dead-letters"
    if not 0 < args.rate <= MAX_RATE:
        return f"--rate must be above 0 and at most {MAX_RATE:g} redrives a second"
    if args.max < 1:
        return "--max must be at least 1"
    return None


async def run(
    api: Api, args: argparse.Namespace, namespace: str, clock: Clock, out: Out | None = None
) -> tuple[int, str]:
    """The command `args` names, in `namespace`, or in all of them with -A (dlq and top)."""
    scope: Any = None if getattr(args, "all_namespaces", False) else namespace
    if args.command == "logs":
        return await logs(api, scope, args, clock, out)
    return await COMMANDS[args.command](api, scope, args, clock)


def main(argv: list[str] | None = None, clock: Clock = SYSTEM) -> int:
    # Imported here: --help and a usage error need none of the client's libraries.
    from vigil.kube import config

    argv = sys.argv[1:] if argv is None else argv
    # Completion: `kubectl-vigil __complete WORDS...` (the scripts), or this same file run under
    # the name kubectl looks for (`kubectl_complete-vigil`, a link to a single-file plugin).
    if argv[:1] == ["__complete"] or Path(sys.argv[0]).name.startswith("kubectl_complete-"):
        return completion.main(argv[1:] if argv[:1] == ["__complete"] else argv)
    args = parser().parse_args(argv)
    if args.command == "completion":
        sys.stdout.write(completion.SCRIPTS[args.shell])
        return EXIT_OK
    try:
        args.output = render.parse_output(getattr(args, "output", "table"), getattr(args, "no_headers", False))
    except render.BadOutput as err:
        print(f"error: {err}", file=sys.stderr)  # exit 1, as kubectl exits for an -o it cannot print
        return EXIT_FAILED
    if problem := usage_error(args):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_CANNOT_ASK
    kubeconfig, context = getattr(args, "kubeconfig", None), getattr(args, "context", None)
    namespace = getattr(args, "namespace", None) or config.context_namespace(kubeconfig, context) or "default"
    try:
        credentials = config.load(kubeconfig, context)
    except config.NoCredentials as err:
        print(f"error: {err}: give --kubeconfig, or set KUBECONFIG", file=sys.stderr)
        return EXIT_CANNOT_ASK

    async def ask() -> tuple[int, str]:
        http = ApiClient(credentials, user_agent(None, "kubectl-vigil"))
        try:
            return await run(Api(http), args, namespace, clock)
        finally:
            await http.close()

    try:
        code, out = asyncio.run(ask())
    except Failed as err:
        print(f"error: {err.message}", file=sys.stderr)
        return err.code
    except ApiError as err:
        code, message = explain(err, credentials.host)
        print(f"error: {message}", file=sys.stderr)
        return code
    except KeyboardInterrupt:  # Ctrl-C on `logs -f`: the user's way to stop following
        return 130
    except BrokenPipeError:  # `logs ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK
    if out:
        # A JSONPath template's text is printed as kubectl prints it: as written, no newline added.
        sys.stdout.write(out if args.output.kind == "jsonpath" else out + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
