"""The static ``access:`` list of kasd's config: kasd's first ``Authority`` (``kasd.seams``).

Bearer tokens are ``ci:<agent id>:<job token>`` or ``pat:<agent id>:<personal token>``; the pipeline
parses them (``kasd.seams.parse_bearer``) and asks the authority. In this version a static list
decides; full CI authorization (signed job tokens, the agent's ``ci_access``) is a second
implementation of the same seam.
"""

from __future__ import annotations

from collections.abc import Sequence

from kasd.config import AccessEntry
from kasd.seams import AccessDenied, Credentials, Grant
from kasd.tokens import digest_matches, hash_token

#: how many granted credentials StaticAccess remembers
GRANT_CACHE_SIZE = 1024


class StaticAccess:
    """The ``access:`` list of kasd's config.

    A client sends the same token with every request, so the grants of the last
    ``GRANT_CACHE_SIZE`` distinct credentials (for an agent) are remembered (the list never changes
    while kasd runs; a reload builds a new StaticAccess). Refusals are not: every bad token costs a
    full check. A lookup compares the secret only on a hash match (SipHash, keyed per process), so
    its timing says nothing about the tokens it holds.
    """

    def __init__(self, entries: Sequence[AccessEntry]) -> None:
        self._entries = tuple(entries)
        self._granted: dict[tuple[Credentials, int], Grant] = {}

    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        key = (credentials, agent_id)
        grant = self._granted.get(key)
        if grant is not None:
            return grant
        grant = self._check(credentials, agent_id)
        granted = self._granted
        if len(granted) >= GRANT_CACHE_SIZE:
            del granted[next(iter(granted))]  # the oldest
        granted[key] = grant
        return grant

    def _check(self, credentials: Credentials, agent_id: int) -> Grant:
        kind = credentials.kind
        entry: AccessEntry | None = None
        digest = hash_token(credentials.secret)
        # Compare against every entry so timing does not say how many there are or which matched.
        for candidate in self._entries:
            if digest_matches(digest, candidate.token_sha256) and candidate.kind == kind and entry is None:
                entry = candidate
        if entry is None:
            raise AccessDenied(401, f"bad token: unknown or invalid {kind} token")
        if agent_id not in entry.agents:
            raise AccessDenied(403, f"this {kind} token is not allowed to use agent {agent_id}")
        return Grant(kind=kind, agent_id=agent_id, impersonate=entry.impersonate, subject=entry.name or kind)
