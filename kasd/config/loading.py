"""How kasd reads its configuration: the one ``daemonkit.settings`` loader over ``Config``, the
words of its errors and of ``kasd --help``, and the entry points (``load_config`` and friends)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from daemonkit import yamldoc
from daemonkit.settings import SettingsLoader, Source
from kasd.config.root import Config, check

try:
    #: what ``kasd --version`` prints: the installed distribution's version, as agentd reports its own
    VERSION = metadata.version("kasd")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    VERSION = "0.0.0"


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
  kasd completion SHELL     print the shell completion script (bash, zsh, fish, tcsh)

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


def config_from_mapping(raw: Any) -> Config:
    """Validate a parsed YAML document (no environment, no flags)."""
    return check(LOADER.structure(raw if raw is not None else {}, {}, None))


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """Flags (``argv`` without the program name) over environment over file over defaults."""
    return check(LOADER.load(argv, environ))


def load_config_file(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[Config, Path | None]:
    """``load_config``, and the file it read (None: none), which a reload watches."""
    loaded = LOADER.load(argv, environ)
    return check(loaded), loaded.config
