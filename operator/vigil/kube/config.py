"""Where the API server is and how to prove who we are: a kubeconfig, or a pod's service account.

This is the one place Vigil uses the official kubernetes client: its loaders read every form a
kubeconfig takes (client certificates, tokens, exec and auth-provider plugins, in-cluster
service-account tokens that the kubelet rotates), which is far more than Vigil would want to
write again. Requests themselves go through `vigil.kube.client`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from kubernetes import client, config


class NoCredentials(Exception):
    """Neither a pod's service account nor a usable kubeconfig; the message says what to set."""


@dataclass(frozen=True)
class Credentials:
    """A loaded client configuration, asked for the host, TLS and the Authorization header."""

    configuration: client.Configuration

    @property
    def host(self) -> str:
        return self.configuration.host

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header, if any. Asked per request, as the official client does: an
        in-cluster token is re-read by the Configuration's refresh hook."""
        bearer = self.configuration.auth_settings().get("BearerToken")
        if bearer and bearer.get("value"):
            return {"Authorization": str(bearer["value"])}
        return {}

    def ssl_context(self) -> ssl.SSLContext | bool:
        conf = self.configuration
        if not conf.host.startswith("https"):
            return False
        context = ssl.create_default_context(cafile=conf.ssl_ca_cert)
        if conf.cert_file:
            context.load_cert_chain(conf.cert_file, conf.key_file)
        if not conf.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


def load(kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """In a pod, its service account; elsewhere the kubeconfig (`kubeconfig`, else $KUBECONFIG,
    else ~/.kube/config), at its current context or `context`. NoCredentials when there is
    neither."""
    configuration = client.Configuration()
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config(client_configuration=configuration)
            return Credentials(configuration)
        except config.ConfigException:
            pass
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError) as err:
        raise NoCredentials(f"no credentials: not in a cluster, and no usable kubeconfig ({err})") from None
    return Credentials(configuration)


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str | None:
    """The namespace the kubeconfig's context names (the current one, or `context`), as kubectl
    reads it for a command given no -n; None if it names none, or there is no kubeconfig."""
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError):
        return None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    return ((chosen or {}).get("context") or {}).get("namespace") or None
