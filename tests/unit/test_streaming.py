"""The lean reader authenticates as the official client does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client, config

from vigil.streaming import ApiReader, resource_path

pytestmark = pytest.mark.unit


def test_a_bearer_token_from_a_kubeconfig_is_sent(tmp_path: Path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "s3cret"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    assert ApiReader(configuration)._headers()["Authorization"] == "Bearer s3cret"


def test_collection_paths():
    assert resource_path("", "v1", "pods", None) == "/api/v1/pods"
    assert (
        resource_path("vigil.dev", "v1alpha1", "vigiljobs", "ns") == "/apis/vigil.dev/v1alpha1/namespaces/ns/vigiljobs"
    )
