"""``ReplicatedRouter`` alone, on the one routing loop (``LocalRouter.route``): fake sessions and a
fake directory, no Redis, no peer, no socket; virtual time."""

from __future__ import annotations

from typing import Any, cast

import attrs
import pytest
import trio
import trio.testing

from routing.local import AgentTunnel, LocalRouter, TunnelRegistry
from routing.membership import Member, StaticMembership
from routing.peers import PeerPool
from routing.router import ReplicatedRouter
from wire.session import Session

pytestmark = pytest.mark.timeout(10)


@attrs.define(eq=False)
class FakeSession:
    name: str
    active_streams: int = 0
    closed: bool = False
    draining: bool = False

    def open_stream_nowait(self, metadata: Any) -> tuple[str, Any]:
        return self.name, metadata


class ConnectsWhileAsked:
    """A directory whose holders read (a Redis round trip) is where agentd's replacement session
    registers (as the agent port's task would while the request awaits Redis). The agent had a
    session here already (draining), so the directory hears nothing: it is told only when an
    agent's first session comes."""

    def __init__(self, registry: TunnelRegistry, replacement: AgentTunnel) -> None:
        self.registry = registry
        self.replacement: AgentTunnel | None = replacement
        self.event = trio.Event()

    async def holders(self, agent_id: int) -> frozenset[str]:
        await trio.lowlevel.checkpoint()
        if self.replacement is not None:
            self.registry.register(self.replacement)
            self.replacement = None
        return frozenset()

    def changed(self, agent_id: int) -> trio.Event:
        return self.event


async def test_a_session_that_registers_while_the_directory_is_asked_takes_the_waiting_request(
        autojump_clock: trio.testing.MockClock) -> None:
    registry = TunnelRegistry()
    registry.register(AgentTunnel(agent_id=1, session=cast(Session, FakeSession("old", draining=True))))
    replacement = AgentTunnel(agent_id=1, session=cast(Session, FakeSession("new")))
    me = Member(name="a:1")
    router = ReplicatedRouter(LocalRouter(registry, agent_wait_timeout=10.0), membership=StaticMembership(me),
                              directory=ConnectsWhileAsked(registry, replacement),  # type: ignore[arg-type]
                              pool=PeerPool(token="unused"))
    started = trio.current_time()
    stream = await router.open_stream(1, {"method": "GET"})
    assert stream == ("new", {"method": "GET"})  # type: ignore[comparison-overlap]
    assert trio.current_time() - started == 0  # not the whole agent_wait_timeout later (or a 503)
