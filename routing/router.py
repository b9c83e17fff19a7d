"""``ReplicatedRouter``: the ``Router`` (``kasd.seams``) of a kasd among replicas.

*A local tunnel, else a peer that holds one, else wait (bounded) for one to appear*:

1. a local session ``TunnelRegistry.pick`` chooses, if it has room now: no timer, no Redis;
2. else the holders the directory names (live members, never this one), in ring order from the
   agent's home (the order nginx fails over in), each over its pooled peer session
   (``routing.peers``), with ``{"forward": …}`` added to the OPEN; a peer that cannot be reached
   (connection refused) is passed over at once, never waited on;
3. none: wait, at most ``agent_wait_timeout`` in all, for the local registry to change or the
   directory's change event for the agent (pub/sub: a tunnel that appears anywhere wakes the
   request at once), then try again.

Failures keep their types: ``AgentNotConnected`` (nobody holds a tunnel), ``NoFreeStream`` (tunnels
are full), ``PeerUnreachable`` (502: the only holders could not be reached, to the end of the wait),
``NoOtherSession`` (every usable session or peer is in ``avoid``). A peer stream's ``session`` is the
peer session, so ``avoid`` (a retry's "not there again") works across the hop unchanged.

The holder side never comes here: ``PeerForwarder`` opens the agent stream with ``LocalRouter``, so
a forwarded request is never forwarded again.

May import: ``routing.local``/``errors``/``peers``, ``wire``, trio, the standard library.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import trio

from daemonkit.logs import BurstLimitedLog
from netio.fastio import cancel_point
from routing.errors import AgentNotConnected, NoFreeStream, NoOtherSession, PeerUnreachable
from routing.local import LocalRouter
from routing.peers import PeerDialError, PeerPool, forward_metadata
from wire.frames import Metadata
from wire.session import MuxStream, Session, SessionClosedError, StreamRefusedError

log = logging.getLogger("routing.router")

_SESSION_UNUSABLE = (StreamRefusedError, SessionClosedError, trio.BrokenResourceError)
_NO_SESSIONS: frozenset[Session] = frozenset()


class _Member(Protocol):
    """What the router needs of a ``routing.membership.Member``."""

    @property
    def name(self) -> str: ...
    @property
    def private_url(self) -> str: ...


class _Ring(Protocol):
    def preference(self, key: str, n: int | None = None) -> list[str]: ...


class MembershipView(Protocol):
    """The part of ``routing.membership.Membership`` the router reads."""

    @property
    def self_name(self) -> str: ...
    def members(self) -> Mapping[str, _Member]: ...
    @property
    def ring(self) -> _Ring: ...


class DirectoryView(Protocol):
    """The part of ``routing.directory.Directory`` the router reads."""

    async def holders(self, agent_id: int) -> frozenset[str]: ...
    def changed(self, agent_id: int) -> trio.Event: ...


class ReplicatedRouter:
    def __init__(self, local: LocalRouter, *, membership: MembershipView, directory: DirectoryView,
                 pool: PeerPool, agent_wait_timeout: float | None = None,
                 on_forward: Callable[[str], object] | None = None) -> None:
        self.local = local
        self.membership = membership
        self.directory = directory
        self.pool = pool
        self.agent_wait_timeout = local.agent_wait_timeout if agent_wait_timeout is None else agent_wait_timeout
        self._on_forward = on_forward
        self._log = BurstLimitedLog(log, interval=10.0)

    async def open_stream(self, agent_id: int, metadata: Metadata, *,
                          avoid: frozenset[Session] = _NO_SESSIONS) -> MuxStream:
        await cancel_point()
        registry = self.local.registry
        skip = avoid
        # 1. The common case: a local session with room, no timer.
        session = registry.pick(agent_id, now=trio.current_time(), avoid=skip)
        if session is not None:
            try:
                return session.open_stream_nowait(metadata)
            except trio.WouldBlock:
                pass
            except _SESSION_UNUSABLE:
                skip = skip | {session}
        found_any = session is not None
        unreachable: PeerDialError | None = None
        with trio.move_on_after(self.agent_wait_timeout):
            while True:
                # Take the event before asking, so a change in between is never missed.
                directory_changed = self.directory.changed(agent_id)
                session = registry.pick(agent_id, now=trio.current_time(), avoid=skip)
                if session is not None:
                    found_any = True
                    try:
                        return session.open_stream_nowait(metadata)
                    except trio.WouldBlock:
                        pass
                    except _SESSION_UNUSABLE:
                        skip = skip | {session}
                        continue
                holders = await self.directory.holders(agent_id)
                busy: list[Session] = []
                avoided = False
                unreachable = None
                for name in self._in_ring_order(agent_id, holders):
                    member = self.membership.members().get(name)
                    if member is None:
                        continue
                    try:
                        peer = await self.pool.session(name, member.private_url)
                    except PeerDialError as exc:
                        unreachable = exc  # passed over at once: the next holder, or the wait
                        continue
                    found_any = True
                    if peer in skip:
                        avoided = True
                        continue
                    try:
                        stream = peer.open_stream_nowait(forward_metadata(metadata, agent_id=agent_id,
                                                                          origin=self.membership.self_name))
                    except trio.WouldBlock:
                        busy.append(peer)
                        continue
                    except _SESSION_UNUSABLE:
                        continue
                    self._forwarded(name)
                    return stream
                if session is not None:
                    # Local sessions exist but are full: wait for room on the one picked.
                    return await session.open_stream(metadata)
                if busy:
                    stream = await busy[0].open_stream(forward_metadata(metadata, agent_id=agent_id,
                                                                        origin=self.membership.self_name))
                    self._forwarded("")
                    return stream
                if avoid and (avoided or registry.has_usable(agent_id, avoid)):
                    raise NoOtherSession(agent_id)
                await self._wait_change(directory_changed)
        if unreachable is not None:
            raise PeerUnreachable(agent_id, unreachable.name, unreachable.detail)
        if found_any:
            raise NoFreeStream(agent_id, self.agent_wait_timeout)
        raise AgentNotConnected(agent_id, self.agent_wait_timeout)

    def _in_ring_order(self, agent_id: int, holders: frozenset[str]) -> list[str]:
        """``holders`` home first (ring order); holders off the ring (draining) last."""
        me = self.membership.self_name
        holders = holders - {me}
        if not holders:
            return []
        order = [name for name in self.membership.ring.preference(str(agent_id)) if name in holders]
        return order + sorted(holders.difference(order))

    async def _wait_change(self, directory_changed: trio.Event) -> None:
        """Until the local registry or the directory says something changed for this agent."""
        async with trio.open_nursery() as nursery:

            async def local() -> None:
                await self.local.registry.wait_for_session()
                nursery.cancel_scope.cancel()

            async def remote() -> None:
                await directory_changed.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(local)
            nursery.start_soon(remote)

    def _forwarded(self, peer: str) -> None:
        if self._on_forward is not None:
            self._on_forward(peer)

    def report(self, stream: MuxStream, refusal: StreamRefusedError | None) -> None:
        # A peer stream's refusal is its holder's business (its breaker saw the agent's refusal).
        if not self.pool.owns(stream.session):
            self.local.report(stream, refusal)


__all__ = ["DirectoryView", "MembershipView", "ReplicatedRouter"]
