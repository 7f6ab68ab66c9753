"""Beats posted to the leader: who sent one (the pod's projected token, verified against the
issuer's keys without an API request), and what the leader answers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from tests.support.tokens import EC_KEY, ISSUER, KEYS, OTHER_KEY, RSA_KEY, jwk
from tests.support.tokens import claims as make_claims
from tests.support.tokens import token as make_token
from vigil import api
from vigil.core import beats

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def claims(**over: Any) -> dict[str, Any]:
    return make_claims(NOW, **over)


def token(payload: dict[str, Any] | None = None, key: Any = RSA_KEY, kid: str = "k1", alg: str = "RS256") -> str:
    return make_token(payload if payload is not None else claims(), key, kid, alg)


def refusal(call: Any) -> beats.Refused:
    with pytest.raises(beats.Refused) as caught:
        call()
    return caught.value


def test_a_pods_projected_token_names_that_pod() -> None:
    assert beats.verify(token(), KEYS, NOW) == beats.PodIdentity("team-a", "ledger-1", "pod-uid-1")
    assert beats.verify(token(kid="k2", key=EC_KEY, alg="ES256"), KEYS, NOW).name == "ledger-1"


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (claims(aud=["https://kubernetes.default.svc"]), "audience"),  # the API server's own token
        (claims(iss="https://evil.example"), "issuer"),
        (claims(exp=int(NOW) - 61), "expired"),
        (claims(nbf=int(NOW) + 3600), "not valid yet"),
        ({k: v for k, v in claims().items() if k != "exp"}, "refused"),
        ({k: v for k, v in claims().items() if k != "kubernetes.io"}, "not bound to a pod"),
        (claims(**{"kubernetes.io": {"namespace": "team-a", "pod": {"name": "x"}}}), "lacks"),
    ],
)
def test_a_token_that_is_not_a_live_pods_token_for_vigil_is_refused(payload: dict, says: str) -> None:
    refused = refusal(lambda: beats.verify(token(payload), KEYS, NOW))
    assert refused.status == 401 and says in str(refused)


def test_expiry_tolerates_a_minute_of_clock_skew_and_no_more() -> None:
    assert beats.verify(token(claims(exp=int(NOW) - 30)), KEYS, NOW).uid == "pod-uid-1"
    assert "expired" in str(refusal(lambda: beats.verify(token(claims(exp=int(NOW) - 30)), KEYS, NOW + 31)))


def test_a_token_signed_by_another_key_under_a_known_key_id_fails_its_signature() -> None:
    assert "signature" in str(refusal(lambda: beats.verify(token(key=OTHER_KEY), KEYS, NOW)))


def test_an_unknown_key_id_asks_for_the_keys_again() -> None:
    with pytest.raises(beats.UnknownKey) as caught:
        beats.verify(token(kid="rotated"), KEYS, NOW)
    assert caught.value.kid == "rotated" and caught.value.status == 401


def test_no_token_can_choose_a_weaker_algorithm() -> None:
    public_pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # The classic confusion: the public key as an HMAC secret, or no signature at all.
    # (by hand: PyJWT itself refuses to sign with a public key as the secret)
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signed = b64(json.dumps({"alg": "HS256", "kid": "k1"}).encode()) + "." + b64(json.dumps(claims()).encode())
    forged_hmac = signed + "." + b64(hmac.new(public_pem, signed.encode(), hashlib.sha256).digest())
    unsigned = jwt.encode(claims(), None, algorithm="none", headers={"kid": "k1"})
    for forged in (forged_hmac, unsigned):
        assert "asymmetric" in str(refusal(lambda forged=forged: beats.verify(forged, KEYS, NOW)))
    # An EC key's id with an RSA signature: the key decides the algorithm, not the token.
    assert "not the one of key" in str(refusal(lambda: beats.verify(token(kid="k2"), KEYS, NOW)))


def test_garbage_and_giants_are_refused_before_any_work() -> None:
    assert "not a JSON Web Token" in str(refusal(lambda: beats.verify("not-a-token", KEYS, NOW)))
    assert "over" in str(refusal(lambda: beats.verify("x" * (beats.MAX_TOKEN_BYTES + 1), KEYS, NOW)))
    assert refusal(lambda: beats.bearer("Bearer " + "x" * (beats.MAX_TOKEN_BYTES + 8))).status == 401
    assert refusal(lambda: beats.bearer(None)).status == 401
    assert refusal(lambda: beats.bearer("Basic dXNlcjpwYXNz")).status == 401
    assert beats.bearer("Bearer abc.def.ghi") == "abc.def.ghi"


def test_a_pod_beats_for_itself_only() -> None:
    mine = beats.PodIdentity("team-a", "ledger-1", "pod-uid-1")
    beats.check_claimed(mine, beats.read_body(b'{"namespace": "team-a", "name": "ledger-1", "uid": "pod-uid-1"}'))
    beats.check_claimed(mine, beats.read_body(b'{"namespace": "team-a", "name": "ledger-1"}'))  # uid optional
    for other in (
        b'{"namespace": "team-a", "name": "ledger-2"}',
        b'{"namespace": "team-b", "name": "ledger-1"}',
        b'{"namespace": "team-a", "name": "ledger-1", "uid": "pod-uid-2"}',
    ):
        assert refusal(lambda other=other: beats.check_claimed(mine, beats.read_body(other))).status == 403


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"{", 400), (b"[]", 400), (b'{"namespace": "a"}', 400), (b'{"namespace": "a", "name": "b", "uid": 3}', 400),
     (b" " * (beats.MAX_BODY_BYTES + 1), 413)],
)
def test_a_malformed_body_says_what_a_beat_is(body: bytes, status: int) -> None:
    assert refusal(lambda: beats.read_body(body)).status == status


def pod(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": "ledger-1", "uid": "pod-uid-1", **meta}}


def test_the_answer_carries_what_fences_the_agent() -> None:
    me = beats.PodIdentity("team-a", "ledger-1", "pod-uid-1")
    superseded = api.ANNOTATION_SUPERSEDED
    assert beats.answer(me, pod(), superseded) == beats.RENEWED
    assert beats.answer(me, pod(annotations={superseded: "2"}), superseded) == beats.SUPERSEDED
    assert beats.answer(me, pod(deletionTimestamp="2026-12-02T10:00:00Z"), superseded) == beats.DELETING
    assert refusal(lambda: beats.answer(me, None, superseded)).status == 404  # deleted, or not seen yet
    assert refusal(lambda: beats.answer(me, pod(name="other"), superseded)).status == 403


def test_a_key_set_keeps_asymmetric_signing_keys_only_and_a_bounded_number() -> None:
    entries = [
        jwk(RSA_KEY, "k1", "RS256"),
        {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
        {**jwk(RSA_KEY, "enc", "RS256"), "use": "enc"},
        {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
        {"kty": "RSA"},  # no kid
        *[jwk(RSA_KEY, f"many-{i}", "RS256") for i in range(beats.MAX_KEYS + 5)],
    ]
    keys = beats.parse_jwks(ISSUER, json.dumps({"keys": entries}))
    assert "k1" in keys.keys and not {"secret", "enc", "broken"} & set(keys.keys)
    assert len(keys.keys) <= beats.MAX_KEYS
    with pytest.raises(ValueError, match="list of keys"):
        beats.parse_jwks(ISSUER, b'{"keys": {}}')


def test_a_remembered_token_answers_as_verify_does_and_still_expires() -> None:
    verified = beats.VerifiedTokens()
    good = token(claims(exp=int(NOW) + 600))
    assert verified.verify(good, KEYS, NOW) == beats.verify(good, KEYS, NOW)
    assert verified.verify(good, KEYS, NOW + 300) == beats.PodIdentity("team-a", "ledger-1", "pod-uid-1")
    assert len(verified) == 1  # checked once, kept by its digest
    # Past its expiry (and the minute of skew) the remembered token is refused, and forgotten.
    assert "expired" in str(refusal(lambda: verified.verify(good, KEYS, NOW + 661)))
    assert len(verified) == 0


def test_a_refused_token_is_refused_every_time_and_never_remembered() -> None:
    verified = beats.VerifiedTokens()
    forged = token(key=OTHER_KEY)
    for _ in range(2):
        assert "signature" in str(refusal(lambda: verified.verify(forged, KEYS, NOW)))
    assert "audience" in str(refusal(lambda: verified.verify(token(), KEYS, NOW, audience="other")))
    assert len(verified) == 0


def test_a_refreshed_key_set_verifies_remembered_tokens_again() -> None:
    verified = beats.VerifiedTokens()
    good = token()
    verified.verify(good, KEYS, NOW)
    # The issuer withdrew key k1 (a rotation): the token it signed is no longer good.
    withdrawn = beats.IssuerKeys(KEYS.issuer, {k: v for k, v in KEYS.keys.items() if k != "k1"})
    with pytest.raises(beats.UnknownKey):
        verified.verify(good, withdrawn, NOW)


def test_a_token_remembered_for_one_audience_is_not_good_for_another() -> None:
    verified = beats.VerifiedTokens()
    good = token()
    verified.verify(good, KEYS, NOW)
    assert "audience" in str(refusal(lambda: verified.verify(good, KEYS, NOW, audience="other.example")))


def test_at_most_the_bound_of_tokens_is_remembered() -> None:
    verified = beats.VerifiedTokens(entries=3)
    for i in range(5):
        verified.verify(token(claims(jti=f"t{i}")), KEYS, NOW)
    assert len(verified) == 3
