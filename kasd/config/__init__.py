"""kasd's configuration: a YAML file, then ``KASD_*`` environment overrides, then flags.

Each setting is declared once, as a field of a frozen attrs class (``setting()``: its file key,
variable, flag, help and check); ``daemonkit.settings`` loads them. A bad value raises
``ConfigError`` naming the key and what is wrong, and the variable or flag when it came from one
(``__main__`` prints it and exits 2). Raw tokens never appear here: agents hold ``token_sha256``
digests (``kasd hash-token`` makes them); CI job and personal tokens are signed, and kasd holds only
the public keys that verify them.

The modules, one per section of the file:

- ``values``: the parsers of one value the sections share (seconds, counts, paths, addresses);
- ``listeners``: ``listeners:`` (addresses, TLS files, connection caps, HTTP/2 limits);
- ``directory``: ``agents:``, ``groups:``, ``projects:``, ``users:``;
- ``receptive``: ``agents[].receptive:`` (how kasd dials a receptive agent);
- ``authorization``: ``authorization:`` (config projects, token verification);
- ``routing``: ``routing:`` (sessions, Redis, replicas and how they trust each other);
- ``store``: ``store:`` (what outlives the process);
- ``web``: ``web:`` (the environments API and dashboard: CORS origins);
- ``root``: ``Config`` (the top-level keys) and the checks that need the whole of it;
- ``loading``: the loader, its words in errors and ``--help``, and ``load_config`` and friends.

Everything importers need is named here: ``from kasd.config import Config, ConfigError, …``.

May import: ``daemonkit`` (settings, yamldoc, notify), ``kasd.authz`` (pure), ``kasd.tokens``,
``routing.peers`` (what crosses a network), ``h2trio.budget``, ``wire.ids``, ``wire.receptive`` (the
key parser, sans-I/O), attrs, joserfc and cryptography (a receptive agent's signing key, loaded to
check it) and the standard library; never a server, a listener or a pipeline.
"""

from kasd.config.authorization import AuthorizationSettings, TokenSettings
from kasd.config.directory import AgentEntry, GroupEntry, ProjectEntry, UserEntry
from kasd.config.listeners import (
    AgentListener,
    ApiListener,
    Http2Limits,
    KubernetesAPIListener,
    Listener,
    Listeners,
    ListenerTLS,
    ObservabilityListener,
    PrivateListener,
)
from kasd.config.loading import (
    DESCRIPTION,
    EPILOG,
    LOADER,
    VERSION,
    argument_parser,
    config_from_mapping,
    load_config,
    load_config_file,
)
from kasd.config.root import (
    LOG_LEVELS,
    Config,
    ConfigError,
    check_plaintext,
    directory_of,
    plaintext_listeners,
    plaintext_peer_secret,
)
from kasd.config.routing import PEER_SECRET_MIN, RedisSettings, Routing, SecretFile
from kasd.config.store import STORE_FILE_NAME, EnvironmentSettings, StoreSettings
from kasd.config.values import parse_address
from kasd.config.web import WebConfig

__all__ = [
    "DESCRIPTION",
    "EPILOG",
    "LOADER",
    "LOG_LEVELS",
    "PEER_SECRET_MIN",
    "STORE_FILE_NAME",
    "VERSION",
    "AgentEntry",
    "AgentListener",
    "ApiListener",
    "AuthorizationSettings",
    "Config",
    "ConfigError",
    "EnvironmentSettings",
    "GroupEntry",
    "Http2Limits",
    "KubernetesAPIListener",
    "Listener",
    "ListenerTLS",
    "Listeners",
    "ObservabilityListener",
    "PrivateListener",
    "ProjectEntry",
    "RedisSettings",
    "Routing",
    "SecretFile",
    "StoreSettings",
    "TokenSettings",
    "UserEntry",
    "WebConfig",
    "argument_parser",
    "check_plaintext",
    "config_from_mapping",
    "directory_of",
    "load_config",
    "load_config_file",
    "parse_address",
    "plaintext_listeners",
    "plaintext_peer_secret",
]
