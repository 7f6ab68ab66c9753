"""`vigil migrate-storage`: writes every VigilJob and VigilQueue of the cluster once, unchanged,
so that etcd holds them all at the storage version (`api.VERSION`), then records that in each
CRD's `status.storedVersions`. Run it after applying a release's CRDs that changed the storage
version (docs/upgrading.md); a later release may then stop serving the old version. The decisions
(what to write, what an error means) are `vigil.core.storage`'s.

Objects are listed a page at a time as metadata only (name, namespace, resourceVersion: a page of
jobs with large templates costs no more than one of small ones), and written no faster than a
token bucket lets them. Nothing of an object's spec or status changes: the write is a merge patch
carrying its resourceVersion alone, which the API server stores re-encoded at the storage version
(and a running operator sees as an update that changes nothing it reads).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from vigil import api
from vigil.api.crd import CRD_NAME, QUEUE_CRD_NAME
from vigil.core import storage
from vigil.core.ratelimit import TokenBucket
from vigil.kube.client import MERGE_PATCH, METADATA_LIST, ApiClient, resource_path, user_agent
from vigil.kube.config import Credentials
from vigil.kube.errors import ApiError
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
METADATA_ITEM = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
RESOURCES = ((api.PLURAL, CRD_NAME), (api.QUEUE_PLURAL, QUEUE_CRD_NAME))


class MigrationFailed(RuntimeError):
    """An object could not be rewritten (or the CRD's status not recorded): storedVersions was
    left as it was, and running the command again resumes the work."""


@dataclass
class Migrated:
    """What one run did, by resource (plural)."""

    rewritten: dict[str, int] = field(default_factory=dict)
    gone: dict[str, int] = field(default_factory=dict)  # deleted between the list and the write
    already: list[str] = field(default_factory=list)  # CRDs whose storedVersions was already the version alone


class Migration:
    def __init__(
        self,
        http: ApiClient,
        *,
        rate: float = storage.DEFAULT_RATE,
        page: int = storage.DEFAULT_PAGE,
        clock: Clock = SYSTEM,
        dry_run: bool = False,
    ) -> None:
        self.http, self.page, self.clock, self.dry_run = http, page, clock, dry_run
        self.bucket = TokenBucket(rate, 1)
        self.done = Migrated()

    async def run(self) -> Migrated:
        """Every resource of RESOURCES; each CRD is checked before any object is written."""
        states = {}
        for plural, crd_name in RESOURCES:
            state = storage.CrdState.of(await self.http.request("GET", f"{CRDS}/{crd_name}"))
            storage.check_ready(state, api.VERSION)
            states[plural] = state
        for plural, crd_name in RESOURCES:
            state = states[plural]
            if storage.migrated(state, api.VERSION):
                log.info("%s: storedVersions is already [%s]: nothing to migrate", crd_name, api.VERSION)
                self.done.already.append(crd_name)
                continue
            await self.rewrite_all(plural)
            if self.dry_run:
                continue
            try:
                await self.http.request(
                    "PATCH",
                    f"{CRDS}/{crd_name}/status",
                    body=storage.stored_versions_patch(state, api.VERSION),
                    content_type=MERGE_PATCH,
                )
            except ApiError as err:
                raise MigrationFailed(
                    f"every {plural} object was rewritten, but recording storedVersions [{api.VERSION}] on {crd_name} "
                    f"failed: {err} (a 409: the CRD changed during the migration; run the command again)"
                ) from err
            log.info("%s: storedVersions is now [%s] (it was %s)", crd_name, api.VERSION, list(state.stored_versions))
        return self.done

    async def rewrite_all(self, plural: str) -> None:
        """Every object of `plural` in the cluster, page by page; a continue token that expired
        starts the list again (writing again what was written changes nothing)."""
        path = resource_path(api.GROUP, api.VERSION, plural, None)
        token = ""
        while True:
            query = {"limit": str(self.page), **({"continue": token} if token else {})}
            try:
                body = await self._with_retries(
                    partial(self.http.request, "GET", path, params=query, accept=METADATA_LIST)
                )
            except ApiError as err:
                if token and storage.list_restarts(err.status):
                    log.info("%s: the list's continue token expired; listing again from the start", plural)
                    token = ""
                    continue
                raise MigrationFailed(f"listing {plural} failed: {err}") from err
            for item in (body or {}).get("items") or ():
                await self.rewrite(plural, item)
            token = ((body or {}).get("metadata") or {}).get("continue") or ""
            if not token:
                return

    async def rewrite(self, plural: str, item: dict) -> None:
        """One object written unchanged, fenced by its resourceVersion; a conflict reads it again."""
        metadata = item.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        path = f"{resource_path(api.GROUP, api.VERSION, plural, namespace)}/{name}"
        conflicts = transient = 0
        current = item
        while True:
            try:
                if self.dry_run:
                    log.info("would rewrite %s %s/%s", plural, namespace, name)
                else:
                    await self._paced()
                    await self.http.request(
                        "PATCH", path, body=storage.rewrite_patch(current), content_type=MERGE_PATCH
                    )
                    log.debug("rewrote %s %s/%s", plural, namespace, name)
                self.done.rewritten[plural] = self.done.rewritten.get(plural, 0) + 1
                return
            except ApiError as err:
                conflicts += err.status == 409
                transient += err.status in storage.TRANSIENT_STATUSES
                step = storage.after_error(err.status, conflicts, transient)
                if step is storage.Next.GONE:
                    self.done.gone[plural] = self.done.gone.get(plural, 0) + 1
                    return
                if step is storage.Next.FAIL:
                    raise MigrationFailed(f"rewriting {plural} {namespace}/{name} failed: {err}") from err
                if step is storage.Next.WAIT:
                    await self.clock.sleep(storage.transient_delay(transient))
                    continue
                try:  # REREAD: the version that is there now
                    current = await self._with_retries(partial(self.http.request, "GET", path, accept=METADATA_ITEM))
                except ApiError as again:
                    if again.status == 404:
                        self.done.gone[plural] = self.done.gone.get(plural, 0) + 1
                        return
                    raise MigrationFailed(f"reading {plural} {namespace}/{name} again failed: {again}") from again

    async def _paced(self) -> None:
        while not self.bucket.take(self.clock.monotonic()):
            # at least 1 ms: a delay computed to the last bit can leave the bucket a rounding short
            await self.clock.sleep(max(0.001, self.bucket.delay(self.clock.monotonic())))

    async def _with_retries(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """A read, tried again after no answer, 429 or 5xx (storage.after_error's bound)."""
        transient = 0
        while True:
            try:
                return await call()
            except ApiError as err:
                if err.status not in storage.TRANSIENT_STATUSES:
                    raise
                transient += 1
                if storage.after_error(err.status, 0, transient) is not storage.Next.WAIT:
                    raise
                await self.clock.sleep(storage.transient_delay(transient))


def run(
    credentials: Credentials,
    *,
    rate: float = storage.DEFAULT_RATE,
    page: int = storage.DEFAULT_PAGE,
    dry_run: bool = False,
) -> Migrated:
    """The command: NotReady if a CRD does not store api.VERSION yet, MigrationFailed if an
    object could not be rewritten; else what was done."""

    async def main() -> Migrated:
        http = ApiClient(credentials, user_agent(None, "migrate-storage"))
        try:
            return await Migration(http, rate=rate, page=page, dry_run=dry_run).run()
        finally:
            await http.close()

    return asyncio.run(main())
