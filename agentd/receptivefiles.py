"""What receptive mode reads from files, and the check of its settings as a whole: below both
``agentd.config`` (which checks the settings at load) and ``agentd.receptive`` (which serves them),
so neither imports the other.

May import: ``netio.tlsreload``, ``wire.receptive``, joserfc and the standard library. It reads
agentd's settings through ``ReceptiveSettings`` (the fields it needs), not ``agentd.config``'s class,
so the two modules do not name each other even for annotations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from joserfc.jwk import OKPKey

from netio.tlsreload import TLSFiles, TLSLoadError, build_context
from wire.receptive import parse_ed25519_key


class ReceptiveSettings(Protocol):
    """The settings receptive mode reads (``agentd.config.AgentdConfig`` has them)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def receptive_cert_file(self) -> Path | None: ...
    @property
    def receptive_key_file(self) -> Path | None: ...
    @property
    def receptive_jwt_file(self) -> Path | None: ...
    @property
    def receptive_ca_cert_file(self) -> Path | None: ...
    @property
    def receptive_client_name(self) -> str | None: ...


class ReceptiveKeyError(Exception):
    """The JWT public key file cannot be used; the message names the file (never its bytes)."""


def load_public_key(path: Path) -> OKPKey:
    """kasd's Ed25519 public key: PEM (SubjectPublicKeyInfo) or GitLab's form, base64 of the 32 raw
    bytes (what its URL configuration API returns as ``public_key``)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReceptiveKeyError(f"cannot read the JWT public key file {path}: {exc.strerror or exc}") from None
    try:
        return parse_ed25519_key(data, private=False)
    except ValueError as exc:
        raise ReceptiveKeyError(f"JWT public key file {path} {exc}") from None


def listener_files(config: ReceptiveSettings) -> TLSFiles:
    """The receptive listener's TLS files: its certificate and key, and (mutual TLS) the CA that signs
    kasd's client certificate."""
    assert config.receptive_cert_file is not None and config.receptive_key_file is not None
    return TLSFiles(server=True, cert=config.receptive_cert_file, key=config.receptive_key_file,
                    ca=config.receptive_ca_cert_file)


def receptive_settings_problem(config: ReceptiveSettings, where: Callable[[str], str]) -> str | None:
    """What is wrong with the receptive settings as a whole (the listen address is set), or None."""
    for key in ("receptive_cert_file", "receptive_key_file"):
        if getattr(config, key) is None:
            return f"{where(key)} is needed with {where('receptive_listen_address')}: kasd dials agentd over TLS"
    if (config.receptive_jwt_file is None) == (config.receptive_ca_cert_file is None):
        return (f"receptive mode authenticates kasd one way: set either {where('receptive_jwt_file')} (JWT) "
                f"or {where('receptive_ca_cert_file')} (mutual TLS)")
    if config.receptive_ca_cert_file is not None and not config.receptive_client_name:
        return (f"{where('receptive_client_name')} is needed with {where('receptive_ca_cert_file')}: the name kasd's "
                "client certificate carries (any other certificate the CA signed, such as an agentd's own, is not kasd's)")
    if config.receptive_jwt_file is not None:
        if not config.agent_id:
            return (f"{where('agent_id')} is needed with {where('receptive_jwt_file')}: agentd accepts only the "
                    "tokens kasd signs for its agent id (a token for another agent that trusts the same key is refused)")
        try:
            load_public_key(config.receptive_jwt_file)
        except ReceptiveKeyError as exc:
            return f"{where('receptive_jwt_file')}: {exc}"
    try:
        build_context(listener_files(config))
    except TLSLoadError as exc:
        return f"{where('receptive_cert_file')} / {where('receptive_key_file')}: {exc}"
    return None
