"""The receptive hello's JWT as agentd checks it (``wire.receptive.verify_token``), sans-I/O: tokens
kasd's own key signed, with claims kasd never mints."""

from __future__ import annotations

from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import OKPKey

from wire.receptive import HandshakeRefused, mint_token, verify_token

pytestmark = pytest.mark.timeout(5)
NOW = 1_800_000_000
KEY = OKPKey.generate_key("Ed25519")


def _signed(**claims: Any) -> str:
    base = {"iss": "kasd", "aud": "agentd", "sub": "7", "iat": NOW, "nbf": NOW, "exp": NOW + 60}
    return jwt.encode({"alg": "Ed25519", "typ": "JWT"}, {**base, **claims}, KEY, algorithms=["Ed25519"])


@pytest.mark.parametrize(("claims", "reason"), [
    # issued far in the future with an old nbf: exp - iat is short, yet it is valid from 1970 to 2090
    ({"nbf": 0, "iat": NOW + 10**9, "exp": NOW + 10**9 + 60}, "token lives too long"),
    ({"nbf": NOW - 10**6}, "token lives too long"),
    ({"iat": NOW + 3600, "nbf": NOW, "exp": NOW + 60}, "token not yet valid"),
    ({"sub": 7}, "token is for another agent"),
    ({"sub": ["7"]}, "token is for another agent"),
    ({"aud": ["agentd", "other"]}, "token is not for agentd"),
    ({"exp": float(NOW + 60)}, "token lacks exp, iat or nbf"),
    ({"exp": True}, "token lacks exp, iat or nbf"),
])
def test_a_token_kasds_key_signed_is_still_refused_for_what_it_claims(claims: dict[str, Any], reason: str) -> None:
    with pytest.raises(HandshakeRefused) as refused:
        verify_token(_signed(**claims), KEY, now=NOW, agent_id="7")
    assert refused.value.reason == reason


def test_the_subject_is_checked_even_when_agentd_has_no_agent_id() -> None:
    """Another agent that trusts the same key must not replay the token kasd sent it to this agentd
    (which would then send that agent its own agent token)."""
    token = mint_token(KEY, agent_id=8, now=NOW)
    for agent_id in ("", "7"):
        with pytest.raises(HandshakeRefused):
            verify_token(token, KEY, now=NOW, agent_id=agent_id)
    verify_token(mint_token(KEY, agent_id=7, now=NOW), KEY, now=NOW + 30, agent_id="7")
