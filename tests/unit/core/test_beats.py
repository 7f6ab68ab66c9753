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
    [
        (b"{", 400),
        (b"[]", 400),
        (b'{"namespace": "a"}', 400),
        (b'{"namespace": "a", "name": "b", "uid": 3}', 400),
        (b" " * (beats.MAX_BODY_BYTES + 1), 413),
    ],
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


# --- what a token's check may cost: refusals remembered, checks budgeted --------------------------


class Checks:
    """A budget that says yes `allowed` times, counting the asks: an ask is a check to be made."""

    def __init__(self, allowed: int = 1_000_000) -> None:
        self.allowed, self.asked = allowed, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked <= self.allowed


def test_a_junk_token_repeated_is_checked_once_then_refused_by_a_lookup() -> None:
    verified, checks = beats.VerifiedTokens(), Checks()
    forged = token(key=OTHER_KEY)
    whys = set()
    for i in range(50):  # 50 posts in 25 s
        with pytest.raises(beats.Refused) as caught:
            verified.verify(forged, KEYS, NOW + i / 2, may_check=checks)
        whys.add(str(caught.value))
    assert checks.asked == 1, "the same junk is checked once, not on every post"
    assert whys == {"the token's signature does not verify"} and verified.refused() == 1 and len(verified) == 0
    # A refusal is believed for REFUSED_TTL_SECONDS, then the token is checked again.
    refusal(lambda: verified.verify(forged, KEYS, NOW + beats.REFUSED_TTL_SECONDS, may_check=checks))
    assert checks.asked == 2


def test_a_refusal_is_not_believed_under_another_key_set_nor_past_its_time_on_a_clock_set_back() -> None:
    verified, checks = beats.VerifiedTokens(), Checks()
    rotated = token(kid="k-new")
    for _ in range(3):  # refused again as an unknown key, so that the caller refreshes the keys
        with pytest.raises(beats.UnknownKey):
            verified.verify(rotated, KEYS, NOW, may_check=checks)
    assert checks.asked == 1
    # The refreshed key set holds the key: the token is checked anew and verifies.
    refreshed = beats.IssuerKeys(KEYS.issuer, {**KEYS.keys, "k-new": KEYS.keys["k1"]})
    assert verified.verify(rotated, refreshed, NOW, may_check=checks).name == "ledger-1"
    assert checks.asked == 2
    forged = token(key=OTHER_KEY)
    refusal(lambda: verified.verify(forged, KEYS, NOW, may_check=checks))
    refusal(lambda: verified.verify(forged, KEYS, NOW - 3600, may_check=checks))  # the wall clock set back
    assert checks.asked == 4


def test_past_the_budget_a_token_is_not_checked_and_nothing_is_remembered_of_it() -> None:
    verified = beats.VerifiedTokens()
    good = token()
    over = refusal(lambda: verified.verify(good, KEYS, NOW, may_check=lambda: False))
    assert isinstance(over, beats.OverBudget) and over.status == 503
    assert len(verified) == 0 and verified.refused() == 0, "no verdict on the token: it is not its fault"
    assert verified.verify(good, KEYS, NOW, may_check=Checks()).name == "ledger-1"


def test_a_verified_token_never_asks_the_budget() -> None:
    verified, checks = beats.VerifiedTokens(), Checks(allowed=1)
    good = token()
    assert verified.verify(good, KEYS, NOW, may_check=checks).name == "ledger-1"
    for i in range(100):  # the budget spent by others: a known token is answered all the same
        assert verified.verify(good, KEYS, NOW + i, may_check=lambda: False).name == "ledger-1"
    assert checks.asked == 1


def test_a_key_set_fetched_again_unchanged_keeps_the_verified_tokens() -> None:
    document = {"keys": [jwk(RSA_KEY, "k1", "RS256"), jwk(EC_KEY, "k2", "ES256")]}
    first, again = beats.parse_jwks(ISSUER, document), beats.parse_jwks(ISSUER, json.dumps(document))
    assert first is not again and first.same_as(again)
    verified, checks = beats.VerifiedTokens(), Checks()
    good = token()
    verified.verify(good, first, NOW, may_check=checks)
    verified.verify(good, again, NOW, may_check=checks)  # the hourly refresh: no check, no budget spent
    assert checks.asked == 1
    rotated = beats.parse_jwks(ISSUER, {"keys": [jwk(OTHER_KEY, "k1", "RS256")]})  # k1 is another key now
    assert not first.same_as(rotated) and not first.same_as(beats.parse_jwks("https://other", document))
    assert "signature" in str(refusal(lambda: verified.verify(good, rotated, NOW, may_check=checks)))


def test_at_most_the_bound_of_refused_tokens_is_remembered() -> None:
    verified = beats.VerifiedTokens(refused_entries=3)
    for i in range(10):
        with pytest.raises(beats.Refused):
            verified.verify(f"junk-{i}", KEYS, NOW)
    assert verified.refused() == 3 and len(verified) == 0
