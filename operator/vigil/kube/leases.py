"""One `coordination.k8s.io/v1` Lease, read and written for leader election.

`LeaseStore` is given an `ApiClient` of its own (the operator makes one for its Lease), so
renewals never queue behind the operator's writes or share their connections; each call is
bounded by `request_timeout`, and nothing here retries: the elector retries on its own schedule.
Writes carry a field manager of their own, so the API server's audit log tells election writes
apart. Errors are those of `vigil.kube.errors`: `Conflict` when someone wrote first (or created
the Lease first), `NotFound` when the Lease was deleted, any other `ApiError` otherwise.

It remembers the last Lease object it read or wrote, to keep the Lease's metadata (labels,
annotations, owner references) and unknown spec fields on update, as client-go does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from vigil.core import fields
from vigil.core.election import LeaseRecord
from vigil.kube.client import ApiClient
from vigil.kube.errors import NotFound

FIELD_MANAGER = "vigil-leader-election"


class LeaseStore:
    def __init__(self, client: ApiClient, namespace: str, name: str, request_timeout: float = 5.0) -> None:
        self.client = client
        self.namespace, self.name = namespace, name
        self.request_timeout = request_timeout
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
        self._path = f"{self._collection}/{quote(name, safe='')}"
        self._object: dict[str, Any] | None = None

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _keep(self, obj: dict[str, Any]) -> tuple[LeaseRecord, str]:
        # Only ever called with an answer awaited on the event loop: a call abandoned by its
        # timeout never completes later and overwrites what is remembered.
        self._object = obj
        return LeaseRecord.from_spec(obj.get("spec")), fields.resource_version(obj)

    async def get(self) -> tuple[LeaseRecord, str] | None:
        """The record and its resourceVersion; None when there is no such Lease."""
        try:
            obj = await self.client.request("GET", self._path, timeout=self.request_timeout)
        except NotFound:
            return None
        return self._keep(obj)

    async def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        obj = await self.client.request(
            "POST", self._collection, params={"fieldManager": FIELD_MANAGER}, body=lease, timeout=self.request_timeout
        )
        return self._keep(obj)

    async def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        """Writes `record` if the Lease is still at `version` (else Conflict)."""
        base = self._object or {"metadata": {"name": self.name, "namespace": self.namespace}}
        metadata = {k: v for k, v in fields.metadata(base).items() if k != "managedFields"}
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {**metadata, "resourceVersion": version},
            "spec": {**fields.spec(base), **record.to_spec()},
        }
        obj = await self.client.request(
            "PUT", self._path, params={"fieldManager": FIELD_MANAGER}, body=lease, timeout=self.request_timeout
        )
        return self._keep(obj)
