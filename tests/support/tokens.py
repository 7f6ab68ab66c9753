"""Projected service-account tokens made here, as the API server makes them for a pod (RS256,
a key id, the `kubernetes.io` claim), and the key set that verifies them."""

from __future__ import annotations

import json
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from vigil.core import beats

ISSUER = "https://kubernetes.default.svc.cluster.local"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwk(private: Any, kid: str, alg: str) -> dict[str, Any]:
    entry = json.loads(jwt.get_algorithm_by_name(alg).to_jwk(private.public_key()))
    return {**entry, "kid": kid, "use": "sig", "alg": alg}


KEYS = beats.parse_jwks(ISSUER, {"keys": [jwk(RSA_KEY, "k1", "RS256"), jwk(EC_KEY, "k2", "ES256")]})


def claims(now: float, namespace: str = "team-a", name: str = "ledger-1", uid: str = "pod-uid-1", **over: Any) -> dict:
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": [beats.AUDIENCE],
        "sub": f"system:serviceaccount:{namespace}:default",
        "exp": int(now) + 3600,
        "iat": int(now) - 10,
        "nbf": int(now) - 10,
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": name, "uid": uid},
            "serviceaccount": {"name": "default", "uid": "sa-uid"},
        },
    }
    base.update(over)
    return base


def token(payload: dict[str, Any], key: Any = RSA_KEY, kid: str = "k1", alg: str = "RS256") -> str:
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})
