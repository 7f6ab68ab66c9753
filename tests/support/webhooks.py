"""Registering Vigil's admission webhook with a cluster under test (blocking calls of the
official client: for tests and tools, never the operator's event loop), and knowing when the API
server calls it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.support.cluster import Kube
from tests.support.jobs import GROUP, PLURAL, VERSION, vigil_job
from tests.support.waits import wait_until


def register(api_client: client.ApiClient, configuration: Mapping[str, Any]) -> None:
    """Creates the ValidatingWebhookConfiguration, or replaces one of the same name (blocking:
    for the test bed and tools, not for the event loop)."""
    admissionregistration = client.AdmissionregistrationV1Api(api_client)
    name = configuration["metadata"]["name"]
    try:
        admissionregistration.create_validating_webhook_configuration(dict(configuration))
    except client.ApiException as err:
        if err.status != 409:
            raise
        current = admissionregistration.read_validating_webhook_configuration(name)
        body = {
            **configuration,
            "metadata": {**configuration["metadata"], "resourceVersion": current.metadata.resource_version},
        }
        admissionregistration.replace_validating_webhook_configuration(name, body)


def unregister(api_client: client.ApiClient, name: str) -> None:
    try:
        client.AdmissionregistrationV1Api(api_client).delete_validating_webhook_configuration(name)
    except client.ApiException as err:
        if err.status != 404:
            raise


PROBE_QUEUE = "probe"  # a VigilQueue that takes nothing (maxQueued 0): a job for it is refused


def dry_run_refused(kube: Kube, namespace: str, queue: str) -> bool:
    """Whether the API server refuses a job for `queue` with 429 (a dry run: nothing is stored)."""
    try:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, vigil_job("probe", queue=queue), dry_run="All"
        )
    except client.ApiException as err:
        return err.status == 429
    return False


def register_and_wait(
    kube: Kube, configuration: Mapping[str, Any], namespace: str, create_queue: Callable[[str], None]
) -> None:
    """Registers the configuration and waits until the API server calls the webhook for
    `namespace`: it takes the configuration up from its own watch, a moment later. The probe:
    `create_queue(PROBE_QUEUE)` makes a VigilQueue with maxQueued 0 there (and waits, if it must,
    until the webhook's replicas see it), and a dry run of a job for it must be refused."""
    register(kube.api, configuration)
    create_queue(PROBE_QUEUE)
    wait_until(lambda: dry_run_refused(kube, namespace, PROBE_QUEUE), 30, "the webhook configuration to take effect")


# ------------------------------------------------------------------------- hostile callers


def admission_review(namespace: str, name: str, queue: str, *, uid: str | None = None) -> dict[str, Any]:
    """A review of a VigilJob create as the API server sends it, for posting to the webhook
    directly (a forgery: nothing is created)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or f"forged-{name}",
            "kind": {"group": GROUP, "version": VERSION, "kind": "VigilJob"},
            "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "dryRun": False,
            "object": {**vigil_job(name, queue=queue), "metadata": {"name": name, "namespace": namespace}},
        },
    }


def heavy_review(namespace: str, queue: str, size: int) -> bytes:
    """A review of `size` bytes whose bulk is the JSON slowest to decode (an array of empty
    objects: 0.5 s for 3 MiB on the 2-core bed, as much memory as it gets)."""
    head = json.dumps(admission_review(namespace, "heavy", queue)).encode()
    # spliced into the job's spec: {"queue": ..., "pad": [{},{},...]}
    room = size - len(head) - len(b', "pad": []')
    pad = b"[" + b",".join([b"{}"] * max(0, (room + 1) // 3)) + b"]"
    body = head.replace(b'"queue": "' + queue.encode() + b'"', b'"queue": "' + queue.encode() + b'", "pad": ' + pad, 1)
    return body[:size] if len(body) > size else body


FLOOD = r"""
import asyncio, collections, json, ssl, sys, time
import aiohttp
url, ca, body_file, clients, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
body = open(body_file, "rb").read()
context = ssl.create_default_context(cafile=ca)
statuses = collections.Counter()
async def client(end):
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1, ssl=context)) as session:
        while time.monotonic() < end:
            try:
                async with session.post(url, data=body, timeout=aiohttp.ClientTimeout(total=30)) as response:
                    await response.read()
                    statuses[str(response.status)] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                statuses[type(err).__name__] += 1
async def main():
    end = time.monotonic() + seconds
    await asyncio.gather(*(client(end) for _ in range(clients)))
asyncio.run(main())
print(json.dumps(statuses))
"""


def flood(url: str, ca_file: Path, body: bytes, clients: int, seconds: float, scratch: Path) -> subprocess.Popen:
    """`clients` HTTPS clients posting `body` to `url` in a loop for `seconds`, in a process of
    their own (so that the test's own measurements do not wait for their GIL); it prints a JSON
    count of the answers' statuses when done."""
    scratch.mkdir(parents=True, exist_ok=True)
    body_file = scratch / "flood-body.json"
    body_file.write_bytes(body)
    args = [sys.executable, "-c", FLOOD, url, str(ca_file), str(body_file), str(clients), str(seconds)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
