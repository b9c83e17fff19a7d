"""Routing a request onto an agent session, against real kasd with fake agents: heads the tunnel
cannot carry are answered at once (414/431, no OPEN sent), and traffic is steered away from a
session that refused or whose agent cannot reach its API server."""

from __future__ import annotations

import itertools
import json
import logging
import socket
from pathlib import Path

import pytest
import trio

from agentd.config import AgentdConfig
from agentd.kubeapi import KubeTarget, kubeconfig_target
from kasd.server import Runtime
from kubesim.server import open_kubesim
from tests.agentd.harness import SIM_TOKEN, RequestLog, agent_config, running_agent
from tests.kasd.helpers import (
    AGENT1_TOKEN,
    CI_TOKEN,
    Handler,
    Reply,
    bearer,
    fake_agent,
    http_request,
    json_handler,
    make_config,
    running_kasd,
    wait_sessions,
)
from tests.kasd.test_http2_tls import H2Client
from tests.trusted import TRUSTED
from tunnelhttp.head import RequestHead, TunnelCode
from wire.errors import ErrorCode
from wire.session import MuxStream, Session

pytestmark = pytest.mark.timeout(20)

KiB = 1024


async def _get(kasd: Runtime, target: str = "/api", headers: list[tuple[str, str]] | None = None) -> Reply:
    return await http_request(kasd.port("kubernetes_api"), "GET", target, [bearer(CI_TOKEN), *(headers or [])])


def _lines_at_info(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.INFO]


# --------------------------------------------------------------------------- heads over the tunnel's limits


async def test_a_path_over_the_tunnel_limit_is_414_at_once_and_never_opens_a_stream(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    target = "/api/v1/namespaces/" + "a" * (17 * KiB)
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        caplog.clear()
        answer = await _get(kasd, target)
        lines = _lines_at_info(caplog)
        assert answer.status == 414
        status = answer.json()
        assert status["kind"] == "Status" and status["code"] == 414
        assert status["message"] == (
            f"request target is {len(target)} bytes, over the tunnel's limit of 16384 bytes for a path and query"
        )
        assert agent.opens == 0
        assert len(lines) < 3, lines  # the access-log line, not a retry storm
        # The session is as good as before: the next request is served.
        assert (await _get(kasd)).status == 200


async def test_a_header_over_the_tunnel_limit_is_431_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        caplog.clear()
        answer = await _get(kasd, headers=[("x-big", "b" * (17 * KiB))])
        assert answer.status == 431
        assert answer.json()["reason"] == "RequestHeaderFieldsTooLarge"
        assert answer.json()["message"] == (
            f"request header 'x-big' is {17 * KiB} bytes, over the tunnel's limit of 16384 bytes for a header"
        )
        assert agent.opens == 0
        assert len(_lines_at_info(caplog)) < 3


async def test_more_headers_than_the_tunnel_carries_is_431_at_once() -> None:
    many = [(f"x-h{i}", "v") for i in range(300)]
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        answer = await _get(kasd, headers=many)
        assert answer.status == 431
        assert answer.json()["message"] == "request has 300 headers to forward, over the tunnel's limit of 256 headers"
        assert agent.opens == 0


async def test_an_over_limit_path_over_http2_is_414_too() -> None:
    target = "/api/" + "p" * (17 * KiB)
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        tcp = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
        client = H2Client(tcp)
        headers, body = await client.response(await client.request("GET", target, [bearer(CI_TOKEN)]))
        await tcp.aclose()
        assert headers[":status"] == "414"
        assert "over the tunnel's limit of 16384 bytes" in json.loads(body)["message"]
        assert agent.opens == 0


# --------------------------------------------------------------------------- steering between sessions


def named(name: str, served: list[str], inner: Handler = json_handler) -> Handler:
    """A handler that notes ``name`` in ``served`` for each request it answers."""

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        served.append(name)
        await inner(stream, head, session)

    return handler


async def test_equally_idle_sessions_take_sequential_requests_in_turn() -> None:
    # The older session has served a few requests before the newer one connects: what it served
    # in its lifetime must not send everything to the newcomer.
    served: list[str] = []
    async with running_kasd() as kasd, fake_agent(kasd, named("old", served)):
        for _ in range(4):
            assert (await _get(kasd)).status == 200
        served.clear()
        async with fake_agent(kasd, named("new", served), hello={"pod_name": "agentd-1"}):
            for _ in range(6):
                assert (await _get(kasd)).status == 200
    assert served.count("old") == served.count("new") == 3
    assert all(a != b for a, b in itertools.pairwise(served)), served


async def test_a_request_refused_by_one_session_is_retried_on_the_other() -> None:
    # REFUSED_STREAM from a session that is not draining (a full backlog, a handler that could not
    # start): the retry must go to the other session, not back to the one that refused.
    served: list[str] = []
    refused: list[str] = []
    armed = [False]

    def refusing_once(name: str) -> Handler:
        async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
            if armed[0]:
                armed[0] = False
                refused.append(name)
                await stream.refuse(ErrorCode.REFUSED_STREAM, "cannot serve the stream")
                return
            served.append(name)
            await json_handler(stream, head, session)

        return handler

    async with running_kasd() as kasd, fake_agent(kasd, refusing_once("old")):
        for _ in range(4):  # the older session has served a few before the newer one connects
            assert (await _get(kasd)).status == 200
        served.clear()
        async with fake_agent(kasd, refusing_once("new"), hello={"pod_name": "agentd-1"}):
            armed[0] = True
            answer = await _get(kasd)
    assert answer.status == 200
    assert len(refused) == 1 and served == [{"old": "new", "new": "old"}[refused[0]]]


async def test_a_session_whose_agent_cannot_reach_its_api_server_is_avoided() -> None:
    # Two replicas; the newest one's API server is down. Every request succeeds through the other,
    # and the breaker keeps the broken one from being asked again within its hold (30 s here).
    config = make_config({"routing": {"breaker_initial_hold": 30, "breaker_max_hold": 30}})
    served: list[str] = []

    async def unreachable(stream: MuxStream, head: RequestHead, session: Session) -> None:
        served.append("broken")
        await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "dial tcp 10.0.0.1:443: connect: connection refused")

    async with running_kasd(config) as kasd, fake_agent(kasd, named("healthy", served)) as healthy, \
            fake_agent(kasd, unreachable, hello={"pod_name": "agentd-1"}) as broken:
        answers = [await _get(kasd) for _ in range(100)]
    assert [a.status for a in answers] == [200] * 100
    assert served.count("healthy") == 100 and healthy.opens == 100
    assert broken.opens <= 1


async def test_the_breaker_lets_a_failing_session_be_tried_again_after_its_hold() -> None:
    # The hold is short here: the broken session is asked again from time to time (a probe), and
    # every request still succeeds through the healthy one.
    config = make_config({"routing": {"breaker_initial_hold": 0.05, "breaker_max_hold": 0.05}})

    async def unreachable(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "connection refused")

    async with running_kasd(config) as kasd, fake_agent(kasd) as healthy, \
            fake_agent(kasd, unreachable, hello={"pod_name": "agentd-1"}) as broken:
        first = await _get(kasd)
        while broken.opens < 2:  # the hold runs out; a later request probes it again
            assert (await _get(kasd)).status == 200
    assert first.status == 200 and healthy.opens >= 2


async def test_with_no_other_session_the_client_gets_the_agents_cause() -> None:
    async def unreachable(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "dial tcp 10.0.0.1:443: connect: connection refused")

    async with running_kasd() as kasd, fake_agent(kasd, unreachable) as agent:
        answer = await _get(kasd)
        assert answer.status == 502
        assert answer.json()["message"] == (
            "cluster API unreachable from agent 1: dial tcp 10.0.0.1:443: connect: connection refused"
        )
        assert agent.opens == 1  # not asked again: there is nobody else to ask


async def test_a_request_with_a_body_refused_as_unreachable_is_not_repeated() -> None:
    served: list[str] = []

    async def unreachable(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "connection refused")

    async with running_kasd() as kasd, fake_agent(kasd, named("healthy", served)) as healthy, \
            fake_agent(kasd, unreachable, hello={"pod_name": "agentd-1"}) as broken:
        await wait_sessions(kasd, 1, 2)
        answers = [await http_request(kasd.port("kubernetes_api"), "POST", "/api/v1/namespaces",
                                      [bearer(CI_TOKEN)], b"{}") for _ in range(2)]
    # Round robin sends one of the two to the broken session; that one is answered 502, not repeated.
    assert sorted(a.status for a in answers) == [200, 502]
    assert broken.opens == 1 and healthy.opens == 1


async def test_requests_waiting_together_for_an_absent_agent_do_not_wake_each_other() -> None:
    # Each request waits for a session to come; a second one starting to wait must not wake the
    # first (which would then wake the second, and so on: a busy loop for the whole wait).
    async with running_kasd(make_config({"agent_wait_timeout": 0.5})) as kasd:
        registry = kasd.registry
        pick = registry.pick
        calls = 0

        def counting_pick(*args: object, **kwargs: object) -> object:
            nonlocal calls
            calls += 1
            return pick(*args, **kwargs)  # type: ignore[arg-type]

        registry.pick = counting_pick  # type: ignore[method-assign,assignment]
        answers: list[int] = []

        async def get() -> None:
            answers.append((await _get(kasd, "/api")).status)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(get)
    assert answers == [503, 503, 503]
    assert calls <= 3 * 3  # the fast path, then once per wait


# --------------------------------------------------------------------------- with real agentd replicas


async def test_real_agentd_replicas_one_of_which_cannot_reach_its_api_server(tmp_path: Path) -> None:
    # Two agentd replicas of agent 1: the first talks to kubesim, the second (the newest) to a port
    # nobody listens on. Every GET succeeds; the broken replica is asked once, then held back.
    token_file = tmp_path / "kasd-agent-token"
    token_file.write_text(AGENT1_TOKEN + "\n")
    config = make_config({"routing": {"breaker_initial_hold": 30, "breaker_max_hold": 30}})
    with socket.socket() as dead:  # bound, never listening: connections to it are refused
        dead.bind(("127.0.0.1", 0))
        dead_port = dead.getsockname()[1]
        async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN, bookmark_interval=3600) as sim, running_kasd(config) as kasd, \
                trio.open_nursery() as nursery:
            sim.write_kubeconfig(tmp_path / "kubeconfig")

            def replica(name: str) -> AgentdConfig:
                return agent_config(tmp_path, kasd.agent_url, token_file=token_file, agent_id="1", pod_name=name)

            async with running_agent(nursery, replica("agentd-healthy"), kubeconfig_target(tmp_path / "kubeconfig")):
                await wait_sessions(kasd, 1, 1)
                broken_target = KubeTarget(scheme="http", host="127.0.0.1", port=dead_port)
                async with running_agent(nursery, replica("agentd-broken"), broken_target) as broken:
                    seen_by_broken = RequestLog(broken)
                    await wait_sessions(kasd, 1, 2)
                    answers = [await _get(kasd, "/api/v1/namespaces") for _ in range(100)]
    assert [a.status for a in answers] == [200] * 100
    assert all(a.json()["kind"] == "NamespaceList" for a in answers)
    assert len(seen_by_broken.records) <= 1


async def test_a_lone_real_agentd_that_cannot_reach_its_api_server_gives_its_cause(tmp_path: Path) -> None:
    token_file = tmp_path / "kasd-agent-token"
    token_file.write_text(AGENT1_TOKEN + "\n")
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        dead_port = dead.getsockname()[1]
        async with running_kasd() as kasd, trio.open_nursery() as nursery:
            config = agent_config(tmp_path, kasd.agent_url, token_file=token_file, agent_id="1")
            target = KubeTarget(scheme="http", host="127.0.0.1", port=dead_port)
            async with running_agent(nursery, config, target) as agent:
                seen = RequestLog(agent)
                await wait_sessions(kasd, 1, 1)
                answer = await _get(kasd, "/api/v1/namespaces")
    assert answer.status == 502
    message = answer.json()["message"]
    # agentd's words, whole, after kasd's own
    assert message.startswith(f"cluster API unreachable from agent 1: cannot reach http://127.0.0.1:{dead_port}")
    assert len(seen.records) == 1, message
