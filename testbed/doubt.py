"""The part of `make up REAL_NODE=1` that needs real containers: the default heartbeat from an
image with nothing of Vigil, an attempt going Uncertain and back, an attempt Lost whose hung
process its agent stops before the next attempt starts (NoOverlap), and a checkpoint carried to
that next attempt. The jobs are examples/any-image/stall.yaml and hang.yaml as they are, but for
their image (busybox cannot be pulled here: the bed's plain image runs their scripts unchanged)
and their placement on the bed's real node.

`watch` applies them and records what it sees (every change of a job's phase, each attempt's pod:
superseded or not, its exit code, when it ended, its log); `problems` (pure) says what of the
story is missing; e2e/test_real_node.py runs both against the suite's real node.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vigil import api

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("stall", "hang")  # examples/any-image/<name>.yaml
STARTS_AT = re.compile(r"attempt (\d+) starts at (\d+)")

Kubectl = Callable[..., str]  # kubectl(*args, input=None) -> its stdout; raises when it fails


def manifests(image: str, placement: dict) -> list[dict]:
    """The examples, their containers' image replaced by `image` (already on the node: never
    pulled) and their pods placed by `placement` (nodeSelector and tolerations)."""
    jobs = []
    for name in EXAMPLES:
        job = yaml.safe_load((ROOT / "examples" / "any-image" / f"{name}.yaml").read_text())
        pod = job["spec"]["template"]["spec"]
        for container in pod["containers"]:
            container.update(image=image, imagePullPolicy="Never")
        pod.update(copy.deepcopy(placement))
        jobs.append(job)
    return jobs


@dataclass
class Pod:
    """What was seen of one attempt's pod."""

    name: str
    created: str = ""
    superseded: str | None = None  # the annotation's value, once seen
    exit_code: int | None = None  # the job's container, once it ended
    finished: str = ""  # when it ended (RFC 3339, the kubelet's)
    log: str = ""


@dataclass
class Seen:
    """What was seen of one job: its phases as they changed, its attempts' pods, its final status."""

    timeline: list[tuple[float, str]] = field(default_factory=list)  # (seconds since applied, what)
    pods: dict[int, Pod] = field(default_factory=dict)
    status: dict = field(default_factory=dict)

    def states(self) -> list[str]:
        return [what for _, what in self.timeline]


def state(status: dict) -> str:
    """A job's state as the story tells it: its phase and the attempt it is on."""
    return f"{status.get('phase') or 'Pending'}, attempt {status.get('attempts') or 0}"


def _main_container(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == "main"), {})


def _observe_pods(kubectl: Kubectl, namespace: str, job: dict, seen: Seen) -> None:
    uid = job["metadata"]["uid"]
    listed = json.loads(kubectl("get", "pods", "-n", namespace, "-l", f"{api.LABEL_JOB_UID}={uid}", "-o", "json"))
    for pod in listed["items"]:
        number = int(pod["metadata"]["labels"].get(api.LABEL_ATTEMPT, "0"))
        mine = seen.pods.setdefault(number, Pod(pod["metadata"]["name"], pod["metadata"]["creationTimestamp"]))
        mine.superseded = (pod["metadata"].get("annotations") or {}).get(api.ANNOTATION_SUPERSEDED, mine.superseded)
        ended = (_main_container(pod).get("state") or {}).get("terminated")
        if ended and mine.exit_code is None:
            mine.exit_code, mine.finished = ended.get("exitCode"), ended.get("finishedAt") or ""
            try:
                mine.log = kubectl("logs", "-n", namespace, mine.name, "-c", "main")
            except Exception as err:  # a log that cannot be read is told, not fatal: problems() names it
                mine.log = f"(kubectl logs failed: {err})"


def watch(
    kubectl: Kubectl,
    namespace: str,
    image: str,
    placement: dict,
    timeout: float,
    say: Callable[[str], None] = print,
) -> dict[str, Seen]:
    """Applies the examples in `namespace` (after deleting an earlier run's) and follows them until
    each has ended or `timeout` has passed; says each change of a job's state as it sees it."""
    jobs = manifests(image, placement)
    names = [job["metadata"]["name"] for job in jobs]
    kubectl("delete", "vj", "-n", namespace, *names, "--ignore-not-found", "--cascade=foreground", "--wait=true")
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": jobs}))
    began, seen = time.monotonic(), {name: Seen() for name in names}
    while time.monotonic() - began < timeout:
        listed = json.loads(kubectl("get", "vj", "-n", namespace, *names, "-o", "json"))
        for job in listed["items"]:
            name, status = job["metadata"]["name"], job.get("status") or {}
            mine = seen[name]
            mine.status = status
            now = state(status)
            if not mine.timeline or mine.timeline[-1][1] != now:
                elapsed = time.monotonic() - began
                mine.timeline.append((elapsed, now))
                say(f"  {elapsed:5.1f}s  {name:6} {now}{_why(status)}")
            _observe_pods(kubectl, namespace, job, mine)
        if all(s.status.get("phase") in api.TERMINAL_PHASES for s in seen.values()):
            break
        time.sleep(0.5)
    return seen


def _why(status: dict) -> str:
    reason = status.get("reason")
    return f" ({reason})" if reason else ""


def problems(seen: dict[str, Seen]) -> list[str]:
    """What of the story is missing from what was seen: empty when all of it was."""
    found: list[str] = []

    def follows(states: list[str], wanted: list[str]) -> bool:
        """`wanted` appear in `states` in this order (others may come between)."""
        it = iter(states)
        return all(any(s == w for s in it) for w in wanted)

    stall = seen.get("stall", Seen())
    wanted = ["Running, attempt 1", "Uncertain, attempt 1", "Running, attempt 1", "Succeeded, attempt 1"]
    if not follows(stall.states(), wanted):
        found.append(f"stall: expected {' -> '.join(wanted)}, saw {' -> '.join(stall.states()) or 'nothing'}")

    hang = seen.get("hang", Seen())
    wanted = ["Running, attempt 1", "Uncertain, attempt 1", "Succeeded, attempt 2"]
    if not follows(hang.states(), wanted):
        found.append(f"hang: expected {' -> '.join(wanted)}, saw {' -> '.join(hang.states()) or 'nothing'}")
    history = hang.status.get("history") or []
    if not history or history[0].get("outcome") != "Lost":
        found.append(f"hang: attempt 1 was not Lost: {history[:1]}")
    first, second = hang.pods.get(1), hang.pods.get(2)
    if first is None or second is None:
        found.append(f"hang: the pods of attempts 1 and 2 were not both seen: {sorted(hang.pods)}")
        return found
    if first.superseded is None:
        found.append(f"hang: attempt 1's pod {first.name} was never marked {api.ANNOTATION_SUPERSEDED}")
    if first.exit_code not in (143, 137):
        found.append(f"hang: attempt 1's job was not stopped by its agent (exit {first.exit_code}, not 143 or 137)")
    elif not (first.finished and second.created >= first.finished):
        # Both are RFC 3339 in UTC from the API server's clock, to the second: they compare as text.
        found.append(f"hang: attempt 2's pod was created {second.created}, before attempt 1's ended ({first.finished})")
    resumed = STARTS_AT.search(second.log)
    if not resumed or resumed.group(1) != "2" or int(resumed.group(2)) == 0:
        found.append(f"hang: attempt 2 did not start from attempt 1's checkpoint: its log says {second.log[:200]!r}")
    return found


def tell(seen: dict[str, Seen]) -> list[str]:
    """The story in a few lines, from what was seen."""
    lines = []
    stall, hang = seen.get("stall"), seen.get("hang")
    if stall:
        lines.append(f"stall: {' -> '.join(stall.states())}")
    if hang:
        lines.append(f"hang: {' -> '.join(hang.states())}")
        first, second = hang.pods.get(1), hang.pods.get(2)
        if first:
            lines.append(
                f"  attempt 1 ({first.name}): marked superseded={first.superseded}, its job stopped by the "
                f"agent with exit {first.exit_code} at {first.finished}"
            )
        if second:
            resumed = STARTS_AT.search(second.log)
            lines.append(
                f"  attempt 2 ({second.name}): created {second.created}, "
                + (f'started from the checkpoint {{"done":{resumed.group(2)}}}' if resumed else "no start line")
            )
        if hang.status.get("lastCheckpoint"):
            lines.append(f"  status.lastCheckpoint: {hang.status['lastCheckpoint']}")
    return lines
