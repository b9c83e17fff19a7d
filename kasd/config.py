"""kasd's configuration: a YAML file, then ``KASD_*`` environment overrides, then flags.

Each setting is declared once below, as a field of a frozen attrs class (``setting()``: its file key,
variable, flag, help and check); ``daemonkit.settings`` loads them. A bad value raises
``ConfigError`` naming the key and what is wrong, and the variable or flag when it came from one
(``__main__`` prints it and exits 2). Raw tokens never appear here: agents hold ``token_sha256``
digests (``kasd hash-token`` makes them); CI job and personal tokens are signed, and kasd holds only
the public keys that verify them.
"""

from __future__ import annotations

import argparse
import math
import re
import ssl
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs

from daemonkit import yamldoc
from daemonkit.notify import ready_file_problem
from daemonkit.settings import (
    HostPort,
    Loaded,
    Problem,
    SettingsError,
    SettingsLoader,
    Source,
    setting,
)
from h2trio.budget import ResetLimit
from kasd.authz.directory import (
    Directory,
    DirectoryError,
    Role,
    full_path_problem,
    parse_role,
    username_problem,
)
from kasd.authz.snapshot import DEFAULT_MAX_JOB_TOKEN_LIFETIME
from kasd.tokens import is_token_hash
from routing.peers import is_loopback_host, plaintext_crosses_network
from wire.ids import MAX_ID, InvalidNumber, check_id, parse_decimal

LOG_LEVELS = ("debug", "info", "warning", "error")

try:
    #: what ``kasd --version`` prints: the installed distribution's version, as agentd reports its own
    VERSION = metadata.version("kasd")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    VERSION = "0.0.0"

#: the configuration is unusable; the message names the key (and its variable or flag) and the problem
ConfigError = SettingsError


# --------------------------------------------------------------------------- checks of one value


def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise Problem(f"must be {what}, got {yamldoc.describe(value)}")
    if not isinstance(value, kind):
        raise Problem(f"must be {what}, got {yamldoc.describe(value)}")
    return value


def _string(value: Any) -> str:
    return _expect(value, str, "a string")  # type: ignore[no-any-return]


def parse_address(value: Any) -> HostPort:
    """``host:port`` (``[v6]:port`` too); port 0 picks a free port."""
    text = _expect(value, str, "a host:port string")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise Problem(f"{text!r} is not host:port (e.g. 0.0.0.0:8154)")
    try:
        port = parse_decimal(port_text, "port", maximum=65535)
    except InvalidNumber as exc:
        raise Problem(exc.message) from None
    return HostPort(host.strip("[]"), port)


def _log_level(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise Problem(f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.lower()


def _seconds(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise Problem(f"{value!r} is not a number of seconds") from None
    seconds = float(_expect(value, (int, float), "a number of seconds"))
    if not math.isfinite(seconds):  # NaN passes `<= 0`, and trio refuses a NaN deadline per connection
        raise Problem(f"must be a finite number of seconds, got {value!r}")
    if seconds <= 0:
        raise Problem(f"must be greater than 0 seconds, got {value!r}")
    return seconds


def _boolean(value: Any) -> bool:
    """``true``/``false`` in the file; the same words (any case) in a variable."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise Problem(f"must be true or false, got {value!r}")


def _existing_file(value: Any) -> Path:
    path = Path(_expect(value, str, "a file path"))
    if not path.is_file():
        raise Problem(f"file {str(path)!r} does not exist")
    return path


def _url_path(value: Any) -> str:
    path = _expect(value, str, "a path")
    if not path.startswith("/"):
        raise Problem(f"must start with '/', got {path!r}")
    return path  # type: ignore[no-any-return]


def _max_header_bytes(value: Any) -> int:
    size = _expect(value, int, "a number of bytes")
    if size < 1024:
        raise Problem(f"must be at least 1024, got {size}")
    return size  # type: ignore[no-any-return]


def _count(value: Any) -> int:
    """A whole number of at least 1: an int from the file (not a bool), or its text from env and flags."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = parse_decimal(value.strip(), "the number")
        except InvalidNumber:
            number = None
    if number is None:
        raise Problem(f"must be a whole number, got {value!r}")
    if number < 1:
        raise Problem(f"must be at least 1, got {number}")
    return number


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\*?")


def _header_names(value: Any) -> tuple[str, ...]:
    """Header names (any case; ``X-Auth-*`` names a prefix), lower-cased."""
    if isinstance(value, str):
        value = value.split(",")
    names = _strings(value, "")
    out = []
    for i, name in enumerate(names):
        name = name.strip()
        if not _HEADER_NAME.fullmatch(name) or name == "*":
            raise Problem(f"{name!r} is not a header name (or a prefix ending in '*')", at=f"[{i}]")
        out.append(name.lower())
    return tuple(out)


def _positive_id(value: Any) -> int:
    agent_id = _expect(value, int, "a positive integer")
    if agent_id <= 0:
        raise Problem(f"must be a positive integer, got {agent_id}")
    try:
        return check_id(agent_id)  # GitLab's ids are bigint: what a token or a database can carry
    except InvalidNumber:
        raise Problem(f"must be at most {MAX_ID} (a signed 64-bit integer)") from None


def _token_hash(value: Any) -> str:
    if not is_token_hash(value):
        raise Problem("must be 64 lower-case hex characters (use `kasd hash-token`)")
    return value  # type: ignore[no-any-return]


def _strings(value: Any, at: str) -> tuple[str, ...]:
    if value is None:
        return ()
    try:
        items = _expect(value, list, "a list of strings")
    except Problem as problem:
        raise Problem(problem.text, at=at) from None
    for i, item in enumerate(items):
        try:
            _expect(item, str, "a string")
        except Problem as problem:
            raise Problem(problem.text, at=f"{at}[{i}]") from None
    return tuple(items)


class _EncryptedKeyError(Exception):
    pass


def _no_passphrase() -> str:
    raise _EncryptedKeyError  # a daemon has no one to ask (OpenSSL would prompt on a terminal)


def _tls_pair_problem(cert: Path, key: Path) -> str | None:
    """Load the pair now: a bad file is a configuration error naming both files, not a failure
    once kasd is about to listen (OpenSSL's own "[SSL] PEM lib" names neither)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=str(cert))
    except ssl.SSLError:
        return f"no PEM certificate in {str(cert)!r}"
    except OSError as exc:
        return f"cannot read {str(cert)!r}: {exc.strerror or exc}"
    try:
        context.load_cert_chain(str(cert), str(key), password=_no_passphrase)
    except _EncryptedKeyError:
        return "the key is encrypted (kasd needs it without a passphrase)"
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            return "the key does not belong to the certificate"
        return f"no PEM private key in {str(key)!r}"
    except OSError as exc:
        return f"cannot read {str(key)!r}: {exc.strerror or exc}"
    return None


def _ready_file(value: Any) -> Path:
    path = Path(value)
    problem = ready_file_problem(path)
    if problem is not None:
        raise Problem(f"cannot write the ready file {str(path)!r}: {problem}")
    return path


def _no_tls(value: Any) -> None:
    if value is not None:
        raise Problem("not supported (plain HTTP; keep it on a private address)")


# --------------------------------------------------------------------------- the settings


_TLS_MISSING = "missing (TLS needs both cert and key files)"


# --------------------------------------------------------------------------- HTTP/2 limits (issue 13)
# What one HTTP/2 connection's peer may cost, on each listener that speaks HTTP/2 (``http2:`` under
# ``listeners.agent`` and ``listeners.kubernetes_api``); docs/security.md, "## HTTP/2".


def _stream_count(value: Any) -> int:
    count = _expect(value, int, "a number of streams")
    if count < 1:
        raise Problem(f"must be at least 1, got {count}")
    return count  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class Http2Limits:
    #: streams a client may reset before their answer began (or have refused) per reset_window,
    #: as a token bucket; beyond it GOAWAY ENHANCE_YOUR_CALM (HTTP/2 rapid reset, CVE-2023-44487)
    reset_budget: int = setting(200, parse=_stream_count)
    #: seconds over which reset_budget refills
    reset_window: float = setting(30.0, parse=_seconds)

    @property
    def reset_limit(self) -> ResetLimit:
        return ResetLimit(budget=self.reset_budget, window=self.reset_window)


# --------------------------------------------------------------------------- the listeners


@attrs.frozen(kw_only=True)
class TLSFiles:
    cert: Path = setting(parse=_existing_file, missing=_TLS_MISSING)
    key: Path = setting(parse=_existing_file, missing=_TLS_MISSING)

    def __attrs_post_init__(self) -> None:
        problem = _tls_pair_problem(self.cert, self.key)
        if problem is not None:
            raise Problem(f"cannot load certificate {str(self.cert)!r} with key {str(self.key)!r}: {problem}")


def _max_connections(name: str, what: str, default: int) -> Any:
    """The ``max_connections`` setting of the listener ``name`` (its variable and flag follow it)."""
    return setting(
        default, parse=_count, env=f"KASD_{name.upper()}_MAX_CONNECTIONS",
        flag=f"--{name.replace('_', '-')}-max-connections", metavar="N",
        help=f"connections the {what} listener holds at once; more are refused at accept",
    )


def _max_per_source(name: str, what: str, default: int) -> Any:
    """The ``max_connections_per_source`` setting of the listener ``name``."""
    return setting(
        default, parse=_count, env=f"KASD_{name.upper()}_MAX_CONNECTIONS_PER_SOURCE",
        flag=f"--{name.replace('_', '-')}-max-connections-per-source", metavar="N",
        help=f"{what} connections from one source address (IPv6: one /64) at once",
    )


@attrs.frozen(kw_only=True)
class Listener:
    address: HostPort = setting(HostPort("0.0.0.0", 0), parse=parse_address)
    tls: TLSFiles | None = setting(None)
    #: connections open at once; more are refused at accept (each listener declares its own default)
    max_connections: int = setting(1024, parse=_count)
    #: connections open at once from one source address (an IPv6 /64), at most ``max_connections``
    max_connections_per_source: int = setting(256, parse=_count)

    @property
    def host(self) -> str:
        return self.address.host

    @property
    def port(self) -> int:
        return self.address.port


@attrs.frozen(kw_only=True)
class AgentListener(Listener):
    address: HostPort = setting(
        HostPort("0.0.0.0", 8150), parse=parse_address, env="KASD_AGENT_ADDRESS", flag="--agent-address",
        metavar="HOST:PORT", help="agent listener",
    )
    path: str = setting("/tunnel", parse=_url_path)
    #: seconds an agent connection has for TLS, HTTP/2 preface and the tunnel request
    handshake_timeout: float = setting(10.0, parse=_seconds)
    # A few agentd per cluster, a few connections each; clusters behind one NAT share a source.
    max_connections: int = _max_connections("agent", "agent", 4096)
    max_connections_per_source: int = _max_per_source("agent", "agent", 256)
    http2: Http2Limits = Http2Limits()


@attrs.frozen(kw_only=True)
class ObservabilityListener(Listener):
    address: HostPort = setting(
        HostPort("127.0.0.1", 8151), parse=parse_address, env="KASD_OBSERVABILITY_ADDRESS",
        flag="--observability-address", metavar="HOST:PORT", help="observability listener",
    )
    tls: None = setting(None, parse=_no_tls)
    # Probes and scrapers need a handful; a runaway scraper keeps at most half.
    max_connections: int = _max_connections("observability", "observability", 64)
    max_connections_per_source: int = _max_per_source("observability", "observability", 32)


@attrs.frozen(kw_only=True)
class KubernetesAPIListener(Listener):
    address: HostPort = setting(
        HostPort("0.0.0.0", 8154), parse=parse_address, env="KASD_KUBERNETES_API_ADDRESS",
        flag="--kubernetes-api-address", metavar="HOST:PORT", help="Kubernetes API proxy listener",
    )
    #: seconds a client has to send a complete request head (slowloris bound)
    header_timeout: float = setting(30.0, parse=_seconds)
    #: seconds an idle keep-alive connection is kept open between requests
    idle_timeout: float = setting(120.0, parse=_seconds)
    #: largest request head (request line + headers) accepted, in bytes
    max_header_bytes: int = setting(64 * 1024, parse=_max_header_bytes)
    # kubectl over HTTP/2 holds one connection per process; an office behind one NAT has many.
    max_connections: int = _max_connections("kubernetes_api", "Kubernetes API proxy", 4096)
    max_connections_per_source: int = _max_per_source("kubernetes_api", "Kubernetes API proxy", 512)
    #: requests one principal (one token) has open at once, watches and exec sessions included
    max_requests_per_principal: int = setting(
        512, parse=_count, env="KASD_KUBERNETES_API_MAX_REQUESTS_PER_PRINCIPAL",
        flag="--kubernetes-api-max-requests-per-principal", metavar="N",
        help="requests one token may have open at once (watches and exec included); more get 429",
    )
    #: request headers never passed to the agent, besides X-Remote-User, X-Remote-Group, X-Remote-Extra-*
    strip_request_headers: tuple[str, ...] = setting(
        (), parse=_header_names, env="KASD_KUBERNETES_API_STRIP_REQUEST_HEADERS", env_split=",",
        flag="--kubernetes-api-strip-request-header", flag_action="append", metavar="NAME",
        help="a request header never passed to the agent (any case; NAME* is a prefix); repeatable",
    )
    http2: Http2Limits = Http2Limits()


@attrs.frozen(kw_only=True)
class PrivateListener(Listener):
    """kasd-to-kasd (issue 15): the port peers open forwarded requests on. Started only when
    ``routing.redis.url`` is set; as much a stranger's port as the agent port before authentication."""

    address: HostPort = setting(
        HostPort("0.0.0.0", 8155), parse=parse_address, env="KASD_PRIVATE_ADDRESS", flag="--private-address",
        metavar="HOST:PORT", help="private (kasd-to-kasd) listener, started only with routing.redis.url",
    )
    #: CA file that verifies peers' client certificates: mutual TLS between replicas (needs tls)
    client_ca: Path | None = setting(None, parse=_existing_file)
    #: let the peer secret cross a network in clear (h2c on a non-loopback address, or an http://
    #: peer on another host): whoever reads it there has every agent's rights. A WARNING at start
    insecure_plaintext: bool = setting(False, parse=_boolean, env="KASD_PRIVATE_INSECURE_PLAINTEXT")
    #: seconds a peer connection has for TLS, HTTP/2 preface and the tunnel request
    handshake_timeout: float = setting(10.0, parse=_seconds)
    # One pooled connection per peer replica (a few more across restarts).
    max_connections: int = _max_connections("private", "private (kasd-to-kasd)", 256)
    max_connections_per_source: int = _max_per_source("private", "private (kasd-to-kasd)", 16)
    http2: Http2Limits = Http2Limits()


def _optional_address(value: Any) -> HostPort | None:
    return None if value is None else parse_address(value)


@attrs.frozen(kw_only=True)
class ApiListener(Listener):
    """The REST API (8153): ``GET /api/v4/job/allowed_agents`` for CI jobs. Off unless an address is set."""

    address: HostPort | None = setting(  # type: ignore[assignment]
        None, parse=_optional_address, env="KASD_API_ADDRESS", flag="--api-address", metavar="HOST:PORT",
        help="REST API listener (GitLab's /api/v4/job/allowed_agents); off unless set",
    )
    # CI jobs ask once each; a burst of pipelines from one runner host shares a source.
    max_connections: int = _max_connections("api", "REST API", 1024)
    max_connections_per_source: int = _max_per_source("api", "REST API", 128)


@attrs.frozen(kw_only=True)
class Listeners:
    agent: AgentListener = AgentListener()
    observability: ObservabilityListener = ObservabilityListener()
    kubernetes_api: KubernetesAPIListener = KubernetesAPIListener()
    private: PrivateListener = PrivateListener()
    api: ApiListener = ApiListener()


@attrs.frozen(kw_only=True)
class AgentEntry:
    """One ``agents:`` entry: an agent as the directory knows it (``kasd.authz.directory.Agent``) and
    the hash of its tunnel token, which only the agent port reads."""

    id: int = setting(parse=_positive_id)
    name: str = setting(parse=_string)
    config_project: str = setting(parse=_string)
    token_sha256: str = setting(parse=_token_hash, repr=False)


# --------------------------------------------------------------------------- the directory (issue 16)
# Groups, projects and users as GitLab lays them out (kasd.authz.directory checks them as a whole, in
# _check below); agents are the ``agents:`` list. docs/authorization.md, "## The model".


def _full_path(value: Any) -> str:
    problem = full_path_problem(value)
    if problem:
        raise Problem(problem)
    return value  # type: ignore[no-any-return]


def _username(value: Any) -> str:
    problem = username_problem(value)
    if problem:
        raise Problem(problem)
    return value  # type: ignore[no-any-return]


def _optional_id(value: Any) -> int | None:
    return None if value is None else _positive_id(value)


def _memberships(value: Any) -> dict[str, Role]:
    """``{group or project path: role}``; the paths are checked against the directory in _check."""
    if value is None:
        return {}
    raw = _expect(value, dict, "a mapping of group or project path to role")
    out: dict[str, Role] = {}
    for path, role in raw.items():
        problem = full_path_problem(path)
        if problem:
            raise Problem(problem, at=f".{path}")
        try:
            out[path] = parse_role(role)
        except ValueError as exc:
            raise Problem(str(exc), at=f".{path}") from None
    return out


@attrs.frozen(kw_only=True)
class GroupEntry:
    #: full path, ``group/subgroup``; a subgroup's parent must be declared too
    path: str = setting(parse=_full_path)
    id: int = setting(parse=_positive_id)


@attrs.frozen(kw_only=True)
class ProjectEntry:
    #: full path, ``group/subgroup/project``; its group must be declared (or be a user's namespace)
    path: str = setting(parse=_full_path)
    id: int = setting(parse=_positive_id)
    #: its jobs' ``CI_DEFAULT_BRANCH`` (for ``rules:``)
    default_branch: str = setting("main", parse=_string)


@attrs.frozen(kw_only=True)
class UserEntry:
    username: str = setting(parse=_username)
    id: int | None = setting(None, parse=_optional_id)
    #: project or group path → guest, reporter, developer, maintainer or owner
    memberships: dict[str, Role] = setting(factory=dict, parse=_memberships)


def _existing_dir(value: Any) -> Path | None:
    if value is None:
        return None
    path = Path(_expect(value, str, "a directory path"))
    if not path.is_dir():
        raise Problem(f"directory {str(path)!r} does not exist")
    return path


def _key_files(value: Any) -> tuple[Path, ...]:
    paths = []
    for i, item in enumerate(_strings(value, "")):
        try:
            paths.append(_existing_file(item))
        except Problem as problem:
            raise Problem(problem.text, at=f"[{i}]") from None
    return tuple(paths)


def _token_ids(value: Any) -> frozenset[str]:
    return frozenset(_strings(value, ""))


@attrs.frozen(kw_only=True)
class TokenSettings:
    """How CI job tokens (``ci:``) and personal tokens (``pat:``) are verified (``kasctl token``)."""

    #: PEM files of the Ed25519 public keys tokens may be signed with (two while rotating); a
    #: private key file stands for its public half
    public_keys: tuple[Path, ...] = setting((), parse=_key_files)
    audience: str = setting("kasd", parse=_string)
    issuer: str = setting("kasd", parse=_string)
    #: how far clocks may disagree
    leeway: float = setting(60.0, parse=_seconds)
    #: token ids (``jti``, printed by ``kasctl token``) refused before they expire
    revoked: frozenset[str] = setting(frozenset(), parse=_token_ids)
    #: seconds a job token may live (``exp - iat``); longer ones are refused. A finished job's
    #: record (``kasctl token revoke``) lasts this long, so it outlives every token of the job.
    max_job_token_lifetime: float = setting(DEFAULT_MAX_JOB_TOKEN_LIFETIME.total_seconds(), parse=_seconds)


@attrs.frozen(kw_only=True)
class AuthorizationSettings:
    #: where the agents' config projects are checked out: <config_root>/<project path>/.gitlab/agents/<name>/config.yaml
    config_root: Path | None = setting(None, parse=_existing_dir)
    tokens: TokenSettings = TokenSettings()

    @property
    def enabled(self) -> bool:
        return self.config_root is not None


_REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "redis+sentinel")


def _redis_url(value: Any) -> str | None:
    """``redis://h:p/db``, ``rediss://…``, ``redis+cluster://h:p[,h:p…]``, ``redis+sentinel://h:p[,h:p]/<master>``;
    never with a password in it (URLs end up in logs and process listings: use password_file)."""
    if value is None:
        return None
    text = _expect(value, str, "a redis:// URL").strip()
    if not text:
        return None
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in _REDIS_SCHEMES:
        raise Problem(f"must start with one of {', '.join(s + '://' for s in _REDIS_SCHEMES)}, got {scheme + sep!r}")
    netloc = rest.split("/", 1)[0]
    if "@" in netloc:
        userinfo = netloc.rsplit("@", 1)[0]
        if ":" in userinfo:
            # the password is not echoed back: it must never reach a log line
            raise Problem("must not hold a password (put it in routing.redis.password_file)")
    hosts = netloc.rsplit("@", 1)[-1]
    if not hosts:
        raise Problem(f"names no host ({scheme}://host:port…)")
    if scheme == "redis+sentinel" and not rest.partition("/")[2].strip("/"):
        raise Problem("must name the master: redis+sentinel://host:port[,host:port]/<master name>")
    return text  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class SecretFile:
    """A file holding one secret: its path, and the secret (never shown, never logged)."""

    path: Path
    value: str = attrs.field(repr=False)


def _secret_file(minimum: int) -> Any:
    def parse(value: Any) -> SecretFile | None:
        if value is None:
            return None
        path = _existing_file(value)
        try:
            secret = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise Problem(f"cannot read {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
        if len(secret) < minimum:
            # its length only: never a character of it
            raise Problem(f"the secret in {str(path)!r} is {len(secret)} characters; it needs at least {minimum}")
        return SecretFile(path=path, value=secret)

    return parse


def _key_prefix(value: Any) -> str:
    text = _expect(value, str, "a string")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", text):
        raise Problem(f"must be 1-64 letters, digits or '_.:-' (no '{{}}' or spaces), got {text!r}")
    return text  # type: ignore[no-any-return]


def _ring_name(value: Any) -> str | None:
    if value is None:
        return None
    text = _expect(value, str, "a host:port string")
    address = parse_address(text)
    if address.port == 0:
        raise Problem(f"must name a real port, got {text!r}")
    return text  # type: ignore[no-any-return]


def _http_url(value: Any) -> str | None:
    if value is None:
        return None
    text = _expect(value, str, "an http:// or https:// URL")
    scheme, sep, rest = text.partition("://")
    if scheme not in ("http", "https") or not sep or not rest.split("/", 1)[0]:
        raise Problem(f"must be http://host:port or https://host:port, got {yamldoc.describe(text)}")
    return text  # type: ignore[no-any-return]


def _weight(value: Any) -> int:
    weight = _count(value)
    if weight > 1000:
        raise Problem(f"must be at most 1000, got {weight}")
    return weight


@attrs.frozen(kw_only=True)
class RedisSettings:
    """Where replicas meet. Without ``url`` kasd is alone: an in-memory registry, no private listener."""

    url: str | None = setting(
        None, parse=_redis_url, env="KASD_REDIS_URL", flag="--redis-url", metavar="URL",
        help="Redis of the replicas (redis://, rediss://, redis+cluster://, redis+sentinel://…/master); "
        "unset: a lone kasd",
    )
    #: the Redis password (AUTH), in a file; never logged
    password_file: SecretFile | None = setting(
        None, parse=_secret_file(1), env="KASD_REDIS_PASSWORD_FILE", flag="--redis-password-file", metavar="PATH",
        help="file holding the Redis password",
    )
    #: prefix of every key and channel (several kasd fleets can share one Redis)
    key_prefix: str = setting("kasd", parse=_key_prefix)

    @property
    def password(self) -> str | None:
        return self.password_file.value if self.password_file is not None else None


#: shortest peer secret accepted
PEER_SECRET_MIN = 32


@attrs.frozen(kw_only=True)
class Routing:
    """How requests are steered between an agent's sessions (``routing.local``), and, with
    ``redis.url``, between replicas (``routing.router``)."""

    #: seconds a session whose agent cannot reach its API server is passed over after its first
    #: such refusal; doubled after each further one (a passive circuit breaker)
    breaker_initial_hold: float = setting(1.0, parse=_seconds)
    #: the longest such hold, in seconds
    breaker_max_hold: float = setting(30.0, parse=_seconds)
    redis: RedisSettings = RedisSettings()
    #: this replica on the ring: its ``server`` string in the front end's upstream block
    name: str | None = setting(
        None, parse=_ring_name, env="KASD_ROUTING_NAME", flag="--routing-name", metavar="HOST:PORT",
        help="this replica on the ring, exactly its server entry in the front end's upstream block "
        "(default: the kubernetes_api listener address)",
    )
    #: share of agents homed here (nginx's server weight=)
    weight: int = setting(10, parse=_weight, env="KASD_ROUTING_WEIGHT", flag="--routing-weight", metavar="N",
                          help="ring weight: this replica's share of agents (as weight= in the front end)")
    heartbeat_interval: float = setting(1.0, parse=_seconds)
    tunnel_ttl: float = setting(30.0, parse=_seconds)
    #: what peers dial to forward a request here
    private_url: str | None = setting(
        None, parse=_http_url, env="KASD_PRIVATE_URL", flag="--private-url", metavar="URL",
        help="URL peers dial to reach this replica's private listener (default: from its address)",
    )
    #: what agentd dials to reach this replica (placement notices)
    agent_url: str | None = setting(
        None, parse=_http_url, env="KASD_AGENT_URL", flag="--agent-url", metavar="URL",
        help="URL agentd dials to reach this replica (default: from the agent listener's address)",
    )
    #: the shared secret replicas authenticate each other with (unless mutual TLS); never logged
    peer_secret_file: SecretFile | None = setting(
        None, parse=_secret_file(PEER_SECRET_MIN), env="KASD_PEER_SECRET_FILE", flag="--peer-secret-file",
        metavar="PATH", help=f"file holding the replicas' shared secret (at least {PEER_SECRET_MIN} characters)",
    )
    #: CA that verifies peers' private-port certificates (an https private_url)
    peer_ca_file: Path | None = setting(
        None, parse=_existing_file, env="KASD_PEER_CA_FILE", flag="--peer-ca-file", metavar="PATH",
        help="CA file that verifies the other replicas' private-port certificates",
    )

    @property
    def replicated(self) -> bool:
        return self.redis.url is not None


def _store_path(value: Any) -> Path | None:
    if value is None:
        return None
    text = _expect(value, str, "a file path").strip()
    if not text:
        raise Problem("must be a file path (or left out: $STATE_DIRECTORY/kasd.sqlite3)")
    path = Path(text)
    if path.is_dir():
        raise Problem(f"{text!r} is a directory; name the file, e.g. {str(path / STORE_FILE_NAME)!r}")
    return path


#: the store's file name in systemd's ``$STATE_DIRECTORY`` (``StateDirectory=kasd``: /var/lib/kasd)
STORE_FILE_NAME = "kasd.sqlite3"


@attrs.frozen(kw_only=True)
class StoreSettings:
    """What must outlive the process (finished jobs). Among replicas it is kept in ``routing.redis``
    and ``path`` is not used."""

    path: Path | None = setting(
        None, parse=_store_path, env="KASD_STORE_PATH", flag="--store-path", metavar="FILE",
        help=f"a lone kasd's SQLite store (default $STATE_DIRECTORY/{STORE_FILE_NAME}; neither: in memory only)",
    )


@attrs.frozen(kw_only=True)
class Config:
    listeners: Listeners = Listeners()
    agents: tuple[AgentEntry, ...] = ()
    groups: tuple[GroupEntry, ...] = ()
    projects: tuple[ProjectEntry, ...] = ()
    users: tuple[UserEntry, ...] = ()
    authorization: AuthorizationSettings = AuthorizationSettings()
    routing: Routing = Routing()
    store: StoreSettings = StoreSettings()
    agent_wait_timeout: float = setting(
        10.0, parse=_seconds, env="KASD_AGENT_WAIT_TIMEOUT", flag="--agent-wait-timeout", metavar="SECONDS",
        help="how long a request waits for its agent to connect before 503",
    )
    shutdown_timeout: float = setting(
        20.0, parse=_seconds, env="KASD_SHUTDOWN_TIMEOUT", flag="--shutdown-timeout", metavar="SECONDS",
        help="bound on the graceful drain after SIGTERM",
    )
    log_level: str = setting(
        "info", parse=_log_level, env="KASD_LOG_LEVEL", flag="--log-level", metavar="LEVEL",
        help=f"one of {', '.join(LOG_LEVELS)}, any case",
    )
    ready_file: Path | None = setting(
        None, parse=_ready_file, in_file=False, env="KASD_READY_FILE", flag="--ready-file", metavar="PATH",
        help="once listening, write the bound addresses there as JSON",
    )

    @property
    def agent(self) -> AgentListener:
        return self.listeners.agent

    @property
    def observability(self) -> ObservabilityListener:
        return self.listeners.observability

    @property
    def kubernetes_api(self) -> KubernetesAPIListener:
        return self.listeners.kubernetes_api

    @property
    def private(self) -> PrivateListener:
        return self.listeners.private


# --------------------------------------------------------------------------- how kasd words errors


class _KasdBlame:
    """``KASD_AGENT_WAIT_TIMEOUT: agent_wait_timeout: …`` for a variable or flag, ``<file>:
    listeners.agent.tls.cert: …`` for the file."""

    def where(self, key: str, source: Source, in_file: bool) -> str:
        if source.is_override:
            return f"{source.name}: {key}" if in_file else source.name
        if source.kind == "file":
            return f"{source.name}: {key}"
        return key

    def missing(self, where: str, problem: str) -> str:
        return f"{where}: {problem}"

    def unknown_keys(self, key: str, unknown: Sequence[str], known: Sequence[str], config: Path | None) -> str:
        prefix = f"{config}: " if config is not None else ""
        place = f"{key}." if key else ""
        return f"{prefix}{place}{unknown[0]}: unknown key (expected one of: {', '.join(known)})"

    def unreadable(self, config: Path, named_by: str, reason: str) -> str:
        return f"{named_by}: cannot read {str(config)!r}: {reason}"

    def not_yaml(self, config: Path, error: yamldoc.YamlError) -> str:
        where = f" at line {error.line}, column {error.column}" if error.line is not None else ""
        return f"{config}: not valid YAML{where}: {error.problem.removeprefix('not valid YAML: ')}"

    def not_a_mapping(self, config: Path, document: object) -> str | None:
        return None


DESCRIPTION = """\
kasd: the server agentd connects to. Agents (agentd) dial the agent port and keep tunnels open;
kubectl, CI jobs and people reach their clusters through the Kubernetes API proxy.

Listeners (defaults): agent 0.0.0.0:8150 (HTTP/2, path /tunnel), observability 127.0.0.1:8151
(/liveness, /readiness, /metrics), Kubernetes API proxy 0.0.0.0:8154 (HTTP/1.1 and HTTP/2); with
--redis-url (replicas), private 0.0.0.0:8155 (kasd-to-kasd, HTTP/2: with a peer secret it needs
TLS, a loopback address or listeners.private.insecure_plaintext); REST API (--api-address) off.

Configuration comes from a YAML file (--config or KASD_CONFIG; see docs/kasd.md and
examples/kasd.yaml), then KASD_* environment variables, then the flags below: the later wins.
"""

EPILOG = """\
commands:
  kasd [options]            serve (the default)
  kasd hash-token           read a token on stdin, print its sha256 for token_sha256: in the config

examples:
  kasd --config /etc/kasd/kasd.yaml
  KASD_KUBERNETES_API_ADDRESS=127.0.0.1:0 kasd --config kasd.yaml --ready-file /run/kasd/ready.json
  printf %s "$AGENT_TOKEN" | kasd hash-token

kubectl then uses server https://<kasd>:8154 with token ci:<agent id>:<job token> or
pat:<agent id>:<personal token>.

Settings without a flag (agents, access, TLS files, timeouts, listeners.*.http2.*, most of routing.*)
are set in the file: docs/kasd.md lists every key, docs/security.md every limit and what it defends.
"""


LOADER = SettingsLoader(
    Config, prog="kasd", description=DESCRIPTION, epilog=EPILOG, config_env="KASD_CONFIG", blame=_KasdBlame(),
    version=VERSION,
)


def argument_parser() -> argparse.ArgumentParser:
    return LOADER.parser()


def _check(loaded: Loaded[Config]) -> Config:
    """What no single value can tell: listeners on distinct addresses, agents told apart by id and
    token."""
    config = loaded.value
    taken: dict[tuple[str, int], str] = {}
    names = ("agent", "observability", "kubernetes_api") + (("private",) if config.routing.replicated else ()) \
        + (("api",) if config.listeners.api.address is not None else ())
    for name in names:
        listener: Listener = getattr(config.listeners, name)
        if listener.port == 0:  # port 0 picks a port for each
            continue
        other = taken.setdefault((listener.host, listener.port), name)
        if other != name:
            raise ConfigError(
                f"{loaded.where(f'listeners.{name}.address')}: {listener.address} is also the {other} listener's "
                "address (each listener needs its own)"
            )
    seen: dict[int, int] = {}
    tokens: dict[str, int] = {}
    for i, agent in enumerate(config.agents):
        if agent.id in seen:
            raise ConfigError(f"{loaded.where(f'agents[{i}].id')}: agent id {agent.id} is already used by agents[{seen[agent.id]}]")
        seen[agent.id] = i
        # kasd knows an agent by its token: two agents with one token could not be told apart.
        if agent.token_sha256 in tokens:
            first = config.agents[tokens[agent.token_sha256]]
            raise ConfigError(
                f"{loaded.where(f'agents[{i}].token_sha256')}: agent {agent.id} ({agent.name}) has the same token as "
                f"agents[{tokens[agent.token_sha256]}], agent {first.id} ({first.name}); each agent needs a token of its own"
            )
        tokens[agent.token_sha256] = i
    _check_directory(loaded)
    routing = config.routing
    if routing.breaker_initial_hold > routing.breaker_max_hold:
        raise ConfigError(
            f"{loaded.where('routing.breaker_initial_hold')}: {routing.breaker_initial_hold:g}s is longer than "
            f"routing.breaker_max_hold ({routing.breaker_max_hold:g}s), the longest hold"
        )
    if routing.replicated:
        _check_replicas(loaded)
    return config


def _check_directory(loaded: Loaded[Config]) -> Directory:
    """Groups, projects, users and agents as a whole: no duplicate path or id, every subgroup's and
    project's group declared, memberships naming declared groups or projects; with
    ``authorization.config_root``, every agent's config project declared."""
    config = loaded.value
    try:
        return Directory.build(
            groups=config.groups, projects=config.projects, users=config.users, agents=config.agents,
            require_agent_projects=config.authorization.enabled,
        )
    except DirectoryError as exc:
        raise ConfigError(f"{loaded.where(exc.key)}: {exc.problem}") from None


def directory_of(config: Config) -> Directory:
    """The directory of an already checked config (``load_config`` checked it)."""
    return Directory.build(
        groups=config.groups, projects=config.projects, users=config.users, agents=config.agents,
        require_agent_projects=config.authorization.enabled,
    )


_WILDCARDS = ("0.0.0.0", "::", "")


def _check_replicas(loaded: Loaded[Config]) -> None:
    """With ``routing.redis.url``: the replica can be named, reached and trusted."""
    config = loaded.value
    routing, private = config.routing, config.private
    if private.client_ca is not None and private.tls is None:
        raise ConfigError(
            f"{loaded.where('listeners.private.client_ca')}: mutual TLS needs listeners.private.tls (cert and key) too"
        )
    if routing.peer_secret_file is None and private.client_ca is None:
        raise ConfigError(
            f"{loaded.where('routing.peer_secret_file')}: replicas must authenticate each other: set "
            f"routing.peer_secret_file (a shared secret of at least {PEER_SECRET_MIN} characters) or "
            "listeners.private.tls with listeners.private.client_ca (mutual TLS)"
        )
    if plaintext_peer_secret(config) and not private.insecure_plaintext:
        raise ConfigError(
            f"{loaded.where('listeners.private.tls')}: missing; the peer secret (routing.peer_secret_file) would "
            f"cross the network in clear ({_plaintext_why(config)}), and whoever reads it has every agent's "
            "rights: set listeners.private.tls (cert and key; peers dial https:// with routing.peer_ca_file), "
            "or listen on a loopback address, or accept the risk on a network you trust with "
            "listeners.private.insecure_plaintext: true (KASD_PRIVATE_INSECURE_PLAINTEXT)"
        )
    if private.tls is not None and routing.peer_ca_file is None and private.client_ca is None:
        raise ConfigError(
            f"{loaded.where('routing.peer_ca_file')}: missing; listeners.private has TLS, so peers dial https://, "
            "and without the CA of the replicas' private-port certificates they would trust the system's CAs: "
            "whoever can write a member URL into Redis and holds any publicly trusted certificate would receive "
            "the peer secret and the forwarded requests. Set routing.peer_ca_file (KASD_PEER_CA_FILE), or "
            "listeners.private.client_ca (mutual TLS, which then verifies peers both ways)"
        )
    if routing.name is None and config.kubernetes_api.host in _WILDCARDS:
        raise ConfigError(
            f"{loaded.where('routing.name')}: missing; the kubernetes_api listener's address "
            f"({config.kubernetes_api.address}) cannot name this replica: set routing.name (KASD_ROUTING_NAME) to "
            "its server entry in the front end's upstream block, e.g. 10.0.0.5:8154"
        )
    if routing.private_url is None and private.host in _WILDCARDS:
        raise ConfigError(
            f"{loaded.where('routing.private_url')}: missing; listeners.private listens on {private.address}, "
            "which peers cannot dial: set routing.private_url (KASD_PRIVATE_URL), e.g. https://10.0.0.5:8155"
        )
    if routing.agent_url is None and config.agent.host in _WILDCARDS:
        raise ConfigError(
            f"{loaded.where('routing.agent_url')}: missing; listeners.agent listens on {config.agent.address}, "
            "which agentd cannot dial: set routing.agent_url (KASD_AGENT_URL), e.g. https://10.0.0.5:8150/tunnel"
        )
    if routing.private_url is not None and routing.private_url.startswith("https://") != (private.tls is not None):
        raise ConfigError(
            f"{loaded.where('routing.private_url')}: {routing.private_url!r} does not match listeners.private "
            f"({'TLS' if private.tls is not None else 'plain HTTP/2'}): use "
            f"{'https' if private.tls is not None else 'http'}://"
        )


def plaintext_peer_secret(config: Config) -> bool:
    """Whether this replica's peer secret crosses a network in clear: a shared secret (not mutual
    TLS) on a private port without TLS that listens beyond loopback, or is reached over ``http://``
    at another host (``routing.private_url``)."""
    routing, private = config.routing, config.private
    if routing.peer_secret_file is None or private.tls is not None:
        return False
    url = routing.private_url
    return not is_loopback_host(private.host) or (url is not None and plaintext_crosses_network(url))


def _plaintext_why(config: Config) -> str:
    private, url = config.private, config.routing.private_url
    if not is_loopback_host(private.host):
        return f"listeners.private listens on {private.address} without TLS"
    return f"routing.private_url {url!r} is plain http:// to another host"


def config_from_mapping(raw: Any) -> Config:
    """Validate a parsed YAML document (no environment, no flags)."""
    return _check(LOADER.structure(raw if raw is not None else {}, {}, None))


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """Flags (``argv`` without the program name) over environment over file over defaults."""
    return _check(LOADER.load(argv, environ))


def load_config_file(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[Config, Path | None]:
    """``load_config``, and the file it read (None: none), which a reload watches."""
    loaded = LOADER.load(argv, environ)
    return _check(loaded), loaded.config


__all__ = [
    "VERSION",
    "AuthorizationSettings",
    "Config",
    "ConfigError",
    "GroupEntry",
    "PrivateListener",
    "ProjectEntry",
    "RedisSettings",
    "SecretFile",
    "TokenSettings",
    "UserEntry",
    "config_from_mapping",
    "directory_of",
    "load_config",
    "load_config_file",
    "plaintext_peer_secret",
]
