"""Fixtures for every test directory."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.redisproc import RedisCluster, RedisProcess


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something is already listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """A real redis-server for the tests of one module (flush it where a test needs it empty)."""
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real 3-master Redis Cluster for the tests of one module."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
