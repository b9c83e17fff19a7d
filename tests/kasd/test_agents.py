"""The agent port (8150): token authentication, HELLO checks, the registry's least-loaded choice."""

from __future__ import annotations

import json

import pytest
import trio

from tests.kasd.helpers import (
    AGENT1_TOKEN,
    CI_TOKEN,
    bearer,
    fake_agent,
    http_request,
    json_handler,
    make_config,
    running_kasd,
    wait_sessions,
)
from tunnelhttp.head import RequestHead, TunnelCode
from wire.carrier import TunnelRejectedError
from wire.h2carrier import open_h2_session
from wire.session import MuxStream, Session, StreamRefusedError

pytestmark = pytest.mark.timeout(20)


async def test_good_token_registers_bad_token_is_401_before_any_session() -> None:
    async with running_kasd() as kasd:
        with pytest.raises(TunnelRejectedError) as info:
            async with open_h2_session(kasd.agent_url, token="not-an-agent-token"):
                pass
        assert info.value.status == 401
        assert kasd.registry.statistics().sessions == 0
        async with fake_agent(kasd, hello={"pod_name": "agentd-7", "version": "1.2.3"}):
            (tunnel,) = kasd.registry.tunnels(1)
            assert (tunnel.pod_name, tunnel.version) == ("agentd-7", "1.2.3")
            assert kasd.registry.statistics().sessions == 1
        await wait_sessions(kasd, 1, 0)


@pytest.mark.parametrize("claimed", ["1", "", None, 1])
async def test_hello_agent_id_matching_or_absent_is_accepted(claimed: object) -> None:
    async with running_kasd() as kasd, fake_agent(kasd, hello={"agent_id": claimed}):
        assert kasd.registry.statistics().sessions == 1


async def test_a_flood_of_bad_agent_tokens_is_logged_in_a_few_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    async with running_kasd() as kasd:
        for n in range(30):
            with pytest.raises(TunnelRejectedError) as info:
                async with open_h2_session(kasd.agent_url, token=f"guess-{n}"):
                    pass
            assert info.value.status == 401
    failures = [r for r in caplog.records if "agent authentication failed" in r.getMessage()]
    assert 1 <= len(failures) <= 2
    assert not any("guess-" in r.getMessage() for r in caplog.records)


async def test_hello_agent_id_contradicting_the_token_closes_the_session(caplog: pytest.LogCaptureFixture) -> None:
    async with running_kasd() as kasd:
        async with open_h2_session(kasd.agent_url, token=AGENT1_TOKEN, metadata={"agent_id": "2"}) as session:
            with trio.fail_after(5):
                await session.wait_closed()
        assert kasd.registry.statistics().sessions == 0
        assert "reason=hello-contradicts-token" in caplog.text
        assert AGENT1_TOKEN not in caplog.text


async def test_requests_go_to_the_least_loaded_session() -> None:
    held = trio.Event()
    release = trio.Event()

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        if head.target == "/hold":
            held.set()
            await release.wait()
        await json_handler(stream, head, session)

    async with (
        running_kasd() as kasd,
        fake_agent(kasd, handler, hello={"pod_name": "a"}) as a,
        fake_agent(kasd, handler, hello={"pod_name": "b"}) as b,
        trio.open_nursery() as nursery,
    ):
        port = kasd.port("kubernetes_api")
        nursery.start_soon(http_request, port, "GET", "/hold", [bearer(CI_TOKEN)])
        await held.wait()
        busy, idle = (a, b) if a.heads else (b, a)
        assert [h.target for h in busy.heads] == ["/hold"]
        for _ in range(3):
            reply = await http_request(port, "GET", "/quick", [bearer(CI_TOKEN)])
            assert reply.status == 200 and json.loads(reply.body)["target"] == "/quick"
        assert [h.target for h in idle.heads] == ["/quick"] * 3
        assert [h.target for h in busy.heads] == ["/hold"]
        release.set()


async def test_agent_sessions_tolerate_the_configured_silence() -> None:
    """``listeners.agent.keepalive_timeout`` is what kasd's agent sessions use: the silence it
    tolerates, and a ping of its own only after two thirds of it (agentd, which dialled, pings)."""
    listeners = {"agent": {"address": "127.0.0.1:0", "keepalive_timeout": 90},
                 "observability": {"address": "127.0.0.1:0"}, "kubernetes_api": {"address": "127.0.0.1:0"}}
    async with running_kasd(make_config({"listeners": listeners})) as kasd, fake_agent(kasd):
        [tunnel] = kasd.registry.tunnels(1)
        # an accepting session pings after twice its interval: 60 s, two thirds of 90
        assert (tunnel.session.keepalive_timeout, tunnel.session.keepalive_interval) == (90.0, 30.0)


async def test_a_stream_of_a_kind_kasd_does_not_serve_is_refused_naming_it() -> None:
    """An agent may open only the kinds kasd serves (``cluster-info``); any other is refused at once
    with UNKNOWN_TARGET naming the kind (cut: an agent's string), and the session goes on."""
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        for kind, shown in (("webhook", "'webhook'"), ("x" * 100, repr("x" * 64)), (7, "'int'")):
            stream = await agent.session.open_stream({"v": 1, "kind": kind})
            with trio.fail_after(5), pytest.raises(StreamRefusedError) as refused:
                await stream.wait_accepted()
            assert refused.value.code == TunnelCode.UNKNOWN_TARGET
            assert refused.value.message == f"kasd has no handler for kind {shown}"
        assert not agent.session.closed
