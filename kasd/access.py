"""Who may use which agent through the Kubernetes API proxy, and as whom.

Bearer tokens are ``ci:<agent id>:<job token>`` or ``pat:<agent id>:<personal token>``. In this
version a static list in kasd's config decides (``access:``); full CI authorization (signed job
tokens, the agent's ``ci_access``) replaces the lookup later, behind the same ``authorize``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kasd.config import AccessEntry
from kasd.tokens import digest_matches, hash_token
from tunnelhttp.head import Impersonation

TOKEN_FORMATS = "ci:<agent id>:<job token> or pat:<agent id>:<token>"


class AccessDenied(Exception):
    """``status`` 401 (who are you?) or 403 (not for this agent); ``message`` is safe to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen(kw_only=True)
class Grant:
    kind: str
    agent_id: int
    #: None: agentd acts as itself
    impersonate: Impersonation | None
    #: the access entry's name, for logs (never the token)
    subject: str


def parse_bearer(authorization: str | None) -> tuple[str, int, str]:
    """``Authorization`` header → (kind, agent id, secret), or AccessDenied(401) saying what is wrong."""
    if not authorization:
        raise AccessDenied(401, f"missing bearer token: send Authorization: Bearer {TOKEN_FORMATS}")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise AccessDenied(401, f"bad token: expected Authorization: Bearer {TOKEN_FORMATS}")
    kind, sep1, rest = credentials.strip().partition(":")
    agent_text, sep2, secret = rest.partition(":")
    if kind not in ("ci", "pat") or not (sep1 and sep2) or not secret:
        raise AccessDenied(401, f"bad token: malformed, expected {TOKEN_FORMATS}")
    if not agent_text.isdigit() or agent_text.startswith("0"):
        raise AccessDenied(401, f"bad token: agent id {agent_text[:20]!r} is not a number (expected {TOKEN_FORMATS})")
    return kind, int(agent_text), secret


#: how many granted ``Authorization`` values StaticAccess remembers
GRANT_CACHE_SIZE = 1024


class StaticAccess:
    """The ``access:`` list of kasd's config.

    A client sends the same token with every request, so the grants of the last
    ``GRANT_CACHE_SIZE`` distinct ``Authorization`` values are remembered (the list never changes
    while kasd runs; a reload builds a new StaticAccess). Refusals are not: every bad token costs a
    full check. A lookup compares the header only on a hash match (SipHash, keyed per process), so
    its timing says nothing about the tokens it holds.
    """

    def __init__(self, entries: Sequence[AccessEntry]) -> None:
        self._entries = tuple(entries)
        self._granted: dict[str, Grant] = {}

    def authorize(self, authorization: str | None) -> Grant:
        if authorization is not None:
            grant = self._granted.get(authorization)
            if grant is not None:
                return grant
        grant = self._check(authorization)
        assert authorization is not None  # _check refused a missing header
        granted = self._granted
        if len(granted) >= GRANT_CACHE_SIZE:
            del granted[next(iter(granted))]  # the oldest
        granted[authorization] = grant
        return grant

    def _check(self, authorization: str | None) -> Grant:
        kind, agent_id, secret = parse_bearer(authorization)
        entry: AccessEntry | None = None
        digest = hash_token(secret)
        # Compare against every entry so timing does not say how many there are or which matched.
        for candidate in self._entries:
            if digest_matches(digest, candidate.token_sha256) and candidate.kind == kind and entry is None:
                entry = candidate
        if entry is None:
            raise AccessDenied(401, f"bad token: unknown or invalid {kind} token")
        if agent_id not in entry.agents:
            raise AccessDenied(403, f"this {kind} token is not allowed to use agent {agent_id}")
        return Grant(kind=kind, agent_id=agent_id, impersonate=entry.impersonate, subject=entry.name or kind)
