"""The Ed25519 keys that sign and verify kasd's job and personal tokens.

One private key signs (``kasctl token …`` reads it; kasd itself never needs it); kasd verifies with a
``KeySet`` of public keys, looked up by the token's ``kid``. Rotation is two keys in the set at once:
add the new public key, sign with the new private key, drop the old public key once the last token
it signed has expired. A key's ``kid`` is its RFC 7638 JWK thumbprint (SHA-256, base64url) unless the
configuration names one, so the same file always has the same id on every replica.

Files are PEM: PKCS8 for the private key (mode 0600), SubjectPublicKeyInfo for the public one, as
``openssl genpkey -algorithm ed25519`` and ``openssl pkey -pubout`` write them. Errors name the file
and what is wrong with it, never its bytes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from joserfc.jwk import OKPKey

#: ``kasctl keys generate`` writes ``<name>.pem`` and ``<name>.pub.pem``
DEFAULT_KEY_NAME = "jobtoken-signing"


class KeyFileError(Exception):
    """A key file that cannot be used; the message names the file and why (never its content)."""


def key_id(public_key: ed25519.Ed25519PublicKey) -> str:
    """The RFC 7638 JWK thumbprint of ``public_key`` (SHA-256, base64url): a stable ``kid``."""
    return OKPKey.import_key(public_key).thumbprint()


@attrs.frozen(kw_only=True)
class VerificationKey:
    """A public key that kasd accepts token signatures from."""

    kid: str
    #: where it came from (a file name), for messages
    source: str
    jwk: OKPKey = attrs.field(repr=False, eq=False)

    @classmethod
    def from_public_key(cls, public_key: ed25519.Ed25519PublicKey, *, source: str,
                        kid: str | None = None) -> VerificationKey:
        return cls(kid=kid or key_id(public_key), source=source, jwk=OKPKey.import_key(public_key))


@attrs.frozen(kw_only=True)
class SigningKey:
    """A private key that signs tokens (kasctl, the demo, tests)."""

    kid: str
    source: str
    private_key: ed25519.Ed25519PrivateKey = attrs.field(repr=False, eq=False)
    jwk: OKPKey = attrs.field(repr=False, eq=False)

    @classmethod
    def from_private_key(cls, private_key: ed25519.Ed25519PrivateKey, *, source: str,
                         kid: str | None = None) -> SigningKey:
        return cls(kid=kid or key_id(private_key.public_key()), source=source,
                   private_key=private_key, jwk=OKPKey.import_key(private_key))

    @classmethod
    def generate(cls, *, kid: str | None = None) -> SigningKey:
        """A fresh key that lives only in memory (tests; ``write_key_pair`` to keep one)."""
        return cls.from_private_key(ed25519.Ed25519PrivateKey.generate(), source="<generated>", kid=kid)

    def verification_key(self) -> VerificationKey:
        """The public half, under the same ``kid``."""
        return VerificationKey.from_public_key(self.private_key.public_key(), source=self.source, kid=self.kid)

    def private_pem(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    def public_pem(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@attrs.frozen
class KeySet:
    """The public keys tokens may be signed with, by ``kid``: at least one; two while rotating."""

    by_kid: Mapping[str, VerificationKey]

    @classmethod
    def of(cls, keys: Iterable[VerificationKey]) -> KeySet:
        by_kid: dict[str, VerificationKey] = {}
        for key in keys:
            if key.kid in by_kid:
                raise KeyFileError(f"{key.source}: key id {key.kid!r} is also the id of "
                                   f"{by_kid[key.kid].source}; each verification key needs its own")
            by_kid[key.kid] = key
        if not by_kid:
            raise KeyFileError("no verification key: name at least one public key file")
        return cls(by_kid)

    @classmethod
    def from_pem_files(cls, paths: Iterable[str | os.PathLike[str]]) -> KeySet:
        """Public key files (a private key file stands for its public half), kid = thumbprint."""
        return cls.of(load_verification_key(path) for path in paths)

    def get(self, kid: str) -> VerificationKey | None:
        return self.by_kid.get(kid)

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self.by_kid)


# ------------------------------------------------------------------ loading


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{os.fspath(path)}: cannot read the key file: {exc.strerror or exc}") from None


def signing_key_from_pem(data: bytes, *, source: str, kid: str | None = None) -> SigningKey:
    """An unencrypted Ed25519 private key in PEM, or ``KeyFileError`` saying what ``source`` holds instead."""
    if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data:
        raise KeyFileError(f"{source}: the private key is encrypted; kasctl needs an unencrypted PKCS8 "
                           "key (`kasctl keys generate` writes one, mode 0600)")
    if b"-----BEGIN PUBLIC KEY-----" in data and b"PRIVATE KEY-----" not in data:
        raise KeyFileError(f"{source}: this is a public key; signing needs the private key "
                           f"(e.g. {DEFAULT_KEY_NAME}.pem, not {DEFAULT_KEY_NAME}.pub.pem)")
    try:
        private_key = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # cryptography: "Password was not given but private key is encrypted"
        raise KeyFileError(f"{source}: the private key is encrypted; kasctl needs an unencrypted "
                           "PKCS8 key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(f"{source}: not a PEM private key (expected -----BEGIN PRIVATE KEY-----, "
                           "an Ed25519 key in PKCS8)") from None
    if not isinstance(private_key, ed25519.Ed25519PrivateKey):
        raise KeyFileError(f"{source}: holds {_kind(private_key)} key; tokens are signed with Ed25519 "
                           "(`kasctl keys generate`, or `openssl genpkey -algorithm ed25519`)")
    return SigningKey.from_private_key(private_key, source=source, kid=kid)


def verification_key_from_pem(data: bytes, *, source: str, kid: str | None = None) -> VerificationKey:
    """An Ed25519 public key in PEM; an unencrypted private key stands for its public half."""
    if b"PRIVATE KEY-----" in data:
        return signing_key_from_pem(data, source=source, kid=kid).verification_key()
    try:
        public_key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(f"{source}: not a PEM public key (expected -----BEGIN PUBLIC KEY-----, "
                           "an Ed25519 key)") from None
    if not isinstance(public_key, ed25519.Ed25519PublicKey):
        raise KeyFileError(f"{source}: holds {_kind(public_key)} key; tokens are verified with Ed25519")
    return VerificationKey.from_public_key(public_key, source=source, kid=kid)


def load_signing_key(path: str | os.PathLike[str], *, kid: str | None = None) -> SigningKey:
    return signing_key_from_pem(_read(path), source=os.fspath(path), kid=kid)


def load_verification_key(path: str | os.PathLike[str], *, kid: str | None = None) -> VerificationKey:
    return verification_key_from_pem(_read(path), source=os.fspath(path), kid=kid)


def _kind(key: object) -> str:
    for kinds, name in (((rsa.RSAPrivateKey, rsa.RSAPublicKey), "an RSA"),
                        ((ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey), "an EC"),
                        ((ed448.Ed448PrivateKey, ed448.Ed448PublicKey), "an Ed448"),
                        ((dsa.DSAPrivateKey, dsa.DSAPublicKey), "a DSA")):
        if isinstance(key, kinds):
            return name
    return "another kind of"


# ------------------------------------------------------------------ writing


@attrs.frozen(kw_only=True)
class KeyPairFiles:
    private: Path
    public: Path
    kid: str


def write_key_pair(directory: str | os.PathLike[str], *, name: str = DEFAULT_KEY_NAME,
                   key: SigningKey | None = None) -> KeyPairFiles:
    """Write ``key`` (a new one by default) as ``<name>.pem`` (0600) and ``<name>.pub.pem`` (0644)
    in ``directory`` (made 0700 if absent). Never overwrites: if either file exists nothing is
    written; on any failure neither file is left behind (both are written aside, then linked in)."""
    key = key or SigningKey.generate()
    folder = Path(directory)
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    for path in (private, public):
        if path.exists() or path.is_symlink():
            raise KeyFileError(f"{path}: already exists; keys are never overwritten (move it away, "
                               "or choose another directory)")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyFileError(f"{folder}: cannot create the directory: {exc.strerror or exc}") from None
    placed: list[Path] = []
    aside: list[Path] = []
    try:
        for final, data, mode in ((private, key.private_pem(), 0o600), (public, key.public_pem(), 0o644)):
            temporary = folder / f".{final.name}.{secrets.token_hex(6)}.tmp"
            aside.append(temporary)
            _write_new(temporary, data, mode)
        for final, temporary in zip((private, public), aside, strict=True):
            os.link(temporary, final)  # unlike rename, fails rather than replace a file that appeared
            placed.append(final)
    except OSError as exc:
        for path in placed:
            path.unlink(missing_ok=True)
        raise KeyFileError(f"{exc.filename or folder}: cannot write the key: {exc.strerror or exc}") from None
    finally:
        for temporary in aside:
            temporary.unlink(missing_ok=True)
    return KeyPairFiles(private=private, public=public, kid=key.kid)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may only have narrowed it; say exactly
        with os.fdopen(fd, "wb", closefd=False) as out:
            out.write(data)
            out.flush()
            os.fsync(fd)
    finally:
        os.close(fd)
