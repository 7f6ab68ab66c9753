"""Registering Vigil's admission webhook with a cluster under test (blocking calls of the
official client: for tests and tools, never the operator's event loop)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client


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
