"""agentd's configuration: a YAML file, then environment variables, then flags (each overriding the
one before). Each setting is declared once below, as a field of ``AgentdConfig`` (``setting()``: its
file key, variable, flag, help and check); ``daemonkit.settings`` loads them. Every problem is a
``ConfigError`` whose message names the setting and what is wrong; the console script turns it into
``agentd: error: …`` and exit code 2, argparse style.
"""

from __future__ import annotations

import argparse
import math
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from agentd import __version__
from agentd.events.settings import EventActions, parse_events
from agentd.kubeapi import shown_url
from agentd.receptivefiles import receptive_settings_problem
from agentd.services import ServiceSettings, parse_services
from agentd.upstream import DEFAULT_RESPONSE_HEADER_TIMEOUT
from daemonkit import yamldoc
from daemonkit.logs import LOG_FORMATS
from daemonkit.notify import ready_file_problem
from daemonkit.settings import (
    HostPort,
    Loaded,
    Problem,
    SettingsError,
    SettingsLoader,
    Source,
    UsageError,
    ca_bundle,
    setting,
)
from netio.tlsreload import TLSFiles, TLSLoadError, build_context
from wire.ids import InvalidNumber, parse_decimal

DEFAULT_CONNECTIONS = 2
#: an outage's first minute is redialed at most 2 s apart (a kasd restart, a rescheduled kasd pod);
#: a longer one is backed off from exponentially (agentd.redial)
DEFAULT_RECONNECT_QUICK_WINDOW = 60.0
DEFAULT_SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LOG_LEVELS = ("debug", "info", "warning", "error")

#: bad configuration: the message says which setting and why (exit code 2)
ConfigError = SettingsError

EXAMPLES = """\
examples:
  # tab completion of the flags (bash, zsh, fish, tcsh)
  source <(agentd completion bash)

  # in a pod: the API server from the service account, the kasd address and token from env
  AGENTD_KAS_ADDRESS=https://kas.example.com:8150/tunnel \\
  AGENTD_TOKEN_FILE=/etc/agentd/token agentd --in-cluster

  # on a workstation against a kubeconfig, plain h2c to a local kasd, three tunnels
  agentd --kas-address http://127.0.0.1:8150/tunnel --token-file ./agent-token \\
         --kubeconfig ~/.kube/config --connections 3 --health-address 127.0.0.1:8080

  # everything from a file (see examples/agentd.yaml); flags still win over it
  agentd --config /etc/agentd/agentd.yaml --log-level debug

precedence: config file < environment (AGENTD_*, POD_NAME, POD_UID, POD_NAMESPACE, NODE_NAME) < flags.
The kasd address is https://host:8150/tunnel (TLS, ALPN h2) or http://… (h2c); wss://host:8150/tunnel
(or ws://…) carries the tunnel over a WebSocket instead, for proxies that pass only HTTP/1.1; repeat --kas-address (or comma-separate AGENTD_KAS_ADDRESS) to spread tunnels over several.
The token is read from the file at every dial and is never logged.
"""



# --------------------------------------------------------------------------- checks of one value
# Environment and flags always give text (or a list of it); a file may hold anything.


def _text(value: Any, *, allow_int: bool = False) -> str:
    """``value`` unless it is not text: ``pod_name: [a]`` is an error, not ``"['a']"``. An agent id
    may be written as a number (``agent_id: 42``), as kasd's agent ids are."""
    if value is None or isinstance(value, str | Path):
        return "" if value is None else str(value)
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise Problem(f"expected a string, got {yamldoc.describe(value)}")


def _optional_path(value: Any) -> Path | None:
    text = _text(value)
    return Path(text).expanduser() if text else None


def _kas_addresses(value: Any) -> tuple[str, ...]:
    addresses = value.split(",") if isinstance(value, str) else value
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise Problem("must be a URL or a list of URLs")
    urls = [a.strip() for a in addresses if a.strip()]
    if not urls:
        raise Problem(_NO_KAS, whole=True)
    return tuple(_kas_url(url) for url in urls)


def _kas_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise Problem("kasd address must be https://host:port/tunnel (HTTP/2), wss://host:port/tunnel (WebSocket), "
                      f"or http:// / ws:// without TLS, got {shown_url(url)}")
    try:
        parts.port  # noqa: B018 — raises ValueError for a bad port
    except ValueError:
        raise Problem(f"bad port in kasd address {shown_url(url)}") from None
    if parts.username is not None or parts.password is not None:
        # every log line about a tunnel names its URL: a password there would be in all of them
        raise Problem(f"kasd address {shown_url(url)} holds user information; agentd authenticates with its "
                      "token file only")
    if parts.path in ("", "/"):
        url = parts._replace(path="/tunnel").geturl()
    return url


def _token_file(value: Any) -> Path:
    path = _optional_path(value)
    if path is None:
        raise Problem(_NO_TOKEN, whole=True)
    try:
        content = path.read_text()
    except FileNotFoundError:
        raise Problem(f"token file {path} does not exist") from None
    except OSError as exc:
        raise Problem(f"cannot read token file {path}: {exc.strerror or exc}") from None
    if not content.strip():
        raise Problem(f"token file {path} is empty")
    return path


def _kas_ca_file(value: Any) -> Path | None:
    path = _optional_path(value)
    return None if path is None else ca_bundle(path)


def _ready_file(value: Any) -> Path | None:
    text = _text(value)
    if not text:
        return None
    path = Path(text)
    problem = ready_file_problem(path)
    if problem is not None:
        raise Problem(f"cannot write the ready file {path}: {problem}")
    return path


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.lower() in ("true", "yes", "1")
    raise Problem(f"expected true or false, got {value!r}")


def _optional_listen_address(value: Any) -> HostPort | None:
    return _health_address(value) if _text(value) else None


def _connections(value: Any) -> int:
    """A whole number: an int from the file (not a bool, not 3.7), or its text from env and flags."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = parse_decimal(value.strip(), "connections", maximum=999)
        except InvalidNumber:
            pass
    if number is None:
        raise Problem(f"expected a whole number, got {value!r}")
    if not 1 <= number <= 64:
        raise Problem(f"must be between 1 and 64, got {number}")
    return number


def _health_address(value: Any) -> HostPort:
    text = _text(value)
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise Problem(f"expected HOST:PORT (e.g. 0.0.0.0:8080), got {text!r}")
    try:
        port = parse_decimal(port_text, "port", maximum=65535)
    except InvalidNumber as exc:
        raise Problem(f"expected HOST:PORT (e.g. 0.0.0.0:8080): {exc.message}") from None
    return HostPort(host.strip("[]") or "0.0.0.0", port)


def _log_format(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_FORMATS:
        raise Problem(f"must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return value.lower()


def _log_level(value: Any) -> str:
    level = _text(value).lower()
    if level not in LOG_LEVELS:
        raise Problem(f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise Problem("must be a number of seconds >= 0")
    return float(value)


def _seconds_or_off(value: Any) -> float:
    """Seconds, from the file (a number) or from the environment and flags (its text); 0 turns the
    bound off."""
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise Problem(f"expected a number of seconds, got {value!r}")
    if number < 0:
        raise Problem(f"must be 0 (off) or more seconds, got {value!r}")
    return number


#: the longest keepalive interval agentd accepts: an hour (no load balancer keeps an idle
#: connection longer by default; longer only delays noticing a dead path)
MAX_KEEPALIVE = 3600.0
DEFAULT_KEEPALIVE_INTERVAL = 15.0


def _keepalive_seconds(value: Any) -> float:
    """Seconds for the keepalive, from the file (a number) or the environment and flags (its text):
    at least 1 (each ping costs both ends CPU), at most an hour."""
    number = _seconds_or_off(value)
    if not 1 <= number <= MAX_KEEPALIVE:
        raise Problem(f"must be between 1 and {MAX_KEEPALIVE:.0f} seconds, got {value!r}")
    return number


def _optional_keepalive_seconds(value: Any) -> float | None:
    return None if value is None or value == "" else _keepalive_seconds(value)


def _optional_text(value: Any) -> str | None:
    return _text(value) or None


def _pod_name(value: Any) -> str:
    return _text(value) or socket.gethostname()


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: namespaces one agentd may name as served (each is reported, and reviewed for RBAC: 16 at most)
MAX_NAMESPACES = 256


def _namespaces(value: Any) -> tuple[str, ...]:
    """The namespaces agentd serves: a list (file) or comma-separated text (environment, flags);
    each a DNS-1123 label, no repeats; empty: the whole cluster."""
    names = value.split(",") if isinstance(value, str) else value
    if names is None:
        return ()
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise Problem("must be a list of namespace names")
    out: list[str] = []
    for name in (n.strip() for n in names):
        if not name:
            continue
        if not _NAMESPACE.fullmatch(name):
            raise Problem(f"{name[:80]!r} is not a namespace name (lower-case letters, digits and '-', at most 63)")
        if name in out:
            raise Problem(f"namespace {name!r} is named twice")
        out.append(name)
    if len(out) > MAX_NAMESPACES:
        raise Problem(f"at most {MAX_NAMESPACES} namespaces, got {len(out)}")
    return tuple(out)


_NO_KAS = "no kasd address: pass --kas-address URL (or set AGENTD_KAS_ADDRESS)"
_NO_TOKEN = "no agent token: pass --token-file PATH (or set AGENTD_TOKEN_FILE)"


# --------------------------------------------------------------------------- the settings


@attrs.frozen(kw_only=True)
class AgentdConfig:
    kas_addresses: tuple[str, ...] = setting(
        (), key="kas_address", parse=_kas_addresses, env="AGENTD_KAS_ADDRESS", env_split=",", flag="--kas-address",
        flag_action="append", metavar="URL", help="kasd tunnel URL, https://host:8150/tunnel (HTTP/2) or wss://… (WebSocket); http:// and ws:// in plain text; repeatable",
        missing=_NO_KAS,
    )
    token_file: Path = setting(
        parse=_token_file, env="AGENTD_TOKEN_FILE", flag="--token-file", metavar="PATH",
        help="file holding the agent token", missing=_NO_TOKEN,
    )
    kubeconfig: Path | None = setting(
        None, parse=_optional_path, env="AGENTD_KUBECONFIG", flag="--kubeconfig", metavar="PATH",
        help="reach the API server through this kubeconfig",
    )
    kube_context: str | None = setting(
        None, parse=_optional_text, flag="--kube-context", metavar="NAME", help="kubeconfig context to use",
        show_default="its current-context",
    )
    in_cluster: bool = setting(
        False, parse=_bool, flag="--in-cluster", flag_action="store_true",
        help="reach the API server with the pod's service account (the default when KUBERNETES_SERVICE_HOST is set)",
        show_default="",
    )
    serviceaccount_dir: Path = setting(DEFAULT_SERVICEACCOUNT_DIR, parse=lambda value: Path(_text(value)))
    #: KUBERNETES_SERVICE_HOST/PORT as seen at start (in-cluster mode)
    kubernetes_service_host: str | None = setting(None, parse=_optional_text, in_file=False, env="KUBERNETES_SERVICE_HOST")
    kubernetes_service_port: str | None = setting(None, parse=_optional_text, in_file=False, env="KUBERNETES_SERVICE_PORT")
    connections: int = setting(
        DEFAULT_CONNECTIONS, parse=_connections, env="AGENTD_CONNECTIONS", flag="--connections", metavar="N",
        help="tunnels to keep open",
    )
    health: HostPort = setting(
        HostPort("0.0.0.0", 8080), key="health_address", parse=_health_address, env="AGENTD_HEALTH_ADDRESS",
        flag="--health-address", metavar="HOST:PORT", help="where /liveness and /readiness listen; port 0 picks one",
    )
    agent_id: str = setting(
        "", parse=lambda value: _text(value, allow_int=True), env="AGENTD_AGENT_ID", flag="--agent-id", metavar="ID",
        help="agent id presented to kasd",
    )
    pod_name: str = setting(
        factory=socket.gethostname, parse=_pod_name, env="POD_NAME", flag="--pod-name", metavar="NAME",
        help="pod name presented to kasd", show_default="the host name",
    )
    pod_uid: str = setting("", parse=_text, env="POD_UID", flag="--pod-uid", metavar="UID", help="pod uid presented to kasd")
    pod_namespace: str = setting(
        "", parse=_text, env="POD_NAMESPACE", flag="--pod-namespace", metavar="NAMESPACE",
        help="the namespace of agentd's pod, presented to kasd (Downward API: metadata.namespace)",
    )
    node_name: str = setting(
        "", parse=_text, env="NODE_NAME", flag="--node-name", metavar="NODE",
        help="the node agentd's pod runs on, presented to kasd (Downward API: spec.nodeName)",
    )
    namespaces: tuple[str, ...] = setting(
        (), parse=_namespaces, env="AGENTD_NAMESPACES", flag="--namespaces", metavar="NS[,NS…]",
        help="the namespaces this agentd serves, told to kasd and reviewed for RBAC in its cluster report "
        "(not enforced by agentd: its service account's RBAC is the bound); none: the whole cluster",
        show_default="the whole cluster",
    )
    discovery_interval: float = setting(
        300.0, parse=_seconds_or_off, env="AGENTD_DISCOVERY_INTERVAL", flag="--discovery-interval",
        metavar="SECONDS",
        help="look at the cluster again this often and report to kasd when something changed; 0: no cluster "
        "discovery at all (nothing reported)",
    )
    api_check_interval: float = setting(
        10.0, parse=_seconds_or_off, env="AGENTD_API_CHECK_INTERVAL", flag="--api-check-interval",
        metavar="SECONDS",
        help="ask the API server GET /version this often (at start too, each bounded to 5 s) so that /readiness "
        "says when it cannot be reached; 0: only agentd's own requests tell",
    )
    keepalive_interval: float = setting(
        DEFAULT_KEEPALIVE_INTERVAL, parse=_keepalive_seconds, env="AGENTD_KEEPALIVE_INTERVAL",
        flag="--keepalive-interval", metavar="SECONDS",
        help="ping kasd when a tunnel heard nothing for this long (agentd dials, so it alone pings); keep it "
        "below the smallest idle timeout of every load balancer, proxy and NAT between agentd and kasd "
        "(docs/agentd.md#keepalive), and below two thirds of kasd's listeners.agent.keepalive_timeout",
    )
    keepalive_timeout: float | None = setting(
        None, parse=_optional_keepalive_seconds, env="AGENTD_KEEPALIVE_TIMEOUT", flag="--keepalive-timeout",
        metavar="SECONDS",
        help="close a tunnel (and redial) that heard nothing at all for this long; at least twice "
        "keepalive_interval", show_default="3 × keepalive_interval",
    )
    kas_ca_file: Path | None = setting(
        None, parse=_kas_ca_file, env="AGENTD_KAS_CA_FILE", flag="--kas-ca-file", metavar="PATH",
        help="PEM CA bundle that signs kasd's certificate (read again when it changes, and on SIGHUP)",
    )
    #: seconds between two looks at kas_ca_file: a changed bundle verifies the next dial; 0: only on SIGHUP
    kas_ca_reload_interval: float = setting(
        10.0, parse=_seconds_or_off, env="AGENTD_KAS_CA_RELOAD_INTERVAL", flag="--kas-ca-reload-interval",
        metavar="SECONDS", help="look at kas_ca_file this often; a changed bundle verifies the next dial (0: on SIGHUP "
        "only)",
    )
    #: seconds between two looks at the receptive listener's and the health address's TLS files; 0: only on SIGHUP
    tls_reload_interval: float = setting(
        10.0, parse=_seconds_or_off, env="AGENTD_TLS_RELOAD_INTERVAL", flag="--tls-reload-interval",
        metavar="SECONDS", help="look at the receptive and health certificate files this often; changed files serve "
        "the next connection (0: on SIGHUP only)",
    )
    # Optional TLS on the health address (kubelet probes: scheme HTTPS; Prometheus: scheme https).
    health_cert_file: Path | None = setting(
        None, parse=_optional_path, env="AGENTD_HEALTH_CERT_FILE", flag="--health-cert-file", metavar="PATH",
        help="serve the health address over HTTPS only, with this PEM certificate (chain); none: plain HTTP",
    )
    health_key_file: Path | None = setting(
        None, parse=_optional_path, env="AGENTD_HEALTH_KEY_FILE", flag="--health-key-file", metavar="PATH",
        help="PEM private key of health_cert_file",
    )
    # Receptive mode (docs/agentd.md, "Receptive agents"): kasd dials in, agentd never dials out.
    # GitLab's agentk flags, by the same names.
    receptive_listen_address: HostPort | None = setting(
        None, parse=_optional_listen_address, env="AGENTD_RECEPTIVE_LISTEN_ADDRESS", flag="--receptive-listen-address",
        metavar="HOST:PORT", help="receptive mode: kasd dials agentd here (TLS); agentd does not dial out",
    )
    receptive_cert_file: Path | None = setting(
        None, parse=_optional_path, env="AGENTD_RECEPTIVE_CERT_FILE", flag="--receptive-cert-file", metavar="PATH",
        help="PEM certificate (chain) of the receptive listener",
    )
    receptive_key_file: Path | None = setting(
        None, parse=_optional_path, env="AGENTD_RECEPTIVE_KEY_FILE", flag="--receptive-key-file", metavar="PATH",
        help="PEM private key of the receptive listener",
    )
    receptive_jwt_file: Path | None = setting(
        None, parse=_optional_path, env="AGENTD_RECEPTIVE_JWT_FILE", flag="--receptive-jwt-file", metavar="PATH",
        help="kasd authenticates by JWT: the Ed25519 public key that verifies it (PEM, or GitLab's base64)",
    )
    receptive_ca_cert_file: Path | None = setting(
        None, parse=_kas_ca_file, env="AGENTD_RECEPTIVE_CA_CERT_FILE", flag="--receptive-ca-cert-file",
        metavar="PATH", help="kasd authenticates by mutual TLS: the PEM CA bundle that signs its client certificate",
    )
    receptive_client_name: str | None = setting(
        None, parse=_optional_text, env="AGENTD_RECEPTIVE_CLIENT_NAME", flag="--receptive-client-name", metavar="NAME",
        help="with --receptive-ca-cert-file: the DNS or URI subject alternative name kasd's client certificate "
             "carries (another certificate of the same CA is not kasd's)",
    )
    ready_file: Path | None = setting(
        None, parse=_ready_file, flag="--ready-file", metavar="PATH",
        help='write {"health": "host:port"} as JSON here once listening and the first tunnel is up (for tests)',
    )
    log_level: str = setting(
        "info", parse=_log_level, env="AGENTD_LOG_LEVEL", flag="--log-level", metavar="LEVEL",
        help=f"one of {', '.join(LOG_LEVELS)}, any case",
    )
    log_format: str = setting(
        "logfmt", parse=_log_format, env="AGENTD_LOG_FORMAT", flag="--log-format", metavar="FORMAT",
        help="logfmt (key=value lines) or json (one object per line); SIGHUP applies a change, as for log_level",
    )
    #: how long in-flight streams may run on after SIGTERM
    shutdown_grace: float = setting(10.0, parse=_seconds)
    upstream_response_header_timeout: float = setting(
        DEFAULT_RESPONSE_HEADER_TIMEOUT, parse=_seconds_or_off, env="AGENTD_UPSTREAM_RESPONSE_HEADER_TIMEOUT",
        flag="--upstream-response-header-timeout", metavar="SECONDS",
        help="give up on an API server that sends no response head this long after the request was sent "
        "(answered 504); the body has no bound (watches, logs -f); 0: no bound",
    )
    reconnect_quick_window: float = setting(
        DEFAULT_RECONNECT_QUICK_WINDOW, parse=_seconds_or_off, env="AGENTD_RECONNECT_QUICK_WINDOW",
        flag="--reconnect-quick-window", metavar="SECONDS",
        help="for this long after kasd goes away (any tunnel drop, however soon after the last), redial at "
        "most 2 s apart (full jitter) before backing off exponentially to 60 s; 0: back off at once",
    )
    #: in-cluster services kasd may reach through this agentd (agentd.services; docs/agentd.md#services)
    services: tuple[ServiceSettings, ...] = setting((), parse=parse_services)

    #: what agentd does with the events kasd pushes (docs/agentd.md §Events); file only
    events: EventActions = setting(factory=EventActions, parse=parse_events)

    @property
    def session_keepalive(self) -> dict[str, float]:
        """The keyword arguments of agentd's tunnel sessions (``wire.session.Session``) for the keepalive."""
        interval = self.keepalive_interval
        timeout = self.keepalive_timeout if self.keepalive_timeout is not None else 3 * interval
        return {"keepalive_interval": interval, "keepalive_timeout": timeout}

    @property
    def health_host(self) -> str:
        return self.health.host

    @property
    def health_port(self) -> int:
        return self.health.port

    @property
    def health_address(self) -> str:
        return str(self.health)


# --------------------------------------------------------------------------- how agentd words errors


class _AgentdBlame:
    """``--connections: …``, ``AGENTD_CONNECTIONS: …`` or ``connections in <file>: …``."""

    def where(self, key: str, source: Source, in_file: bool) -> str:
        if source.kind == "file":
            return f"{key} in {source.name}"
        return source.name if source.is_override else key

    def missing(self, where: str, problem: str) -> str:
        return problem

    def unknown_keys(self, key: str, unknown: Sequence[str], known: Sequence[str], config: Path | None) -> str:
        within = f" in {key}:" if key else ""  # a list item's (services[1]), not the top level's
        return f"config file {config}: unknown key(s){within} {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"

    def unreadable(self, config: Path, named_by: str, reason: str) -> str:
        return f"cannot read config file {config}: {reason}"

    def not_yaml(self, config: Path, error: yamldoc.YamlError) -> str:
        where = f" at line {error.line}, column {error.column}" if error.line is not None else ""
        return f"config file {config} is not valid YAML{where}: {error.problem.removeprefix('not valid YAML: ')}"

    def not_a_mapping(self, config: Path, document: object) -> str | None:
        return f"config file {config} must be a mapping of settings, not {type(document).__name__}"


def _later_source_chooses(document: dict[str, Any], sources: dict[str, Source]) -> None:
    """kubeconfig and in_cluster are one choice: a later source choosing one overrides the other."""
    if document.get("kubeconfig") and document.get("in_cluster") not in (None, False):
        kubeconfig = sources["kubeconfig"].rank if "kubeconfig" in sources else 0
        in_cluster = sources["in_cluster"].rank if "in_cluster" in sources else 0
        if kubeconfig > in_cluster:
            document["in_cluster"] = False
        elif in_cluster > kubeconfig:
            document.pop("kubeconfig")


LOADER = SettingsLoader(
    AgentdConfig,
    prog="agentd",
    description="The in-cluster agent of kasd: dials out to kasd, keeps tunnels up, and proxies "
    "the requests kasd sends to the Kubernetes API server with its own credentials plus "
    "Impersonate-* headers.",
    epilog=EXAMPLES,
    config_env="AGENTD_CONFIG",
    config_help="YAML config file",
    blame=_AgentdBlame(),
    version=__version__,
    prepare=_later_source_chooses,
)


def build_parser() -> argparse.ArgumentParser:
    return LOADER.parser()


def _check(loaded: Loaded[AgentdConfig]) -> AgentdConfig:
    """The one way to the API server: a kubeconfig, or the pod's service account."""
    config = loaded.value
    if config.kubeconfig is not None and config.in_cluster:
        raise ConfigError(
            f"choose one way to reach the API server: {loaded.where('kubeconfig')} and {loaded.where('in_cluster')} are both set"
        )
    if config.kubeconfig is None and not config.in_cluster:
        if not config.kubernetes_service_host:
            raise ConfigError(
                "no way to reach the Kubernetes API: pass --kubeconfig PATH, or --in-cluster inside a pod "
                "(KUBERNETES_SERVICE_HOST is not set)"
            )
        config = attrs.evolve(config, in_cluster=True)
    if config.keepalive_timeout is not None and config.keepalive_timeout < 2 * config.keepalive_interval:
        # less, and a PONG delayed by a busy kasd or a slow path tears down a healthy tunnel
        raise ConfigError(
            f"{loaded.where('keepalive_timeout')} ({config.keepalive_timeout:g} s) must be at least twice "
            f"{loaded.where('keepalive_interval')} ({config.keepalive_interval:g} s)"
        )
    if config.receptive_listen_address is None and not config.kas_addresses:
        raise ConfigError(_NO_KAS)
    if config.receptive_listen_address is not None:
        problem = receptive_settings_problem(config, loaded.where)
        if problem is not None:
            raise ConfigError(problem)
    problem = health_tls_problem(config, loaded.where)
    if problem is not None:
        raise ConfigError(problem)
    if config.kubeconfig is not None and not config.kubeconfig.is_file():
        raise ConfigError(f"{loaded.where('kubeconfig')}: kubeconfig file {config.kubeconfig} does not exist")
    return config


def health_tls_problem(config: AgentdConfig, where: Callable[[str], str]) -> str | None:
    """What is wrong with health_cert_file / health_key_file, or None (both unset: plain HTTP)."""
    cert, key = config.health_cert_file, config.health_key_file
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        return f"{where('health_cert_file')} and {where('health_key_file')} go together (HTTPS needs both)"
    try:
        build_context(TLSFiles(server=True, cert=cert, key=key))
    except TLSLoadError as exc:
        return f"{where('health_cert_file')} / {where('health_key_file')}: {exc}"
    return None


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> AgentdConfig:
    """Merge file < environment < flags into an AgentdConfig; raises ConfigError on bad input."""
    return _check(LOADER.load(argv, environ))


__all__ = ["AgentdConfig", "ConfigError", "UsageError", "build_parser", "load_config"]
