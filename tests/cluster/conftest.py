"""Several kasd replicas as real processes sharing a real redis-server, real agentd, kubesim and
real kubectl (both versions): kasctl's Stack with ``replicas``."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kasctl.stack import AGENT_ID, Stack
from routing.ring import Ring
from tests.e2e.conftest import KUBECTL_CAP, KUBECTLS, LineReader

__all__ = ["KUBECTLS", "LineReader", "kubectl_at", "metric", "replicated_stack"]

#: heartbeats every 0.3 s: joins and leaves are seen within 0.6 s in these tests
HEARTBEAT = 0.3


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kubectl_bin" in metafunc.fixturenames:
        metafunc.parametrize(
            "kubectl_bin", [path for _, path in KUBECTLS], ids=[f"kubectl-{minor}" for minor, _ in KUBECTLS]
        )


def replicated_stack(workdir: Path, **kwargs: object) -> Stack:
    settings = {"replicas": 3, "heartbeat_interval": HEARTBEAT, "agent_wait_timeout": 5.0, **kwargs}
    stack = Stack(workdir, **settings)  # type: ignore[arg-type]
    stack.start()
    return stack


def kubectl_at(binary: str, stack: Stack, replica: int, *args: str, stdin: str | None = None,
               timeout: float = KUBECTL_CAP) -> subprocess.CompletedProcess[str]:
    """kubectl through replica ``replica`` (its context in the stack's kubeconfig)."""
    return subprocess.run(
        [binary, "--kubeconfig", str(stack.kubeconfig), "--context", stack.context_of(replica), *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


#: kasd's default routing.weight
WEIGHT = 10


def member_names(stack: Stack) -> list[str]:
    """Each replica's name on the ring: its proxy address (kasd's default ``routing.name``)."""
    return [stack.replica_addresses[i]["kubernetes_api"] for i in range(stack.replicas)]


def home_of(stack: Stack) -> int:
    """The replica the ring names home for the stack's agent."""
    names = member_names(stack)
    home = Ring({name: WEIGHT for name in names}).home(str(AGENT_ID))
    return names.index(home)  # type: ignore[arg-type]


def wait_for_home(stack: Stack, bound: float = 10.0) -> int:
    """The home replica, once agentd's one tunnel is there and nowhere else (the placement NOTICE
    moved it; until then one tunnel in all can still be on the replica agentd dialed first)."""
    home = home_of(stack)
    deadline = time.monotonic() + bound
    held: list[float] = []
    while time.monotonic() < deadline:
        held = [metric(stack, i, "kasd_agent_sessions") for i in range(stack.replicas)]
        if held[home] == 1 and sum(held) == 1:
            return home
        time.sleep(0.05)  # kasd tells no one when placement settles: its metrics are read again
    raise AssertionError(f"agentd's tunnel is not on the home kasd-{home + 1}: sessions per replica {held}")


def metric(stack: Stack, replica: int, line_start: str) -> float:
    """One sample of replica ``replica``'s /metrics (0 when the series is absent)."""
    url = f"http://{stack.replica_addresses[replica]['observability']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Three replicas; agentd knows them all but keeps one tunnel (on its home replica, where
    kasd's placement puts it), so a request on the other two crosses the hop. agentd logs at debug:
    its line for every request, not only for those that fail (test_battery follows one request)."""
    stack = replicated_stack(tmp_path_factory.mktemp("three"), agentd_connections=1,
                             agentd_settings={"log_level": "debug"})
    try:
        yield stack
    finally:
        codes = stack.stop()
        assert set(codes.values()) == {0}, codes


@pytest.fixture(scope="module")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 3-master Redis Cluster for the module's stacks (they share it; each stack uses its own
    agent and replica names, so nothing collides)."""
    from tests.redisproc import RedisCluster

    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def three_on_cluster(tmp_path_factory: pytest.TempPathFactory, redis_cluster_url: str) -> Iterator[Stack]:
    """``three``, with the replicas' Redis a 3-master Redis Cluster."""
    stack = replicated_stack(tmp_path_factory.mktemp("three-cluster"), agentd_connections=1,
                             redis_url=redis_cluster_url)
    try:
        yield stack
    finally:
        codes = stack.stop()
        assert set(codes.values()) == {0}, codes
