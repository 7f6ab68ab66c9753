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

A token's check is the dearest thing a beat costs (0.3-0.8 ms: the base64 and JSON of up to
8 KiB, then the signature), and anyone who can reach the port may ask for one, so
`VerifiedTokens` checks a token at most once: a good one is remembered until it expires (no
budget spent on it, ever), a refused one for REFUSED_TTL_SECONDS (the same junk repeated costs a
dictionary lookup), and a token in neither is checked only within a budget of checks, per source
address and in all (`VerificationBudget`); past it the beat is refused at once (OverBudget: 503
with a Retry-After, and the agent beats by its pod annotation meanwhile).

Times are passed in (`now`, epoch seconds): no clock is read here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt

from vigil.core.lru import Lru
from vigil.core.ratelimit import SourceBudget

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
# Tokens whose signature is known good, one per beating pod: room for the 50,000 attempts in flight
# docs/capacity-planning.md sizes for.
# An entry is a digest, a pod's identity and an expiry, about 0.4 KiB: at most ~26 MiB.
MAX_VERIFIED = 65_536
# Tokens refused, by digest, for REFUSED_TTL_SECONDS (a refusal under a key set the issuer has
# since replaced is not believed): at most MAX_REFUSED, about 0.3 KiB each (~1.3 MiB).
REFUSED_TTL_SECONDS = 30.0
MAX_REFUSED = 4096

# The budget of checks of tokens not remembered (`VerificationBudget`). A check costs ~0.4 ms of
# the event loop for a pod's ~1 KiB RS256 token, ~0.8 ms for 8 KiB of junk with a valid-looking
# header (measured on the bed, PyJWT 2.15).
# - Steady: 50,000 beating pods each bring a new token once an hour or so (the kubelet rotates
#   it at 80% of its 1 h life): 50,000 / 3,600 s = ~14 checks a second, far under the budget.
# - A leader change: the new leader remembers no token, so every pod's next beat is a check,
#   spread over one beat interval by the pods' phases (10 s by default): 10,000 pods bring
#   1,000 a second for 10 s. The global burst (5,000) and rate (500/s) pass 5,000 + 10 * 500 =
#   10,000 in 10 s: their re-verification takes one interval, as without a budget, at 20% of a
#   core. 50,000 pods take 5,000 + 500 * t = 50,000, t = 90 s (about 9 intervals; the pods past
#   the budget beat by annotation meanwhile); the leader could not do much more anyway, since
#   50,000 checks are 20 s of its one event loop, before the 50,000 TLS handshakes.
# - A flood: one address gets SOURCE_CHECKS_PER_SECOND (2, burst 20) whatever it sends, at most
#   1.6 ms of the loop a second for 8 KiB of junk; it takes 250 addresses (attacking pods) to
#   reach the global rate, which bounds the loop's share at 500 * 0.8 ms = 40% of a core,
#   whatever the number of addresses. Tokens already verified spend no budget: a flood refuses
#   no pod whose token is known, only new tokens, and those from other addresses only once the
#   global budget is spent. The per-address burst is the connections one address may hold
#   (`CONNECTIONS_PER_SOURCE`, 128; at least SOURCE_CHECK_BURST), since each holds at most one
#   pod's token: the pods of one node behind one address (hostNetwork pods, 110 at most) all
#   re-verify at once after a leader change, and a flood from one address gets ~0.1 s of the
#   loop once, then 2 checks a second.
CHECKS_PER_SECOND = 500.0
CHECK_BURST = 5_000
SOURCE_CHECKS_PER_SECOND = 2.0
SOURCE_CHECK_BURST = 20
CHECK_SOURCES = 8192  # addresses whose budgets are kept, ~2 MiB (a new one comes back full)
# Past the budget the agent is asked to rest this long (beating by annotation meanwhile): about
# one and a half default intervals, so a pod refused in a leader change's rush asks again once
# the rush is over, not every beat.
OVER_BUDGET_RETRY_SECONDS = 15

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


class OverBudget(Refused):
    """The token is not remembered and the budget of checks is spent (its source's or all
    sources'): not checked, and no verdict on it. Answered 503 with a Retry-After of
    OVER_BUDGET_RETRY_SECONDS."""

    def __init__(self) -> None:
        super().__init__(503, "too many new tokens to verify now: beat by the pod annotation, retry later")


@dataclass(frozen=True, slots=True)
class PodIdentity:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class IssuerKeys:
    """The service-account issuer and its public keys by key id. `fingerprint` (parse_jwks'
    digest of the issuer and the keys kept; "" when not made by it) tells a key set fetched
    again unchanged from a new one: the tokens verified under the first stay verified."""

    issuer: str
    keys: Mapping[str, jwt.PyJWK]
    fingerprint: str = field(default="", compare=False)

    def same_as(self, other: IssuerKeys) -> bool:
        return self is other or (bool(self.fingerprint) and self.fingerprint == other.fingerprint)


@dataclass
class VerificationBudget(SourceBudget):
    """Checks of tokens not remembered: `rate` a second in all (at most `burst` at once), and
    `source_rate` a second from any one address (at most `source_burst` at once). Monotonic
    times."""

    rate: float = CHECKS_PER_SECOND
    burst: int = CHECK_BURST
    source_rate: float = SOURCE_CHECKS_PER_SECOND
    source_burst: int = SOURCE_CHECK_BURST
    sources: int = CHECK_SOURCES


def parse_jwks(issuer: str, document: bytes | str | Mapping[str, Any]) -> IssuerKeys:
    """The keys of a JSON Web Key Set (RFC 7517), asymmetric ones with a key id only."""
    doc = json.loads(document) if isinstance(document, bytes | str) else document
    entries = doc.get("keys") if isinstance(doc, Mapping) else None
    if not isinstance(entries, list):
        raise ValueError("a JSON Web Key Set has a list of keys")
    keys: dict[str, jwt.PyJWK] = {}
    kept: dict[str, Mapping[str, Any]] = {}
    for entry in entries[:MAX_KEYS]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("kid"), str):
            continue
        if entry.get("kty") not in ("RSA", "EC") or entry.get("use", "sig") != "sig":
            continue
        try:
            keys[entry["kid"]] = jwt.PyJWK(dict(entry))
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue  # a key this library cannot use is one no token of ours is signed with
        kept[entry["kid"]] = entry
    canonical = json.dumps([issuer, kept], sort_keys=True, separators=(",", ":"), default=str)
    return IssuerKeys(issuer, keys, hashlib.sha256(canonical.encode()).hexdigest())


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


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A refusal as data: not the exception, whose traceback would keep the token alive."""

    status: int
    why: str
    kid: str | None  # an UnknownKey's: raised as one again, so the caller refreshes the keys
    keys: IssuerKeys  # the key set it was refused under
    at: float

    @classmethod
    def of(cls, refused: Refused, keys: IssuerKeys, now: float) -> _Refusal:
        kid = refused.kid if isinstance(refused, UnknownKey) else None
        return cls(refused.status, str(refused), kid, keys, now)

    def again(self) -> Refused:
        return UnknownKey(self.kid) if self.kid is not None else Refused(self.status, self.why)


def always() -> bool:
    return True


class VerifiedTokens:
    """`verify`, remembering what it found. A pod sends the same token with every beat until the
    kubelet rotates it (at 80% of its life), and checking it is the dearest part of a beat, so it
    is checked once per token rather than once per beat. The same bytes under the same key set
    verify the same way; what changes with time is checked on every use: the expiry against
    `now`, and a key set that changed (a rotation, a withdrawn key) verifies every token anew (one
    fetched again unchanged does not: `IssuerKeys.same_as`). At most `entries` good tokens are
    held, the least recently used going first.

    Refused tokens are remembered too, apart (so junk never pushes a pod's good token out): at
    most `refused_entries`, each for REFUSED_TTL_SECONDS, so the same junk posted again is
    refused by a lookup, not another check. Only a token in neither is checked, and only when
    `may_check()` allows it (a budget, `VerificationBudget`), else OverBudget, which is not
    remembered. The keys are the token's SHA-256 (with the audience), so a token is never kept in
    memory."""

    def __init__(self, entries: int = MAX_VERIFIED, refused_entries: int = MAX_REFUSED) -> None:
        self._held: Lru[bytes, _Verified] = Lru(entries)
        self._refused: Lru[bytes, _Refusal] = Lru(refused_entries)

    def __len__(self) -> int:
        """The good tokens remembered."""
        return len(self._held)

    def refused(self) -> int:
        """The refused tokens remembered."""
        return len(self._refused)

    def verify(
        self,
        token: str,
        keys: IssuerKeys,
        now: float,
        audience: str = AUDIENCE,
        may_check: Callable[[], bool] = always,
    ) -> PodIdentity:
        if len(token) > MAX_TOKEN_BYTES:
            raise Refused(401, f"the token is over {MAX_TOKEN_BYTES} bytes")
        digest = hashlib.sha256(f"{audience}\n{token}".encode()).digest()
        held = self._held.get(digest)
        if held is not None and held.keys.same_as(keys):
            if now >= held.exp + LEEWAY_SECONDS:
                self._held.discard(digest)
                raise Refused(401, "the token has expired")
            return held.identity
        refusal = self._refused.get(digest)
        if refusal is not None:
            # `now` is a wall clock: one set back does not stretch a refusal past its time either.
            if refusal.keys.same_as(keys) and refusal.at <= now < refusal.at + REFUSED_TTL_SECONDS:
                raise refusal.again()
            self._refused.discard(digest)
        if not may_check():
            raise OverBudget()
        try:
            identity, exp = _verify(token, keys, now, audience)
        except Refused as refused:
            self._refused.put(digest, _Refusal.of(refused, keys, now))
            raise
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
