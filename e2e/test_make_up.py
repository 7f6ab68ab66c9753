"""The README's first command, run as a newcomer runs it: `make up` from a stopped cluster, `make
up` again on the running one, then `make down`. Each `make up` must exit 0, say where it is (the
build's and the demo's step lines), and leave the example jobs as the README's table shows them.

It runs the demo as a cluster of its own (VIGIL_CLUSTER, VIGIL_PORT_BASE), so a developer's `make
up` cluster ("default", 16443) and the suite's ("pytest", 17443, or this xdist worker's own) are
left alone; it checks that. The standard library, pytest, `testbed` and the suite's cluster name
only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testbed import cluster as testbed
from tests.support.cluster import suite_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = testbed.Cluster(
    os.environ.get("VIGIL_TEST_MAKE_UP_CLUSTER", "pytest-make-up"),
    testbed.Ports.from_base(int(os.environ.get("VIGIL_TEST_MAKE_UP_PORT_BASE", 19443))),
)
# The whole test: two `make up` on cached binaries take about a minute together (the examples
# alone need ~15 s each); a build from cold would not fit, and is not what this test is about.
DEADLINE_SECONDS = 420
BUILD_STEPS, DEMO_STEPS = 6, 5  # testbed/build.sh demo; testbed/demo.py


def _make(target: str, deadline: float) -> subprocess.CompletedProcess:
    """`make <target>` as typed in the README, for this test's cluster; killed at the deadline."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "KUBECONFIG")}
    env.update(VIGIL_CLUSTER=CLUSTER.name, VIGIL_PORT_BASE=str(CLUSTER.ports.apiserver))
    began = time.monotonic()
    proc = subprocess.Popen(
        ["make", target],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        print(out)
        pytest.fail(f"`make {target}` did not finish by the test's deadline ({DEADLINE_SECONDS}s); its output is above")
    print(f"::: make {target}: exit {proc.returncode} in {time.monotonic() - began:.1f}s\n{out}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def _tables(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """The kubectl-style tables in `text` (separated by blank lines), by their header's second
    column (QUEUE for `get vj`, QUEUED for `get vq`), the last one of each: each row by its NAME,
    a {COLUMN: value} cut at the header's column positions, so that an empty cell stays empty."""
    tables = {}
    for chunk in re.split(r"\n\s*\n", text.strip()):
        header, *lines = chunk.splitlines()
        if not header.startswith("NAME "):
            continue
        columns = [(m.group(), m.start()) for m in re.finditer(r"\S+", header)]
        rows = {}
        for line in lines:
            if line.startswith("["):  # a log line of the demo's, not a row
                break
            cells = {
                name: line[begin : columns[i + 1][1] if i + 1 < len(columns) else None].strip()
                for i, (name, begin) in enumerate(columns)
            }
            rows[cells["NAME"]] = cells
        tables[columns[1][0]] = rows
    return tables


def _readme_tables() -> dict[str, dict[str, dict[str, str]]]:
    """The README's picture of what `make up` leaves: the code block with `kubectl get vj`'s and
    `kubectl get vq`'s tables."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```\n(NAME\s+QUEUE\s+PHASE.*?)```", text, re.S)
    assert blocks, "README.md has no `kubectl get vj` table in a code block any more"
    return _tables(blocks[0])


def _readme_refusal() -> str:
    """The README's picture of the webhook's 429 in `make up`'s output."""
    found = re.findall(r"^Error from server \(TooManyRequests\).*$", (ROOT / "README.md").read_text(), re.M)
    assert found, "README.md shows no 429 of the webhook any more"
    return found[0]


def _without(rows: dict[str, dict[str, str]], *columns: str) -> dict[str, dict[str, str]]:
    return {name: {k: v for k, v in row.items() if k not in columns} for name, row in rows.items()}


def _running(cluster: testbed.Cluster) -> dict[str, int]:
    return {c: pid for c in (*testbed.COMPONENTS, "vigil-operator") if (pid := testbed.running_pid(cluster, c))}


def _others() -> dict[str, dict[str, int]]:
    """What runs of the other clusters on this machine (a developer's, this worker's own suite
    cluster): left alone. Another xdist worker's cluster is not among them: its own tests restart
    its control plane meanwhile."""
    names = ("default", suite_cluster(os.environ).name)
    return {name: _running(testbed.Cluster(name, testbed.Ports.from_base(16443))) for name in names}


def _assert_says_where_it_is(out: str) -> None:
    for n in range(1, BUILD_STEPS + 1):
        assert f"[build step {n}/{BUILD_STEPS}]" in out, f"no [build step {n}/{BUILD_STEPS}] line"
    for n in range(1, DEMO_STEPS + 1):
        assert re.search(rf"\[demo step {n}/{DEMO_STEPS}\] done in [\d.]+s", out), f"no [demo step {n}] done line"


def _jobs() -> dict[str, dict]:
    items = json.loads(testbed.kubectl(CLUSTER, "get", "vj", "-o", "json"))["items"]
    return {job["metadata"]["name"]: job for job in items}


def test_make_up_from_stopped_then_again_then_down():
    deadline = time.monotonic() + DEADLINE_SECONDS
    readme = _readme_tables()
    want_jobs = _without(readme["QUEUE"], "LAST-BEAT", "AGE")
    want_queues = _without(readme["QUEUED"], "AGE")
    assert {"flaky", "hello", "poison"} <= set(want_jobs), want_jobs
    others = _others()
    try:
        # From a stopped cluster: whatever a run before this one left is stopped first.
        assert _make("down", deadline).returncode == 0
        assert not _running(CLUSTER), "`make down` left processes of the cluster running"

        uids: dict[str, str] = {}
        for run in ("first, from a stopped cluster", "second, on the running cluster"):
            result = _make("up", deadline)
            assert result.returncode == 0, f"`make up` ({run}) exited {result.returncode}:\n{result.stdout[-4000:]}"
            _assert_says_where_it_is(result.stdout)
            # The last tables the demo printed, and the cluster itself, are the README's.
            printed = _tables(result.stdout)
            assert _without(printed["QUEUE"], "LAST-BEAT", "AGE") == want_jobs, f"({run}) printed last:\n{printed}"
            assert _without(printed["QUEUED"], "AGE") == want_queues, f"({run}) printed last:\n{printed}"
            got = testbed.kubectl(CLUSTER, "get", "vj")
            assert _without(_tables(got)["QUEUE"], "LAST-BEAT", "AGE") == want_jobs, f"({run})\n{got}"
            got = testbed.kubectl(CLUSTER, "get", "vq")
            assert _without(_tables(got)["QUEUED"], "AGE") == want_queues, f"({run})\n{got}"
            assert set(_running(CLUSTER)) == {*testbed.COMPONENTS, "vigil-operator"}, _running(CLUSTER)
            # Vigil as the chart runs it: the webhook's 429 (the README's line), the metrics
            # scraped with a reader's token, a leader holding the Lease, etcd fsyncing.
            assert _readme_refusal() in result.stdout, f"({run}) no 429 from the webhook:\n{result.stdout[-3000:]}"
            assert re.search(
                r'vigil_queue_admission_refusals_total\{namespace="default",queue="closed"\} [1-9]', result.stdout
            )
            holder = testbed.kubectl(
                CLUSTER, "get", "lease", "-n", "default", "vigil", "-o", "jsonpath={.spec.holderIdentity}"
            )
            assert holder, "no operator holds the Lease default/vigil"
            assert testbed.Cluster.saved(CLUSTER.name).get("durable") is True, "etcd runs with --unsafe-no-fsync"
            # The second run ran the examples again, not just found the first run's.
            now = {name: job["metadata"]["uid"] for name, job in _jobs().items()}
            assert not set(now.values()) & set(uids.values()), "the second `make up` did not run the examples again"
            uids = now

        result = _make("down", deadline)
        assert result.returncode == 0, result.stdout
        assert not _running(CLUSTER), f"`make down` left {_running(CLUSTER)} running"
        assert _others() == others, "`make up`/`make down` of another cluster touched the default or the suite's"
    finally:
        if _running(CLUSTER):
            testbed.down(CLUSTER)
