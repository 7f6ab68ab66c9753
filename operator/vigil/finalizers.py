"""`vigil release-finalizers`: removes Vigil's attempt-tracking finalizer from pods when no
operator will, so that nothing Vigil leaves behind keeps a pod Terminating or a namespace's
deletion hanging. The chart runs it as a pre-delete hook (`helm uninstall`); run it yourself
after removing Vigil any other way, or after narrowing `watchNamespaces` (for the namespaces no
longer watched).

The finalizer keeps a deleted pod until the operator has read how it ended. With no operator
left to read it, it keeps nothing but the pod. So the operator is stopped first
(`--stop-deployment`: its Deployment scaled to 0 and its pods awaited), since one still running
would put the finalizer on the next pod it creates. Every pod of the namespaces given is listed
(not only those Vigil labels: a label can be removed, the finalizer stays), a page at a time.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from vigil.core import fields, podstate
from vigil.kube.client import ApiClient, user_agent
from vigil.kube.config import Credentials
from vigil.kube.operations import Kube
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

STOP_POLL_SECONDS = 1.0


class OperatorStillRunning(RuntimeError):
    """The operator's pods outlived the wait: releasing now could race its next pod."""


@dataclass
class Released:
    pods: int = 0  # pods that carried the finalizer
    namespaces: set[str] = field(default_factory=set)


async def stop_operator(kube: Kube, namespace: str, name: str, timeout: float, clock: Clock = SYSTEM) -> bool:
    """Scales the operator's Deployment to 0 and waits until none of its pods is left; False
    if there is no such Deployment. OperatorStillRunning after `timeout` seconds."""
    selector = await kube.deployment_selector(namespace, name)
    if selector is None or not await kube.scale_deployment(namespace, name, 0):
        return False
    until = clock.monotonic() + timeout
    # The chart's pre-delete hook runs this in a pod of the release's namespace that carries the
    # release's labels, so the Deployment's selector matches it too: it is not the operator (in a
    # pod, the host name is the pod's name). Waiting for it would fail every uninstall.
    itself = socket.gethostname()
    while True:
        left = [pod async for page in kube.list_pods(namespace, selector) for pod in page if fields.name(pod) != itself]
        if not left:
            return True
        if clock.monotonic() >= until:
            names = ", ".join(fields.name(pod) for pod in left)
            raise OperatorStillRunning(
                f"the operator's pods in {namespace} ({names}) were still there after {timeout:g}s; "
                "releasing the finalizers now could race the next pod it creates"
            )
        await clock.sleep(STOP_POLL_SECONDS)


async def release_all(
    kube: Kube, scopes: Collection[str | None], accept: Callable[[Mapping[str, Any]], bool], dry_run: bool = False
) -> Released:
    """Removes the finalizer from every pod of `scopes` (a namespace, or None for all) that
    `accept` keeps and that carries it."""
    done = Released()
    for scope in scopes:
        async for page in kube.list_pods(scope):
            for pod in page:
                if not (accept(pod) and podstate.is_tracked(pod)):
                    continue
                namespace, name = fields.namespace(pod), fields.name(pod)
                if not dry_run:
                    await kube.release_pod(namespace, name, fields.uid(pod))
                log.info("%s %s/%s", "would release" if dry_run else "released", namespace, name)
                done.pods += 1
                done.namespaces.add(namespace)
    return done


def run(
    credentials: Credentials,
    namespaces: Collection[str],
    *,
    stop_deployment: tuple[str, str] | None = None,
    stop_timeout: float = 120.0,
    dry_run: bool = False,
) -> Released:
    """The command: stop the operator if asked, then release. Namespaces are as the operator's
    --namespace takes them (none: all; glob patterns allowed)."""
    from vigil.manager import watch_scopes  # the operator's own reading of the patterns

    scopes, accept = watch_scopes(namespaces)

    async def main() -> Released:
        http = ApiClient(credentials, user_agent(None, "release-finalizers"))
        try:
            kube = Kube(http)
            if stop_deployment is not None and not dry_run:
                stopped = await stop_operator(kube, *stop_deployment, stop_timeout)
                log.info("operator %s/%s %s", *stop_deployment, "stopped" if stopped else "not found: nothing to stop")
            return await release_all(kube, scopes, accept, dry_run)
        finally:
            await http.close()

    return asyncio.run(main())
