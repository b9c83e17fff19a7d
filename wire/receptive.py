"""The receptive handshake (docs/protocol.md, "Receptive agents: the dial-in handshake"), sans-I/O.

For a receptive agent kasd dials agentd instead of the other way round. Over the TLS connection kasd
opened, before anything else, kasd sends one line, the *hello*::

    KASR/1 <credential>\\n

``<credential>`` is a JWT (Ed25519, signed with the private key kasd holds for that agent; agentd
verifies it with the public key) or ``-`` when the TLS client certificate is the credential (mutual
TLS). agentd answers one line, ``OK\\n`` or ``NO <reason>\\n`` (then closes). After ``OK`` the roles
are those of the agent port: agentd is the HTTP/2 client and sends its tunnel request (``POST
/tunnel`` with its agent token), kasd the server that authenticates it; the session follows.

Both lines are bounded (``MAX_HELLO``, ``MAX_REPLY``) and parsed as they arrive, so a stranger's bytes
are refused at the first wrong one. Time is an argument (``now``); nothing here reads a clock or a
socket. The JWT is joserfc's (``alg: Ed25519``, RFC 9864's name for EdDSA over Ed25519, and no other).
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

#: the hello's first bytes: the handshake's name and version
MAGIC = b"KASR/1 "
#: a hello (the line kasd sends) is at most this long, newline included
MAX_HELLO = 2048
#: agentd's answer is at most this long
MAX_REPLY = 256
#: the credential of a hello when the client certificate authenticates kasd
MTLS_CREDENTIAL = "-"
OK = b"OK\n"
#: the JWT's audience and issuer
AUDIENCE = "agentd"
ISSUER = "kasd"
#: a token lives this long (kasd mints one per dial)
TOKEN_TTL = 60
#: agentd refuses tokens meant to live longer than this, and tolerates this much clock skew
MAX_TOKEN_LIFETIME = 300
CLOCK_SKEW = 30
#: EdDSA over Ed25519, by RFC 9864's name (as kasd's job tokens)
_ALGORITHMS = ["Ed25519"]


class HandshakeRefused(Exception):
    """The peer's handshake is refused; ``reason`` is short, fixed text (never a credential)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def hello(credential: str) -> bytes:
    """kasd's first line."""
    line = MAGIC + credential.encode("ascii") + b"\n"
    if len(line) > MAX_HELLO or b"\n" in line[:-1] or b" " in line[len(MAGIC):]:
        raise ValueError("the receptive credential must be one line of at most "
                         f"{MAX_HELLO - len(MAGIC) - 1} ASCII characters")
    return line


def parse_hello(buffer: bytes | bytearray) -> str | None:
    """The credential once ``buffer`` holds the whole hello; None while it may still come. Raises
    ``HandshakeRefused`` at the first byte that cannot begin a hello, or past ``MAX_HELLO``."""
    head = bytes(buffer[:len(MAGIC)])
    if not MAGIC.startswith(head):
        raise HandshakeRefused("not a receptive hello")
    end = buffer.find(b"\n")
    if end < 0:
        if len(buffer) >= MAX_HELLO:
            raise HandshakeRefused("hello too long")
        return None
    if end + 1 > MAX_HELLO or len(head) < len(MAGIC):
        raise HandshakeRefused("not a receptive hello")
    if end + 1 != len(buffer):
        # kasd waits for the answer before it says anything else
        raise HandshakeRefused("bytes after the hello")
    try:
        credential = bytes(buffer[len(MAGIC):end]).decode("ascii")
    except UnicodeDecodeError:
        raise HandshakeRefused("hello is not ASCII") from None
    if not credential or any(c.isspace() for c in credential):
        raise HandshakeRefused("malformed hello")
    return credential


def refusal(reason: str) -> bytes:
    """agentd's answer to a refused hello."""
    return (b"NO " + reason.encode("ascii", "replace") + b"\n")[:MAX_REPLY]


def parse_reply(buffer: bytes | bytearray) -> str | None:
    """``""`` for OK, the reason for a refusal, None while the line may still come. Raises
    ``HandshakeRefused`` for anything else (past ``MAX_REPLY``, or not a reply at all)."""
    end = buffer.find(b"\n")
    if end < 0:
        if len(buffer) >= MAX_REPLY or not (OK.startswith(bytes(buffer[:3])) or b"NO ".startswith(bytes(buffer[:3]))):
            raise HandshakeRefused("agentd's answer is not a receptive reply")
        return None
    line = bytes(buffer[:end + 1])
    if line == OK:
        return ""
    if line.startswith(b"NO "):
        return line[3:-1].decode("ascii", "replace") or "refused"
    raise HandshakeRefused("agentd's answer is not a receptive reply")


# --------------------------------------------------------------------------- the JWT


def parse_ed25519_key(data: bytes, *, private: bool) -> OKPKey:
    """The Ed25519 key a file holds (kasd's private half, agentd's public half): PEM, or GitLab's
    form, base64 of the raw bytes (a public key's 32; a private key's 32-byte seed, or seed + public
    key as Go's ``ed25519.PrivateKey``). ``ValueError`` says what is wrong (after the file's name),
    never the bytes."""
    half = "private" if private else "public"
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            key = OKPKey.import_key(text)
        except Exception:
            raise ValueError(f"holds no Ed25519 {half} key") from None
        if key.is_private != private or key.curve_name != "Ed25519":
            raise ValueError(f"must hold an Ed25519 {half} key" + ("" if private else " only"))
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if private and len(raw) in (32, 64):
        return OKPKey.import_key(ed25519.Ed25519PrivateKey.from_private_bytes(raw[:32]))
    if not private and len(raw) == 32:
        return OKPKey.import_key(ed25519.Ed25519PublicKey.from_public_bytes(raw))
    raise ValueError("is neither PEM nor the base64 of " + ("an Ed25519 private key" if private
                                                             else "32 bytes of an Ed25519 key"))


def mint_token(private_key: OKPKey, *, agent_id: int, now: float, ttl: int = TOKEN_TTL) -> str:
    """A JWT for one dial to agent ``agent_id``: Ed25519, short-lived, with a fresh ``jti``."""
    issued = int(now)
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": str(agent_id), "iat": issued, "nbf": issued,
              "exp": issued + ttl, "jti": secrets.token_urlsafe(12)}
    return jwt.encode({"alg": "Ed25519", "typ": "JWT"}, claims, private_key, algorithms=_ALGORITHMS)


def verify_token(token: str, public_key: OKPKey, *, now: float, agent_id: str) -> None:
    """Raise ``HandshakeRefused`` unless ``token`` is a JWT kasd signed with ``public_key``'s private
    half, for agent ``agent_id`` (its ``sub``), valid at ``now`` and short-lived: every instant it
    claims to be valid at (``iat`` and ``nbf`` to ``exp``) lies within ``MAX_TOKEN_LIFETIME``, and it
    was not issued in the future. The subject is always checked: a token kasd minted for another
    agent (one that trusts the same key) is refused, so that agent cannot pose as kasd here."""
    if not agent_id:
        raise HandshakeRefused("this agentd has no agent id to check the token's subject against")
    try:
        decoded = jwt.decode(token, public_key, algorithms=_ALGORITHMS)
    except (JoseError, ValueError, TypeError, json.JSONDecodeError):
        raise HandshakeRefused("bad token") from None
    claims: dict[str, Any] = dict(decoded.claims)
    exp, iat = claims.get("exp"), claims.get("iat")
    nbf = claims.get("nbf", iat)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (exp, iat, nbf)):
        raise HandshakeRefused("token lacks exp, iat or nbf")
    assert isinstance(exp, int) and isinstance(iat, int) and isinstance(nbf, int)
    if claims.get("aud") != AUDIENCE or claims.get("iss") != ISSUER:
        raise HandshakeRefused("token is not for agentd")
    if exp - min(iat, nbf) > MAX_TOKEN_LIFETIME:
        raise HandshakeRefused("token lives too long")
    if now > exp + CLOCK_SKEW:
        raise HandshakeRefused("token expired")
    if now + CLOCK_SKEW < max(nbf, iat):
        raise HandshakeRefused("token not yet valid")
    if claims.get("sub") != agent_id:
        raise HandshakeRefused("token is for another agent")
