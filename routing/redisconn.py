"""Redis for kasd replicas, through coredis on trio (its anyio core runs natively there).

``open_redis(url, password=...)`` is an async context manager giving a client for

- ``redis://host:port[/db]`` and ``rediss://…`` (TLS) — one server;
- ``redis+cluster://host:port[,host:port…]`` — a Redis Cluster (every key kasd uses carries a hash
  tag, and no command or script spans two slots);
- ``redis+sentinel://host:port[,host:port…]/<master name>`` — the master Sentinel names, followed
  across failovers.

``describe(url)`` is the URL as logs may show it: never a password. ``RedisHealth`` is what the
membership and the directory share to say "Redis is away" once per outage, not once per request.

May import: coredis (and anyio, the core it runs on: its exceptions), trio, attrs, the standard library.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn
from urllib.parse import urlsplit

import anyio
import coredis
import coredis.exceptions
import trio

log = logging.getLogger("routing.redis")

#: what a call to an unreachable or failing Redis raises (coredis wraps socket errors in its own)
REDIS_ERRORS: tuple[type[BaseException], ...] = (
    coredis.exceptions.RedisError, OSError, trio.TooSlowError, anyio.ClosedResourceError, anyio.BrokenResourceError,
)

#: seconds to connect, and for any one command to answer, before Redis counts as unreachable
CONNECT_TIMEOUT = 2.0
COMMAND_TIMEOUT = 3.0


def _hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    hosts = []
    for part in netloc.rsplit("@", 1)[-1].split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = port, str(default_port)
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def describe(url: str) -> str:
    """``url`` without user information (a password must never reach a log line)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{netloc}{parts.path}"


@asynccontextmanager
async def open_redis(url: str, *, password: str | None = None, **options: Any) -> AsyncIterator[Any]:
    """A coredis client for ``url`` (decoded strings), open for the ``async with`` block."""
    parts = urlsplit(url)
    scheme = parts.scheme
    common: dict[str, Any] = {
        "decode_responses": True,
        "connect_timeout": CONNECT_TIMEOUT,
        "stream_timeout": COMMAND_TIMEOUT,
        **options,
    }
    if password is not None:
        common["password"] = password
    if parts.username:
        common["username"] = parts.username
    if scheme in ("redis", "rediss"):
        (host, port), = _hosts(parts.netloc, 6379)[:1]
        db = int(parts.path.strip("/") or 0)
        async with coredis.Redis(host=host, port=port, db=db, ssl=scheme == "rediss", **common) as client:
            yield client
    elif scheme == "redis+cluster":
        nodes = [coredis.typing.Node(host=h, port=p) for h, p in _hosts(parts.netloc, 6379)]
        async with coredis.RedisCluster(startup_nodes=nodes, **common) as client:
            yield client
    elif scheme == "redis+sentinel":
        from coredis.connection import TCPLocation

        master = parts.path.strip("/")
        sentinels = [TCPLocation(h, p) for h, p in _hosts(parts.netloc, 26379)]
        async with coredis.Sentinel(sentinels, decode_responses=True) as sentinel, \
                sentinel.primary_for(master, **common) as client:
            yield client
    else:
        raise ValueError(f"not a Redis URL kasd knows: {describe(url)!r}")


@asynccontextmanager
async def subscription(client: Any, channels: list[str]) -> AsyncIterator[Any]:
    """``client.pubsub(channels=...)`` for the ``async with`` block (coredis re-subscribes by itself
    after a reconnect: each time, a ``subscribe`` message comes again).

    Fenced here (coredis 6.9):

    - when the block is cancelled while its connection is already closed, coredis sends UNSUBSCRIBE
      into that closed connection and raises anyio.ClosedResourceError from its cleanup. Nothing
      is lost by ignoring it (the subscription is gone with the connection);
    - its SUBSCRIBE runs in a task group of its own, so a connection lost just then (``Connection
      not usable``) comes out wrapped in an ExceptionGroup, which a caller's ``except REDIS_ERRORS``
      does not catch: the listener, and the replica with it, would end. A group of nothing but
      Redis errors is raised as its first error."""
    try:
        try:
            async with client.pubsub(channels=channels) as pubsub:
                yield pubsub
        except* anyio.ClosedResourceError:
            await trio.lowlevel.checkpoint_if_cancelled()
    except BaseExceptionGroup as group:
        matched, rest = group.split(REDIS_ERRORS)
        if matched is None or rest is not None:
            raise
        raise _first_leaf(matched) from group


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


class RedisHealth:
    """Whether Redis answers, shared by everything of one replica that talks to it: the first
    failure of an outage is logged (a warning), the recovery too (info); ``returned`` is set (and
    replaced) each time Redis comes back, so the membership and directory re-register at once."""

    def __init__(self, url: str) -> None:
        self.where = describe(url)
        self.healthy = True
        self.outages = 0
        self.returned = trio.Event()
        self.away = trio.Event()

    def failed(self, error: BaseException) -> None:
        if self.healthy:
            self.healthy = False
            self.outages += 1
            log.warning("redis unreachable; serving the agents connected here, routing to others paused "
                        "redis=%s error=%s", self.where, _short(error))
            self.away.set()
            self.away = trio.Event()

    def succeeded(self) -> None:
        if not self.healthy:
            self.healthy = True
            log.info("redis reachable again; re-registering redis=%s", self.where)
            self.returned.set()
            self.returned = trio.Event()


def _short(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text[:200]


async def follow(client: Any, channel: str, *, subscribed: Callable[[], Awaitable[object]],
                 message: Callable[[str], Awaitable[object]], lost: Callable[[BaseException], object],
                 errors: tuple[type[BaseException], ...] = REDIS_ERRORS, delay: float = 1.0) -> NoReturn:
    """Stay subscribed to ``channel``: ``subscribed()`` at each (re)subscription (what was said
    while away was not heard: read it now), ``message(text)`` for each notice, ``lost(error)`` when
    the subscription breaks (Redis away: ``errors``), then subscribe again after ``delay``."""
    while True:
        try:
            async with subscription(client, [channel]) as pubsub:
                async for notice in pubsub:
                    if notice["type"] == "subscribe":
                        await subscribed()
                    elif notice["type"] == "message":
                        data = notice["data"]
                        await message(data.decode() if isinstance(data, bytes) else str(data))
        except errors as exc:
            lost(exc)
            await trio.sleep(delay)


__all__ = ["COMMAND_TIMEOUT", "CONNECT_TIMEOUT", "REDIS_ERRORS", "RedisHealth", "describe", "follow", "open_redis",
           "subscription"]
