"""The orphan sweep against the real kube-apiserver: it lists Vigil's pods as their metadata alone
(PartialObjectMetadataList), and what that listing carries is enough to find an orphan and
release it (a pod holding Vigil's finalizer whose VigilJob is gone)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kubernetes import client, config

from tests.support import waits
from tests.support.cluster import Kube
from vigil import api
from vigil.controllers.jobs.orphans import Releaser
from vigil.controllers.jobs.podcache import PodCache
from vigil.kube.client import ApiClient, user_agent
from vigil.kube.config import Credentials
from vigil.kube.operations import Kube as Operations
from vigil.metrics import Metrics
from vigil.runtime.clock import SYSTEM

pytestmark = pytest.mark.integration


def orphan(job_uid: str) -> dict:
    """A pod of a VigilJob that does not exist, still held by Vigil's attempt-tracking finalizer."""
    owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "gone", "uid": job_uid, "controller": True}
    return {
        "metadata": {
            "name": "gone-1",
            "labels": {api.LABEL_JOB_UID: job_uid, api.LABEL_ATTEMPT: "1"},
            "ownerReferences": [owner],
            "finalizers": [api.FINALIZER_ATTEMPT_TRACKING],
        },
        "spec": {"containers": [{"name": "main", "image": "example.invalid/none"}]},
    }


def test_the_sweep_reads_pods_as_metadata_and_releases_an_orphan(kube: Kube, own_namespace: str) -> None:
    core = client.CoreV1Api(kube.api)
    job_uid = str(uuid.uuid4())
    created = core.create_namespaced_pod(own_namespace, orphan(job_uid))

    conf = client.Configuration()
    config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=conf)

    async def sweep() -> list[dict]:
        http = ApiClient(Credentials(conf), user_agent("test", "orphan-sweep"))
        try:
            ops = Operations(http)
            listed = [pod async for page in ops.list_vigil_pods(own_namespace) for pod in page]
            releaser = Releaser(
                ops, PodCache(), SYSTEM, metrics=Metrics(), knows_job=lambda job: False, scopes=[own_namespace]
            )
            releaser.start()
            try:
                await releaser.sweep()
                async with asyncio.timeout(30):  # the releases it handed to the queue
                    while releaser.busy():
                        await asyncio.sleep(0.1)
            finally:
                await releaser.stop()
            return listed
        finally:
            await http.close()

    listed = asyncio.run(sweep())
    (seen,) = [pod for pod in listed if pod["metadata"]["name"] == "gone-1"]
    assert "spec" not in seen and "status" not in seen, "the sweep lists metadata alone"
    meta = seen["metadata"]
    assert (meta["namespace"], meta["uid"]) == (own_namespace, created.metadata.uid)
    assert meta["labels"][api.LABEL_JOB_UID] == job_uid
    assert meta["ownerReferences"][0]["uid"] == job_uid
    assert meta["finalizers"] == [api.FINALIZER_ATTEMPT_TRACKING]

    def released() -> bool:
        try:
            pod = core.read_namespaced_pod("gone-1", own_namespace)
        except client.ApiException as err:
            return err.status == 404  # released, then taken by the garbage collector (its owner is gone)
        return api.FINALIZER_ATTEMPT_TRACKING not in (pod.metadata.finalizers or [])

    waits.wait_until(released, 30, "the orphan's finalizer released by the sweep")
