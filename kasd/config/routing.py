"""``routing:``: how requests are steered between an agent's sessions and, with a Redis, between
replicas: the Redis, this replica's name and URLs on the ring, and how replicas trust each other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs

from daemonkit import yamldoc
from daemonkit.settings import Problem, setting
from kasd.config.values import (
    expect_type,
    parse_address,
    parse_count,
    parse_existing_file,
    parse_seconds,
)

_REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "redis+sentinel")


def _redis_url(value: Any) -> str | None:
    """``redis://h:p/db``, ``rediss://…``, ``redis+cluster://h:p[,h:p…]``, ``redis+sentinel://h:p[,h:p]/<master>``;
    never with a password in it (URLs end up in logs and process listings: use password_file)."""
    if value is None:
        return None
    text = expect_type(value, str, "a redis:// URL").strip()
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
        path = parse_existing_file(value)
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
    text = expect_type(value, str, "a string")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", text):
        raise Problem(f"must be 1-64 letters, digits or '_.:-' (no '{{}}' or spaces), got {text!r}")
    return text  # type: ignore[no-any-return]


def _ring_name(value: Any) -> str | None:
    if value is None:
        return None
    text = expect_type(value, str, "a host:port string")
    address = parse_address(text)
    if address.port == 0:
        raise Problem(f"must name a real port, got {text!r}")
    return text  # type: ignore[no-any-return]


def _http_url(value: Any) -> str | None:
    if value is None:
        return None
    text = expect_type(value, str, "an http:// or https:// URL")
    scheme, sep, rest = text.partition("://")
    if scheme not in ("http", "https") or not sep or not rest.split("/", 1)[0]:
        raise Problem(f"must be http://host:port or https://host:port, got {yamldoc.describe(text)}")
    return text  # type: ignore[no-any-return]


def _weight(value: Any) -> int:
    weight = parse_count(value)
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
    breaker_initial_hold: float = setting(1.0, parse=parse_seconds)
    #: the longest such hold, in seconds
    breaker_max_hold: float = setting(30.0, parse=parse_seconds)
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
    heartbeat_interval: float = setting(1.0, parse=parse_seconds)
    tunnel_ttl: float = setting(30.0, parse=parse_seconds)
    #: seconds a replica shutting down waits for Redis to mark itself draining, and again to withdraw
    #: its agents' entries and leave the membership after the drain: Redis may be away
    leave_timeout: float = setting(2.0, parse=parse_seconds)
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
        None, parse=parse_existing_file, env="KASD_PEER_CA_FILE", flag="--peer-ca-file", metavar="PATH",
        help="CA file that verifies the other replicas' private-port certificates",
    )

    @property
    def replicated(self) -> bool:
        return self.redis.url is not None
