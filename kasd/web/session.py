"""The browser session: a signed cookie (``_kasd_session``) that stands for a personal token for at
most its lifetime (and ``MAX_SESSION_SECONDS``), and the CSRF token tied to it.

The cookie holds no token: ``{"u": user, "exp": …, "jti": the token's id, "kid": the id of the key
that signed the token, "n": a random nonce}``,
base64url, then ``.``, then HMAC-SHA256 over that (base64url). Every replica signs with the same key
(``session_key``: HKDF-SHA256 of the peer secret, labelled, so a session made on one replica is good
on all); a lone kasd draws a random key at start (sessions end with the process). The CSRF token is
HMAC(key, "csrf" + nonce): only who can read the sign-in answer or ``GET /-/session`` (same origin)
knows it, and a cross-site form cannot set the ``X-CSRF-Token`` header nor read the token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from typing import Any

import attrs
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

COOKIE = "_kasd_session"
#: longest session, whatever the token's lifetime
MAX_SESSION_SECONDS = 12 * 3600
#: HKDF's label: this key signs nothing but sessions
_LABEL = b"kasd web session cookie v1"
#: a cookie longer than this is not read
MAX_COOKIE_BYTES = 1024


def session_key(peer_secret: str | None) -> bytes:
    """The key every replica shares (derived from ``routing.peer_secret_file``), or a random one."""
    if not peer_secret:
        return os.urandom(32)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(peer_secret.encode())


@attrs.frozen(kw_only=True)
class BrowserSession:
    user: str
    #: seconds since the epoch
    expires: int
    #: the personal token's ``jti`` (a revoked token ends its sessions)
    token_id: str
    nonce: str
    #: the ``kid`` of the key that signed the token (a key taken out of the key set ends its sessions)
    key_id: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, what: bytes) -> str:
        return _b64(hmac.new(self._key, what, hashlib.sha256).digest())

    def new(self, user: str, token_expires: int, token_id: str, now: float, key_id: str = "") -> BrowserSession:
        expires = min(int(token_expires), int(now) + MAX_SESSION_SECONDS)
        return BrowserSession(user=user, expires=expires, token_id=token_id, nonce=secrets.token_urlsafe(16),
                              key_id=key_id)

    def cookie_value(self, session: BrowserSession) -> str:
        payload = _b64(json.dumps({"u": session.user, "exp": session.expires, "jti": session.token_id,
                                   "kid": session.key_id, "n": session.nonce}, separators=(",", ":")).encode())
        return f"{payload}.{self._mac(payload.encode())}"

    def read(self, value: str | None, now: float) -> BrowserSession | None:
        """The session of a cookie value, or None (absent, forged, malformed or expired)."""
        if not value or len(value) > MAX_COOKIE_BYTES:
            return None
        payload, sep, mac = value.partition(".")
        if not sep or not hmac.compare_digest(mac.encode(), self._mac(payload.encode()).encode()):
            return None
        try:
            data: Any = json.loads(_unb64(payload))
            session = BrowserSession(user=str(data["u"]), expires=int(data["exp"]), token_id=str(data["jti"]),
                                     nonce=str(data["n"]), key_id=str(data["kid"]))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires > now else None

    def csrf_token(self, session: BrowserSession) -> str:
        return self._mac(b"csrf\x00" + session.nonce.encode())

    def csrf_ok(self, session: BrowserSession, offered: str | None) -> bool:
        return bool(offered) and hmac.compare_digest(str(offered).encode(), self.csrf_token(session).encode())
