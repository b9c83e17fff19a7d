"""agentd's allow-list of in-cluster services (the ``services:`` section of its configuration), the
check of each request against it, and where and how each service is reached (``ServiceTarget``).

The allow-list is agentd's own: kasd may ask for a service, a method and a path, never decide them.
A request is checked on its *normalised* path — the target's path, percent-decoded once, as the
service will read it — and any target whose reading could differ between agentd and the service is
refused outright rather than normalised: a dot segment (``..``, ``.``, in any encoding, before a
``;`` parameter, or as full-width dots), an encoded ``/`` or ``\\`` (``%2f``, ``%5c``), a backslash,
a NUL or other control character, a target not starting with exactly one ``/``, invalid UTF-8 after
decoding (overlong forms such as ``%c0%ae``), or a percent-encoding of any of these at any depth
(``%252e``). What is left has one reading, so a prefix of it is a prefix for the service too.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from agentd.upstream import host_header, target_url
from daemonkit import yamldoc
from daemonkit.settings import Problem, ca_bundle, setting, structure
from tunnelhttp.servicepath import UnsafeTarget, normalised_path

log = logging.getLogger("agentd.services")

DEFAULT_METHODS = ("GET", "HEAD")
DEFAULT_PATHS = ("/",)
DEFAULT_RESPONSE_HEADER_TIMEOUT = 30.0
#: a credentials file is a token, not a document: read no more of it than this
MAX_CREDENTIALS_BYTES = 16 * 1024

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_METHOD = re.compile(r"[A-Z]{1,20}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def prefix_allows(prefix: str, path: str) -> bool:
    """Whether the allowed ``prefix`` covers ``path``, segment by segment: ``/api/v1/`` and
    ``/api/v1`` both cover ``/api/v1`` and ``/api/v1/query``, neither covers ``/api/v1beta``."""
    base = prefix.rstrip("/")
    return base == "" or path == base or path.startswith(base + "/")


@attrs.frozen
class Verdict:
    """Why a request is not passed on: the HTTP status agentd answers with, its ``Status`` reason,
    and the message (it names the service, never a secret)."""

    status: int
    reason: str
    message: str


def check_request(service: ServiceSettings, method: str, target: str) -> Verdict | None:
    """None when ``service``'s allow-list lets ``method`` ``target`` through, else why not."""
    try:
        path = normalised_path(target)
    except UnsafeTarget as exc:
        return Verdict(400, "BadRequest", f"agentd: refusing the path for service {service.name!r}: {exc}")
    if method not in service.methods:
        return Verdict(403, "Forbidden", f"agentd: service {service.name!r} allows the methods "
                       f"{', '.join(service.methods)}, not {method}")
    if not any(prefix_allows(prefix, path) for prefix in service.paths):
        return Verdict(403, "Forbidden", f"agentd: service {service.name!r} allows the paths under "
                       f"{', '.join(service.paths)}, not {_shown_path(path)}")
    return None


def _shown_path(path: str) -> str:
    return repr(path if len(path) <= 200 else path[:200] + "…")


# --------------------------------------------------------------------------- the settings


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise Problem(f"expected a string, got {yamldoc.describe(value)}")
    return value


def _name(value: Any) -> str:
    name = _text(value)
    if not _NAME.fullmatch(name):
        raise Problem(f"must be a DNS label (lower-case letters, digits and '-', at most 63), got {name[:80]!r}")
    return name


def _url(value: Any) -> str:
    url = _text(value).strip()
    parts = urlsplit(url)
    shown = _shown_url(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Problem(f"must be an http:// or https:// URL with a host, got {shown}")
    if parts.username is not None or parts.password is not None:
        raise Problem(f"{shown} holds user information; give a credentials_file instead")
    try:
        parts.port  # noqa: B018 — raises ValueError for a bad port
    except ValueError:
        raise Problem(f"bad port in {shown}") from None
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise Problem(f"{shown} has a query or fragment; only a path may follow the host")
    if parts.path:
        try:
            normalised_path(parts.path)
        except UnsafeTarget as exc:
            raise Problem(f"{shown}: {exc}") from None
    return url


def _shown_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "…@" + netloc.rsplit("@", 1)[1]
    shown = f"{scheme}{sep}{netloc}{slash}{path}"
    return repr(shown if len(shown) <= 200 else shown[:200] + "…")


def _list_of_text(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise Problem(f"must be a list, got {yamldoc.describe(value)}")
    if not value:
        raise Problem("must not be empty (leave the key out for the default)")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise Problem(f"expected a string, got {yamldoc.describe(item)}", at=f"[{index}]")
    return value


def _methods(value: Any) -> tuple[str, ...]:
    methods = _list_of_text(value)
    for index, method in enumerate(methods):
        if not _METHOD.fullmatch(method):
            raise Problem(f"must be an upper-case HTTP method such as GET, got {method[:40]!r}", at=f"[{index}]")
    return tuple(dict.fromkeys(methods))


def _paths(value: Any) -> tuple[str, ...]:
    paths = _list_of_text(value)
    for index, path in enumerate(paths):
        if not path.startswith("/") or "?" in path or "%" in path:
            raise Problem(f"must be a path starting with / (no query, no percent-encoding), got {path[:80]!r}",
                          at=f"[{index}]")
        try:
            normalised_path(path)
        except UnsafeTarget as exc:
            raise Problem(f"{path[:80]!r}: {exc}", at=f"[{index}]") from None
    return tuple(dict.fromkeys(paths))


def _credentials_file(value: Any) -> Path | None:
    text = _text(value) if value is not None else ""
    if not text:
        return None
    path = Path(text).expanduser()
    try:
        read_credentials(path)
    except CredentialsError as exc:
        raise Problem(str(exc)) from None
    return path


def _ca_file(value: Any) -> Path | None:
    text = _text(value) if value is not None else ""
    return ca_bundle(Path(text).expanduser()) if text else None


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Problem(f"expected a number of seconds, got {yamldoc.describe(value)}")
    if not 0 < value <= 3600:
        raise Problem(f"must be above 0 and at most 3600 seconds, got {value!r}")
    return float(value)


@attrs.frozen(kw_only=True)
class ServiceSettings:
    """One in-cluster service kasd may reach through this agentd (``services:`` in its file)."""

    #: what kasd's request names (``RequestHead.service``)
    name: str = setting("", parse=_name)
    #: where it is; a path here is prepended to every request's
    url: str = setting("", parse=_url)
    methods: tuple[str, ...] = setting(DEFAULT_METHODS, parse=_methods)
    #: allowed prefixes of the normalised path
    paths: tuple[str, ...] = setting(DEFAULT_PATHS, parse=_paths)
    #: agentd sends ``Authorization: Bearer <its content>``; re-read when the file changes
    credentials_file: Path | None = setting(None, parse=_credentials_file)
    #: the CA bundle that signs an https service's certificate (default: the system's)
    ca_file: Path | None = setting(None, parse=_ca_file)
    #: seconds to wait for the response head before answering 504
    response_header_timeout: float = setting(DEFAULT_RESPONSE_HEADER_TIMEOUT, parse=_timeout)


def parse_services(value: Any) -> tuple[ServiceSettings, ...]:
    """The ``services:`` list: each item structured as the loader does (its errors keep their path,
    ``services[1].url``), then the checks across fields and items."""
    services: tuple[ServiceSettings, ...] = structure(value, tuple[ServiceSettings, ...])
    seen: dict[str, int] = {}
    for index, service in enumerate(services):
        if not service.name:
            raise Problem("missing: every service needs a name", at=f"[{index}].name")
        if not service.url:
            raise Problem("missing: every service needs a url", at=f"[{index}].url")
        if service.ca_file is not None and not service.url.startswith("https://"):
            raise Problem("a CA file is for an https:// service; this one is http://", at=f"[{index}].ca_file")
        if service.name in seen:
            raise Problem(f"duplicate name {service.name!r} (services[{seen[service.name]}] has it too)",
                          at=f"[{index}].name")
        seen[service.name] = index
    return services


# --------------------------------------------------------------------------- credentials


class CredentialsError(Exception):
    """A credentials file cannot be used; the message names the file, never its content."""


def read_credentials(path: Path) -> str:
    """The token in ``path`` (surrounding whitespace removed): one line of visible characters."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CREDENTIALS_BYTES + 1)
    except FileNotFoundError:
        raise CredentialsError(f"credentials file {path} does not exist") from None
    except OSError as exc:
        raise CredentialsError(f"cannot read credentials file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CREDENTIALS_BYTES:
        raise CredentialsError(f"credentials file {path} is over {MAX_CREDENTIALS_BYTES} bytes; it should hold one token")
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise CredentialsError(f"credentials file {path} holds bytes that are not ASCII") from None
    if not token:
        raise CredentialsError(f"credentials file {path} is empty")
    if _CONTROL.search(token) or " " in token:
        raise CredentialsError(f"credentials file {path} holds more than one token (spaces, lines or control characters)")
    return token


class CredentialsFile:
    """A bearer token kept in a file (a mounted Secret, which Kubernetes replaces when it rotates):
    ``refresh()`` looks at the file on every request and re-reads it only when it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._token: str | None = None

    def __repr__(self) -> str:  # never the token
        return f"<CredentialsFile {self.path}>"

    def refresh(self) -> None:
        """Re-read the file if it changed; CredentialsError if it cannot be used and no earlier
        token is known (a rotation caught half-way keeps the previous token, with a warning)."""
        try:
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev)
            if stamp == self._stamp:
                return
            token = read_credentials(self.path)
        except (OSError, CredentialsError) as exc:
            problem = exc if isinstance(exc, CredentialsError) else CredentialsError(
                f"cannot read credentials file {self.path}: {exc.strerror or exc}")
            if self._token is None:
                raise problem from None
            log.warning("credentials file re-read failed, keeping the previous token error=%r", str(problem))
            return
        self._stamp, self._token = stamp, token

    def bearer(self) -> str:
        if self._token is None:
            self.refresh()
        assert self._token is not None
        return f"Bearer {self._token}"


# --------------------------------------------------------------------------- where a service is


@attrs.frozen(kw_only=True)
class ServiceTarget:
    """Where ``agentd.upstream.UpstreamPool`` connects for one service, and the credential it adds."""

    name: str
    scheme: str
    host: str
    port: int
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    server_hostname: str | None = None
    path_prefix: str = ""
    credentials: CredentialsFile | None = attrs.field(default=None, eq=False)
    #: how messages name it; ``service '<name>'`` when None
    label: str | None = None

    @classmethod
    def for_service(cls, service: ServiceSettings) -> ServiceTarget:
        parts = urlsplit(service.url)
        assert parts.hostname is not None  # checked when the settings were loaded
        context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=str(service.ca_file) if service.ca_file else None)
            context.set_alpn_protocols(["http/1.1"])  # the pool speaks only that (and upgrades need it)
        return cls(
            name=service.name,
            scheme=parts.scheme,
            host=parts.hostname,
            port=parts.port or (443 if parts.scheme == "https" else 80),
            ssl_context=context,
            path_prefix=parts.path.rstrip("/"),
            credentials=CredentialsFile(service.credentials_file) if service.credentials_file else None,
        )

    @property
    def url(self) -> str:
        return target_url(self.scheme, self.host, self.port, self.path_prefix)

    @property
    def host_header(self) -> str:
        return host_header(self.scheme, self.host, self.port)

    @property
    def peer(self) -> str:
        return self.label or f"service {self.name!r}"

    @property
    def peer_title(self) -> str:
        return self.peer

    def authorization(self) -> str | None:
        return self.credentials.bearer() if self.credentials is not None else None


def describe_services(services: Sequence[ServiceSettings]) -> str:
    """For agentd's start-up line: ``prometheus=http://prometheus.monitoring.svc:9090`` …"""
    return ",".join(f"{s.name}={s.url}" for s in services) or "-"


__all__ = [
    "CredentialsError",
    "CredentialsFile",
    "ServiceSettings",
    "ServiceTarget",
    "UnsafeTarget",
    "Verdict",
    "check_request",
    "normalised_path",
    "parse_services",
    "prefix_allows",
    "read_credentials",
]
