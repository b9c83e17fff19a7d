"""``ReplicatedRouter``: the ``Router`` (``kasd.seams``) of a kasd among replicas.

*A local tunnel, else a peer that holds one, else wait (bounded) for one to appear* — the loop is
``LocalRouter.route``'s, with the other replicas as its ``elsewhere``:

1. a local session ``TunnelRegistry.pick`` chooses, if it has room now: no timer, no Redis;
2. else the holders the directory names (live members, never this one), in ring order from the
   agent's home (the order nginx fails over in), each over its pooled peer session
   (``routing.peers``), with ``{"forward": …}`` added to the OPEN; a peer that cannot be reached
   (connection refused) is passed over at once, never waited on;
3. none: wait, at most ``agent_wait_timeout`` in all, for room on a full local session, else on a
   full holder, else for the local registry to change or the directory's change event for the
   agent (pub/sub: a tunnel that appears anywhere wakes the request at once), then try again.

Failures keep their types: ``AgentNotConnected`` (nobody holds a tunnel), ``NoFreeStream`` (tunnels
are full), ``PeerUnreachable`` (502: the only holders could not be reached, to the end of the wait),
``NoOtherSession`` (every usable session or peer is in ``avoid``). A peer stream's ``session`` is the
peer session, so ``avoid`` (a retry's "not there again") works across the hop unchanged.

The holder side never comes here: ``PeerForwarder`` opens the agent stream with ``LocalRouter``, so
a forwarded request is never forwarded again.

May import: ``routing.local``/``errors``/``peers``/``membership``/``directory``, ``wire``,
``daemonkit.logs``, trio, the standard library.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from daemonkit.logs import BurstLimitedLog
from routing.errors import PeerUnreachable, RouteError
from routing.local import LocalRouter, RemoteLook
from routing.peers import PeerDialError, PeerPool, forward_metadata
from wire.frames import Metadata
from wire.session import MuxStream, Session, SessionClosedError, StreamRefusedError

if TYPE_CHECKING:  # (both pull in coredis: only a kasd with routing.redis.url loads them)
    from routing.directory import TunnelDirectory
    from routing.membership import Membership

log = logging.getLogger("routing.router")

_SESSION_UNUSABLE = (StreamRefusedError, SessionClosedError, trio.BrokenResourceError)
_NO_SESSIONS: frozenset[Session] = frozenset()


class ReplicatedRouter:
    def __init__(self, local: LocalRouter, *, membership: Membership, directory: TunnelDirectory,
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
        return await self.local.route(agent_id, metadata, avoid=avoid, elsewhere=self, wait=self.agent_wait_timeout)

    # ------------------------------------------------------------------ LocalRouter's elsewhere

    def changed(self, agent_id: int) -> trio.Event:
        return self.directory.changed(agent_id)

    async def look(self, agent_id: int, metadata: Metadata, skip: frozenset[Session]) -> RemoteLook:
        """A stream forwarded to the first holder (in ring order) that takes one now; never waits
        for room (the loop does, on the first full holder: ``wait_for_room``)."""
        holders = await self.directory.holders(agent_id)
        busy: list[Session] = []
        found = avoided = False
        unreachable: RouteError | None = None
        forwarded = forward_metadata(metadata, agent_id=agent_id, origin=self.membership.self_name)
        for name in self._in_ring_order(agent_id, holders):
            member = self.membership.members().get(name)
            if member is None:
                continue
            try:
                peer = await self.pool.session(name, member.private_url)
            except PeerDialError as exc:  # passed over at once: the next holder, or the wait
                unreachable = PeerUnreachable(agent_id, exc.name, exc.detail)
                continue
            found = True
            if peer in skip:
                avoided = True
                continue
            try:
                stream = peer.open_stream_nowait(forwarded)
            except trio.WouldBlock:
                busy.append(peer)
                continue
            except _SESSION_UNUSABLE:
                continue
            self._forwarded(name)
            return RemoteLook(stream=stream)

        async def wait_for_room(peer: Session) -> MuxStream:
            stream = await peer.open_stream(forwarded)
            self._forwarded("")
            return stream

        return RemoteLook(wait_for_room=(lambda: wait_for_room(busy[0])) if busy else None, found=found,
                          avoided=avoided, unreachable=unreachable)

    def _in_ring_order(self, agent_id: int, holders: frozenset[str]) -> list[str]:
        """``holders`` home first (ring order); holders off the ring (draining) last."""
        me = self.membership.self_name
        holders = holders - {me}
        if not holders:
            return []
        order = [name for name in self.membership.ring.preference(str(agent_id)) if name in holders]
        return order + sorted(holders.difference(order))

    def _forwarded(self, peer: str) -> None:
        if self._on_forward is not None:
            self._on_forward(peer)

    def report(self, stream: MuxStream, refusal: StreamRefusedError | None) -> None:
        # A peer stream's refusal is its holder's business (its breaker saw the agent's refusal).
        if not self.pool.owns(stream.session):
            self.local.report(stream, refusal)


__all__ = ["ReplicatedRouter"]
