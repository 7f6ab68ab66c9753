"""The one error hierarchy of Vigil's calls to the API server.

Every call through `vigil.kube.client.ApiClient` either returns the decoded answer or raises an
`ApiError`: the API server answered with an error status (the subclass says which outcome a
caller tells apart), or it did not answer at all (`Unreachable`, status 0). Callers catch these
and nothing else: no aiohttp, urllib3 or kubernetes-client exception leaves the client.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any


class ApiError(Exception):
    """An answer with an error status (`status` is the HTTP code), or none (`status` 0).

    `reason` is the Kubernetes Status reason when the server gave one (NotFound, Conflict,
    AlreadyExists, Forbidden, Invalid, ...); `verb` and `resource` say what was asked, once
    `vigil.kube.operations` has named the call (for metrics, logs and conditions)."""

    status: int = 0

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.reason, self.message = reason, message
        self.verb: str = ""
        self.resource: str = ""

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}" if self.status else self.message


class Refused(ApiError):
    """A request the API server will not carry out as sent: a bad request (400: a webhook's
    refusal), forbidden (403: RBAC, a quota, a policy) or invalid (422)."""


class Unauthorized(ApiError):
    """401: the credentials were refused (a deleted pod's token, or an API server that has just
    restarted and cannot look the token's pod up yet)."""

    status = 401


class NotFound(ApiError):
    """404: no such object (or namespace)."""

    status = 404


class Conflict(ApiError):
    """409: the object changed since it was read (a resourceVersion or UID precondition failed),
    or one of that name exists already (reason AlreadyExists)."""

    status = 409


class Expired(ApiError):
    """410: the resourceVersion a watch or list asked for is too old; list again."""

    status = 410


class TooLarge(ApiError):
    """An answer longer than the caller would read (`ApiClient.request`'s `max_bytes`); the rest
    of it was not read. A list asks again for fewer items a page."""


class Unreachable(ApiError):
    """No answer: the connection could not be made, broke, or a timeout passed. The request may
    or may not have reached the API server."""


class Stalled(Unreachable):
    """A watch delivered nothing, not even a bookmark, within its progress deadline."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: Refused,
    401: Unauthorized,
    403: Refused,
    404: NotFound,
    409: Conflict,
    410: Expired,
    422: Refused,
}


def from_status(status: int, body: bytes | str | dict[str, Any] | None) -> ApiError:
    """The error for an answer with this status and body (a Kubernetes Status, or anything)."""
    reason, message = _status_of(body)
    if not reason:
        try:
            reason = HTTPStatus(status).phrase.replace(" ", "")
        except ValueError:
            reason = ""
    kind = _BY_STATUS.get(status, ApiError)
    return kind(message or f"HTTP {status}", status=status, reason=reason)


def _status_of(body: bytes | str | dict[str, Any] | None) -> tuple[str, str]:
    if isinstance(body, dict):
        return str(body.get("reason") or ""), str(body.get("message") or "")
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        decoded = json.loads(text)
    except ValueError:
        return "", text[:200]
    if isinstance(decoded, dict):
        return str(decoded.get("reason") or ""), str(decoded.get("message") or text[:200])
    return "", text[:200]
