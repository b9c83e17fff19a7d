"""Secrets as kasd stores them: sha256 hex digests, compared in constant time. Never logged."""

from __future__ import annotations

import hashlib
import hmac
import re

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def token_from_text(text: str) -> str:
    """The token a token file holds, read as agentd reads its ``--token-file``: surrounding
    whitespace, blank lines included, is not part of it (``str.strip``, as in
    ``agentd.connection.ConnectionManager``), so ``kasd hash-token`` hashes what agentd sends."""
    return text.strip()


def hash_token(token: str) -> str:
    """The ``token_sha256`` value for a raw token (what ``kasd hash-token`` prints)."""
    return hashlib.sha256(token.encode()).hexdigest()


def is_token_hash(value: object) -> bool:
    return isinstance(value, str) and _HEX64.match(value) is not None


def digest_matches(digest: str, token_sha256: str) -> bool:
    """A ``hash_token`` result against a stored hash, in constant time (hash once, compare many)."""
    return hmac.compare_digest(digest, token_sha256)
