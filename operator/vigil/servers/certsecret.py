"""The operator's own certificates, kept (`vigil operator --self-managed-certs-secret`): the
Secret read and written, the files written for the servers, the webhook's caBundle kept. What
the Secret should hold is `vigil.core.certs`'s decision.

Every replica does this at start, before any TLS server starts (the servers need the files),
then every hour: a renewal, or a Secret someone replaced, is picked up there. Writes are fenced
by resourceVersion, so replicas starting together agree: the first create wins (409
AlreadyExists: read theirs), a stale update is refused (409: read again, decide again). The
servers' `ServingCertificate` reloads the files within seconds of them changing. No key
material is ever logged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from vigil.core import certs
from vigil.kube.errors import ApiError, Conflict, NotFound
from vigil.runtime.background import Background
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

RECHECK_SECONDS = 3600.0  # renewal, and a Secret replaced by someone else
RETRY_SECONDS = 10.0  # after a failed check, or while the webhook configuration is not there yet
ATTEMPTS = 5  # reads and writes in a row lost to other writers before a check gives up for now
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


class Api(Protocol):
    async def request(self, method: str, path: str, *, body: Any = None) -> Any: ...


class CertificateKeeper:
    """`ensure()` once at start (before the servers); `start()` then re-checks every hour."""

    def __init__(self, api: Api, managed: certs.Managed, *, clock: Clock = SYSTEM, ca_name: str = "vigil-ca") -> None:
        self.api, self.managed, self.clock, self.ca_name = api, managed, clock, ca_name
        self.path = f"/api/v1/namespaces/{managed.namespace}/secrets/{managed.secret}"
        self.ca_pem = b""
        self.bundle_kept = managed.webhook_configuration is None
        self._watching = Background(self._watch)

    async def ensure(self) -> bytes:
        """The Secret as it should be, its files written and the caBundle kept; the CA (PEM).
        Raises ApiError when the API server does not let it."""
        for _ in range(ATTEMPTS):
            secret = await self._read()
            held = _decoded(secret) if secret is not None else None
            plan = certs.decide(held, self.managed.leaves, self.clock.wall(), self.ca_name)
            if plan.changed:
                for reason in plan.reasons:
                    log.info("certificates in Secret %s: %s", self.managed.secret, reason)
                try:
                    await self._write(secret, plan.data)
                except Conflict:  # another replica wrote first: read theirs and decide again
                    log.info(
                        "Secret %s was written by another replica meanwhile: reading it again", self.managed.secret
                    )
                    continue
            self._write_files(plan.data)
            self.ca_pem = plan.data["ca.crt"]
            await self._keep_bundle()
            return self.ca_pem
        raise ApiError(f"Secret {self.managed.secret}: lost {ATTEMPTS} writes in a row to other writers")

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await self.api.request("GET", self.path)
        except NotFound:
            return None

    async def _write(self, secret: dict[str, Any] | None, data: Mapping[str, bytes]) -> None:
        encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
        if secret is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": self.managed.secret,
                    "namespace": self.managed.namespace,
                    "labels": {"app.kubernetes.io/name": "vigil", "app.kubernetes.io/component": "certificates"},
                },
                "data": encoded,
            }
            await self.api.request("POST", f"/api/v1/namespaces/{self.managed.namespace}/secrets", body=body)
        else:
            # A PUT with the resourceVersion read: refused (409) if anyone wrote since.
            body = {**secret, "data": encoded}
            body.pop("stringData", None)
            await self.api.request("PUT", self.path, body=body)

    def _write_files(self, data: Mapping[str, bytes]) -> None:
        directory = self.managed.directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        names = ["ca.crt", *(k for leaf in self.managed.leaves for k in leaf.keys)]
        for name in names:
            _replace(directory / name, data[name])

    async def _keep_bundle(self) -> None:
        """Every webhook of the configuration trusts the CA; a 409 reads it again."""
        name = self.managed.webhook_configuration
        if name is None:
            return
        bundle = base64.b64encode(self.ca_pem).decode()
        for _ in range(ATTEMPTS):
            try:
                config = await self.api.request("GET", f"{WEBHOOKS}/{name}")
            except NotFound:
                # Applied with the Deployment in one file, it may come a moment later.
                log.warning("ValidatingWebhookConfiguration %s not found yet: its caBundle is set when it is", name)
                self.bundle_kept = False
                return
            webhooks = config.get("webhooks") or []
            if all((w.get("clientConfig") or {}).get("caBundle") == bundle for w in webhooks):
                self.bundle_kept = True
                return
            for webhook in webhooks:
                webhook.setdefault("clientConfig", {})["caBundle"] = bundle
            try:
                await self.api.request("PUT", f"{WEBHOOKS}/{name}", body=config)
            except Conflict:
                continue
            log.info(
                "ValidatingWebhookConfiguration %s: caBundle set to the CA of Secret %s", name, self.managed.secret
            )
            self.bundle_kept = True
            return
        raise ApiError(f"ValidatingWebhookConfiguration {name}: lost {ATTEMPTS} writes in a row to other writers")

    async def start(self) -> None:
        self._watching.start()

    async def stop(self) -> None:
        await self._watching.stop()

    async def _watch(self) -> None:
        wait = RETRY_SECONDS if not self.bundle_kept else RECHECK_SECONDS
        while True:
            await self.clock.sleep(wait)
            try:
                await self.ensure()
            except (ApiError, OSError) as err:
                log.warning(
                    "certificates in Secret %s: not checked (%s); again in %gs", self.managed.secret, err, RETRY_SECONDS
                )
                wait = RETRY_SECONDS
                continue
            wait = RECHECK_SECONDS if self.bundle_kept else RETRY_SECONDS


async def ensure_at_start(keeper: CertificateKeeper, stopping: asyncio.Event, clock: Clock = SYSTEM) -> bytes | None:
    """`keeper.ensure()` until it succeeds (the API server may not answer yet), or None once
    `stopping` is set: no server can start without its files."""
    while True:
        try:
            return await keeper.ensure()
        except (ApiError, OSError) as err:
            log.warning("certificates in Secret %s: not ready (%s); trying again", keeper.managed.secret, err)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), RETRY_SECONDS)
        if stopping.is_set():
            return None


def _decoded(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """The Secret's data as bytes; a value that is not base64 is kept as it came (decide then
    says it is not PEM)."""
    out: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            out[key] = str(value).encode()
    return out


def _replace(path: Path, content: bytes) -> None:
    """`content` into `path` at once (a temporary file renamed over it), if it differs; only
    the owner reads it (keys)."""
    with contextlib.suppress(OSError):
        if path.read_bytes() == content:
            return
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
