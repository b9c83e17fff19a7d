"""A replica killed with SIGKILL, and Redis away for a while: requests re-route without an
operator; a replica without Redis keeps serving the agents connected to it."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kasctl.stack import Stack
from tests.cluster.conftest import KUBECTLS, kubectl_at, metric, replicated_stack

KUBECTL = KUBECTLS[-1][1]


@pytest.fixture
def spread(tmp_path: Path) -> Iterator[Stack]:
    """Three replicas; agentd knows all three but keeps one tunnel (on its home, by placement)."""
    stack = replicated_stack(tmp_path / "stack", agentd_connections=1)
    try:
        yield stack
    finally:
        stack.stop()


def _server_errors(stack: Stack, replica: int) -> float:
    """The 5xx answers replica ``replica``'s proxy port has given (kasd_proxy_requests_total)."""
    return sum(metric(stack, replica, f'kasd_proxy_requests_total{{code="{code}"}}') for code in (500, 502, 503, 504))


def _get(stack: Stack, replica: int) -> tuple[int, str]:
    result = kubectl_at(KUBECTL, stack, replica, "get", "namespaces", "-o", "name")
    return result.returncode, result.stderr


def _holder(stack: Stack) -> int:
    """The replica that holds agentd's one tunnel (its kasd_agent_sessions says so), once placement
    settled it (a move makes the new tunnel before it breaks the old one)."""
    deadline = time.monotonic() + 10
    while True:
        held = [i for i in range(stack.replicas) if metric(stack, i, "kasd_agent_sessions") > 0]
        if len(held) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(held) == 1, held
    return held[0]


@pytest.fixture
def spread_on_cluster(tmp_path: Path, redis_cluster_url: str) -> Iterator[Stack]:
    stack = replicated_stack(tmp_path / "stack", agentd_connections=1, redis_url=redis_cluster_url)
    try:
        yield stack
    finally:
        stack.stop()


def test_kill_9_of_the_holder_reroutes_without_an_operator(spread: Stack) -> None:
    kill_9_reroutes(spread)


def test_kill_9_with_a_redis_cluster(spread_on_cluster: Stack) -> None:
    kill_9_reroutes(spread_on_cluster)


def kill_9_reroutes(spread: Stack) -> None:
    holder = _holder(spread)
    other = (holder + 1) % 3
    assert _get(spread, other)[0] == 0  # across the hop
    process = spread.kasds[holder]
    assert process is not None
    refused = _server_errors(spread, other)
    process.kill()  # SIGKILL: no drain, no goodbye to Redis
    # The very next request through a survivor succeeds, no retry by the client: it waits inside
    # kasd until agentd's redial lands on a survivor and the directory says so (pub/sub).
    code, stderr = _get(spread, other)
    assert code == 0, stderr
    # Served by the re-route, not by luck after a 503 and a retry (this was a wall-clock bound,
    # took < agent_wait_timeout, that a loaded machine could break): the survivor answered no 5xx.
    assert _server_errors(spread, other) == refused
    # Both survivors serve; the dead one is gone from their view within two heartbeats.
    for replica in (r for r in range(3) if r != holder):
        assert _get(spread, replica)[0] == 0


def _readiness(stack: Stack, replica: int) -> str:
    url = f"http://{stack.replica_addresses[replica]['observability']}/readiness"
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode().strip()


def test_redis_away_local_agents_keep_working_and_routing_recovers(spread: Stack) -> None:
    holder = _holder(spread)
    other = (holder + 1) % 3
    assert _get(spread, other)[0] == 0
    # The stack's job deploys to an environment: each replica checks its slug's owner in the store
    # once (then remembers it), and refuses the job (503) while it cannot — the job has used the
    # holder before the outage, as a running job has.
    assert _get(spread, holder)[0] == 0
    assert spread.redis is not None
    assert spread.redis.stop() == 0
    # For 10 s without Redis: the holder serves its agent throughout; readiness and the metric say
    # degraded (still 200: pulling every replica from the load balancer would cut everyone off).
    deadline = time.monotonic() + 10
    served = 0
    while time.monotonic() < deadline:
        code, stderr = _get(spread, holder)
        assert code == 0, stderr
        served += 1
    assert served >= 3
    assert _readiness(spread, holder).startswith("degraded")
    assert metric(spread, holder, "kasd_redis_up") == 0
    spread.start_redis()  # the same port, empty: every replica re-registers itself and its tunnels
    code, stderr = _get(spread, other)  # waits inside kasd for the directory to be rebuilt
    assert code == 0, stderr
    assert _readiness(spread, holder) == "ready"
    assert metric(spread, holder, "kasd_redis_up") == 1
    # kasd logged the outage once, not once per request
    log = (spread.dir / f"kasd-{holder + 1}.log").read_text()
    assert 1 <= log.count("redis unreachable") <= 3, log.count("redis unreachable")
