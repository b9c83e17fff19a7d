"""The routing tests run on a real single Redis and a real 3-master Redis Cluster (tests/conftest.py
starts both, once per module)."""

from __future__ import annotations

import pytest

from tests.redisproc import RedisCluster, RedisProcess


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
