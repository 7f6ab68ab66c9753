"""The leader's mark on its own pod, `vigil.dev/leader: <lease name>`, which the admission
webhook's Service selects, so that one replica, one watch, answers admission (docs/admission.md:
the overshoot of a burst is what the answering replica's watch has not shown yet).

The leader sets the mark on its pod as it begins to act, and removes it from every other pod
that carries it: a deposed leader exits fenced, unable to write, and its restarted container
(same pod) would otherwise keep the mark while it stands by. A leader that releases the Lease on
SIGTERM removes its own mark first, so the Service empties until the next leader marks its pod
(the webhook's failurePolicy decides meanwhile). The value is the Lease's name, so two
installations in one namespace never clear each other's marks. A process not in a pod
(POD_NAME and POD_NAMESPACE unset) has nothing to mark.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vigil.core import fields
from vigil.core.election import mark_changes
from vigil.kube.operations import Kube
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

LEADER_LABEL = "vigil.dev/leader"
MARK_RETRY_SECONDS = 2.0  # until the mark is placed; meanwhile the webhook's failurePolicy applies


@dataclass(frozen=True)
class OwnPod:
    namespace: str
    name: str

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> OwnPod | None:
        """The pod this process runs in, from the downward API (the chart sets both)."""
        namespace, name = environ.get("POD_NAMESPACE"), environ.get("POD_NAME")
        return cls(namespace, name) if namespace and name else None


class LeaderMark:
    """Places and removes the mark; every write is the leader's, so the fence lets it pass."""

    def __init__(self, kube: Kube, pod: OwnPod, lease: str, clock: Clock = SYSTEM) -> None:
        self.kube, self.pod, self.lease, self.clock = kube, pod, lease, clock
        self._claiming: asyncio.Task | None = None

    async def start(self) -> None:
        """This process leads: its pod is marked, in the background (`claim`)."""
        self._claiming = asyncio.ensure_future(self.claim())

    async def stop(self) -> None:
        """Leading ends: the claim is given up and this pod's mark removed (`drop`)."""
        if self._claiming is not None:
            self._claiming.cancel()
            await asyncio.gather(self._claiming, return_exceptions=True)
        await self.drop()

    async def claim(self) -> None:
        """Marks this pod and unmarks the others, retrying until done (cancel to give up)."""
        while True:
            try:
                listed = await self.kube.list_labelled_pods(self.pod.namespace, f"{LEADER_LABEL}={self.lease}")
                pods = {fields.name(pod): pod for pod in listed}
                own = pods.get(self.pod.name) or await self.kube.read_pod(*self.pod.key)
                if own is None:
                    raise RuntimeError(f"pod {self.pod.namespace}/{self.pod.name} not found")
                pods[self.pod.name] = own
                for name, value in mark_changes(self.pod.name, self.lease, pods).items():
                    # Each write only on the pod as read (a Conflict: read again, in the retry).
                    await self._label(pods[name], value)
                log.info("marked pod %s/%s as the leader (%s=%s)", *self.pod.key, LEADER_LABEL, self.lease)
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - retried; the webhook's failurePolicy covers the gap
                log.warning("could not mark this pod as the leader (retrying in %.0f s): %s", MARK_RETRY_SECONDS, err)
                await self.clock.sleep(MARK_RETRY_SECONDS)

    async def drop(self) -> None:
        """Removes this pod's mark, once, before the Lease is released."""
        try:
            # By the selector, as `claim` reads: a pod as Vigil keeps it (strip_pod) has no mark.
            listed = await self.kube.list_labelled_pods(self.pod.namespace, f"{LEADER_LABEL}={self.lease}")
            own = next((pod for pod in listed if fields.name(pod) == self.pod.name), None)
            if own is not None:
                await self._label(own, None)
        except Exception as err:  # noqa: BLE001 - the next leader clears it
            log.warning("could not remove the leader mark from this pod: %s", err)

    async def _label(self, pod: Mapping[str, Any], value: str | None) -> None:
        await self.kube.label_pod(
            self.pod.namespace, fields.name(pod), fields.uid(pod), fields.resource_version(pod), {LEADER_LABEL: value}
        )
