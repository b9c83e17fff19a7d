"""Real redis-server processes for the routing tests: one server (module-scoped, flushed per test)
and a 3-master Redis Cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redisproc import RedisCluster, RedisProcess


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["redis", "redis-cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """The same test on a single Redis and on a 3-master Redis Cluster (flushed first)."""
    if request.param == "redis":
        server: RedisProcess = request.getfixturevalue("redis_server")
        server.command("FLUSHALL")
        return server.url
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    for node in cluster.nodes:
        node.command("FLUSHALL")
    return cluster.url
