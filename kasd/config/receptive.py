"""``agents[].receptive:``: an agent kasd dials (docs/kasd.md, "Receptive agents").

The fields are GitLab's URL configuration of a receptive agent (``url``, ``ca_cert``, ``tls_host``,
``client_cert`` + ``client_key`` for certificate authentication, or ``private_key`` for JWT
authentication), as files: ``ca_cert_file``, ``client_cert_file``, ``client_key_file``,
``private_key_file``. Every file is loaded now, so a wrong one is a configuration error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
from joserfc.jwk import OKPKey

from daemonkit.settings import Problem, ca_bundle, setting
from kasd.config.listeners import tls_pair_problem
from kasd.config.values import expect_type, parse_existing_file, parse_string
from wire.receptive import parse_ed25519_key

#: TLS schemes: GitLab's ``grpcs`` and ``https`` (both mean TLS to agentd's receptive listener)
SCHEMES = ("grpcs", "https")


def _url(value: Any) -> str:
    text = expect_type(value, str, "a URL, grpcs://host:port")
    parts = urlsplit(text)
    if parts.scheme in ("grpc", "http"):
        raise Problem(f"{text!r} is plaintext: kasd dials receptive agents over TLS only (grpcs://host:port)")
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise Problem(f"must be grpcs://host:port (or https://host:port), got {text!r}")
    try:
        port = parts.port
    except ValueError:
        raise Problem(f"bad port in {text!r}") from None
    if port is None:
        raise Problem(f"{text!r} names no port (agentd's --receptive-listen-address)")
    if parts.username is not None or parts.password is not None or parts.path not in ("", "/"):
        raise Problem(f"must be grpcs://host:port with no user, password or path, got {text!r}")
    return text  # type: ignore[no-any-return]


def _optional_file(value: Any) -> Path | None:
    return None if value is None else parse_existing_file(value)


def _optional_ca(value: Any) -> Path | None:
    return None if value is None else ca_bundle(Path(expect_type(value, str, "a file path")))


def _optional_name(value: Any) -> str | None:
    return None if value is None else parse_string(value)


def load_private_key(path: Path) -> OKPKey:
    """The Ed25519 private key kasd signs a receptive agent's JWTs with: PEM (PKCS8), or GitLab's
    form, base64 of the 32-byte seed. ``Problem`` names the file, never its bytes."""
    try:
        text = path.read_bytes().strip()
    except OSError as exc:
        raise Problem(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return parse_ed25519_key(text, private=True)
    except ValueError as exc:
        raise Problem(f"{str(path)!r} {exc}") from None


@attrs.frozen(kw_only=True)
class ReceptiveEntry:
    """How kasd dials one receptive agent and proves itself to it."""

    #: agentd's receptive listener, grpcs://host:port
    url: str = setting(parse=_url)
    #: the CA bundle that verifies agentd's certificate (default: the system's)
    ca_cert_file: Path | None = setting(None, parse=_optional_ca)
    #: the name agentd's certificate is verified for (and SNI), when not the URL's host
    tls_host: str | None = setting(None, parse=_optional_name)
    #: mutual TLS: kasd's client certificate and key
    client_cert_file: Path | None = setting(None, parse=_optional_file)
    client_key_file: Path | None = setting(None, parse=_optional_file)
    #: JWT: the Ed25519 private key kasd signs with (agentd holds the public key)
    private_key_file: Path | None = setting(None, parse=_optional_file)

    def __attrs_post_init__(self) -> None:
        mtls = self.client_cert_file is not None or self.client_key_file is not None
        if mtls == (self.private_key_file is not None):
            raise Problem("choose one way to authenticate to agentd: client_cert_file and client_key_file "
                          "(mutual TLS), or private_key_file (JWT)")
        if mtls:
            if self.client_cert_file is None or self.client_key_file is None:
                raise Problem("mutual TLS needs both client_cert_file and client_key_file")
            # (as the listeners' pairs: an encrypted key is refused by name, never prompted for)
            problem = tls_pair_problem(self.client_cert_file, self.client_key_file)
            if problem is not None:
                raise Problem(f"client_cert_file / client_key_file: {problem}")
        else:
            assert self.private_key_file is not None
            problem = None
            try:
                load_private_key(self.private_key_file)
            except Problem as exc:
                problem = exc.text
            if problem is not None:
                raise Problem(f"private_key_file: {problem}")

    @property
    def auth(self) -> str:
        return "jwt" if self.private_key_file is not None else "mtls"

    @property
    def host(self) -> str:
        host = urlsplit(self.url).hostname
        assert host is not None
        return host

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port
