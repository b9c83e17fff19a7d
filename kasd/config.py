"""kasd's configuration: a YAML file, then ``KASD_*`` environment overrides, then flags.

Everything is validated up front into frozen values; a bad value raises ``ConfigError`` naming the
key and what is wrong (``__main__`` prints it and exits 2). Raw tokens never appear here: agents and
access entries hold ``token_sha256`` digests (``kasd hash-token`` makes them).
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import yaml

from daemonkit.notify import ready_file_problem
from kasd.tokens import is_token_hash
from tunnelhttp.head import Impersonation

LOG_LEVELS = ("debug", "info", "warning", "error")

try:
    #: what ``kasd --version`` prints: the installed distribution's version, as agentd reports its own
    VERSION = metadata.version("kasd")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    VERSION = "0.0.0"


class ConfigError(Exception):
    """The configuration is unusable; the message names the key and the problem."""


class _OverrideError(ConfigError):
    """A bad value from an environment variable or a flag: the message names that, not the file."""


@attrs.frozen(kw_only=True)
class TLSFiles:
    cert: Path
    key: Path


@attrs.frozen(kw_only=True)
class Listener:
    host: str
    port: int
    tls: TLSFiles | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@attrs.frozen(kw_only=True)
class AgentListener(Listener):
    path: str = "/tunnel"
    #: seconds an agent connection has for TLS, HTTP/2 preface and the tunnel request
    handshake_timeout: float = 10.0


@attrs.frozen(kw_only=True)
class KubernetesAPIListener(Listener):
    #: seconds a client has to send a complete request head (slowloris bound)
    header_timeout: float = 30.0
    #: seconds an idle keep-alive connection is kept open between requests
    idle_timeout: float = 120.0
    #: largest request head (request line + headers) accepted, in bytes
    max_header_bytes: int = 64 * 1024


@attrs.frozen(kw_only=True)
class Agent:
    id: int
    name: str
    config_project: str
    token_sha256: str = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class AccessEntry:
    """One static grant: holders of this token may use these agents, acting as ``impersonate``."""

    kind: str  # "ci" or "pat"
    token_sha256: str = attrs.field(repr=False)
    agents: frozenset[int]
    #: None: act as the agent itself (no Impersonate-* headers)
    impersonate: Impersonation | None = None
    name: str = ""


@attrs.frozen(kw_only=True)
class Config:
    agent: AgentListener = AgentListener(host="0.0.0.0", port=8150)
    observability: Listener = Listener(host="127.0.0.1", port=8151)
    kubernetes_api: KubernetesAPIListener = KubernetesAPIListener(host="0.0.0.0", port=8154)
    agents: tuple[Agent, ...] = ()
    access: tuple[AccessEntry, ...] = ()
    agent_wait_timeout: float = 10.0
    shutdown_timeout: float = 20.0
    log_level: str = "info"
    ready_file: Path | None = None


# --------------------------------------------------------------------------- parsing helpers


def _expect(value: Any, kind: type | tuple[type, ...], key: str, what: str) -> Any:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"{key}: must be {what}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{key}: must be {what}, got {type(value).__name__} {value!r}")
    return value


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    return _expect(value, dict, key, "a mapping")  # type: ignore[no-any-return]


def _unknown_keys(raw: Mapping[str, Any], allowed: Sequence[str], key: str) -> None:
    extra = sorted(set(raw) - set(allowed))
    if extra:
        where = f"{key}." if key else ""
        raise ConfigError(f"{where}{extra[0]}: unknown key (expected one of: {', '.join(allowed)})")


def parse_address(value: Any, key: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too); port 0 picks a free port."""
    text = _expect(value, str, key, "a host:port string")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{key}: {text!r} is not host:port (e.g. 0.0.0.0:8154)")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{key}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{key}: port {port} is out of range 0-65535")
    return host, port


def _log_level(value: Any, key: str) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise ConfigError(f"{key}: must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.lower()


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is not a number of seconds") from None
    seconds = float(_expect(value, (int, float), key, "a number of seconds"))
    if seconds <= 0:
        raise ConfigError(f"{key}: must be greater than 0 seconds, got {value!r}")
    return seconds


def _tls(raw: Any, key: str) -> TLSFiles | None:
    if raw is None:
        return None
    raw = _mapping(raw, key)
    _unknown_keys(raw, ("cert", "key"), key)
    paths = {}
    for name in ("cert", "key"):
        if name not in raw:
            raise ConfigError(f"{key}.{name}: missing (TLS needs both cert and key files)")
        path = Path(_expect(raw[name], str, f"{key}.{name}", "a file path"))
        if not path.is_file():
            raise ConfigError(f"{key}.{name}: file {str(path)!r} does not exist")
        paths[name] = path
    _check_tls_pair(paths["cert"], paths["key"], key)
    return TLSFiles(cert=paths["cert"], key=paths["key"])


class _EncryptedKeyError(Exception):
    pass


def _no_passphrase() -> str:
    raise _EncryptedKeyError  # a daemon has no one to ask (OpenSSL would prompt on a terminal)


def _check_tls_pair(cert: Path, key: Path, where: str) -> None:
    """Load the pair now: a bad file is a configuration error naming both files, not a failure
    once kasd is about to listen (OpenSSL's own "[SSL] PEM lib" names neither)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    problem = ""
    try:
        context.load_verify_locations(cafile=str(cert))
    except ssl.SSLError:
        problem = f"no PEM certificate in {str(cert)!r}"
    except OSError as exc:
        problem = f"cannot read {str(cert)!r}: {exc.strerror or exc}"
    if not problem:
        try:
            context.load_cert_chain(str(cert), str(key), password=_no_passphrase)
        except _EncryptedKeyError:
            problem = "the key is encrypted (kasd needs it without a passphrase)"
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                problem = "the key does not belong to the certificate"
            else:
                problem = f"no PEM private key in {str(key)!r}"
        except OSError as exc:
            problem = f"cannot read {str(key)!r}: {exc.strerror or exc}"
    if problem:
        raise ConfigError(f"{where}: cannot load certificate {str(cert)!r} with key {str(key)!r}: {problem}")


def _listener(raw: Any, key: str, default: Listener, extra: Sequence[str] = ()) -> dict[str, Any]:
    raw = _mapping(raw, key)
    _unknown_keys(raw, ("address", "tls", *extra), key)
    host, port = (default.host, default.port)
    if "address" in raw:
        host, port = parse_address(raw["address"], f"{key}.address")
    return {"host": host, "port": port, "tls": _tls(raw.get("tls"), f"{key}.tls")}


def _agent(raw: Any, key: str) -> Agent:
    raw = _mapping(raw, key)
    _unknown_keys(raw, ("id", "name", "config_project", "token_sha256"), key)
    for name in ("id", "name", "config_project", "token_sha256"):
        if name not in raw:
            raise ConfigError(f"{key}.{name}: missing")
    agent_id = _expect(raw["id"], int, f"{key}.id", "a positive integer")
    if agent_id <= 0:
        raise ConfigError(f"{key}.id: must be a positive integer, got {agent_id}")
    token_hash = raw["token_sha256"]
    if not is_token_hash(token_hash):
        raise ConfigError(f"{key}.token_sha256: must be 64 lower-case hex characters (use `kasd hash-token`)")
    return Agent(
        id=agent_id,
        name=_expect(raw["name"], str, f"{key}.name", "a string"),
        config_project=_expect(raw["config_project"], str, f"{key}.config_project", "a string"),
        token_sha256=token_hash,
    )


def _strings(raw: Any, key: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = _expect(raw, list, key, "a list of strings")
    return tuple(_expect(v, str, f"{key}[{i}]", "a string") for i, v in enumerate(items))


def _impersonation(raw: Any, key: str) -> Impersonation | None:
    if raw is None:
        return None
    raw = _mapping(raw, key)
    _unknown_keys(raw, ("user", "groups", "uid", "extra"), key)
    if "user" not in raw:
        raise ConfigError(f"{key}.user: missing (impersonation needs a user; use null to act as the agent)")
    user = _expect(raw["user"], str, f"{key}.user", "a non-empty string")
    if not user:
        raise ConfigError(f"{key}.user: must not be empty")
    uid = raw.get("uid")
    if uid is not None:
        _expect(uid, str, f"{key}.uid", "a string")
    extra = _mapping(raw.get("extra"), f"{key}.extra")
    pairs = tuple(sorted((str(k), _strings(v, f"{key}.extra.{k}")) for k, v in extra.items()))
    return Impersonation(user=user, groups=_strings(raw.get("groups"), f"{key}.groups"), uid=uid, extra=pairs)


def _access(raw: Any, key: str, agent_ids: set[int]) -> AccessEntry:
    raw = _mapping(raw, key)
    _unknown_keys(raw, ("name", "kind", "token_sha256", "agents", "impersonate"), key)
    for name in ("kind", "token_sha256", "agents"):
        if name not in raw:
            raise ConfigError(f"{key}.{name}: missing")
    kind = raw["kind"]
    if kind not in ("ci", "pat"):
        raise ConfigError(f"{key}.kind: must be 'ci' or 'pat', got {kind!r}")
    if not is_token_hash(raw["token_sha256"]):
        raise ConfigError(f"{key}.token_sha256: must be 64 lower-case hex characters (use `kasd hash-token`)")
    ids = _expect(raw["agents"], list, f"{key}.agents", "a list of agent ids")
    for i, agent_id in enumerate(ids):
        _expect(agent_id, int, f"{key}.agents[{i}]", "an agent id (integer)")
        if agent_id not in agent_ids:
            raise ConfigError(f"{key}.agents[{i}]: agent {agent_id} is not defined under agents:")
    return AccessEntry(
        kind=kind,
        token_sha256=raw["token_sha256"],
        agents=frozenset(ids),
        impersonate=_impersonation(raw.get("impersonate"), f"{key}.impersonate"),
        name=_expect(raw.get("name", ""), str, f"{key}.name", "a string"),
    )


def _distinct_addresses(listeners: Mapping[str, Listener], sources: Mapping[str, str]) -> None:
    """Two listeners on one ``host:port`` can never both bind (port 0 picks a port for each)."""
    taken: dict[tuple[str, int], str] = {}
    for name, listener in listeners.items():
        if listener.port == 0:
            continue
        other = taken.setdefault((listener.host, listener.port), name)
        if other != name:
            where = f"listeners.{name}.address"
            message = f"{where}: {listener.address} is also the {other} listener's address (each listener needs its own)"
            source = sources.get(f"{name}_address")
            if source is not None:
                raise _OverrideError(f"{source}: {message}")
            raise ConfigError(message)


_TOP_KEYS = ("listeners", "agents", "access", "agent_wait_timeout", "shutdown_timeout", "log_level")
_LISTENER_KEYS = ("agent", "observability", "kubernetes_api")
_K8S_EXTRA = ("header_timeout", "idle_timeout", "max_header_bytes")


def config_from_mapping(
    raw: Any, overrides: Mapping[str, Any] | None = None, sources: Mapping[str, str] | None = None
) -> Config:
    """Validate a parsed YAML document; ``overrides`` (env and flags) win over it. ``sources`` names
    where each override came from (``KASD_AGENT_ADDRESS``, ``--agent-address``) for error messages."""
    overrides = overrides or {}
    sources = sources or {}
    raw = _mapping(raw, "(top level)")
    _unknown_keys(raw, _TOP_KEYS, "")
    listeners = _mapping(raw.get("listeners"), "listeners")
    _unknown_keys(listeners, _LISTENER_KEYS, "listeners")
    defaults = Config()

    agent_raw = dict(_mapping(listeners.get("agent"), "listeners.agent"))
    obs_raw = dict(_mapping(listeners.get("observability"), "listeners.observability"))
    k8s_raw = dict(_mapping(listeners.get("kubernetes_api"), "listeners.kubernetes_api"))
    for raw_listener, name in ((agent_raw, "agent"), (obs_raw, "observability"), (k8s_raw, "kubernetes_api")):
        if f"{name}_address" in overrides:
            raw_listener["address"] = overrides[f"{name}_address"]

    agent_kwargs = _listener(agent_raw, "listeners.agent", defaults.agent, extra=("path", "handshake_timeout"))
    path = _expect(agent_raw.get("path", "/tunnel"), str, "listeners.agent.path", "a path")
    if not path.startswith("/"):
        raise ConfigError(f"listeners.agent.path: must start with '/', got {path!r}")
    handshake = _seconds(agent_raw.get("handshake_timeout", defaults.agent.handshake_timeout), "listeners.agent.handshake_timeout")
    agent_listener = AgentListener(path=path, handshake_timeout=handshake, **agent_kwargs)
    if obs_raw.get("tls") is not None:
        raise ConfigError("listeners.observability.tls: not supported (plain HTTP; keep it on a private address)")
    observability = Listener(**_listener(obs_raw, "listeners.observability", defaults.observability))
    k8s_kwargs = _listener(k8s_raw, "listeners.kubernetes_api", defaults.kubernetes_api, extra=_K8S_EXTRA)
    k8s_default = defaults.kubernetes_api
    header_timeout = _seconds(k8s_raw.get("header_timeout", k8s_default.header_timeout), "listeners.kubernetes_api.header_timeout")
    idle_timeout = _seconds(k8s_raw.get("idle_timeout", k8s_default.idle_timeout), "listeners.kubernetes_api.idle_timeout")
    max_header = _expect(
        k8s_raw.get("max_header_bytes", k8s_default.max_header_bytes),
        int,
        "listeners.kubernetes_api.max_header_bytes",
        "a number of bytes",
    )
    if max_header < 1024:
        raise ConfigError(f"listeners.kubernetes_api.max_header_bytes: must be at least 1024, got {max_header}")
    kubernetes_api = KubernetesAPIListener(
        header_timeout=header_timeout, idle_timeout=idle_timeout, max_header_bytes=max_header, **k8s_kwargs
    )
    _distinct_addresses({"agent": agent_listener, "observability": observability, "kubernetes_api": kubernetes_api}, sources)

    agents_raw = _expect(raw.get("agents") or [], list, "agents", "a list")
    agents = tuple(_agent(a, f"agents[{i}]") for i, a in enumerate(agents_raw))
    seen: dict[int, int] = {}
    tokens: dict[str, int] = {}
    for i, agent in enumerate(agents):
        if agent.id in seen:
            raise ConfigError(f"agents[{i}].id: agent id {agent.id} is already used by agents[{seen[agent.id]}]")
        seen[agent.id] = i
        # kasd knows an agent by its token: two agents with one token could not be told apart.
        if agent.token_sha256 in tokens:
            first = tokens[agent.token_sha256]
            raise ConfigError(
                f"agents[{i}].token_sha256: agent {agent.id} ({agent.name}) has the same token as agents[{first}], "
                f"agent {agents[first].id} ({agents[first].name}); each agent needs a token of its own"
            )
        tokens[agent.token_sha256] = i
    access_raw = _expect(raw.get("access") or [], list, "access", "a list")
    access = tuple(_access(a, f"access[{i}]", set(seen)) for i, a in enumerate(access_raw))

    wait = overrides.get("agent_wait_timeout", raw.get("agent_wait_timeout", defaults.agent_wait_timeout))
    shutdown = overrides.get("shutdown_timeout", raw.get("shutdown_timeout", defaults.shutdown_timeout))
    level = _log_level(overrides.get("log_level", raw.get("log_level", defaults.log_level)), "log_level")
    return Config(
        agent=agent_listener,
        observability=observability,
        kubernetes_api=kubernetes_api,
        agents=agents,
        access=access,
        agent_wait_timeout=_seconds(wait, "agent_wait_timeout"),
        shutdown_timeout=_seconds(shutdown, "shutdown_timeout"),
        log_level=level,
        ready_file=overrides.get("ready_file"),
    )


# --------------------------------------------------------------------------- env and flags

#: environment variable → override key
ENVIRONMENT = {
    "KASD_AGENT_ADDRESS": "agent_address",
    "KASD_OBSERVABILITY_ADDRESS": "observability_address",
    "KASD_KUBERNETES_API_ADDRESS": "kubernetes_api_address",
    "KASD_AGENT_WAIT_TIMEOUT": "agent_wait_timeout",
    "KASD_SHUTDOWN_TIMEOUT": "shutdown_timeout",
    "KASD_LOG_LEVEL": "log_level",
    "KASD_READY_FILE": "ready_file",
}

DESCRIPTION = """\
kasd: the server agentd connects to. Agents (agentd) dial the agent port and keep tunnels open;
kubectl, CI jobs and people reach their clusters through the Kubernetes API proxy.

Listeners (defaults): agent 0.0.0.0:8150 (HTTP/2, path /tunnel), observability 127.0.0.1:8151
(/liveness, /readiness, /metrics), Kubernetes API proxy 0.0.0.0:8154 (HTTP/1.1 and HTTP/2).

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
"""


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kasd", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", metavar="PATH", help="YAML configuration file (env: KASD_CONFIG)")
    parser.add_argument("--agent-address", metavar="HOST:PORT", help="agent listener (env: KASD_AGENT_ADDRESS; default 0.0.0.0:8150)")
    parser.add_argument(
        "--observability-address",
        metavar="HOST:PORT",
        help="observability listener (env: KASD_OBSERVABILITY_ADDRESS; default 127.0.0.1:8151)",
    )
    parser.add_argument(
        "--kubernetes-api-address",
        metavar="HOST:PORT",
        help="Kubernetes API proxy listener (env: KASD_KUBERNETES_API_ADDRESS; default 0.0.0.0:8154)",
    )
    parser.add_argument(
        "--agent-wait-timeout",
        metavar="SECONDS",
        help="how long a request waits for its agent to connect before 503 (env: KASD_AGENT_WAIT_TIMEOUT; default 10)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        metavar="SECONDS",
        help="bound on the graceful drain after SIGTERM (env: KASD_SHUTDOWN_TIMEOUT; default 20)",
    )
    parser.add_argument(
        "--log-level", type=str.lower, choices=LOG_LEVELS, help="any case (env: KASD_LOG_LEVEL; default info)"
    )
    parser.add_argument(
        "--ready-file",
        metavar="PATH",
        help="once listening, write the bound addresses there as JSON (env: KASD_READY_FILE)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    return parser


#: override key → the file key whose check its value gets
_OVERRIDE_KEYS = {
    "agent_address": "listeners.agent.address",
    "observability_address": "listeners.observability.address",
    "kubernetes_api_address": "listeners.kubernetes_api.address",
    "agent_wait_timeout": "agent_wait_timeout",
    "shutdown_timeout": "shutdown_timeout",
    "log_level": "log_level",
}


def _check_override(key: str, value: str, source: str) -> None:
    """An environment variable's or flag's value gets its file key's check, blamed on its source:
    ``KASD_AGENT_WAIT_TIMEOUT: agent_wait_timeout: 'abc' is not a number of seconds``."""
    file_key = _OVERRIDE_KEYS[key]
    try:
        if file_key.endswith(".address"):
            parse_address(value, file_key)
        elif file_key == "log_level":
            _log_level(value, file_key)
        else:
            _seconds(value, file_key)
    except ConfigError as exc:
        raise _OverrideError(f"{source}: {exc}") from None


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """Flags (``argv`` without the program name) over environment over file over defaults."""
    args = argument_parser().parse_args(list(argv))
    overrides: dict[str, Any] = {}
    sources: dict[str, str] = {}  # override key → the environment variable or flag it came from
    for env, key in ENVIRONMENT.items():
        if environ.get(env):
            overrides[key] = environ[env]
            sources[key] = env
    for key in (*_OVERRIDE_KEYS, "ready_file"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
            sources[key] = "--" + key.replace("_", "-")
    for key, value in overrides.items():
        if key in _OVERRIDE_KEYS:
            _check_override(key, value, sources[key])
    if "ready_file" in overrides:
        overrides["ready_file"] = Path(overrides["ready_file"])
        problem = ready_file_problem(overrides["ready_file"])
        if problem is not None:
            raise ConfigError(f"{sources['ready_file']}: cannot write the ready file {str(overrides['ready_file'])!r}: {problem}")
    path = args.config or environ.get("KASD_CONFIG")
    raw: Any = {}
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            where = "--config" if args.config else "KASD_CONFIG"
            raise ConfigError(f"{where}: cannot read {path!r}: {exc.strerror or exc}") from None
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    try:
        return config_from_mapping(raw, overrides, sources)
    except _OverrideError:
        raise
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None


__all__ = ["VERSION", "Config", "ConfigError", "config_from_mapping", "load_config"]
