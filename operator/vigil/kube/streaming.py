"""A lean HTTP client for reading the API server: paginated lists and watch streams, over
aiohttp with the credentials of the official client's Configuration (client certificates, a
bearer token that may be refreshed, the cluster's CA).

Reads are the hot path (every heartbeat is a watch event, a pod of ~6 KB), so they go straight
from bytes to dicts, without the official client's model classes, and are decoded by orjson:
decoding was the largest cost of the operator under heartbeat load, and orjson takes 54 us for a
6 KB pod where `json.loads` takes 127 us. Writes go the same way, with the same credentials, in
`vigil.kube.client`. Every request is bounded: connecting, and each read, has a timeout; a watch's
reads are bounded by the caller's progress deadline.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from kubernetes import client

CONNECT_TIMEOUT_SECONDS = 5.0
LIST_TIMEOUT_SECONDS = 60.0
MAX_EVENT_BYTES = 64 * 1024 * 1024  # far above etcd's object limit (1.5 MiB): a cap, not a tuning


class ApiError(Exception):
    """The API server answered with an error status; `status` is the HTTP code (410: Gone)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class Stalled(Exception):
    """A watch delivered nothing, not even a bookmark, within its progress deadline."""


class ApiReader:
    """GET lists and watches from one API server, sharing one connection pool."""

    def __init__(self, configuration: client.Configuration, user_agent: str = "vigil"):
        self.configuration = configuration
        self.user_agent = user_agent  # the process's, as on its writes (election.user_agent)
        self.base = configuration.host.rstrip("/")
        self._ssl = ssl_context(configuration)
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        return {"Accept": "application/json", "User-Agent": self.user_agent, **auth_headers(self.configuration)}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=16),
                timeout=aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT_SECONDS, sock_connect=CONNECT_TIMEOUT_SECONDS),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, path: str, params: Mapping[str, str], timeout: float = LIST_TIMEOUT_SECONDS) -> dict:
        """One GET, decoded; ApiError for an error status."""
        async with self.session.get(
            self.base + path,
            params=params,
            headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=timeout, connect=CONNECT_TIMEOUT_SECONDS),
        ) as response:
            body = await response.read()
            if response.status >= 400:
                raise ApiError(response.status, _message(body))
            return orjson.loads(body)

    async def list_all(self, path: str, params: Mapping[str, str], page: int = 500) -> tuple[list[dict], str]:
        """Every item, page by page (one consistent snapshot), and the list's resourceVersion."""
        items: list[dict] = []
        token = ""
        while True:
            query = {**params, "limit": str(page)}
            if token:
                query["continue"] = token
            body = await self.get(path, query)
            items.extend(body.get("items") or [])
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return items, metadata.get("resourceVersion", "")

    async def watch(
        self,
        path: str,
        params: Mapping[str, str],
        progress_deadline: float,
        on_bytes: Callable[[], None],
        pace: float = 0.0,
    ) -> AsyncIterator[dict]:
        """The events of one watch request, decoded, until the server ends it. Raises Stalled when
        no bytes at all arrive for `progress_deadline` seconds (a half-open connection), ApiError
        when the server answers with an error or sends an ERROR event (410 when resourceVersion is
        too old). `on_bytes` is called when the server accepts the watch, and whenever bytes
        arrive: the connection is alive.

        `pace` > 0: after each read the connection is not read for `pace` seconds, so the events
        of that time wait in the socket and come in one read, one TLS decryption pass and one
        HTTP parse. A busy watch then costs a few reads a second instead of one per event, for at
        most `pace` seconds of added delay."""
        async with self.session.get(
            self.base + path,
            params={**params, "watch": "1", "allowWatchBookmarks": "true"},
            headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_SECONDS, sock_read=None),
        ) as response:
            if response.status >= 400:
                raise ApiError(response.status, _message(await response.read()))
            on_bytes()
            buffer = b""
            while True:
                try:
                    async with asyncio.timeout(progress_deadline):
                        chunk = await response.content.readany()
                except TimeoutError:
                    raise Stalled(f"no event or bookmark for {progress_deadline:g}s") from None
                if not chunk:
                    return  # the server ended the watch (its timeoutSeconds): resume from the last version
                on_bytes()
                buffer += chunk
                if len(buffer) > MAX_EVENT_BYTES:
                    raise ApiError(0, f"a watch event over {MAX_EVENT_BYTES} bytes")
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise ApiError(int(status.get("code") or 500), status.get("message", "watch error"))
                    yield event
                if pace > 0 and response.connection is not None:
                    await _rest(response.connection.transport, pace)


async def _rest(transport: asyncio.Transport | None, seconds: float) -> None:
    """Leave a connection unread for `seconds`: what arrives meanwhile waits in the socket."""
    if transport is None or transport.is_closing():
        return
    transport.pause_reading()
    try:
        await asyncio.sleep(seconds)
    finally:
        if not transport.is_closing():
            transport.resume_reading()


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message", body[:200]))
    except ValueError:
        return body[:200].decode(errors="replace")


def auth_headers(configuration: client.Configuration) -> dict[str, str]:
    """The Authorization header, if any. Asked per request, as the official client does: an
    in-cluster token is re-read by the Configuration's refresh hook."""
    bearer = configuration.auth_settings().get("BearerToken")
    if bearer and bearer.get("value"):
        return {"Authorization": bearer["value"]}
    return {}


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext | bool:
    if not configuration.host.startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def resource_path(group: str, version: str, plural: str, namespace: str | None) -> str:
    """The collection's URL path, across all namespaces when `namespace` is None."""
    prefix = "/api/v1" if group == "" else f"/apis/{group}/{version}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


# Client-side `kubectl apply` (the default, and Argo CD's) copies the whole manifest into this
# annotation: for a VigilJob, a second copy of its template that Vigil never reads.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    """Drops what Vigil never reads and what makes objects large, in place: managedFields and
    kubectl's last-applied copy. Every object Vigil keeps goes through here: a VigilJob's
    managedFields are half of it in memory (about 14 of 27 KB as Python objects). What is dropped
    is never written back: Vigil's writes are patches of named fields, and a pod is built from
    the job's spec.template, kept whole."""
    metadata = obj.get("metadata", {})
    metadata.pop("managedFields", None)
    annotations = metadata.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        del annotations[LAST_APPLIED]
    return obj
