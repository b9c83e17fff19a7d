"""The listeners' settings (``listeners:``): where each port listens, its TLS files, its
connection caps, and what one HTTP/2 peer may cost on the ports that speak HTTP/2."""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any

import attrs

from daemonkit.settings import HostPort, Problem, setting
from h2trio.budget import ResetLimit
from kasd.config.values import (
    expect_type,
    parse_address,
    parse_boolean,
    parse_count,
    parse_existing_file,
    parse_seconds,
    parse_strings,
)


def _url_path(value: Any) -> str:
    path = expect_type(value, str, "a path")
    if not path.startswith("/"):
        raise Problem(f"must start with '/', got {path!r}")
    return path  # type: ignore[no-any-return]


def _max_header_bytes(value: Any) -> int:
    size = expect_type(value, int, "a number of bytes")
    if size < 1024:
        raise Problem(f"must be at least 1024, got {size}")
    return size  # type: ignore[no-any-return]


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\*?")


def _header_names(value: Any) -> tuple[str, ...]:
    """Header names (any case; ``X-Auth-*`` names a prefix), lower-cased."""
    if isinstance(value, str):
        value = value.split(",")
    names = parse_strings(value, "")
    out = []
    for i, name in enumerate(names):
        name = name.strip()
        if not _HEADER_NAME.fullmatch(name) or name == "*":
            raise Problem(f"{name!r} is not a header name (or a prefix ending in '*')", at=f"[{i}]")
        out.append(name.lower())
    return tuple(out)


class _EncryptedKeyError(Exception):
    pass


def _no_passphrase() -> str:
    raise _EncryptedKeyError  # a daemon has no one to ask (OpenSSL would prompt on a terminal)


def tls_pair_problem(cert: Path, key: Path) -> str | None:
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


_TLS_MISSING = "missing (TLS needs both cert and key files)"


# --------------------------------------------------------------------------- HTTP/2 limits
# What one HTTP/2 connection's peer may cost, on each listener that speaks HTTP/2 (``http2:`` under
# ``listeners.agent`` and ``listeners.kubernetes_api``); docs/security.md, "## HTTP/2".


def _stream_count(value: Any) -> int:
    count = expect_type(value, int, "a number of streams")
    if count < 1:
        raise Problem(f"must be at least 1, got {count}")
    return count  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class Http2Limits:
    #: streams a client may reset before their answer began (or have refused) per reset_window,
    #: as a token bucket; beyond it GOAWAY ENHANCE_YOUR_CALM (HTTP/2 rapid reset, CVE-2023-44487)
    reset_budget: int = setting(200, parse=_stream_count)
    #: seconds over which reset_budget refills
    reset_window: float = setting(30.0, parse=parse_seconds)

    @property
    def reset_limit(self) -> ResetLimit:
        return ResetLimit(budget=self.reset_budget, window=self.reset_window)


# --------------------------------------------------------------------------- the listeners


@attrs.frozen(kw_only=True)
class ListenerTLS:
    """A listener's ``tls`` section: the files ``netio.tlsreload`` serves from (and reloads)."""

    cert: Path = setting(parse=parse_existing_file, missing=_TLS_MISSING)
    key: Path = setting(parse=parse_existing_file, missing=_TLS_MISSING)
    #: seconds between two looks at the files (and at client_ca): changed files are loaded without a
    #: restart for new connections (a pair that does not load is refused, the old one kept); 0: only
    #: on SIGHUP
    reload_interval: float = setting(10.0, parse=parse_seconds)

    def __attrs_post_init__(self) -> None:
        problem = tls_pair_problem(self.cert, self.key)
        if problem is not None:
            raise Problem(f"cannot load certificate {str(self.cert)!r} with key {str(self.key)!r}: {problem}")


def _max_connections(name: str, what: str, default: int) -> Any:
    """The ``max_connections`` setting of the listener ``name`` (its variable and flag follow it)."""
    return setting(
        default, parse=parse_count, env=f"KASD_{name.upper()}_MAX_CONNECTIONS",
        flag=f"--{name.replace('_', '-')}-max-connections", metavar="N",
        help=f"connections the {what} listener holds at once; more are refused at accept",
    )


def _max_per_source(name: str, what: str, default: int) -> Any:
    """The ``max_connections_per_source`` setting of the listener ``name``."""
    return setting(
        default, parse=parse_count, env=f"KASD_{name.upper()}_MAX_CONNECTIONS_PER_SOURCE",
        flag=f"--{name.replace('_', '-')}-max-connections-per-source", metavar="N",
        help=f"{what} connections from one source address (IPv6: one /64) at once",
    )


#: the keepalive's bounds, in seconds: at least 1 (each ping costs both ends CPU), at most an hour
#: (no load balancer keeps an idle connection longer by default)
MIN_KEEPALIVE, MAX_KEEPALIVE = 1.0, 3600.0


def _keepalive_seconds(value: Any) -> float:
    seconds = parse_seconds(value)
    if not MIN_KEEPALIVE <= seconds <= MAX_KEEPALIVE:
        raise Problem(f"must be between {MIN_KEEPALIVE:.0f} and {MAX_KEEPALIVE:.0f} seconds, got {value!r}")
    return seconds


def _keepalive_timeout(value: Any) -> float:
    """The idle bound kasd tolerates from an agent: agentd pings every ``keepalive_interval`` (15 s
    by default) while idle; kasd only answers, and pings itself only after two thirds of this."""
    seconds = parse_seconds(value)
    if not 3 * MIN_KEEPALIVE <= seconds <= 3 * MAX_KEEPALIVE:  # room for agentd's interval, 1 s to an hour
        raise Problem(f"must be between {3 * MIN_KEEPALIVE:.0f} and {3 * MAX_KEEPALIVE:.0f} seconds, got {value!r}")
    return seconds


@attrs.frozen(kw_only=True)
class Listener:
    address: HostPort = setting(HostPort("0.0.0.0", 0), parse=parse_address)
    tls: ListenerTLS | None = setting(None)
    #: connections open at once; more are refused at accept (each listener declares its own default)
    max_connections: int = setting(1024, parse=parse_count)
    #: connections open at once from one source address (an IPv6 /64), at most ``max_connections``
    max_connections_per_source: int = setting(256, parse=parse_count)

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
    #: serve plain text (no ``tls``) on an address beyond loopback: whoever is on the network reads and
    #: alters the agents' tokens and every request to their clusters. Refused without it; a WARNING at start with it
    insecure_plaintext: bool = setting(False, parse=parse_boolean, env="KASD_AGENT_INSECURE_PLAINTEXT")
    #: seconds an agent connection has for TLS, HTTP/2 preface and the tunnel request
    handshake_timeout: float = setting(10.0, parse=parse_seconds)
    #: seconds an agent session may be silent (no frame at all) before kasd closes it; agentd dials
    #: and pings (its ``keepalive_interval``), kasd answers; kasd pings only after two thirds of it
    keepalive_timeout: float = setting(
        45.0, parse=_keepalive_timeout, env="KASD_AGENT_KEEPALIVE_TIMEOUT", flag="--agent-keepalive-timeout",
        metavar="SECONDS", help="close an agent session silent this long; keep it above 1.5 × every agentd's "
        "keepalive_interval (docs/kasd.md#keepalive)",
    )

    @property
    def session_keepalive(self) -> dict[str, float]:
        """The keepalive keywords of an accepted agent session (``wire.session.Session``): the side that
        accepted pings after twice the interval, so the interval is a third of the timeout."""
        return {"keepalive_interval": self.keepalive_timeout / 3, "keepalive_timeout": self.keepalive_timeout}

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
    #: optional: HTTPS only (kubelet probes ``scheme: HTTPS``, Prometheus ``scheme: https``); none: plain HTTP
    tls: ListenerTLS | None = setting(None)
    # Probes and scrapers need a handful; a runaway scraper keeps at most half.
    max_connections: int = _max_connections("observability", "observability", 64)
    max_connections_per_source: int = _max_per_source("observability", "observability", 32)


@attrs.frozen(kw_only=True)
class KubernetesAPIListener(Listener):
    address: HostPort = setting(
        HostPort("0.0.0.0", 8154), parse=parse_address, env="KASD_KUBERNETES_API_ADDRESS",
        flag="--kubernetes-api-address", metavar="HOST:PORT", help="Kubernetes API proxy listener",
    )
    #: serve plain text (no ``tls``) on an address beyond loopback: whoever is on the network reads and
    #: alters the CI job and user tokens and every request and answer. Refused without it; a WARNING at start with it
    insecure_plaintext: bool = setting(False, parse=parse_boolean, env="KASD_KUBERNETES_API_INSECURE_PLAINTEXT")
    #: seconds a client has to send a complete request head (slowloris bound)
    header_timeout: float = setting(30.0, parse=parse_seconds)
    #: seconds an idle keep-alive connection is kept open between requests
    idle_timeout: float = setting(120.0, parse=parse_seconds)
    #: largest request head (request line + headers) accepted, in bytes
    max_header_bytes: int = setting(64 * 1024, parse=_max_header_bytes)
    # kubectl over HTTP/2 holds one connection per process; an office behind one NAT has many.
    max_connections: int = _max_connections("kubernetes_api", "Kubernetes API proxy", 4096)
    max_connections_per_source: int = _max_per_source("kubernetes_api", "Kubernetes API proxy", 512)
    #: requests one principal (one token) has open at once, watches and exec sessions included
    max_requests_per_principal: int = setting(
        512, parse=parse_count, env="KASD_KUBERNETES_API_MAX_REQUESTS_PER_PRINCIPAL",
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
    """kasd-to-kasd (docs/routing.md): the port peers open forwarded requests on. Started only when
    ``routing.redis.url`` is set; as much a stranger's port as the agent port before authentication."""

    address: HostPort = setting(
        HostPort("0.0.0.0", 8155), parse=parse_address, env="KASD_PRIVATE_ADDRESS", flag="--private-address",
        metavar="HOST:PORT", help="private (kasd-to-kasd) listener, started only with routing.redis.url",
    )
    #: CA file that verifies peers' client certificates: mutual TLS between replicas (needs tls)
    client_ca: Path | None = setting(None, parse=parse_existing_file)
    #: let the peer secret cross a network in clear (h2c on a non-loopback address, or an http://
    #: peer on another host): whoever reads it there has every agent's rights. A WARNING at start
    insecure_plaintext: bool = setting(False, parse=parse_boolean, env="KASD_PRIVATE_INSECURE_PLAINTEXT")
    #: seconds a peer connection has for TLS, HTTP/2 preface and the tunnel request
    handshake_timeout: float = setting(10.0, parse=parse_seconds)
    #: seconds a peer session (kasd to kasd) may be idle before the replica that dialled it pings;
    #: one that heard nothing for three times as long is closed (either side)
    keepalive_interval: float = setting(
        15.0, parse=_keepalive_seconds, env="KASD_PRIVATE_KEEPALIVE_INTERVAL", flag="--private-keepalive-interval",
        metavar="SECONDS", help="ping a peer replica whose session was idle this long (the dialling replica "
        "pings; silent for 3 × this: closed); the same on every replica",
    )

    @property
    def session_keepalive(self) -> dict[str, float]:
        """The keepalive keywords of peer sessions, dialled (``PeerPool``) and accepted alike."""
        return {"keepalive_interval": self.keepalive_interval, "keepalive_timeout": 3 * self.keepalive_interval}

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
    #: serve plain text (no ``tls``) on an address beyond loopback: whoever is on the network reads and
    #: alters the job and user tokens, session cookies and answers. Refused without it; a WARNING at start with it
    insecure_plaintext: bool = setting(False, parse=parse_boolean, env="KASD_API_INSECURE_PLAINTEXT")
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
