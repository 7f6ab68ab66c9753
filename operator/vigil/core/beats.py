"""Heartbeats posted to the leader, pure: who sent a beat, and what the leader answers.

A beat is `POST /v1/heartbeat` with the pod's projected service-account token (audience
`AUDIENCE`, made and rotated by the kubelet) as its bearer token, and a body naming the pod it
beats for. The token is verified here, against the cluster's service-account issuer keys (the
JSON Web Key Set the API server publishes at /openid/v1/jwks, fetched by the shell): a beat
costs no API request. The token proves which pod sent it, since the kubelet binds it to the pod
(the `kubernetes.io` claim names the pod and its UID), and the API server stops honouring it once
the pod is deleted; a leader that verifies it locally sees that deletion in its cache instead:
a beat for a pod it does not hold is refused.

What is checked, in order, each refusal saying why (never echoing the token):
- size: a token over MAX_TOKEN_BYTES or a body over MAX_BODY_BYTES is refused unread;
- the signature: the header's `kid` must name a key of the issuer (an unknown one makes the
  shell refresh the keys, at most every KEY_REFRESH_SECONDS), its `alg` must be the one that key
  is for (never `none`, never HMAC: a public key used as an HMAC secret would forge anything);
- the claims: `iss` the cluster's issuer, `aud` containing Vigil's audience (a token minted
  for another audience, such as the API server's own, is refused), `exp` in the future and
  `nbf`/`iat` not in the future, within LEEWAY_SECONDS of the operator's wall clock;
- the pod: the token's pod must be the one the body names (namespace, name and, when given, UID),
  so a pod can only ever beat for itself.

Times are passed in (`now`, epoch seconds): no clock is read here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from vigil.core.lru import Lru

AUDIENCE = "vigil.dev"  # the projected token's audience: a token for anything else is refused
PATH = "/v1/heartbeat"
MAX_TOKEN_BYTES = 8 * 1024  # a kubelet's projected token is about 1 KiB
MAX_BODY_BYTES = 1024  # a beat names a pod and carries a short counter
MAX_KEYS = 32  # an issuer publishes a few keys (rotation); more is not a key set
LEEWAY_SECONDS = 60.0  # clock skew between the API server and the operator tolerated on exp/nbf
KEY_REFRESH_SECONDS = 10.0  # an unknown key id refreshes the keys at most this often
# Connections the beat server holds from one address: a pod keeps one, and pods on their node's
# network share its address (the kubelet runs at most 110 pods by default).
CONNECTIONS_PER_SOURCE = 128
# Tokens whose signature is known good, one per beating pod: room for the seed's 50,000 in flight.
# An entry is a digest, a pod's identity and an expiry, about 0.4 KiB: at most ~26 MiB.
MAX_VERIFIED = 65_536
# Signature algorithms of asymmetric keys only (the API server signs with RS256 or ES256).
ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"})

RENEWED, SUPERSEDED, DELETING = "Renewed", "Superseded", "Deleting"


class Refused(Exception):
    """A beat that is not counted; `status` is the HTTP status to answer with, the message why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class UnknownKey(Refused):
    """The token names a key id the cached keys do not hold: refresh them, then ask again."""

    def __init__(self, kid: str) -> None:
        super().__init__(401, f"the token is signed by key {kid[:64]!r}, not a key of the cluster's issuer")
        self.kid = kid


@dataclass(frozen=True, slots=True)
class PodIdentity:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class IssuerKeys:
    """The service-account issuer and its public keys by key id."""

    issuer: str
    keys: Mapping[str, jwt.PyJWK]


def parse_jwks(issuer: str, document: bytes | str | Mapping[str, Any]) -> IssuerKeys:
    """The keys of a JSON Web Key Set (RFC 7517), asymmetric ones with a key id only."""
    doc = json.loads(document) if isinstance(document, bytes | str) else document
    entries = doc.get("keys") if isinstance(doc, Mapping) else None
    if not isinstance(entries, list):
        raise ValueError("a JSON Web Key Set has a list of keys")
    keys: dict[str, jwt.PyJWK] = {}
    for entry in entries[:MAX_KEYS]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("kid"), str):
            continue
        if entry.get("kty") not in ("RSA", "EC") or entry.get("use", "sig") != "sig":
            continue
        try:
            keys[entry["kid"]] = jwt.PyJWK(dict(entry))
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue  # a key this library cannot use is one no token of ours is signed with
    return IssuerKeys(issuer, keys)


def read_body(body: bytes) -> PodIdentity:
    """The pod a beat's body names; its uid is "" when the body gives none (it is optional)."""
    if len(body) > MAX_BODY_BYTES:
        raise Refused(413, f"a beat's body is at most {MAX_BODY_BYTES} bytes")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise Refused(400, 'a beat\'s body is JSON: {"namespace": ..., "name": ..., "uid": ...}') from None
    if not isinstance(doc, dict):
        raise Refused(400, "a beat's body is a JSON object")
    namespace, name, uid = doc.get("namespace"), doc.get("name"), doc.get("uid")
    if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
        raise Refused(400, "a beat names its pod: namespace and name (strings)")
    if uid is not None and not isinstance(uid, str):
        raise Refused(400, "a beat's uid is a string")
    return PodIdentity(namespace, name, uid or "")


def bearer(header: str | None) -> str:
    """The token of an `Authorization: Bearer TOKEN` header."""
    if not header:
        raise Refused(401, "a beat carries the pod's projected token: Authorization: Bearer TOKEN")
    if len(header) > MAX_TOKEN_BYTES + 7:
        raise Refused(401, f"the token is over {MAX_TOKEN_BYTES} bytes")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "a beat carries the pod's projected token: Authorization: Bearer TOKEN")
    return token.strip()


def verify(token: str, keys: IssuerKeys, now: float, audience: str = AUDIENCE) -> PodIdentity:
    """The pod a token was bound to, or Refused (UnknownKey: refresh the keys and retry)."""
    return _verify(token, keys, now, audience)[0]


@dataclass(frozen=True, slots=True)
class _Verified:
    identity: PodIdentity
    exp: float
    keys: IssuerKeys  # the key set the signature was checked against


class VerifiedTokens:
    """`verify`, remembering the tokens it found good. A pod sends the same token with every beat
    until the kubelet rotates it (at 80% of its life), and checking the signature is the dearest
    part of a beat (an RSA verification and the base64 of ~1 KiB), so it is checked once per
    token rather than once per beat. The same bytes under the same key set verify the same way;
    what changes with time is checked on every use: the expiry against `now`, and a refreshed key
    set (a rotation, a withdrawn key) verifies every token anew. Refused tokens are not kept. At
    most `entries` tokens are held, the least recently used going first; the key is the token's
    SHA-256, so a token is never kept in memory."""

    def __init__(self, entries: int = MAX_VERIFIED) -> None:
        self._held: Lru[bytes, _Verified] = Lru(entries)

    def __len__(self) -> int:
        return len(self._held)

    def verify(self, token: str, keys: IssuerKeys, now: float, audience: str = AUDIENCE) -> PodIdentity:
        if len(token) > MAX_TOKEN_BYTES:
            raise Refused(401, f"the token is over {MAX_TOKEN_BYTES} bytes")
        digest = hashlib.sha256(f"{audience}\n{token}".encode()).digest()
        held = self._held.get(digest)
        if held is not None and held.keys is keys:
            if now >= held.exp + LEEWAY_SECONDS:
                self._held.discard(digest)
                raise Refused(401, "the token has expired")
            return held.identity
        identity, exp = _verify(token, keys, now, audience)
        self._held.put(digest, _Verified(identity, exp, keys))
        return identity


def _verify(token: str, keys: IssuerKeys, now: float, audience: str) -> tuple[PodIdentity, float]:
    if len(token) > MAX_TOKEN_BYTES:
        raise Refused(401, f"the token is over {MAX_TOKEN_BYTES} bytes")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise Refused(401, "the token is not a JSON Web Token") from None
    kid, alg = header.get("kid"), header.get("alg")
    if not isinstance(kid, str) or not kid:
        raise Refused(401, "the token names no key id (kid)")
    if alg not in ALGORITHMS:
        raise Refused(401, f"the token's algorithm {str(alg)[:16]!r} is not an asymmetric signature")
    key = keys.keys.get(kid)
    if key is None:
        raise UnknownKey(kid)
    if key.algorithm_name != alg:
        raise Refused(401, f"the token's algorithm {alg} is not the one of key {kid[:64]!r}")
    try:
        # Time is checked below against the `now` given, not the library's clock.
        claims = jwt.decode(
            token,
            key.key,
            algorithms=[alg],
            audience=audience,
            issuer=keys.issuer,
            options={"verify_exp": False, "verify_nbf": False, "verify_iat": False, "require": ["exp"]},
        )
    except jwt.InvalidAudienceError:
        raise Refused(401, f"the token is not for audience {audience!r}: project one for it") from None
    except jwt.InvalidIssuerError:
        raise Refused(401, "the token is not of this cluster's service-account issuer") from None
    except jwt.InvalidSignatureError:
        raise Refused(401, "the token's signature does not verify") from None
    except jwt.PyJWTError as err:
        raise Refused(401, f"the token is refused: {type(err).__name__}") from None
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or now >= exp + LEEWAY_SECONDS:
        raise Refused(401, "the token has expired")
    for claim in ("nbf", "iat"):
        at = claims.get(claim)
        if at is not None and (not isinstance(at, int | float) or at > now + LEEWAY_SECONDS):
            raise Refused(401, f"the token is not valid yet ({claim})")
    return identity_of(claims), float(exp)


def identity_of(claims: Mapping[str, Any]) -> PodIdentity:
    k8s = claims.get("kubernetes.io")
    pod = k8s.get("pod") if isinstance(k8s, Mapping) else None
    if not isinstance(pod, Mapping) or not isinstance(k8s, Mapping):
        raise Refused(401, "the token is not bound to a pod: mount a projected service-account token")
    namespace, name, uid = k8s.get("namespace"), pod.get("name"), pod.get("uid")
    if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str)):
        raise Refused(401, "the token's pod claim lacks its namespace, name or uid")
    return PodIdentity(namespace, name, uid)


def check_claimed(token: PodIdentity, claimed: PodIdentity) -> None:
    """The pod a beat names must be the token's own."""
    if (claimed.namespace, claimed.name) != (token.namespace, token.name) or claimed.uid not in ("", token.uid):
        raise Refused(403, "the token is another pod's: a pod beats for itself only")


def answer(token: PodIdentity, pod: Mapping[str, Any] | None, superseded_annotation: str) -> str:
    """The state the leader answers for a verified beat, from its cache: `pod` is the pod of the
    token's UID it holds (None: not held). Refused(404) when it holds no such pod of a job."""
    if pod is None:
        raise Refused(404, "the leader holds no attempt pod of this UID (not seen yet, or not a Vigil attempt)")
    meta = pod.get("metadata") or {}
    if (meta.get("namespace"), meta.get("name")) != (token.namespace, token.name):
        raise Refused(403, "the token's pod and the pod of its UID differ")
    if superseded_annotation in (meta.get("annotations") or {}):
        return SUPERSEDED
    if meta.get("deletionTimestamp"):
        return DELETING
    return RENEWED
