"""TLS contexts built from files that are read again when the files change, without a restart.

    tls = ReloadingContext(TLSFiles(cert=..., key=..., server=True), name="agent")
    tls_stream(stream, tls, server_side=True)    # every handshake uses the context current then

A ``ReloadingContext`` is an ``ssl.SSLContext`` (so every server and client that takes one takes it
unchanged) whose ``wrap_bio``/``wrap_socket`` hand out TLS objects of the *current* context, built from
the files. At most every ``check_interval`` seconds (checked at the next handshake) and at each
``reload()`` (SIGHUP) it compares the files' identity (device, inode, size, modification time: a
rename over the file, as Kubernetes does for a Secret's mount, changes it too) with the last one seen;
when it changed it builds a NEW context from them. A connection keeps the context it was made with,
so connections in flight are not touched. A pair that does not load (unreadable, half written, the
key of another certificate, an encrypted key) is refused with one ERROR line and the previous
context stays: nothing is ever half loaded. Each loaded certificate is logged at INFO (subject,
notAfter, serial, SHA-256 fingerprint; never the key).

Only what ``set_alpn_protocols`` sets on it is carried to the contexts it builds; everything else
is said by ``TLSFiles``. The files are read on the event loop: a stat per file at most every
``check_interval``, a load (a few milliseconds) only when they changed.

May import: attrs, cryptography and the standard library.
"""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
from cryptography import x509

log = logging.getLogger("netio.tls")

#: seconds between two looks at the files, by default
CHECK_INTERVAL = 10.0


class TLSLoadError(Exception):
    """The files do not make a TLS context; the message names the file and the problem."""


@attrs.frozen(kw_only=True)
class TLSFiles:
    """The files of one TLS context. A server has ``cert`` and ``key`` (``ca``: require client
    certificates signed by it); a client has ``ca`` (None: the system's CAs) and, for mutual TLS,
    ``cert`` and ``key``."""

    server: bool
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.cert, self.key, self.ca) if p is not None)


def _no_passphrase() -> str:
    raise TLSLoadError("the key is encrypted (it must be readable without a passphrase)")


def build_context(files: TLSFiles) -> ssl.SSLContext:
    """A new context from ``files``; ``TLSLoadError`` naming the file and the problem if they do not load."""
    purpose = ssl.Purpose.CLIENT_AUTH if files.server else ssl.Purpose.SERVER_AUTH
    if files.ca is None:
        context = ssl.create_default_context(purpose)  # a client: the system's CAs
    else:
        try:  # (given a CA file, create_default_context loads it alone, never the system's CAs too)
            context = ssl.create_default_context(purpose, cafile=str(files.ca))
        except ssl.SSLError:
            raise TLSLoadError(f"no PEM certificate in {str(files.ca)!r}") from None
        except OSError as exc:
            raise TLSLoadError(f"cannot read {str(files.ca)!r}: {exc.strerror or exc}") from None
        if files.server:
            context.verify_mode = ssl.CERT_REQUIRED
    if files.cert is not None:
        if files.key is None:
            raise TLSLoadError(f"a key file is needed with {str(files.cert)!r}")
        _certificate(files.cert)  # a clear error for a certificate file that is not one
        try:
            context.load_cert_chain(str(files.cert), str(files.key), password=_no_passphrase)
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise TLSLoadError(f"the key {str(files.key)!r} does not belong to the certificate "
                                   f"{str(files.cert)!r}") from None
            raise TLSLoadError(f"no PEM private key in {str(files.key)!r}") from None
        except OSError as exc:
            raise TLSLoadError(f"cannot read {str(files.key)!r}: {exc.strerror or exc}") from None
    elif files.server:
        raise TLSLoadError("a server needs a certificate and a key")
    return context


def _certificate(path: Path) -> x509.Certificate:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TLSLoadError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise TLSLoadError(f"no PEM certificate in {str(path)!r}") from None


def describe_certificate(path: Path) -> str:
    """``subject=… not_after=… serial=… sha256=…`` of the first certificate in ``path`` (for the log)."""
    cert = _certificate(path)
    from cryptography.hazmat.primitives.serialization import Encoding

    fingerprint = hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()
    return (f"subject={cert.subject.rfc4514_string()!r} not_after={cert.not_valid_after_utc.isoformat()} "
            f"serial={cert.serial_number:x} sha256={fingerprint}")


_Identity = tuple[tuple[int, int, int, int] | None, ...]


def file_identity(path: Path) -> tuple[int, int, int, int] | None:
    """What tells a file changed (device, inode, size, modification time; None: it cannot be stat'ed)."""
    return _identity((path,))[0]


def _identity(paths: Iterable[Path]) -> _Identity:
    out: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ReloadingContext(ssl.SSLContext):
    """See the module docstring. Raises ``TLSLoadError`` if the files do not load at the start."""

    def __new__(cls, files: TLSFiles, **_: Any) -> ReloadingContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_SERVER if files.server else ssl.PROTOCOL_TLS_CLIENT)

    def __init__(self, files: TLSFiles, *, name: str, check_interval: float = CHECK_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.files = files
        self.name = name
        self.check_interval = check_interval
        self._clock = clock
        self._alpn: list[str] | None = None
        self._seen = _identity(files.paths)
        self._current = build_context(files)
        self._next_check = clock() + check_interval
        #: contexts built since the start (the first one included), and changed files refused
        self.loads = 1
        self.failures = 0
        self._log_loaded("loaded")

    @property
    def current(self) -> ssl.SSLContext:
        """The context new connections get (after a look at the files, if one is due)."""
        if self.check_interval > 0 and self._clock() >= self._next_check:
            self.check()
        return self._current

    def check(self) -> bool:
        """Build a new context if the files changed since the last look; True if one was built."""
        self._next_check = self._clock() + self.check_interval
        seen = _identity(self.files.paths)
        if seen == self._seen:
            return False
        self._seen = seen  # a broken pair is reported once, then again only when the files change
        try:
            context = build_context(self.files)
        except TLSLoadError as exc:
            self.failures += 1
            log.error("TLS files not reloaded name=%s: %s; connections keep the previous certificate", self.name, exc)
            return False
        if self._alpn is not None:
            context.set_alpn_protocols(self._alpn)
        self._current = context
        self.loads += 1
        self._log_loaded("reloaded")
        return True

    def reload(self) -> bool:
        """Look at the files now (SIGHUP); True if a new context was built."""
        return self.check()

    def _log_loaded(self, what: str) -> None:
        if self.files.cert is not None:
            log.info("TLS certificate %s name=%s %s", what, self.name, describe_certificate(self.files.cert))
        elif self.files.ca is not None:
            log.info("TLS CA bundle %s name=%s file=%s", what, self.name, self.files.ca)

    # ---- what an SSLContext's users call

    def set_alpn_protocols(self, alpn_protocols: Iterable[str]) -> None:
        self._alpn = list(alpn_protocols)
        self._current.set_alpn_protocols(self._alpn)

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, server_side: bool = False,
                 server_hostname: str | bytes | None = None, session: ssl.SSLSession | None = None) -> ssl.SSLObject:
        return self.current.wrap_bio(incoming, outgoing, server_side=server_side, server_hostname=server_hostname,
                                     session=session)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        return self.current.wrap_socket(*args, **kwargs)


def reload_counts(contexts: Iterable[ssl.SSLContext | None]) -> dict[str, tuple[int, int]]:
    """Per context name (``ReloadingContext.name``), the reloads since the start that took (a new
    context built) and those refused (changed files that did not load): for a daemon's metrics."""
    counts: dict[str, tuple[int, int]] = {}
    for context in contexts:
        if isinstance(context, ReloadingContext):
            ok, failed = counts.get(context.name, (0, 0))
            counts[context.name] = (ok + context.loads - 1, failed + context.failures)
    return counts


def reload_all(contexts: Iterable[ssl.SSLContext | None]) -> None:
    """``reload()`` each ``ReloadingContext`` among ``contexts`` (a SIGHUP)."""
    for context in contexts:
        if isinstance(context, ReloadingContext):
            context.reload()


__all__ = ["CHECK_INTERVAL", "ReloadingContext", "TLSFiles", "TLSLoadError", "build_context", "describe_certificate",
           "file_identity", "reload_all", "reload_counts"]
