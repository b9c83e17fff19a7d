"""Signed CI job tokens and personal access tokens: what ``ci:<agent id>:<job token>`` and
``pat:<agent id>:<token>`` carry, how kasctl mints them and how kasd verifies them.

Both are compact JWS (a JWT) signed with Ed25519 (``alg: Ed25519``, RFC 9864) by a key named in the
header's ``kid``, so the verifier's ``KeySet`` can hold two keys while one replaces the other. Each kind
has its own ``typ`` header (RFC 8725 §3.11, explicit typing): a personal token is never taken for a job
token, nor the reverse. The job claims follow GitLab's CI ID tokens (``project_path``, ``job_id``,
``user_login``, ``ref_type``, ``ref_protected``, ``deployment_tier``, a ``sub`` of
``project_path:…:ref_type:…:ref:…``), except that ``ref_protected`` is a JSON boolean.

Verification checks, in this order, and stops at the first failure with a ``TokenInvalid`` whose
reason is safe to show the client: length (before any parsing), shape, algorithm (only Ed25519: no
``none``, no HMAC keyed with a public key), key id, signature, token type, then the registered claims
(issuer, audience, expiry, not-before, with leeway) and our own. Time is an argument (``now``), so
tests and callers with a clock of their own need no sleeping.

Why signed personal tokens, and how they are revoked: docs/authorization.md, "Tokens".
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Container, Mapping
from datetime import timedelta
from typing import Any, Final, Literal, TypeVar

import attrs
from joserfc import jws
from joserfc.errors import ClaimError, ExpiredTokenError, JoseError, MissingClaimError
from joserfc.jwt import ClaimsOption, JWTClaimsRegistry

from kasd.authz.keys import KeySet, SigningKey
from wire.ids import check_id

#: the one signature algorithm minted and accepted: EdDSA over Ed25519, RFC 9864's name for it
ALGORITHM: Final = "Ed25519"
JOB_TOKEN_TYPE: Final = "kasd-ci-job+jwt"
PERSONAL_TOKEN_TYPE: Final = "kasd-pat+jwt"
#: a token longer than this is refused before it is parsed (ours are ~600 bytes)
MAX_TOKEN_LENGTH: Final = 8 * 1024
#: clock skew tolerated between the minting and the verifying machine
DEFAULT_LEEWAY: Final = timedelta(seconds=60)
DEFAULT_AUDIENCE: Final = "kasd"
DEFAULT_ISSUER: Final = "kasd"
#: GitLab's environment tiers (``deployment_tier``)
ENVIRONMENT_TIERS: Final = ("production", "staging", "testing", "development", "other")
REF_TYPES: Final = ("branch", "tag")

_ALLOWED_HEADER: Final = frozenset({"alg", "kid", "typ"})
_REGISTRY: Final = jws.JWSRegistry(algorithms=[ALGORITHM])
# GitLab paths: namespaces and a project, each a run of letters, digits, '_', '-', '.'
_PROJECT_PATH = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*(/[A-Za-z0-9_.][A-Za-z0-9_.-]*)+$")


class TokenInvalid(Exception):
    """A token that is refused. ``reason`` says which check failed and is safe to show the client
    (it never quotes the token): ``too long``, ``malformed``, ``algorithm not allowed``, ``signed by an
    unknown key``, ``bad signature``, ``not a job token``, ``not a personal token``, ``wrong issuer``,
    ``wrong audience``, ``expired``, ``not yet valid``, ``revoked``. ``detail`` (optional, just as safe)
    narrows a ``malformed``."""

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason = reason
        self.detail = detail


# ------------------------------------------------------------------ claims


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    check_id(value, attribute.name)  # an InvalidNumber is a ValueError: a refused claim, never a crash


def _text(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value or value != value.strip() or "\n" in value:
        raise ValueError(f"{attribute.name} must be non-empty text without surrounding spaces")


def _project_path(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _PROJECT_PATH.match(value):
        raise ValueError(f"project must be a project path such as group/app, got {value!r}")


@attrs.frozen(kw_only=True)
class TokenStamp:
    """What every verified token says about itself: who issued it, for whom, when, with which key."""

    issuer: str
    audience: str
    #: the ``kid`` that signed it
    key_id: str
    #: ``jti``: unique per token, what a revocation list names
    token_id: str
    issued_at: int
    not_before: int
    expires_at: int


@attrs.frozen(kw_only=True)
class JobClaims:
    """Who a CI job token says its bearer is: one job of one pipeline of one project, run for a user.

    The one job value from the token to the grant: the decision (``policy``), the CI variables
    (``civars``), the managed resources and the grant itself (``verdict``) all read this, never a copy."""

    #: the project's full path, e.g. ``group/app``
    project: str = attrs.field(validator=_project_path)
    project_id: int | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    job_id: int = attrs.field(validator=_positive)
    pipeline_id: int = attrs.field(validator=_positive)
    #: the username the job runs for (GitLab's ``user_login``)
    user: str = attrs.field(validator=_text)
    ref: str = attrs.field(validator=_text)
    ref_type: Literal["branch", "tag"] = attrs.field(default="branch", validator=attrs.validators.in_(REF_TYPES))
    #: a protected branch or tag
    protected: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    environment: str | None = attrs.field(default=None, validator=attrs.validators.optional(_text))
    environment_tier: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(ENVIRONMENT_TIERS)))
    #: set on claims from ``verify_job_token``; ``mint_job_token`` ignores it and stamps afresh
    stamp: TokenStamp | None = None

    def __attrs_post_init__(self) -> None:
        if self.environment_tier is not None and self.environment is None:
            raise ValueError("environment_tier needs an environment")

    @property
    def subject(self) -> str:
        """GitLab's ``sub`` of a CI ID token."""
        return f"project_path:{self.project}:ref_type:{self.ref_type}:ref:{self.ref}"

    def _payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "sub": self.subject,
            "project_path": self.project,
            "job_id": self.job_id,
            "pipeline_id": self.pipeline_id,
            "user_login": self.user,
            "ref": self.ref,
            "ref_type": self.ref_type,
            "ref_protected": self.protected,
        }
        if self.project_id is not None:
            payload["project_id"] = self.project_id
        if self.environment is not None:
            payload["environment"] = self.environment
        if self.environment_tier is not None:
            payload["deployment_tier"] = self.environment_tier
        return payload

    @classmethod
    def _from_payload(cls, payload: Mapping[str, Any], stamp: TokenStamp) -> JobClaims:
        return cls(
            project=_claim(payload, "project_path", str),
            project_id=_claim(payload, "project_id", int, required=False),
            job_id=_claim(payload, "job_id", int),
            pipeline_id=_claim(payload, "pipeline_id", int),
            user=_claim(payload, "user_login", str),
            ref=_claim(payload, "ref", str),
            ref_type=_claim(payload, "ref_type", str),  # checked by its validator
            protected=_claim(payload, "ref_protected", bool),
            environment=_claim(payload, "environment", str, required=False),
            environment_tier=_claim(payload, "deployment_tier", str, required=False),
            stamp=stamp,
        )


@attrs.frozen(kw_only=True)
class PersonalClaims:
    """Who a personal access token says its bearer is: a user (the token's ``sub``)."""

    user: str = attrs.field(validator=_text)
    stamp: TokenStamp | None = None


_Claims = TypeVar("_Claims", JobClaims, PersonalClaims)


def _claim(payload: Mapping[str, Any], name: str, kind: type[Any], *, required: bool = True) -> Any:
    value = payload.get(name)
    if value is None:
        if required:
            raise TokenInvalid("malformed", f"claim {name!r} is missing")
        return None
    # bool is an int to Python, but a job id of `true` is not a job id
    if type(value) is not kind:
        raise TokenInvalid("malformed", f"claim {name!r} must be {kind.__name__}")
    return value


# ------------------------------------------------------------------ minting


def mint_job_token(key: SigningKey, claims: JobClaims, ttl: timedelta, *, audience: str = DEFAULT_AUDIENCE,
                   issuer: str = DEFAULT_ISSUER, now: float | None = None) -> str:
    """A job token for ``claims``, valid from ``now`` for ``ttl``, signed by ``key``."""
    return _mint(key, JOB_TOKEN_TYPE, claims._payload(), ttl, audience=audience, issuer=issuer, now=now)


def mint_personal_token(key: SigningKey, user: str, ttl: timedelta, *, audience: str = DEFAULT_AUDIENCE,
                        issuer: str = DEFAULT_ISSUER, now: float | None = None) -> str:
    """A personal access token for ``user``, valid from ``now`` for ``ttl``, signed by ``key``."""
    claims = PersonalClaims(user=user)
    return _mint(key, PERSONAL_TOKEN_TYPE, {"sub": claims.user}, ttl, audience=audience, issuer=issuer, now=now)


def _mint(key: SigningKey, typ: str, claims: dict[str, Any], ttl: timedelta, *, audience: str,
          issuer: str, now: float | None) -> str:
    seconds = int(ttl.total_seconds())
    if seconds <= 0:
        raise ValueError(f"ttl must be at least one second, got {ttl}")
    if not audience or not issuer:
        raise ValueError("audience and issuer must not be empty")
    issued = int(time.time() if now is None else now)
    payload = {
        "iss": issuer,
        "aud": audience,
        "iat": issued,
        "nbf": issued,
        "exp": issued + seconds,
        "jti": secrets.token_urlsafe(16),
        **claims,
    }
    header = {"alg": ALGORITHM, "typ": typ, "kid": key.kid}
    encoded = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return jws.serialize_compact(header, encoded, key.jwk, registry=_REGISTRY)


# ------------------------------------------------------------------ verifying


def verify_job_token(token: str, keyset: KeySet, *, audience: str = DEFAULT_AUDIENCE,
                     issuer: str = DEFAULT_ISSUER, now: float | None = None,
                     leeway: timedelta = DEFAULT_LEEWAY, revoked: Container[str] = ()) -> JobClaims:
    """The claims of a valid job token, or ``TokenInvalid`` saying which check failed.
    ``revoked``: token ids (``jti``) refused even before they expire."""
    payload, stamp = _verify(token, keyset, JOB_TOKEN_TYPE, "not a job token", audience=audience,
                             issuer=issuer, now=now, leeway=leeway, revoked=revoked)
    return _build(JobClaims._from_payload, payload, stamp)


def verify_personal_token(token: str, keyset: KeySet, *, audience: str = DEFAULT_AUDIENCE,
                          issuer: str = DEFAULT_ISSUER, now: float | None = None,
                          leeway: timedelta = DEFAULT_LEEWAY, revoked: Container[str] = ()) -> PersonalClaims:
    """The claims of a valid, unrevoked personal token, or ``TokenInvalid`` saying which check failed.
    ``revoked``: token ids (``jti``, printed by ``kasctl token pat``) refused before they expire."""
    payload, stamp = _verify(token, keyset, PERSONAL_TOKEN_TYPE, "not a personal token", audience=audience,
                             issuer=issuer, now=now, leeway=leeway, revoked=revoked)
    return _build(lambda p, s: PersonalClaims(user=_claim(p, "sub", str), stamp=s), payload, stamp)


def _build(make: Callable[[Mapping[str, Any], TokenStamp], _Claims], payload: Mapping[str, Any],
           stamp: TokenStamp) -> _Claims:
    try:
        return make(payload, stamp)
    except (ValueError, TypeError) as exc:  # a validator refused a signed value: a minting bug
        raise TokenInvalid("malformed", str(exc)) from None


def _verify(token: str, keyset: KeySet, typ: str, wrong_type: str, *, audience: str, issuer: str,
            now: float | None, leeway: timedelta, revoked: Container[str]) -> tuple[dict[str, Any], TokenStamp]:
    if len(token) > MAX_TOKEN_LENGTH:
        raise TokenInvalid("too long", f"over {MAX_TOKEN_LENGTH} bytes")
    try:
        obj = jws.extract_compact(token.encode("ascii"), registry=_REGISTRY)
        header = obj.headers()
    except (JoseError, ValueError, TypeError, AttributeError, KeyError):
        raise TokenInvalid("malformed", "not a signed token (header.payload.signature)") from None
    if not isinstance(header, dict):
        raise TokenInvalid("malformed", "header")
    if header.get("alg") != ALGORITHM:
        raise TokenInvalid("algorithm not allowed", f"only {ALGORITHM}")
    unexpected = set(header) - _ALLOWED_HEADER
    if unexpected:
        raise TokenInvalid("malformed", "unexpected header parameter")
    kid = header.get("kid")
    if not isinstance(kid, str):
        raise TokenInvalid("malformed", "no key id")
    key = keyset.get(kid)
    if key is None:
        raise TokenInvalid("signed by an unknown key")
    try:
        good = jws.validate_compact(obj, key.jwk, registry=_REGISTRY)
    except (JoseError, ValueError, TypeError):
        good = False
    if not good:
        raise TokenInvalid("bad signature")
    if header.get("typ") != typ:
        raise TokenInvalid(wrong_type)

    try:
        payload = json.loads(obj.payload or b"")
    except ValueError:
        raise TokenInvalid("malformed", "payload is not JSON") from None
    if not isinstance(payload, dict):
        raise TokenInvalid("malformed", "payload is not a JSON object")
    for name in ("iat", "nbf", "exp"):
        if type(payload.get(name)) is not int:
            raise TokenInvalid("malformed", f"claim {name!r} must be a whole number of seconds")
    essential: ClaimsOption = {"essential": True}
    registry = JWTClaimsRegistry(
        now=int(time.time() if now is None else now), leeway=int(leeway.total_seconds()),
        iss={"essential": True, "value": issuer}, aud={"essential": True, "value": audience},
        sub=essential, iat=essential, nbf=essential, exp=essential, jti=essential,
    )  # fmt: skip
    try:
        registry.validate(payload)
    except ExpiredTokenError:
        raise TokenInvalid("expired") from None
    except MissingClaimError as exc:
        raise TokenInvalid("malformed", f"claim {exc.claim!r} is missing") from None
    except ClaimError as exc:
        raise _claim_failure(exc.claim) from None
    # a list audience that names us passes the registry; a stamp holds the one we checked
    stamp = TokenStamp(issuer=payload["iss"], audience=audience, key_id=kid, token_id=payload["jti"],
                       issued_at=payload["iat"], not_before=payload["nbf"], expires_at=payload["exp"])
    if stamp.token_id in revoked:
        raise TokenInvalid("revoked")
    return payload, stamp


def _claim_failure(claim: str) -> TokenInvalid:
    if claim in ("nbf", "iat"):  # their types were checked above: this is a time in the future
        return TokenInvalid("not yet valid")
    if claim == "aud":
        return TokenInvalid("wrong audience")
    if claim == "iss":
        return TokenInvalid("wrong issuer")
    return TokenInvalid("malformed", f"claim {claim!r}")
