"""Registering Vigil's admission webhook with a cluster under test (blocking calls of the
official client: for tests and tools, never the operator's event loop), and knowing when the API
server calls it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
