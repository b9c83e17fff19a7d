"""kasd among replicas: what ``serve_kasd`` adds when ``routing.redis.url`` is set (or a test hands it
a ``ReplicationFactory``): this replica's identity on the ring (a ``routing.membership.Member``), the
membership and directory (``routing.membership``, ``routing.directory``: their interfaces are
defined there, beside their implementations), the peer pool and router (``routing.peers``,
``routing.router``), and the TLS and authentication of the private port.

A lone kasd (no ``routing.redis``) uses none of it: ``LocalRouter``, no private listener, no Redis.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import attrs

from kasd.config import Config, ConfigError
from netio.tlsreload import CHECK_INTERVAL, ReloadingContext, TLSFiles, TLSLoadError, build_context
from routing.peers import PEER_PATH

if TYPE_CHECKING:  # (both pull in coredis: a lone kasd never loads them, see the module's docstring)
    from routing.directory import TunnelDirectory
    from routing.membership import Member, Membership

#: the bearer token a replica sends when mutual TLS (not a secret) authenticates it
MTLS_TOKEN = "mutual-tls"


@attrs.frozen(kw_only=True)
class Replication:
    membership: Membership
    directory: TunnelDirectory

    @property
    def healthy(self) -> bool:
        return self.membership.healthy and self.directory.healthy


#: builds this replica's membership and directory once its listeners are bound (its identity, the
#: ``Member`` it is to the others, known): the pair itself, or an async context manager holding them
#: (and their Redis connection) open
ReplicationFactory = Callable[["Member"], "Replication | AbstractAsyncContextManager[Replication]"]


def redis_replication(config: Config) -> ReplicationFactory:
    """The membership and directory in the Redis of ``routing.redis``."""
    from routing.directory import RedisDirectory
    from routing.membership import RedisMembership
    from routing.redisconn import RedisHealth, open_redis

    redis = config.routing.redis
    assert redis.url is not None
    url = redis.url

    @asynccontextmanager
    async def build(me: Member) -> AsyncIterator[Replication]:
        health = RedisHealth(url)
        async with open_redis(url, password=redis.password) as client:
            membership = RedisMembership(client, me, health=health, key_prefix=redis.key_prefix,
                                         heartbeat_interval=config.routing.heartbeat_interval)
            directory = RedisDirectory(client, membership, health=health, key_prefix=redis.key_prefix,
                                       tunnel_ttl=config.routing.tunnel_ttl)
            yield Replication(membership=membership, directory=directory)

    return build


def identity(config: Config, addresses: Mapping[str, str], agent_url: str) -> Member:
    """This replica as the others see it: its name and URLs as configured, else from the bound
    listeners."""
    from routing.membership import Member

    routing = config.routing
    private_scheme = "https" if config.private.tls is not None else "http"
    return Member(
        name=routing.name or addresses["kubernetes_api"],
        weight=routing.weight,
        private_url=routing.private_url or f"{private_scheme}://{addresses['private']}",
        agent_url=routing.agent_url or agent_url,
    )


def peer_token(config: Config) -> str:
    secret = config.routing.peer_secret_file
    return secret.value if secret is not None else MTLS_TOKEN


def peer_client_ssl(config: Config) -> ssl.SSLContext | None:
    """How this replica dials the others' private ports: their CA, and under mutual TLS its own
    private-port certificate as the client certificate."""
    routing, private = config.routing, config.private
    # Under mutual TLS the replicas' private-port certificates are their client certificates too:
    # the CA that vouches for them as clients (client_ca) does as servers, unless peer_ca_file says.
    cafile = routing.peer_ca_file or private.client_ca
    if cafile is None:
        return None  # plain http:// peers on loopback only: PeerPool dials no https:// peer without a CA
    mutual = private.tls if private.client_ca is not None else None
    # The error names the setting of the file at fault: the CA's, or (mutual TLS) the client certificate's.
    try:
        build_context(TLSFiles(server=False, ca=cafile))
    except TLSLoadError as exc:
        setting = "routing.peer_ca_file" if routing.peer_ca_file is not None else "listeners.private.client_ca"
        raise ConfigError(f"{setting}: {exc}") from None
    files = TLSFiles(server=False, ca=cafile, cert=mutual.cert if mutual else None, key=mutual.key if mutual else None)
    interval = private.tls.reload_interval if private.tls is not None else CHECK_INTERVAL
    try:
        return ReloadingContext(files, name="peers", check_interval=interval)
    except TLSLoadError as exc:
        raise ConfigError(f"listeners.private.tls (this replica's client certificate to the others): {exc}") from None


def private_server_ssl(config: Config) -> ssl.SSLContext | None:
    """The private port's TLS (None: plain): under mutual TLS, a client certificate signed by
    ``listeners.private.client_ca`` is required at the handshake. Files read again when they change."""
    private = config.private
    if private.tls is None:
        return None
    files = TLSFiles(server=True, cert=private.tls.cert, key=private.tls.key, ca=private.client_ca)
    try:
        return ReloadingContext(files, name="listeners.private", check_interval=private.tls.reload_interval)
    except TLSLoadError as exc:
        raise ConfigError(f"listeners.private.tls: {exc}") from None


__all__ = [
    "MTLS_TOKEN",
    "PEER_PATH",
    "Replication",
    "ReplicationFactory",
    "identity",
    "peer_client_ssl",
    "peer_token",
    "private_server_ssl",
    "redis_replication",
]
