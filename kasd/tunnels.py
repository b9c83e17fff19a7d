"""The local registry of live agent sessions: several agentd replicas per agent, least-loaded first."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import attrs
import trio

from netio.fastio import cancel_point
from wire.session import Session


@attrs.define(kw_only=True, eq=False)
class Tunnel:
    """One connected agentd replica: its session and what it said about itself in HELLO."""

    agent_id: int
    session: Session
    pod_name: str = ""
    pod_uid: str = ""
    version: str = ""
    peer: str = ""
    connected_at: float = 0.0
    #: requests routed to it, for round-robin among equally loaded sessions
    picks: int = 0

    @property
    def usable(self) -> bool:
        return not self.session.closed and not self.session.draining


@attrs.frozen(kw_only=True)
class RegistryStatistics:
    agents: int
    sessions: int
    sessions_by_agent: tuple[tuple[int, int], ...]
    waiting: int


class TunnelRegistry:
    def __init__(self) -> None:
        self._tunnels: dict[int, list[Tunnel]] = {}
        self._serial = itertools.count()
        self._changed = trio.Event()
        #: requests waiting in ``acquire`` for an agent to connect
        self.waiting = 0

    def register(self, tunnel: Tunnel) -> None:
        self._tunnels.setdefault(tunnel.agent_id, []).append(tunnel)
        self._notify()

    def unregister(self, tunnel: Tunnel) -> None:
        tunnels = self._tunnels.get(tunnel.agent_id, [])
        if tunnel in tunnels:
            tunnels.remove(tunnel)
            if not tunnels:
                del self._tunnels[tunnel.agent_id]
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return at the next register/unregister (tests and the shutdown path wait on this)."""
        await self._changed.wait()

    def tunnels(self, agent_id: int | None = None) -> Iterator[Tunnel]:
        if agent_id is not None:
            yield from list(self._tunnels.get(agent_id, ()))
            return
        for tunnels in list(self._tunnels.values()):
            yield from tunnels

    def pick(self, agent_id: int) -> Session | None:
        """The usable session with the fewest open streams (ties: the least picked), or None."""
        candidates = [t for t in self._tunnels.get(agent_id, ()) if t.usable]
        if not candidates:
            return None
        best = min(candidates, key=lambda t: (t.session.active_streams, t.picks))
        best.picks += 1
        return best.session

    async def acquire(self, agent_id: int) -> Session:
        """A session to ``agent_id``, waiting for one to register; bound it with a cancel scope."""
        while True:
            session = self.pick(agent_id)
            if session is not None:
                await cancel_point()
                return session
            self.waiting += 1
            self._notify()
            try:
                await self._changed.wait()
            finally:
                self.waiting -= 1

    def statistics(self) -> RegistryStatistics:
        by_agent = tuple(sorted((aid, sum(1 for t in ts if not t.session.closed)) for aid, ts in self._tunnels.items()))
        return RegistryStatistics(
            agents=sum(1 for _, n in by_agent if n),
            sessions=sum(n for _, n in by_agent),
            sessions_by_agent=by_agent,
            waiting=self.waiting,
        )
