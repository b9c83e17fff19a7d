"""Fixtures for every test directory."""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redisproc import RedisCluster, RedisProcess

TESTS = Path(__file__).resolve().parent
E2E_DIRECTORIES = (TESTS / "e2e", TESTS / "cluster")
E2E_FIXTURES = frozenset({
    "stack", "own_stack",  # kasctl.stack: kubesim, kasd and agentd as processes
    "kubectl_bin", "k",  # a real kubectl (each version found), the slowest thing a test can run
})


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``KASD_EXPECT_COMPILED=1`` (scripts/test.sh's compiled pass) every module setup.py
    compiles must run as a mypyc extension, so the pass cannot quietly test the Python instead."""
    if os.environ.get("KASD_EXPECT_COMPILED") != "1":
        return
    spec = importlib.util.spec_from_file_location("_compiled", TESTS.parent / "scripts" / "compiled.py")
    assert spec is not None and spec.loader is not None
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    interpreted = [name for name in helper.module_names(TESTS.parent) if not helper.runs_compiled(name)]
    if interpreted:
        raise pytest.UsageError(f"KASD_EXPECT_COMPILED=1 but these run as Python: {', '.join(interpreted)}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``e2e`` (docs/testing.md) on every test that runs real daemons as processes or a real kubectl:
    everything under tests/e2e and tests/cluster, and any test asking for one of ``E2E_FIXTURES``,
    so a new test is marked by what it uses. ``-m "not e2e"`` is the fast loop."""
    for item in items:
        path = Path(str(item.path))
        fixtures = set(getattr(item, "fixturenames", ()))
        if any(path.is_relative_to(d) for d in E2E_DIRECTORIES) or fixtures & E2E_FIXTURES:
            item.add_marker(pytest.mark.e2e)


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
