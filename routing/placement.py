"""Home placement: which kasd replicas an agent's connections belong on (docs/routing.md).

kasd tells each agentd session, in a ``placement`` NOTICE (docs/protocol.md §9a), the live replicas
that are not draining, in ring order from the agent's home: agentd keeps its first connection on
the home (where a front end hashing on the agent id sends the agent's requests: zero hops) and the
others on the next replicas, so losing one replica leaves tunnels on others.

``PlacementHook`` is what kasd's agent sessions (``kasd.agents``) call; ``PlacementNotices``
implements it from the membership.

May import: ``routing.membership``, ``routing.ring``, ``wire``, the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from wire.notices import PLACEMENT
from wire.session import Session, SessionClosedError

if TYPE_CHECKING:  # (routing.membership pulls in coredis: only a kasd with routing.redis.url loads it)
    from routing.membership import Member, Membership


def placement_notice(agent_id: int, members: Mapping[str, Member], ring: Any, *, sender: str,
                     leaving: bool = False) -> dict[str, Any] | None:
    """The NOTICE metadata for ``agent_id``: the live ``members`` in ``ring`` order from its home
    (the ring is over the members that are not draining); ``leaving``: the sender drains, so it is
    left out even before its own heartbeat says so. None when no replica is left to name (the
    agent keeps its configured addresses)."""
    order = [name for name in ring.preference(str(agent_id))
             if name in members and members[name].agent_url and not (leaving and name == sender)]
    if not order:
        return None
    return {
        "type": PLACEMENT,
        "replica": sender,
        "home": order[0],
        "replicas": [{"name": name, "url": members[name].agent_url} for name in order],
    }


class PlacementHook(Protocol):
    """The hook for home placement: ``serve`` runs beside each agent session for its lifetime (the
    placement NOTICE at its start and at every ring change); ``leaving`` sends the last one,
    without this replica, before the drain's GOAWAY."""

    async def serve(self, session: Session, agent_id: int) -> None: ...
    async def leaving(self, session: Session) -> None: ...


class PlacementNotices:
    """kasd's side: a placement NOTICE to each agent session when it starts and whenever the ring
    changes (``serve``, run beside the session), and a last one without this replica before its
    GOAWAY (``leaving``). A session whose agentd predates NOTICE (protocol 1.0) gets none."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership
        self._agents: dict[Session, int] = {}

    async def serve(self, session: Session, agent_id: int) -> None:
        self._agents[session] = agent_id
        last: dict[str, Any] | None = None
        try:
            while True:
                changed = self.membership.changes()  # taken before reading: no change is missed
                notice = placement_notice(agent_id, self.membership.members(), self.membership.ring,
                                          sender=self.membership.self_name)
                if notice is not None and notice != last:
                    if not await self._send(session, notice):
                        return
                    last = notice
                await changed.wait()
        finally:
            self._agents.pop(session, None)

    async def leaving(self, session: Session) -> None:
        agent_id = self._agents.get(session)
        if agent_id is None:
            return
        notice = placement_notice(agent_id, self.membership.members(), self.membership.ring,
                                  sender=self.membership.self_name, leaving=True)
        if notice is not None:
            await self._send(session, notice)

    @staticmethod
    async def _send(session: Session, notice: dict[str, Any]) -> bool:
        try:
            return bool(await session.send_notice(notice))
        except (SessionClosedError, OSError):
            return False
__all__ = ["PlacementNotices", "placement_notice"]
