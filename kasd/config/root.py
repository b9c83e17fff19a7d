"""``Config``, the whole of kasd's configuration, and the checks no single value can tell:
listeners on distinct addresses, agents told apart, the directory as a whole, replicas that can be
named, reached and trusted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from daemonkit.logs import LOG_FORMATS
from daemonkit.notify import ready_file_problem
from daemonkit.settings import Loaded, Problem, SettingsError, setting
from kasd.authz.directory import Directory, DirectoryError
from kasd.config.authorization import AuthorizationSettings
from kasd.config.directory import AgentEntry, GroupEntry, ProjectEntry, UserEntry
from kasd.config.events import EventSettings
from kasd.config.listeners import (
    AgentListener,
    ApiListener,
    KubernetesAPIListener,
    Listener,
    Listeners,
    ObservabilityListener,
    PrivateListener,
)
from kasd.config.routing import PEER_SECRET_MIN, Routing
from kasd.config.store import EnvironmentSettings, StoreSettings
from kasd.config.values import parse_seconds
from kasd.config.web import WebConfig
from routing.peers import is_loopback_host, plaintext_crosses_network

LOG_LEVELS = ("debug", "info", "warning", "error")

#: the configuration is unusable; the message names the key (and its variable or flag) and the problem
ConfigError = SettingsError


def _log_format(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_FORMATS:
        raise Problem(f"must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return value.lower()


def _log_level(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise Problem(f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.lower()


def _ready_file(value: Any) -> Path:
    path = Path(value)
    problem = ready_file_problem(path)
    if problem is not None:
        raise Problem(f"cannot write the ready file {str(path)!r}: {problem}")
    return path


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
    environments: EnvironmentSettings = EnvironmentSettings()
    web: WebConfig = WebConfig()
    events: EventSettings = EventSettings()
    agent_wait_timeout: float = setting(
        10.0, parse=parse_seconds, env="KASD_AGENT_WAIT_TIMEOUT", flag="--agent-wait-timeout", metavar="SECONDS",
        help="how long a request waits for its agent to connect before 503",
    )
    shutdown_timeout: float = setting(
        20.0, parse=parse_seconds, env="KASD_SHUTDOWN_TIMEOUT", flag="--shutdown-timeout", metavar="SECONDS",
        help="bound on the graceful drain after SIGTERM",
    )
    log_level: str = setting(
        "info", parse=_log_level, env="KASD_LOG_LEVEL", flag="--log-level", metavar="LEVEL",
        help=f"one of {', '.join(LOG_LEVELS)}, any case",
    )
    log_format: str = setting(
        "logfmt", parse=_log_format, env="KASD_LOG_FORMAT", flag="--log-format", metavar="FORMAT",
        help="logfmt (key=value lines) or json (one object per line); SIGHUP applies a change, as for log_level",
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


def check(loaded: Loaded[Config]) -> Config:
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


#: the listeners that serve plain text beyond loopback only when told (``insecure_plaintext``); the
#: private one has its own rule (``plaintext_peer_secret``), the observability one never has TLS
_PLAINTEXT_CHECKED = ("agent", "kubernetes_api", "api")


def check_plaintext(config: Config, names: tuple[str, ...]) -> None:
    """Before kasd listens (not at loading: a configuration is read for more than serving): a
    ConfigError for each of ``names`` that would serve plain text beyond loopback unasked."""
    for name in _PLAINTEXT_CHECKED:
        if name not in names:
            continue
        served: AgentListener | KubernetesAPIListener | ApiListener = getattr(config.listeners, name)
        if served.tls is None and not is_loopback_host(served.host) and not served.insecure_plaintext:
            raise ConfigError(
                f"listeners.{name}.tls: missing; the {name} listener would serve plain text on {served.address}, "
                "beyond loopback, where whoever is on the network reads and alters what crosses it, tokens "
                f"included: set listeners.{name}.tls (cert and key), or listen on a loopback address (behind a TLS "
                f"terminator on this host), or accept the risk on a network you trust with "
                f"listeners.{name}.insecure_plaintext: true (KASD_{name.upper()}_INSECURE_PLAINTEXT)"
            )


def plaintext_listeners(config: Config, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, address) of each of ``names`` that serves plain text beyond loopback (allowed by the
    checks: its ``insecure_plaintext``; observability without its optional TLS): each a WARNING at start."""
    found = []
    for name in names:
        listener = getattr(config.listeners, name)
        if name == "private":
            continue  # its own WARNING (plaintext_peer_secret), about the secret
        if listener.tls is None and not is_loopback_host(listener.host):
            found.append((name, str(listener.address)))
    return found


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
