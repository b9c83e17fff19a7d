"""The local registry of live agent sessions (several agentd replicas per agent, least-loaded
first) and ``LocalRouter``, the ``Router`` (``kasd.seams``) that opens streams on them."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import attrs
import trio

from kasd.seams import AgentNotConnected, NoFreeStream
from netio.fastio import cancel_point
from wire.frames import Metadata
from wire.session import MuxStream, Session, SessionClosedError, StreamRefusedError

log = logging.getLogger("kasd.tunnels")

#: a session picked for a request that began draining or died before the stream opened
_SESSION_UNUSABLE = (StreamRefusedError, SessionClosedError, trio.BrokenResourceError)


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


class LocalRouter:
    """Streams to agents connected to this kasd: the least-loaded session, else the next one to
    connect, waiting at most ``agent_wait_timeout``."""

    def __init__(self, registry: TunnelRegistry, *, agent_wait_timeout: float) -> None:
        self.registry = registry
        self.agent_wait_timeout = agent_wait_timeout

    async def open_stream(self, agent_id: int, metadata: Metadata) -> MuxStream:
        await cancel_point()
        # The common case — a session is up and has room — needs no timer.
        session = self.registry.pick(agent_id)
        if session is not None:
            try:
                return session.open_stream_nowait(metadata)
            except (trio.WouldBlock, *_SESSION_UNUSABLE):
                pass  # full, draining or dead: wait below, within the bound
        found_any = False
        with trio.move_on_after(self.agent_wait_timeout):
            while True:
                session = await self.registry.acquire(agent_id)
                found_any = True
                try:
                    return await session.open_stream(metadata)
                except _SESSION_UNUSABLE as exc:
                    # It began draining or died between the pick and the open: try another one.
                    log.info("session unusable, retrying agent_id=%d error=%s", agent_id, exc)
                    await trio.lowlevel.checkpoint()
        if found_any:
            raise NoFreeStream(agent_id, self.agent_wait_timeout)
        raise AgentNotConnected(agent_id, self.agent_wait_timeout)
