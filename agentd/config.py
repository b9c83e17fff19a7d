"""agentd's configuration: a YAML file, then environment variables, then flags (each overriding the
one before). Every problem is a ``ConfigError`` whose message names the setting and what is wrong;
the console script turns it into ``agentd: error: …`` and exit code 2, argparse style.
"""

from __future__ import annotations

import argparse
import socket
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import attrs
import yaml

from agentd import __version__
from daemonkit.notify import ready_file_problem

DEFAULT_CONNECTIONS = 2
DEFAULT_HEALTH_ADDRESS = "0.0.0.0:8080"
DEFAULT_SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LOG_LEVELS = ("debug", "info", "warning", "error")

#: keys a config file may hold (snake_case, one per setting); anything else is an error
FILE_KEYS = frozenset(
    {
        "kas_address",
        "token_file",
        "kubeconfig",
        "kube_context",
        "in_cluster",
        "serviceaccount_dir",
        "connections",
        "health_address",
        "agent_id",
        "pod_name",
        "pod_uid",
        "kas_ca_file",
        "ready_file",
        "log_level",
        "shutdown_grace",
    }
)

EXAMPLES = """\
examples:
  # in a pod: the API server from the service account, the kasd address and token from env
  AGENTD_KAS_ADDRESS=https://kas.example.com:8150/tunnel \\
  AGENTD_TOKEN_FILE=/etc/agentd/token agentd --in-cluster

  # on a workstation against a kubeconfig, plain h2c to a local kasd, three tunnels
  agentd --kas-address http://127.0.0.1:8150/tunnel --token-file ./agent-token \\
         --kubeconfig ~/.kube/config --connections 3 --health-address 127.0.0.1:8080

  # everything from a file (see examples/agentd.yaml); flags still win over it
  agentd --config /etc/agentd/agentd.yaml --log-level debug

precedence: config file < environment (AGENTD_*, POD_NAME, POD_UID) < flags.
The kasd address is http://host:8150/tunnel (h2c) or https://host:8150/tunnel (TLS, ALPN h2);
repeat --kas-address (or comma-separate AGENTD_KAS_ADDRESS) to spread tunnels over several.
The token is read from the file at every dial and is never logged.
"""


class ConfigError(Exception):
    """Bad configuration: the message says which setting and why (exit code 2)."""


class UsageError(ConfigError):
    """The command line itself is wrong (an unknown flag, a flag without its value): shown with the
    usage, as argparse (and kasd) do; any other ConfigError is its one line."""


@attrs.frozen(kw_only=True)
class AgentConfig:
    kas_addresses: tuple[str, ...]
    token_file: Path
    kubeconfig: Path | None = None
    kube_context: str | None = None
    in_cluster: bool = False
    serviceaccount_dir: Path = DEFAULT_SERVICEACCOUNT_DIR
    #: KUBERNETES_SERVICE_HOST/PORT as seen at start (in-cluster mode)
    kubernetes_service_host: str | None = None
    kubernetes_service_port: str | None = None
    connections: int = DEFAULT_CONNECTIONS
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    agent_id: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    kas_ca_file: Path | None = None
    ready_file: Path | None = None
    log_level: str = "info"
    #: how long in-flight streams may run on after SIGTERM
    shutdown_grace: float = 10.0

    @property
    def health_address(self) -> str:
        return _join_host_port(self.health_host, self.health_port)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="agentd",
        description="The in-cluster agent of kasd: dials out to kasd, keeps tunnels up, and proxies "
        "the requests kasd sends to the Kubernetes API server with its own credentials plus "
        "Impersonate-* headers.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, metavar="PATH", help="YAML config file (env: AGENTD_CONFIG)")
    parser.add_argument(
        "--kas-address",
        action="append",
        metavar="URL",
        help="kasd tunnel URL, http://host:8150/tunnel or https://…; repeatable (env: AGENTD_KAS_ADDRESS, comma-separated)",
    )
    parser.add_argument("--token-file", type=Path, metavar="PATH", help="file holding the agent token (env: AGENTD_TOKEN_FILE)")
    parser.add_argument("--kubeconfig", type=Path, metavar="PATH", help="reach the API server through this kubeconfig (env: AGENTD_KUBECONFIG)")
    parser.add_argument("--kube-context", metavar="NAME", help="kubeconfig context to use (default: its current-context)")
    parser.add_argument(
        "--in-cluster",
        action="store_true",
        default=None,
        help="reach the API server with the pod's service account (the default when KUBERNETES_SERVICE_HOST is set)",
    )
    parser.add_argument("--connections", metavar="N", help=f"tunnels to keep open (default: {DEFAULT_CONNECTIONS}; env: AGENTD_CONNECTIONS)")
    parser.add_argument(
        "--health-address",
        metavar="HOST:PORT",
        help=f"where /liveness and /readiness listen; port 0 picks one (default: {DEFAULT_HEALTH_ADDRESS}; env: AGENTD_HEALTH_ADDRESS)",
    )
    parser.add_argument("--agent-id", metavar="ID", help="agent id presented to kasd (env: AGENTD_AGENT_ID)")
    parser.add_argument("--pod-name", metavar="NAME", help="pod name presented to kasd (env: POD_NAME; default: the host name)")
    parser.add_argument("--pod-uid", metavar="UID", help="pod uid presented to kasd (env: POD_UID)")
    parser.add_argument("--kas-ca-file", type=Path, metavar="PATH", help="PEM CA bundle that signs kasd's certificate (env: AGENTD_KAS_CA_FILE)")
    parser.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help='write {"health": "host:port"} as JSON here once listening and the first tunnel is up (for tests)',
    )
    parser.add_argument(
        "--log-level", metavar="LEVEL", help=f"one of {', '.join(LOG_LEVELS)}, any case (default: info; env: AGENTD_LOG_LEVEL)"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


_ENV = {
    "AGENTD_KAS_ADDRESS": "kas_address",
    "AGENTD_TOKEN_FILE": "token_file",
    "AGENTD_KUBECONFIG": "kubeconfig",
    "AGENTD_CONNECTIONS": "connections",
    "AGENTD_HEALTH_ADDRESS": "health_address",
    "AGENTD_AGENT_ID": "agent_id",
    "POD_NAME": "pod_name",
    "POD_UID": "pod_uid",
    "AGENTD_KAS_CA_FILE": "kas_ca_file",
    "AGENTD_LOG_LEVEL": "log_level",
}


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> AgentConfig:
    """Merge file < environment < flags into an AgentConfig; raises ConfigError on bad input."""
    args = build_parser().parse_args(list(argv))
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    ranks: dict[str, int] = {}  # 0 file, 1 environment, 2 flags

    config_path = args.config or (Path(environ["AGENTD_CONFIG"]) if environ.get("AGENTD_CONFIG") else None)
    if config_path is not None:
        for key, value in _read_file(config_path).items():
            merged[key] = value
            sources[key] = f"{key} in {config_path}"
            ranks[key] = 0

    for env_name, key in _ENV.items():
        value = environ.get(env_name)
        if value:
            merged[key] = value.split(",") if key == "kas_address" else value
            sources[key] = env_name
            ranks[key] = 1

    for key, value in vars(args).items():
        if key == "config" or value is None:
            continue
        merged[key] = value
        sources[key] = "--" + key.replace("_", "-")
        ranks[key] = 2

    # kubeconfig and in_cluster are one choice: a later source choosing one overrides the other.
    if merged.get("kubeconfig") and merged.get("in_cluster") not in (None, False):
        if ranks["kubeconfig"] > ranks["in_cluster"]:
            merged["in_cluster"] = False
        elif ranks["in_cluster"] > ranks["kubeconfig"]:
            merged.pop("kubeconfig")
    return _build(merged, sources, environ)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of settings, not {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(FILE_KEYS))}"
        )
    return data


def _build(merged: dict[str, Any], sources: dict[str, str], environ: Mapping[str, str]) -> AgentConfig:
    def where(key: str) -> str:
        return sources.get(key, key)

    for key in _TEXT_KEYS:
        if key in merged:
            merged[key] = _text(merged[key], where(key), allow_int=key == "agent_id")

    addresses = merged.get("kas_address")
    if isinstance(addresses, str):
        addresses = addresses.split(",")
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        addresses = [] if addresses is None else None
    if addresses is None:
        raise ConfigError(f"{where('kas_address')}: must be a URL or a list of URLs")
    addresses = [a.strip() for a in addresses if a.strip()]
    if not addresses:
        raise ConfigError("no kasd address: pass --kas-address URL (or set AGENTD_KAS_ADDRESS)")
    kas = tuple(_check_kas_url(a, where("kas_address")) for a in addresses)

    token_value = merged.get("token_file")
    if not token_value:
        raise ConfigError("no agent token: pass --token-file PATH (or set AGENTD_TOKEN_FILE)")
    token_file = Path(str(token_value)).expanduser()
    _check_token_file(token_file, where("token_file"))

    kubeconfig = merged.get("kubeconfig")
    kubeconfig_path = Path(str(kubeconfig)).expanduser() if kubeconfig else None
    in_cluster = _bool(merged.get("in_cluster", False), where("in_cluster"))
    if kubeconfig_path is not None and in_cluster:
        raise ConfigError(f"choose one way to reach the API server: {where('kubeconfig')} and {where('in_cluster')} are both set")
    if kubeconfig_path is None and not in_cluster:
        if environ.get("KUBERNETES_SERVICE_HOST"):
            in_cluster = True
        else:
            raise ConfigError(
                "no way to reach the Kubernetes API: pass --kubeconfig PATH, or --in-cluster inside a pod "
                "(KUBERNETES_SERVICE_HOST is not set)"
            )
    if kubeconfig_path is not None and not kubeconfig_path.is_file():
        raise ConfigError(f"{where('kubeconfig')}: kubeconfig file {kubeconfig_path} does not exist")

    connections = _int(merged.get("connections", DEFAULT_CONNECTIONS), where("connections"))
    if not 1 <= connections <= 64:
        raise ConfigError(f"{where('connections')}: must be between 1 and 64, got {connections}")

    health_host, health_port = _parse_host_port(str(merged.get("health_address", DEFAULT_HEALTH_ADDRESS)), where("health_address"))

    kas_ca = merged.get("kas_ca_file")
    kas_ca_file = Path(str(kas_ca)).expanduser() if kas_ca else None
    if kas_ca_file is not None:
        _check_ca_file(kas_ca_file, where("kas_ca_file"))

    log_level = str(merged.get("log_level", "info")).lower()
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"{where('log_level')}: must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")

    grace = merged.get("shutdown_grace", 10.0)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
        raise ConfigError(f"{where('shutdown_grace')}: must be a number of seconds >= 0")

    ready = merged.get("ready_file")
    ready_file = Path(str(ready)) if ready else None
    if ready_file is not None and (problem := ready_file_problem(ready_file)) is not None:
        raise ConfigError(f"{where('ready_file')}: cannot write the ready file {ready_file}: {problem}")
    return AgentConfig(
        kas_addresses=kas,
        token_file=token_file,
        kubeconfig=kubeconfig_path,
        kube_context=str(merged["kube_context"]) if merged.get("kube_context") else None,
        in_cluster=in_cluster,
        serviceaccount_dir=Path(str(merged.get("serviceaccount_dir", DEFAULT_SERVICEACCOUNT_DIR))),
        kubernetes_service_host=environ.get("KUBERNETES_SERVICE_HOST") or None,
        kubernetes_service_port=environ.get("KUBERNETES_SERVICE_PORT") or None,
        connections=connections,
        health_host=health_host,
        health_port=health_port,
        agent_id=str(merged.get("agent_id") or ""),
        pod_name=str(merged.get("pod_name") or socket.gethostname()),
        pod_uid=str(merged.get("pod_uid") or ""),
        kas_ca_file=kas_ca_file,
        ready_file=ready_file,
        log_level=log_level,
        shutdown_grace=float(grace),
    )


def _check_kas_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: kasd address must be http://host:port/tunnel or https://host:port/tunnel, got {url!r}")
    try:
        parts.port  # noqa: B018 — raises ValueError for a bad port
    except ValueError:
        raise ConfigError(f"{where}: bad port in kasd address {url!r}") from None
    if parts.path in ("", "/"):
        url = parts._replace(path="/tunnel").geturl()
    return url


def _check_ca_file(path: Path, where: str) -> None:
    """Load the bundle now, so a wrong file is a configuration error naming it rather than an
    ``ssl.SSLError`` once agentd runs."""
    if not path.is_file():
        raise ConfigError(f"{where}: CA file {path} does not exist")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(path))
    except ssl.SSLError:
        raise ConfigError(f"{where}: CA file {path} holds no PEM certificate") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read CA file {path}: {exc.strerror or exc}") from None


def _check_token_file(path: Path, where: str) -> None:
    try:
        content = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{where}: token file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read token file {path}: {exc.strerror or exc}") from None
    if not content.strip():
        raise ConfigError(f"{where}: token file {path} is empty")


def _parse_host_port(text: str, where: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"{where}: expected HOST:PORT (e.g. 0.0.0.0:8080), got {text!r}")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"{where}: port {port} is out of range")
    host = host.strip("[]") or "0.0.0.0"
    return host, port


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _int(value: Any, where: str) -> int:
    """A whole number: an int from the file (not a bool, not 3.7), or its text from env and flags."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ConfigError(f"{where}: expected a whole number, got {value!r}")


#: settings whose value is text (a path, a name, an address): every key but the four with a type
#: of their own (a list of URLs, a boolean, a whole number, seconds). Environment and flags always
#: give text (or a Path); a file may hold anything.
_TEXT_KEYS = sorted(FILE_KEYS - {"kas_address", "in_cluster", "connections", "shutdown_grace"})


def _text(value: Any, where: str, *, allow_int: bool = False) -> str | Path | None:
    """``value`` unless it is not text: ``pod_name: [a]`` is an error, not ``"['a']"``. An agent id
    may be written as a number (``agent_id: 42``), as kasd's agent ids are."""
    if value is None or isinstance(value, str | Path):
        return value
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(f"{where}: expected true or false, got {value!r}")
