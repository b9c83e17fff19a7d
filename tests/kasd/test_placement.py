"""Home placement, end to end in one Trio run: real kasd runtimes sharing an in-memory membership,
a real agentd ConnectionManager. kasd's placement NOTICE moves agentd's tunnel to the agent's home
replica (dialled first, the old tunnel drained after), never to a downgraded scheme, and a replica
that cannot be reached is passed over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from agentd.connection import FAILOVER_JITTER, ConnectionManager
from kasd.server import Runtime
from tests.kasd.helpers import AGENT1_TOKEN, CI_TOKEN, bearer, http_request
from tests.kasd.replicas_helpers import name_of, replica_config, running_replicas
from tests.routing.standins import Member, MemoryWorld
from tunnelhttp.head import ResponseHead
from wire.session import MuxStream

pytestmark = pytest.mark.timeout(30)


def _holds(runtime: Runtime) -> int:
    return sum(1 for t in runtime.registry.tunnels(1) if not t.session.closed and not t.session.draining)


async def _answer(stream: MuxStream) -> None:
    body = json.dumps({"served": True}).encode()
    await stream.accept(ResponseHead(status=200, headers=(("content-length", str(len(body))),)).to_metadata())
    await stream.send_all(body)
    await stream.send_eof()


def _manager(tmp_path: Path, urls: list[str], connections: int = 1) -> ConnectionManager:
    token = tmp_path / "agent-token"
    token.write_text(AGENT1_TOKEN)
    return ConnectionManager(urls, token_file=token, handler=_answer, metadata={"agent_id": 1, "pod_name": "p"},
                             connections=connections)


async def _until(condition: object, runtimes: list[Runtime], bound: float = 5.0) -> None:
    with trio.fail_after(bound):
        while not condition():  # type: ignore[operator]
            async with trio.open_nursery() as nursery:
                for runtime in runtimes:
                    async def changed(r: Runtime = runtime) -> None:
                        await r.registry.wait_changed()
                        nursery.cancel_scope.cancel()
                    nursery.start_soon(changed)


async def test_agentd_moves_its_tunnel_to_the_home_replica_make_before_break(tmp_path: Path) -> None:
    world = MemoryWorld()
    async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b):
        world.order = [name_of(b), name_of(a)]  # b is the agent's home
        world.members_changed()
        manager = _manager(tmp_path, [a.agent_url])  # configured with a only
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await _until(lambda: _holds(b) == 1 and _holds(a) == 0, [a, b])
            assert manager.placement == (b.agent_url, a.agent_url)
            # requests through either replica are served (b locally, a across the hop)
            for runtime in (a, b):
                reply = await http_request(runtime.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
                assert reply.status == 200 and reply.json() == {"served": True}
            # the ring changes: a becomes the home; the tunnel follows
            world.order = [name_of(a), name_of(b)]
            world.members_changed()
            await _until(lambda: _holds(a) == 1 and _holds(b) == 0, [a, b])
            manager.stop()


async def test_an_unreachable_placement_is_passed_over(tmp_path: Path) -> None:
    world = MemoryWorld()
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    dead_port = listener.socket.getsockname()[1]
    await listener.aclose()
    ghost = Member(name="127.0.0.1:1", private_url=f"http://127.0.0.1:{dead_port}",
                   agent_url=f"http://127.0.0.1:{dead_port}/tunnel")
    async with running_replicas(world, [replica_config(tmp_path)]) as (a,):
        world.add_member(ghost)
        world.order = [ghost.name, name_of(a)]  # the home is a replica nobody can reach
        manager = _manager(tmp_path, [a.agent_url])
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            with trio.fail_after(5):
                while manager.placement is None or manager._skip_until.get(ghost.agent_url) is None:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert _holds(a) == 1  # it stayed where it could serve
            reply = await http_request(a.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply.status == 200
            manager.stop()


async def test_a_tunnel_that_breaks_fails_over_to_the_next_replica_at_once(tmp_path: Path) -> None:
    """The home's end of the tunnel breaks with no GOAWAY, as when its kasd is killed: agentd's one
    slot redials the placement's next replica within FAILOVER_JITTER, not after a backoff, and not
    the replica that just broke it."""
    world = MemoryWorld()
    async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b):
        world.order = [name_of(b), name_of(a)]  # b is the agent's home
        world.members_changed()
        manager = _manager(tmp_path, [a.agent_url])
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await _until(lambda: _holds(b) == 1 and _holds(a) == 0, [a, b])
            for tunnel in list(b.registry.tunnels(1)):
                await tunnel.session.transport.aclose()  # no GOAWAY: a crash, as agentd sees it
            # (b's own end of the session lingers in this one process; a killed kasd's would not)
            await _until(lambda: _holds(a) == 1, [a, b], bound=FAILOVER_JITTER + 0.8)
            assert manager.placement == (b.agent_url, a.agent_url)  # b is still the home: not a placement move
            reply = await http_request(a.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply.status == 200 and reply.json() == {"served": True}
            manager.stop()


def test_a_placement_never_downgrades_https_to_http(tmp_path: Path) -> None:
    manager = _manager(tmp_path, ["https://kasd.example:8150/tunnel"])
    manager.on_notice({"type": "placement", "replica": "x", "home": "evil:1",
                       "replicas": [{"name": "evil:1", "url": "http://evil.example:8150/tunnel"}]})
    assert manager.placement is None
    manager.on_notice({"type": "placement", "replica": "x", "home": "b:1",
                       "replicas": [{"name": "evil:1", "url": "http://evil.example:8150/tunnel"},
                                    {"name": "b:1", "url": "https://kasd-b.example:8150/tunnel"}]})
    assert manager.placement == ("https://kasd-b.example:8150/tunnel",)
    manager.on_notice({"type": "something-newer", "whatever": 1})  # ignored
    manager.on_notice({"type": "placement", "replicas": "not a list"})  # malformed: ignored
    assert manager.placement == ("https://kasd-b.example:8150/tunnel",)


def test_a_placement_keeps_a_websocket_agent_on_its_carrier(tmp_path: Path) -> None:
    # kasd names replicas by their HTTP/2 URLs; agentd behind a WebSocket-only proxy dials them as
    # wss:// (the same port and path), and still never downgrades to plaintext.
    manager = _manager(tmp_path, ["wss://kasd.example:8150/tunnel", "https://kasd-c.example:8150/tunnel"])
    manager.on_notice({"type": "placement", "replica": "x", "home": "b:1",
                       "replicas": [{"name": "evil:1", "url": "http://evil.example:8150/tunnel"},
                                    {"name": "b:1", "url": "https://kasd-b.example:8150/tunnel"}]})
    assert manager.placement == ("wss://kasd-b.example:8150/tunnel",)
