"""Home placement: which kasd replicas an agent's connections belong on (docs/routing.md).

kasd tells each agentd session, in a ``placement`` NOTICE (docs/protocol.md §9a), the live replicas
that are not draining, in ring order from the agent's home: agentd keeps its first connection on
the home (where a front end hashing on the agent id sends the agent's requests: zero hops) and the
others on the next replicas, so losing one replica leaves tunnels on others.

May import: ``routing.membership``, ``routing.ring``, the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routing.membership import Member
from wire.notices import PLACEMENT


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


class PlacementNotices:
    """kasd's side: a placement NOTICE to each agent session when it starts and whenever the ring
    changes (``serve``, run beside the session), and a last one without this replica before its
    GOAWAY (``leaving``). A session whose agentd predates NOTICE (protocol 1.0) gets none."""

    def __init__(self, membership: Any) -> None:
        self.membership = membership
        self._agents: dict[Any, int] = {}

    async def serve(self, session: Any, agent_id: int) -> None:
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

    async def leaving(self, session: Any) -> None:
        agent_id = self._agents.get(session)
        if agent_id is None:
            return
        notice = placement_notice(agent_id, self.membership.members(), self.membership.ring,
                                  sender=self.membership.self_name, leaving=True)
        if notice is not None:
            await self._send(session, notice)

    @staticmethod
    async def _send(session: Any, notice: dict[str, Any]) -> bool:
        from wire.session import SessionClosedError

        try:
            return bool(await session.send_notice(notice))
        except (SessionClosedError, OSError):
            return False
__all__ = ["PlacementNotices", "placement_notice"]
