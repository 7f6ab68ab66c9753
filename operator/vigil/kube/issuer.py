"""The cluster's service-account issuer and its public keys, as the API server publishes them
(service-account issuer discovery, KEP-1393): /.well-known/openid-configuration names the issuer,
/openid/v1/jwks holds the keys. Every service account may read both (the default ClusterRole
binding system:service-account-issuer-discovery), so the operator needs no extra grant.

Fetched once at start, again every REFRESH_SECONDS (key rotation), and on demand when a token
names a key id not held (at most every `beats.KEY_REFRESH_SECONDS`: a flood of made-up key ids
costs at most one request per period).
"""

from __future__ import annotations

import asyncio
import logging

from vigil.core import beats
from vigil.kube.client import ApiClient
from vigil.kube.errors import ApiError
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

REFRESH_SECONDS = 3600.0  # the API server's keys change when its signing key is rotated
MAX_DOCUMENT_BYTES = 256 * 1024


def fetch_due(current: beats.IssuerKeys | None, age: float | None, unknown_kid: str | None) -> bool:
    """Whether to fetch the keys, holding `current` fetched `age` seconds ago (None: never
    fetched), asked for `unknown_kid` (None: any key)."""
    retry_ok = age is None or age >= beats.KEY_REFRESH_SECONDS  # failures and floods wait
    if current is None:
        return retry_ok
    if age is not None and age >= REFRESH_SECONDS:
        return True
    return unknown_kid is not None and unknown_kid not in current.keys and retry_ok


class IssuerKeySource:
    def __init__(self, client: ApiClient, clock: Clock = SYSTEM) -> None:
        self.client, self.clock = client, clock
        self.current: beats.IssuerKeys | None = None
        self.fetched_at: float | None = None
        self.fetches = 0
        self._lock = asyncio.Lock()  # a burst of beats at start fetches once

    async def keys(self, unknown_kid: str | None = None) -> beats.IssuerKeys | None:
        """The keys, fetched when none are held, when they are older than REFRESH_SECONDS, or
        when `unknown_kid` is not among them and the last fetch is older than the refresh
        period for unknown keys. None while they cannot be fetched.

        Every beat asks: when no fetch is due (nearly always) and none is running, the keys
        held are answered without taking the lock; a call during a fetch waits for its keys."""
        if not self._lock.locked() and not self._due(unknown_kid):
            return self.current
        async with self._lock:
            if self._due(unknown_kid):  # a fetch that ran while this call waited may have done
                await self._fetch()
            return self.current

    def held(self) -> beats.IssuerKeys | None:
        """The keys as they are now, when no fetch is due or running; else None (then `keys()`)."""
        if self._lock.locked() or self._due(None):
            return None
        return self.current

    def _due(self, unknown_kid: str | None) -> bool:
        age = None if self.fetched_at is None else self.clock.monotonic() - self.fetched_at
        return fetch_due(self.current, age, unknown_kid)

    async def _fetch(self) -> None:
        self.fetched_at = self.clock.monotonic()
        self.fetches += 1
        try:
            discovery = await self.client.request(
                "GET", "/.well-known/openid-configuration", max_bytes=MAX_DOCUMENT_BYTES
            )
            # Served only as application/jwk-set+json: a JSON Accept header is refused with 406.
            document = await self.client.request("GET", "/openid/v1/jwks", max_bytes=MAX_DOCUMENT_BYTES, as_bytes=True)
            issuer = (discovery or {}).get("issuer")
            if not isinstance(issuer, str) or not issuer:
                raise ValueError("the discovery document names no issuer")
            fetched = beats.parse_jwks(issuer, document or {})
        except (ApiError, ValueError) as err:
            log.warning("heartbeats: cannot fetch the service-account issuer's keys (%s); beats fall back to pods", err)
            return
        if self.current is None or dict(self.current.keys).keys() != dict(fetched.keys).keys():
            log.info("heartbeats: service-account issuer %s, %d key(s)", fetched.issuer, len(fetched.keys))
        self.current = fetched
