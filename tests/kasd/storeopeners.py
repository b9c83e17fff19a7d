"""The stores the store tests run against, each flushed first: a lone kasd's SQLite file, and a
Redis of replicas, plain (``redis_server``) or as a 3-master Redis Cluster (``redis_cluster``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from kasd.store.redis import RedisStore
from kasd.store.sqlite import SqliteStore
from routing.redisconn import open_redis
from tests.redisproc import RedisCluster, RedisProcess

#: opens a client of one store: the same SQLite file each time (a restart), or another client of
#: one Redis (another replica)
Opener = Callable[[], AbstractAsyncContextManager[Any]]


def flushed_redis_url(request: pytest.FixtureRequest, kind: str) -> str:
    """The URL of a flushed Redis: ``redis`` one server, ``redis-cluster`` a 3-master cluster."""
    if kind == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        for node in cluster.nodes:
            node.command("FLUSHALL")
        return cluster.url
    server: RedisProcess = request.getfixturevalue("redis_server")
    server.command("FLUSHALL")
    return server.url


def store_opener(request: pytest.FixtureRequest, kind: str, tmp_path: Path, **store: Any) -> Opener:
    """``kind`` is ``sqlite``, ``redis`` or ``redis-cluster``; ``store`` are the store's keywords
    (``max_entries``, ``history``, …), the same for both."""
    if kind == "sqlite":
        path = tmp_path / "kasd.sqlite3"

        @asynccontextmanager
        async def sqlite() -> AsyncIterator[Any]:
            opened = SqliteStore.open_sync(path, **store)
            try:
                yield opened
            finally:
                await opened.aclose()

        return sqlite
    url = flushed_redis_url(request, kind)

    @asynccontextmanager
    async def redis() -> AsyncIterator[Any]:
        async with open_redis(url) as client:
            yield RedisStore(client, key_prefix="test", **store)

    return redis
