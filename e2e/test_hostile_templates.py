"""A tenant's large pod templates, against the real operator process.

Anyone who may create VigilJobs can give each a template of up to the API server's limit on an
object (etcd's 1.5 MiB), and keep the job waiting (a paused queue) for as long as they like.
Kept whole, a template of 900 KiB of small env entries costs the operator about 11 MiB as
Python objects: 20 such jobs grew its RSS by 215 MiB before the fix, about 50 passed the chart's
512 Mi, and a restart (a standby taking over) listed them all again. Now the view keeps a
template only up to `TEMPLATE_KEPT_BYTES` of estimated JSON (`core.objects.strip_job`), and the
look that creates a pod from a larger one reads the job whole (`Kube.read_job(..., whole_template=True)`).

The test makes JOBS such jobs in a paused queue, waits until the operator has looked at each (every
one Queued), and reads the operator's memory from /proc/<pid>/status (VmRSS: resident now;
VmHWM: the peak since it started); then restarts it (it lists them all again); then resumes the
queue with STARTED of them left (the rest deleted: each start moves about 4 MiB through the API
server, so starting all 20 took 102 s of the suite): each one's pod has the template's every env
entry, and each succeeds. The figures are in docs/capacity-planning.md ("A tenant's templates").
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.cluster import Kube
from tests.support.jobs import GROUP, PLURAL, QUEUE_PLURAL, VERSION, create, get, vigil_job, vigil_queue, wait_phase
from tests.support.waits import poll, wait_until
from vigil.core.objects import TEMPLATE_KEPT_BYTES
from vigil.kube.client import PAGE_BYTES

pytestmark = pytest.mark.e2e

JOBS = 10  # 20 grew the operator by 189-215 MiB before the fix; 10 by about half that, past the bound
STARTED = 3  # of them resumed: the large-template start path, each read whole and fenced
ENV_ENTRIES = 26_000  # {"name":"E00000","value":"vvvvvvvv"}: 35 bytes each, 900 KiB of template
MIB = 1024 * 1024
QUEUE = "held"
# What the view keeps of a waiting job is bounded by a constant: the job without its template
# (10.5 KiB as Python objects), or with a template of at most TEMPLATE_KEPT_BYTES of estimated
# JSON: 15 KiB with a typical one, 76 KiB with the smallest env entries, 197 KiB at worst (2,707
# empty objects, 64 bytes of Python for 3 characters of JSON; docs/capacity-planning.md). 25 x
# the threshold bounds them all.
KEPT_PER_JOB = 25 * TEMPLATE_KEPT_BYTES
# What glibc may keep of the transient parses (each event of such a job is 900 KiB of JSON parsed
# to about 11 MiB, then trimmed): a high-water mark that does not grow with the number of jobs,
# as the hostile pods' (e2e/test_hostile_pods.py: 24 MiB for parses of 0.5 MiB each) but
# for parses 20 times larger, a few at once (the watch's, the workers' reads): 4 of them.
ALLOCATOR = 4 * 11 * MIB
# Before the fix: 9.5-10.8 MiB a job; this bound is 10 x 200 KiB + 44 MiB = 46 MiB for 10 jobs
# (4.6 MiB a job), where keeping the templates took 95-108 MiB.
RESIDENT_BOUND = JOBS * KEPT_PER_JOB + ALLOCATOR
# A restart lists them in pages of PAGE_BYTES of JSON, each trimmed before the next is asked for:
# what the list adds to the peak is one page and its parse (as much again, and 12 times that as
# Python objects for this JSON), not the jobs.
PEAK_BOUND = 2 * 13 * PAGE_BYTES


def large_job(name: str) -> dict:
    """A job of the paused queue whose pod runs 1 s on a kwok node, with ENV_ENTRIES env entries."""
    job = vigil_job(name, run_for="1s", queue=QUEUE)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": f"E{i:05d}", "value": "v" * 8} for i in range(ENV_ENTRIES)]
    return job


def probe(kube: Kube, namespace: str, name: str) -> None:
    """A job of the default queue runs to Succeeded: the operator has listed and reconciles."""
    create(kube, namespace, vigil_job(name, run_for="1s"))
    wait_phase(kube, namespace, name, "Succeeded", timeout=30)


def phases(kube: Kube, namespace: str, names: list[str] | None = None) -> list[str | None]:
    names = names if names is not None else [f"large-{i:02d}" for i in range(JOBS)]
    return [(get(kube, namespace, name) or {}).get("status", {}).get("phase") for name in names]


def all_in(kube: Kube, namespace: str, phase: str, names: list[str] | None = None) -> bool:
    return all(each == phase for each in phases(kube, namespace, names))


def started_pods(kube: Kube, namespace: str) -> list:
    """The attempts' pods of the large jobs left, once there is one for each (else empty)."""
    pods = [pod for pod in kube.core.list_namespaced_pod(namespace).items if pod.metadata.name.startswith("large-")]
    return pods if len(pods) >= STARTED else []


def test_waiting_jobs_with_large_templates_cost_a_constant_each_and_start_with_their_whole_template(
    kube: Kube, own_namespace: str, own_operator
):
    operator, _ = own_operator()
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, own_namespace, QUEUE_PLURAL, vigil_queue(QUEUE, paused=True)
    )
    probe(kube, own_namespace, "probe-1")
    before = operator.memory()

    began = time.monotonic()
    body = large_job("large-00")
    with ThreadPoolExecutor(2) as pool:  # each create is 900 KiB checked against the pod schema

        def make(i: int) -> None:
            job = copy.deepcopy(body)
            job["metadata"]["name"] = f"large-{i:02d}"
            create(kube, own_namespace, job)

        list(pool.map(make, range(JOBS)))
    wait_until(lambda: all_in(kube, own_namespace, "Queued"), 60, f"the operator to look at all {JOBS} jobs (Queued)")
    waiting = operator.memory()
    looked = time.monotonic()

    operator.stop()
    restarted, _ = own_operator()
    probe(kube, own_namespace, "probe-2")
    relisted = restarted.memory()
    relist = time.monotonic()

    figures = {
        "waiting: RSS growth MiB": round((waiting["VmRSS"] - before["VmRSS"]) / MIB, 1),
        "waiting: RSS growth MiB a job": round((waiting["VmRSS"] - before["VmRSS"]) / MIB / JOBS, 2),
        "waiting: peak growth MiB": round((waiting["VmHWM"] - before["VmHWM"]) / MIB, 1),
        "restart: RSS over the first start's MiB": round((relisted["VmRSS"] - before["VmRSS"]) / MIB, 1),
        "restart: peak over the first start's MiB": round((relisted["VmHWM"] - before["VmHWM"]) / MIB, 1),
    }
    print(f"\nlarge templates ({JOBS} x {ENV_ENTRIES} env entries): {figures}")  # docs/capacity-planning.md
    print(f"made and looked at in {looked - began:.0f}s; restarted and listed in {relist - looked:.0f}s")
    assert waiting["VmRSS"] - before["VmRSS"] <= RESIDENT_BOUND, figures
    assert relisted["VmRSS"] - before["VmRSS"] <= RESIDENT_BOUND, figures
    assert relisted["VmHWM"] - before["VmHWM"] <= PEAK_BOUND, figures

    left = [f"large-{i:02d}" for i in range(STARTED)]
    for i in range(STARTED, JOBS):
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, own_namespace, PLURAL, f"large-{i:02d}")
    wait_until(
        lambda: all(get(kube, own_namespace, f"large-{i:02d}") is None for i in range(STARTED, JOBS)),
        60,
        "the large jobs not resumed to be gone",
    )
    print(f"{JOBS - STARTED} deleted in {time.monotonic() - relist:.0f}s")
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, own_namespace, QUEUE_PLURAL, QUEUE, {"spec": {"paused": False}}
    )
    resumed = time.monotonic()
    # Each start moves about 4 MiB through the API server and etcd on this test's bed (the job
    # read whole and by the fence, the pod created, bound and its status written by kwok, each
    # a copy of 900 KiB): 20 pods were made in 102 s on 2 cores busy with other work (load 5.6),
    # sooner when idle. 10 s a job, and 30 s more; as long again for them to finish.
    started = wait_until(
        lambda: started_pods(kube, own_namespace), 30 + 10 * STARTED, f"the pods of the {STARTED} jobs resumed"
    )
    print(f"resumed: the {STARTED} pods made in {time.monotonic() - resumed:.0f}s")
    for pod in started:
        env = [entry.name for entry in pod.spec.containers[0].env or []]
        assert len([name for name in env if name.startswith("E")]) == ENV_ENTRIES, pod.metadata.name
        assert "VIGIL_JOB" in env  # Vigil's own, added to the template's
    if not poll(lambda: all_in(kube, own_namespace, "Succeeded", left), 30 + 10 * STARTED):
        pytest.fail(f"not all {STARTED} jobs succeeded: {phases(kube, own_namespace, left)}")
    finished = restarted.memory()
    grown = (finished["VmRSS"] - before["VmRSS"]) / MIB
    print(f"after they ran ({time.monotonic() - resumed:.0f}s): RSS over the first start's {grown:.1f} MiB")
