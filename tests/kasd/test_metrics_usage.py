"""The gitlab-kas-style metrics' semantics, in-process (the pipeline with fakes, the tunnel registry):
the usage counter is one per request an agent took, not one per session tried; a refused request
counts under no agent; a routing timeout is counted; a 429 at the principal limit is counted; each
session's breaker shows while it holds the session back."""

from __future__ import annotations

import pytest
import trio

from kasd.k8sproxy.pipeline import RequestPipeline
from kasd.metrics import Metrics
from kasd.seams import AgentNotConnected
from routing.local import AgentTunnel, TunnelRegistry
from tests.kasd.test_pipeline import (
    FakeAuthority,
    FakeExchange,
    FakeRouter,
    agent_session,
    request,
    serve_refused_by_a_draining_agent,
)

pytestmark = pytest.mark.timeout(10)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_request_retried_on_another_session_is_one_use_of_the_agent() -> None:
    metrics = Metrics(TunnelRegistry())
    ex, router = await serve_refused_by_a_draining_agent(metrics)
    async with trio.open_nursery() as nursery:
        refused = FakeExchange(request("ci:1:bad"), nursery)  # no grant: reaches no agent
        await RequestPipeline(FakeAuthority(), router, metrics).serve(refused)
    assert ex.status == 200 and len(router.opened) == 2 and refused.status == 401
    assert sample(metrics, "kasd_agent_requests_total", agent="1", access_type="ci_access") == 1
    assert sample(metrics, "kasd_proxied_requests_total", status_class="2xx", access_type="ci_access", agent="1") == 1
    assert sample(metrics, "kasd_proxied_requests_total", status_class="4xx", access_type="none", agent="") == 1
    assert sample(metrics, "kasd_routing_duration_seconds_count", status="success") == 1


async def test_no_tunnel_within_the_wait_is_a_routing_timeout_and_no_use() -> None:
    metrics = Metrics(TunnelRegistry())
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(), nursery)
        await RequestPipeline(FakeAuthority(), FakeRouter(failure=AgentNotConnected(1, 0.5)), metrics).serve(ex)
    assert ex.status == 503
    assert sample(metrics, "kasd_routing_timeouts_total") == 1
    assert sample(metrics, "kasd_routing_duration_seconds_count", status="timeout") == 1
    assert sample(metrics, "kasd_proxied_requests_total", status_class="5xx", access_type="ci_access", agent="1") == 1
    assert sample(metrics, "kasd_agent_requests_total", agent="1", access_type="ci_access") == 0


async def test_a_request_over_the_principal_limit_is_counted_rate_limited() -> None:
    metrics = Metrics(TunnelRegistry())
    router = FakeRouter()
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(), nursery)
        await RequestPipeline(FakeAuthority(), router, metrics, max_requests_per_principal=0).serve(ex)
    assert ex.status == 429 and router.opened == []
    assert sample(metrics, "kasd_rate_limited_requests_total", limit="principal") == 1
    assert sample(metrics, "kasd_proxied_requests_total", status_class="4xx", access_type="ci_access", agent="1") == 1


async def test_tunnels_pods_and_each_sessions_breaker_are_read_when_scraped() -> None:
    registry = TunnelRegistry()
    metrics = Metrics(registry)
    async with agent_session() as (one, _), agent_session() as (two, _), agent_session() as (three, _):
        registry.register(AgentTunnel(agent_id=7, session=one, pod_name="agentd-a", pod_uid="uid-a"))
        registry.register(AgentTunnel(agent_id=7, session=two, pod_name="agentd-a", pod_uid="uid-a"))
        held = AgentTunnel(agent_id=7, session=three, pod_name="agentd-b", pod_uid="uid-b")
        registry.register(held)
        registry.upstream_unreachable(three, now=trio.current_time(), cause="connection refused")
        assert sample(metrics, "kasd_agent_tunnels", agent="7") == 3
        assert sample(metrics, "kasd_connected_pods", agent="7") == 2
        assert sample(metrics, "kasd_tunnel_breaker_open", agent="7", pod="agentd-b", session="0") == 1
        assert sample(metrics, "kasd_tunnel_breaker_failures", agent="7", pod="agentd-b", session="0") == 1
        # agentd-a's two sessions (agentd's `connections`) are two series, not one label set twice
        # (which Prometheus would drop as a duplicate)
        scraped = metrics.render().decode()
        assert scraped.count('kasd_tunnel_breaker_open{agent="7",pod="agentd-a",session="0"} 0.0') == 1
        assert scraped.count('kasd_tunnel_breaker_open{agent="7",pod="agentd-a",session="1"} 0.0') == 1
        registry.took_stream(three)  # the agent answered again: the breaker resets
        assert sample(metrics, "kasd_tunnel_breaker_open", agent="7", pod="agentd-b", session="0") == 0
        registry.unregister(held)
        assert sample(metrics, "kasd_connected_pods", agent="7") == 1
        assert metrics.registry.get_sample_value("kasd_tunnel_breaker_open",
                                                 {"agent": "7", "pod": "agentd-b", "session": "0"}) is None
