"""The one read of a job that keeps its pod template whole.

The view keeps a job's template only while it is small (`core.objects.strip_job`,
`TEMPLATE_KEPT_BYTES`): a job may wait in its queue for as long as its tenant likes, and kept
whole, a template of 900 KiB costs about 11 MiB as Python objects, so that whoever may create
VigilJobs could fill the operator's memory. Every other copy of a job the operator holds (the
watch's, a write's answer, `Kube.read_job`'s) is trimmed so; the look that would create a pod
from a template that was not kept reads the job here instead, and decides on that read
(`JobReconciler`), fenced by its resourceVersion as every decision is. Nothing of it stays: the
view takes it trimmed (`objects.kept_copy`).

It is `Kube.read_job` without the trim of the template, through the same client, timed and
counted as "get vigiljobs" as that read is; it lives here, beside its one caller.
"""

from __future__ import annotations

from typing import Any

from vigil.core.objects import strip_job
from vigil.kube.errors import ApiError, NotFound
from vigil.kube.operations import JOBS, Kube

VERB, RESOURCE = "get", "vigiljobs"


async def read_whole_job(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The job as the API server has it now, its template whole (`strip_job(whole_template=
    True)`: what else the view drops is dropped); None if it is gone. A failure raises, as any
    read does: the look fails and the worker retries it with backoff."""
    path = f"{JOBS.format(namespace=namespace)}/{name}"
    try:
        with kube.metrics.timed_request(VERB, RESOURCE):
            job = await kube.http.request("GET", path)
    except NotFound:
        return None
    except ApiError as err:
        err.verb, err.resource = VERB, RESOURCE
        raise
    return strip_job(job, whole_template=True)
