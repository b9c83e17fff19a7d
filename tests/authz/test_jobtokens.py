"""Signed job and personal tokens: every check ``verify_*`` makes fails with its own reason, tokens are
forged the ways attackers forge them (tampering, ``alg: none``, HMAC keyed with the public key, a key
of their own), rotation keeps two keys valid at once, and key files load or say what is wrong."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from kasd.authz.jobtokens import (
    DEFAULT_LEEWAY,
    JOB_TOKEN_TYPE,
    MAX_TOKEN_LENGTH,
    PERSONAL_TOKEN_TYPE,
    JobClaims,
    TokenInvalid,
    mint_job_token,
    mint_personal_token,
    verify_job_token,
    verify_personal_token,
)
from kasd.authz.keys import (
    KeyFileError,
    KeySet,
    SigningKey,
    VerificationKey,
    key_id,
    load_signing_key,
    load_verification_key,
    write_key_pair,
)

pytestmark = pytest.mark.timeout(20)

NOW = 1_800_000_000
HOUR = timedelta(hours=1)
LEEWAY = int(DEFAULT_LEEWAY.total_seconds())
JOB = JobClaims(project="group/app", project_id=1234, job_id=42, pipeline_id=7, user="alice",
                ref="feat-x", protected=True, environment="review/feat-x", environment_tier="development")


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="module")
def keyset(key: SigningKey) -> KeySet:
    return KeySet.of([key.verification_key()])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _parts(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    header, payload, signature = token.split(".")
    return json.loads(_unb64(header)), json.loads(_unb64(payload)), signature


def _signed(key: SigningKey, header: dict[str, Any], payload: dict[str, Any] | bytes) -> str:
    """A token signed by ``key`` over exactly this header and payload: a minting bug, or a key thief."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(body)}"
    return f"{signing_input}.{_b64(key.private_key.sign(signing_input.encode()))}"


def _reason(token: str, keyset: KeySet, **kwargs: Any) -> str:
    with pytest.raises(TokenInvalid) as caught:
        verify_job_token(token, keyset, **{"now": NOW + 10, **kwargs})
    return caught.value.reason


# ------------------------------------------------------------------ round trips


def test_a_job_token_round_trips(key: SigningKey, keyset: KeySet) -> None:
    token = mint_job_token(key, JOB, HOUR, audience="kasd", issuer="kasd", now=NOW)
    claims = verify_job_token(token, keyset, audience="kasd", issuer="kasd", now=NOW + 10)
    assert claims == attrs.evolve(JOB, stamp=claims.stamp)
    assert claims.stamp is not None
    assert (claims.stamp.issued_at, claims.stamp.not_before, claims.stamp.expires_at) == (NOW, NOW, NOW + 3600)
    assert (claims.stamp.issuer, claims.stamp.audience, claims.stamp.key_id) == ("kasd", "kasd", key.kid)
    assert len(claims.stamp.token_id) >= 16


def _fields(claims: JobClaims) -> dict[str, Any]:
    return {a.name: getattr(claims, a.name) for a in attrs.fields(JobClaims) if a.name != "stamp"}


def test_the_job_claims_follow_gitlab_ci_id_tokens(key: SigningKey) -> None:
    header, payload, _ = _parts(mint_job_token(key, JOB, HOUR, now=NOW))
    assert header == {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid}
    assert payload["sub"] == "project_path:group/app:ref_type:branch:ref:feat-x"
    assert {k: payload[k] for k in ("project_path", "project_id", "job_id", "pipeline_id", "user_login",
                                    "ref", "ref_type", "ref_protected", "environment", "deployment_tier")} == {
        "project_path": "group/app", "project_id": 1234, "job_id": 42, "pipeline_id": 7,
        "user_login": "alice", "ref": "feat-x", "ref_type": "branch", "ref_protected": True,
        "environment": "review/feat-x", "deployment_tier": "development"}


def test_optional_claims_may_be_left_out(key: SigningKey, keyset: KeySet) -> None:
    plain = JobClaims(project="g/sub/app", job_id=1, pipeline_id=2, user="bob", ref="v1.0", ref_type="tag")
    _, payload, _ = _parts(mint_job_token(key, plain, HOUR, now=NOW))
    assert not {"project_id", "environment", "deployment_tier"} & set(payload)
    claims = verify_job_token(mint_job_token(key, plain, HOUR, now=NOW), keyset, now=NOW)
    assert (claims.project_id, claims.environment, claims.environment_tier, claims.protected) == (None, None, None, False)
    assert claims.ref_type == "tag"


def test_every_token_gets_its_own_id(key: SigningKey, keyset: KeySet) -> None:
    ids = {verify_job_token(mint_job_token(key, JOB, HOUR, now=NOW), keyset, now=NOW).stamp.token_id  # type: ignore[union-attr]
           for _ in range(20)}
    assert len(ids) == 20


def test_a_personal_token_round_trips(key: SigningKey, keyset: KeySet) -> None:
    token = mint_personal_token(key, "alice", timedelta(days=1), now=NOW)
    header, payload, _ = _parts(token)
    assert header["typ"] == PERSONAL_TOKEN_TYPE
    assert payload["sub"] == "alice"
    claims = verify_personal_token(token, keyset, now=NOW + 86_000)
    assert claims.user == "alice"
    assert claims.stamp is not None and claims.stamp.expires_at == NOW + 86_400


# ------------------------------------------------------------------ time


def test_expired_past_the_leeway(key: SigningKey, keyset: KeySet) -> None:
    token = mint_job_token(key, JOB, HOUR, now=NOW)
    verify_job_token(token, keyset, now=NOW + 3600 + LEEWAY - 1)  # clock skew forgiven
    assert _reason(token, keyset, now=NOW + 3600 + LEEWAY) == "expired"
    assert _reason(token, keyset, now=NOW + 3600, leeway=timedelta(0)) == "expired"


def test_not_yet_valid_before_the_leeway(key: SigningKey, keyset: KeySet) -> None:
    token = mint_job_token(key, JOB, HOUR, now=NOW)
    verify_job_token(token, keyset, now=NOW - LEEWAY)
    assert _reason(token, keyset, now=NOW - LEEWAY - 1) == "not yet valid"


def test_a_later_not_before_than_issued_at_is_honoured(key: SigningKey, keyset: KeySet) -> None:
    _, payload, _ = _parts(mint_job_token(key, JOB, HOUR, now=NOW))
    token = _signed(key, {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid}, {**payload, "nbf": NOW + 600})
    assert _reason(token, keyset, now=NOW + 10) == "not yet valid"
    verify_job_token(token, keyset, now=NOW + 600)


def test_minting_needs_a_positive_ttl(key: SigningKey) -> None:
    with pytest.raises(ValueError, match="ttl"):
        mint_job_token(key, JOB, timedelta(0), now=NOW)


# ------------------------------------------------------------------ forgeries


def test_a_tampered_payload_is_a_bad_signature(key: SigningKey, keyset: KeySet) -> None:
    token = mint_job_token(key, JOB, HOUR, now=NOW)
    header, payload, signature = token.split(".")
    claims = json.loads(_unb64(payload))
    claims["project_path"] = "group/other"
    assert _reason(f"{header}.{_b64(json.dumps(claims).encode())}.{signature}", keyset) == "bad signature"


def test_a_tampered_header_is_a_bad_signature(key: SigningKey, keyset: KeySet) -> None:
    _, payload, signature = mint_personal_token(key, "alice", HOUR, now=NOW).split(".")
    # a personal token relabelled as a job token: the type is signed too
    relabelled = _b64(json.dumps({"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid}).encode())
    assert _reason(f"{relabelled}.{payload}.{signature}", keyset) == "bad signature"


@pytest.mark.parametrize("position", [0, 10, -2])
def test_a_tampered_signature_is_a_bad_signature(key: SigningKey, keyset: KeySet, position: int) -> None:
    token = mint_job_token(key, JOB, HOUR, now=NOW)
    header, payload, signature = token.split(".")
    raw = bytearray(_unb64(signature))
    raw[position] ^= 0x01
    assert _reason(f"{header}.{payload}.{_b64(bytes(raw))}", keyset) == "bad signature"
    assert _reason(f"{header}.{payload}.", keyset) == "bad signature"


def test_a_token_from_another_key_is_refused(keyset: KeySet) -> None:
    stranger = SigningKey.generate()
    assert _reason(mint_job_token(stranger, JOB, HOUR, now=NOW), keyset) == "signed by an unknown key"


def test_another_key_claiming_a_known_kid_is_a_bad_signature(key: SigningKey, keyset: KeySet) -> None:
    impostor = SigningKey.generate(kid=key.kid)
    assert _reason(mint_job_token(impostor, JOB, HOUR, now=NOW), keyset) == "bad signature"


def test_other_audience_and_other_issuer(key: SigningKey, keyset: KeySet) -> None:
    token = mint_job_token(key, JOB, HOUR, audience="other-kasd", issuer="gitlab.example.com", now=NOW)
    assert _reason(token, keyset) in ("wrong issuer", "wrong audience")
    assert _reason(token, keyset, issuer="gitlab.example.com") == "wrong audience"
    assert _reason(token, keyset, audience="other-kasd") == "wrong issuer"
    verify_job_token(token, keyset, audience="other-kasd", issuer="gitlab.example.com", now=NOW)


def test_alg_none_is_refused(key: SigningKey, keyset: KeySet) -> None:
    _, payload, _ = _parts(mint_job_token(key, JOB, HOUR, now=NOW))
    for alg in ("none", "None", "NONE"):
        header = _b64(json.dumps({"alg": alg, "typ": JOB_TOKEN_TYPE, "kid": key.kid}).encode())
        body = _b64(json.dumps(payload).encode())
        assert _reason(f"{header}.{body}.", keyset) == "algorithm not allowed"
        assert _reason(f"{header}.{body}", keyset) == "malformed"  # not even three parts


@pytest.mark.parametrize("alg", ["HS256", "HS512"])
def test_hmac_keyed_with_the_public_key_is_refused(key: SigningKey, keyset: KeySet, alg: str) -> None:
    """The classic confusion: the attacker signs with HMAC using the (public) verification key's bytes,
    hoping the verifier feeds its public key to whatever ``alg`` the header names."""
    _, payload, _ = _parts(mint_job_token(key, JOB, HOUR, now=NOW))
    signing_input = (f"{_b64(json.dumps({'alg': alg, 'typ': JOB_TOKEN_TYPE, 'kid': key.kid}).encode())}"
                     f".{_b64(json.dumps({**payload, 'project_path': 'admin/all'}).encode())}")
    digest = hashlib.sha256 if alg == "HS256" else hashlib.sha512
    for secret in (key.public_pem(), key.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)):
        mac = hmac.new(secret, signing_input.encode(), digest).digest()
        assert _reason(f"{signing_input}.{_b64(mac)}", keyset) == "algorithm not allowed"


def test_other_algorithms_even_for_the_same_key_are_refused(key: SigningKey, keyset: KeySet) -> None:
    _, payload, _ = _parts(mint_job_token(key, JOB, HOUR, now=NOW))
    # RFC 8037's polymorphic name for the very same signature: still not on the allow-list
    token = _signed(key, {"alg": "EdDSA", "typ": JOB_TOKEN_TYPE, "kid": key.kid}, payload)
    assert _reason(token, keyset) == "algorithm not allowed"


# ------------------------------------------------------------------ rotation


def test_two_keys_valid_at_once_while_rotating() -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    old_token = mint_job_token(old, JOB, HOUR, now=NOW)
    new_token = mint_job_token(new, JOB, HOUR, now=NOW)
    both = KeySet.of([old.verification_key(), new.verification_key()])
    assert set(both.kids) == {old.kid, new.kid}
    for token in (old_token, new_token):
        verify_job_token(token, both, now=NOW + 10)
    after = KeySet.of([new.verification_key()])
    verify_job_token(new_token, after, now=NOW + 10)
    assert _reason(old_token, after) == "signed by an unknown key"


# ------------------------------------------------------------------ kinds


def test_a_job_token_is_not_a_personal_token(key: SigningKey, keyset: KeySet) -> None:
    with pytest.raises(TokenInvalid) as caught:
        verify_personal_token(mint_job_token(key, JOB, HOUR, now=NOW), keyset, now=NOW)
    assert caught.value.reason == "not a personal token"


def test_a_personal_token_is_not_a_job_token(key: SigningKey, keyset: KeySet) -> None:
    token = mint_personal_token(key, "alice", HOUR, now=NOW)
    assert _reason(token, keyset) == "not a job token"
    # even an expired one says what it is, not how old it is
    assert _reason(token, keyset, now=NOW + 10 * 3600) == "not a job token"


def test_a_token_without_a_type_is_neither(key: SigningKey, keyset: KeySet) -> None:
    _, payload, _ = _parts(mint_job_token(key, JOB, HOUR, now=NOW))
    token = _signed(key, {"alg": "Ed25519", "kid": key.kid}, payload)
    assert _reason(token, keyset) == "not a job token"


# ------------------------------------------------------------------ revocation


def test_a_revoked_personal_token_is_refused(key: SigningKey, keyset: KeySet) -> None:
    token = mint_personal_token(key, "alice", HOUR, now=NOW)
    claims = verify_personal_token(token, keyset, now=NOW)
    assert claims.stamp is not None
    other = mint_personal_token(key, "alice", HOUR, now=NOW)
    revoked = frozenset({claims.stamp.token_id})
    with pytest.raises(TokenInvalid) as caught:
        verify_personal_token(token, keyset, now=NOW, revoked=revoked)
    assert caught.value.reason == "revoked"
    assert verify_personal_token(other, keyset, now=NOW, revoked=revoked).user == "alice"


# ------------------------------------------------------------------ shapes and bounds


def test_an_oversize_token_is_refused_before_parsing(keyset: KeySet) -> None:
    assert _reason("a" * (MAX_TOKEN_LENGTH + 1), keyset) == "too long"
    assert _reason("a" * MAX_TOKEN_LENGTH, keyset) == "malformed"


@pytest.mark.parametrize("token", [
    "", "abc", "a.b", "a.b.c.d", "a.b.c.d.e", "...", "ünïcode.x.y", "eyJ.eyJ.sig",
    _b64(b"[1,2]") + ".e30.sig", _b64(b'"alg"') + ".e30.sig", _b64(b"not json") + ".e30.sig",
])
def test_malformed_tokens(keyset: KeySet, token: str) -> None:
    assert _reason(token, keyset) == "malformed"


def test_the_reason_never_quotes_the_token(key: SigningKey, keyset: KeySet) -> None:
    token = mint_job_token(key, JOB, HOUR, now=NOW)
    for variant in (token, token[:-3] + "AAA", token + "x" * MAX_TOKEN_LENGTH, token.replace(".", "!")):
        with pytest.raises(TokenInvalid) as caught:
            verify_job_token(variant, keyset, now=NOW + 100_000)
        text = str(caught.value)
        assert all(part not in text for part in token.split(".")), text


def _payload(key: SigningKey, **changes: Any) -> dict[str, Any]:
    _, payload, _ = _parts(mint_job_token(key, JOB, HOUR, now=NOW))
    payload.update(changes)
    return {k: v for k, v in payload.items() if v is not None}


@pytest.mark.parametrize("changes", [
    {"job_id": "42"}, {"job_id": True}, {"job_id": 0}, {"job_id": None}, {"pipeline_id": 7.0},
    # past a signed 64-bit integer: what no database or Redis key of a job can hold
    {"job_id": 2**63}, {"pipeline_id": 10**30}, {"project_id": 2**64},
    {"project_path": "no-group"}, {"project_path": None}, {"user_login": ""}, {"ref_type": "commit"},
    {"ref_protected": "true"}, {"deployment_tier": "prod"}, {"environment": None},
    {"exp": None}, {"exp": "never"}, {"exp": 1e30}, {"iat": None}, {"nbf": True}, {"jti": None},
    {"jti": 5}, {"sub": None}, {"sub": 5}, {"iss": None}, {"aud": None},
])
def test_a_signed_payload_with_bad_claims_is_malformed(key: SigningKey, keyset: KeySet, changes: dict[str, Any]) -> None:
    token = _signed(key, {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid}, _payload(key, **changes))
    assert _reason(token, keyset) == "malformed"


@pytest.mark.parametrize(("changes", "reason"), [
    ({"aud": 5}, "wrong audience"), ({"aud": []}, "wrong audience"), ({"iss": 5}, "wrong issuer"),
])
def test_a_signed_payload_with_odd_audience_or_issuer(key: SigningKey, keyset: KeySet,
                                                      changes: dict[str, Any], reason: str) -> None:
    token = _signed(key, {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid}, _payload(key, **changes))
    assert _reason(token, keyset) == reason


def test_a_payload_that_is_not_an_object_is_malformed(key: SigningKey, keyset: KeySet) -> None:
    header = {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid}
    for body in (b"[]", b"42", b"not json", b"\xff"):
        assert _reason(_signed(key, header, body), keyset) == "malformed"


def test_unexpected_header_parameters_are_malformed(key: SigningKey, keyset: KeySet) -> None:
    payload = _payload(key)
    for extra in ({"jwk": {"kty": "OKP"}}, {"b64": False, "crit": ["b64"]}, {"x5u": "https://x"}):
        token = _signed(key, {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid, **extra}, payload)
        assert _reason(token, keyset) == "malformed"
    assert _reason(_signed(key, {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE}, payload), keyset) == "malformed"


def test_a_list_audience_naming_us_is_accepted(key: SigningKey, keyset: KeySet) -> None:
    token = _signed(key, {"alg": "Ed25519", "typ": JOB_TOKEN_TYPE, "kid": key.kid},
                    _payload(key, aud=["other", "kasd"]))
    stamp = verify_job_token(token, keyset, now=NOW).stamp
    assert stamp is not None and stamp.audience == "kasd"


@pytest.mark.parametrize("changes", [
    {"project": "app"}, {"job_id": 0}, {"pipeline_id": -1}, {"user": " alice"}, {"ref": ""},
    {"ref_type": "commit"}, {"environment_tier": "prod"}, {"environment": None},
])
def test_claims_are_checked_when_made(changes: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        JobClaims(**{**_fields(JOB), **changes})


# ------------------------------------------------------------------ keys


def test_the_kid_is_the_rfc7638_thumbprint() -> None:
    # RFC 8037, appendix A.2/A.3: this Ed25519 public key's JWK thumbprint
    x = _unb64("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
    assert key_id(ed25519.Ed25519PublicKey.from_public_bytes(x)) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_a_key_pair_is_written_0600_and_loads_with_the_same_kid(tmp_path: Path) -> None:
    files = write_key_pair(tmp_path / "keys")
    assert files.private.name == "jobtoken-signing.pem" and files.public.name == "jobtoken-signing.pub.pem"
    assert stat.S_IMODE(files.private.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["jobtoken-signing.pem", "jobtoken-signing.pub.pem"]
    signing = load_signing_key(files.private)
    assert signing.kid == files.kid == load_verification_key(files.public).kid
    keyset = KeySet.from_pem_files([files.public])
    assert verify_job_token(mint_job_token(signing, JOB, HOUR, now=NOW), keyset, now=NOW).user == "alice"
    # the private file stands for its public half, so one file can serve a lone kasd
    assert KeySet.from_pem_files([files.private]).kids == (files.kid,)


def test_a_key_pair_is_never_written_over(tmp_path: Path) -> None:
    first = write_key_pair(tmp_path)
    before = first.private.read_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        write_key_pair(tmp_path)
    assert first.private.read_bytes() == before
    # nor half-written next to a public key someone left there
    other = tmp_path / "other"
    other.mkdir()
    (other / "jobtoken-signing.pub.pem").write_text("x")
    with pytest.raises(KeyFileError, match=r"pub\.pem: already exists"):
        write_key_pair(other)
    assert sorted(p.name for p in other.iterdir()) == ["jobtoken-signing.pub.pem"]


def test_a_configured_kid_overrides_the_thumbprint(tmp_path: Path) -> None:
    files = write_key_pair(tmp_path)
    signing = load_signing_key(files.private, kid="2026-07")
    keyset = KeySet.of([load_verification_key(files.public, kid="2026-07")])
    claims = verify_job_token(mint_job_token(signing, JOB, HOUR, now=NOW), keyset, now=NOW)
    assert claims.stamp is not None and claims.stamp.key_id == "2026-07"


def _pem_files(tmp_path: Path) -> dict[str, Path]:
    ed = ed25519.Ed25519PrivateKey.generate()
    ec_key = ec.generate_private_key(ec.SECP256R1())
    blobs = {
        "encrypted": ed.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"secret")),
        "public": ed.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo),
        "ec": ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()),
        "ec-public": ec_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo),
        "garbage": b"hello\n",
        "empty": b"",
    }
    paths = {}
    for name, blob in blobs.items():
        paths[name] = tmp_path / f"{name}.pem"
        paths[name].write_bytes(blob)
    return paths


@pytest.mark.parametrize(("name", "message"), [
    ("encrypted", "is encrypted"), ("public", "this is a public key; signing needs the private key"),
    ("ec", "holds an EC key"), ("garbage", "not a PEM private key"), ("empty", "not a PEM private key"),
    ("missing", "cannot read the key file"),
])
def test_unusable_signing_keys_say_why(tmp_path: Path, name: str, message: str) -> None:
    path = _pem_files(tmp_path).get(name, tmp_path / "missing.pem")
    with pytest.raises(KeyFileError, match=message) as caught:
        load_signing_key(path)
    assert str(caught.value).startswith(str(path))
    assert "BEGIN" not in str(caught.value).replace("-----BEGIN PRIVATE KEY-----", "")


@pytest.mark.parametrize(("name", "message"), [
    ("ec-public", "holds an EC key"), ("garbage", "not a PEM public key"), ("encrypted", "is encrypted"),
])
def test_unusable_verification_keys_say_why(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(KeyFileError, match=message):
        load_verification_key(_pem_files(tmp_path)[name])


def test_a_keyset_needs_distinct_kids_and_at_least_one_key() -> None:
    key = SigningKey.generate()
    with pytest.raises(KeyFileError, match="no verification key"):
        KeySet.of([])
    with pytest.raises(KeyFileError, match="also the id of"):
        KeySet.of([key.verification_key(), SigningKey.generate(kid=key.kid).verification_key()])


def test_keys_never_show_in_repr() -> None:
    key = SigningKey.generate()
    raw = key.private_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                        serialization.NoEncryption())
    text = repr(key) + repr(key.verification_key()) + repr(KeySet.of([key.verification_key()]))
    assert _b64(raw) not in text and "PRIVATE" not in text
    assert isinstance(key.verification_key(), VerificationKey)


def test_write_key_pair_respects_no_umask_surprises(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        files = write_key_pair(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(files.private.stat().st_mode) == 0o600
