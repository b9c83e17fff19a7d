"""The local registry of live agent sessions (several agentd replicas per agent) and
``LocalRouter``, the ``Router`` (``kasd.seams``) that opens streams on them.

Which session takes a request: the usable ones (not draining, not closed, not among those the
request already tried) that no breaker holds; of those the least loaded (fewest open streams),
and among equals the next in turn after the one picked last (a rotating cursor: how many requests a
session took in its lifetime says nothing, and would send all sequential traffic to a newcomer).

The breaker is passive: a session whose agent refused a stream because it cannot reach its API
server (``UPSTREAM_UNREACHABLE``) is held back for ``BreakerPolicy.initial`` seconds, twice as long
after each further such refusal once a hold ran out (at most ``maximum``), and any stream it takes
resets it. When every session is held, the one that failed longest ago is used rather than none.

``LocalRouter.route`` is the one routing loop: a local session with room (no timer), else what
``elsewhere`` (the other replicas, ``routing.router``) finds, else one bounded wait for room or for
a change here or there. A lone kasd passes nothing elsewhere.

May import: ``routing.errors``, ``wire``, ``tunnelhttp``, ``daemonkit``, ``netio``, trio, attrs, the
standard library.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import NamedTuple, Protocol

import attrs
import trio

from daemonkit.logs import BurstLimitedLog
from netio.fastio import cancel_point
from routing.errors import AgentNotConnected, NoFreeStream, NoOtherSession, RouteError
from tunnelhttp.head import TunnelCode
from wire.frames import Metadata
from wire.session import MuxStream, Session, SessionClosedError, StreamRefusedError

log = logging.getLogger("kasd.tunnels")

#: a session picked for a request that began draining or died before the stream opened (an
#: ``UnsendableFrameError``, a verdict on the request itself, is deliberately not among them)
_SESSION_UNUSABLE = (StreamRefusedError, SessionClosedError, trio.BrokenResourceError)
_NO_SESSIONS: frozenset[Session] = frozenset()


@attrs.frozen(kw_only=True)
class BreakerPolicy:
    """How long a session whose agent cannot reach its API server is passed over."""

    #: seconds after the first refusal
    initial: float = 1.0
    #: the longest hold, however many refusals
    maximum: float = 30.0

    def hold(self, failures: int) -> float:
        """The hold after the ``failures``-th refusal in a row (1, 2, …)."""
        return min(self.initial * 2.0 ** min(failures - 1, 64), self.maximum)


@attrs.define(kw_only=True, eq=False)
class AgentTunnel:
    """One connected agentd replica: its session and what it said about itself in HELLO."""

    agent_id: int
    session: Session
    pod_name: str = ""
    pod_uid: str = ""
    #: the pod's namespace and node (Downward API), and the namespaces this agentd serves (none: all)
    pod_namespace: str = ""
    node_name: str = ""
    namespaces: tuple[str, ...] = ()
    version: str = ""
    peer: str = ""
    connected_at: float = 0.0
    #: refusals for an unreachable API server since the session last took a stream
    failures: int = 0
    #: when the last one came (Trio's clock); -inf: never
    failed_at: float = -math.inf
    #: passed over until then (Trio's clock)
    held_until: float = -math.inf

    @property
    def usable(self) -> bool:
        return not self.session.closed and not self.session.draining

    def held(self, now: float) -> bool:
        return now < self.held_until


@attrs.frozen(kw_only=True)
class RegistryStatistics:
    agents: int
    sessions: int
    sessions_by_agent: tuple[tuple[int, int], ...]
    waiting: int


class TunnelRegistry:
    def __init__(self, *, breaker: BreakerPolicy | None = None) -> None:
        self.breaker = breaker if breaker is not None else BreakerPolicy()
        self._tunnels: dict[int, list[AgentTunnel]] = {}
        self._by_session: dict[Session, AgentTunnel] = {}
        #: per agent: the position (in its list) of the session picked last, where the next turn starts
        self._cursor: dict[int, int] = {}
        #: set at every register/unregister and every change of ``waiting``
        self._changed = trio.Event()
        #: set at every register/unregister only: what a waiting request waits on (if a new waiter
        #: woke the others, two of them would wake each other in turn without end)
        self._sessions_changed = trio.Event()
        self._breaker_log = BurstLimitedLog(log, interval=10.0)
        #: requests waiting in ``wait_for_session`` for an agent to connect
        self.waiting = 0

    def register(self, tunnel: AgentTunnel) -> None:
        self._tunnels.setdefault(tunnel.agent_id, []).append(tunnel)
        self._by_session[tunnel.session] = tunnel
        self._notify()

    def unregister(self, tunnel: AgentTunnel) -> None:
        tunnels = self._tunnels.get(tunnel.agent_id, [])
        if tunnel in tunnels:
            tunnels.remove(tunnel)
            self._by_session.pop(tunnel.session, None)
            if not tunnels:
                del self._tunnels[tunnel.agent_id]
                self._cursor.pop(tunnel.agent_id, None)
            self._notify()

    def _notify(self, *, sessions: bool = True) -> None:
        self._changed.set()
        self._changed = trio.Event()
        if sessions:
            self._sessions_changed.set()
            self._sessions_changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return at the next register/unregister or change of ``waiting`` (tests and the shutdown
        path wait on this)."""
        await self._changed.wait()

    def tunnels(self, agent_id: int | None = None) -> Iterator[AgentTunnel]:
        if agent_id is not None:
            yield from list(self._tunnels.get(agent_id, ()))
            return
        for tunnels in list(self._tunnels.values()):
            yield from tunnels

    # ------------------------------------------------------------------ picking

    def pick(self, agent_id: int, *, now: float, avoid: frozenset[Session] = _NO_SESSIONS) -> Session | None:
        """The session for the next request to ``agent_id`` (see the module's docstring), or None
        if none is usable outside ``avoid``. ``now`` is Trio's clock, for the breaker."""
        tunnels = self._tunnels.get(agent_id)
        if not tunnels:
            return None
        ready: list[tuple[int, AgentTunnel]] = []
        held: list[tuple[int, AgentTunnel]] = []
        for index, tunnel in enumerate(tunnels):
            if tunnel.usable and tunnel.session not in avoid:
                (held if tunnel.held(now) else ready).append((index, tunnel))
        if ready:
            least = min(tunnel.session.active_streams for _, tunnel in ready)
            ties = [(index, tunnel) for index, tunnel in ready if tunnel.session.active_streams == least]
            # The first tie after the cursor, going round the list.
            after, size = self._cursor.get(agent_id, -1), len(tunnels)
            index, best = min(ties, key=lambda tie: (tie[0] - after - 1) % size)
        elif held:
            index, best = min(held, key=lambda entry: entry[1].failed_at)
        else:
            return None
        self._cursor[agent_id] = index
        return best.session

    def has_usable(self, agent_id: int, among: frozenset[Session]) -> bool:
        """Whether one of ``among`` is a usable session of ``agent_id``."""
        return any(t.usable and t.session in among for t in self._tunnels.get(agent_id, ()))

    def sessions_changed(self) -> trio.Event:
        """The event the next register/unregister sets: take it before looking, pass it to
        ``wait_for_session`` after, and no change in between is missed."""
        return self._sessions_changed

    async def wait_for_session(self, changed: trio.Event | None = None) -> None:
        """Return once ``changed`` (from ``sessions_changed``) is set, or at the next
        register/unregister; counted in ``waiting``. Bound it with a cancel scope."""
        self.waiting += 1
        self._notify(sessions=False)
        try:
            await (changed if changed is not None else self._sessions_changed).wait()
        finally:
            self.waiting -= 1

    # ------------------------------------------------------------------ the breaker

    def upstream_unreachable(self, session: Session, *, now: float, cause: str = "") -> None:
        """The session's agent refused a stream: it cannot reach its API server. Hold it back."""
        tunnel = self._by_session.get(session)
        if tunnel is None:
            return
        tunnel.failed_at = now
        if tunnel.held(now):
            return  # streams opened before the hold began say nothing new
        tunnel.failures += 1
        hold = self.breaker.hold(tunnel.failures)
        tunnel.held_until = now + hold
        self._breaker_log.warning(
            (tunnel.agent_id, tunnel.pod_name), "session held back agent_id=%d pod=%s for=%gs failures=%d reason=upstream-unreachable"
            " error=%r", tunnel.agent_id, tunnel.pod_name, hold, tunnel.failures, cause[:200])

    def took_stream(self, session: Session) -> None:
        """The session's agent took a stream (its API server answered): the breaker resets."""
        tunnel = self._by_session.get(session)
        if tunnel is None or not tunnel.failures:
            return
        log.info("session recovered agent_id=%d pod=%s after_failures=%d", tunnel.agent_id, tunnel.pod_name,
                 tunnel.failures)
        tunnel.failures = 0
        tunnel.failed_at = tunnel.held_until = -math.inf

    def statistics(self) -> RegistryStatistics:
        by_agent = tuple(sorted((aid, sum(1 for t in ts if not t.session.closed)) for aid, ts in self._tunnels.items()))
        return RegistryStatistics(
            agents=sum(1 for _, n in by_agent if n),
            sessions=sum(n for _, n in by_agent),
            sessions_by_agent=by_agent,
            waiting=self.waiting,
        )


class LocalLook(NamedTuple):
    """What one look at this kasd's sessions found when none took a stream at once."""

    #: a usable session that is full now (wait for room on it)
    full: Session | None = None
    #: the sessions the request must not be opened on: ``avoid``, and those found unusable
    skip: frozenset[Session] = _NO_SESSIONS
    #: whether any session of the agent was picked
    found: bool = False


@attrs.frozen(kw_only=True)
class RemoteLook:
    """What one look elsewhere (other replicas: ``routing.router``) found, without waiting."""

    #: a stream opened there
    stream: MuxStream | None = None
    #: else a wait for room at a holder that is full now
    wait_for_room: Callable[[], Awaitable[MuxStream]] | None = None
    #: a holder was reached
    found: bool = False
    #: a holder was passed over for being in ``avoid``
    avoided: bool = False
    #: what to say if the wait ends with nothing: the holders could not be reached
    unreachable: RouteError | None = None


_NOTHING = RemoteLook()


class Elsewhere(Protocol):
    """Where a stream may come from when this kasd's own sessions cannot take it: the other
    replicas (``routing.router.ReplicatedRouter`` passes its peers to ``LocalRouter.route``)."""

    def changed(self, agent_id: int) -> trio.Event:
        """Set when what ``look`` would find may have changed (take it before looking)."""
        ...

    async def look(self, agent_id: int, metadata: Metadata, skip: frozenset[Session]) -> RemoteLook: ...


class LocalRouter:
    """Streams to agents connected to this kasd: the session ``TunnelRegistry.pick`` chooses, else
    the next one to connect, waiting at most ``agent_wait_timeout``. ``route`` is the one loop of
    every router: a replicated one hands it the other replicas as ``elsewhere``."""

    def __init__(self, registry: TunnelRegistry, *, agent_wait_timeout: float) -> None:
        self.registry = registry
        self.agent_wait_timeout = agent_wait_timeout
        self._unusable_log = BurstLimitedLog(log, interval=10.0)

    async def route(self, agent_id: int, metadata: Metadata, *, avoid: frozenset[Session] = _NO_SESSIONS,
                    elsewhere: Elsewhere | None = None, wait: float | None = None) -> MuxStream:
        """A stream to ``agent_id`` (``Router.open_stream``): a local session with room, else one
        ``elsewhere`` finds, else — at most ``wait`` (``agent_wait_timeout``) in all — room on a
        full local session, then on a full holder elsewhere, then the next change here or there."""
        await cancel_point()
        wait = self.agent_wait_timeout if wait is None else wait
        # The common case — a session is up and has room — needs no timer (and no Redis).
        local = self.look(agent_id, metadata, skip=avoid)
        if not isinstance(local, LocalLook):
            return local
        skip, found_any = local.skip, local.found
        unreachable: RouteError | None = None
        with trio.move_on_after(wait):
            while True:
                # Take the events before looking, so a change in between (a session registering
                # while the directory is asked) is never missed.
                local_changed = self.registry.sessions_changed()
                changed = elsewhere.changed(agent_id) if elsewhere is not None else None
                local = self.look(agent_id, metadata, skip=skip)
                if not isinstance(local, LocalLook):
                    return local
                skip, found_any = local.skip, found_any or local.found
                remote = await elsewhere.look(agent_id, metadata, skip) if elsewhere is not None else _NOTHING
                if remote.stream is not None:
                    return remote.stream
                found_any, unreachable = found_any or remote.found, remote.unreachable
                if local.full is not None:
                    try:
                        return await local.full.open_stream(metadata)
                    except _SESSION_UNUSABLE as exc:
                        skip = self._pass_over(agent_id, local.full, skip, exc)
                        continue
                if remote.wait_for_room is not None:
                    return await remote.wait_for_room()
                if avoid and (remote.avoided or self.registry.has_usable(agent_id, avoid)):
                    raise NoOtherSession(agent_id)
                # Nobody (else) to ask: wait for a session to come or go, here or there; never spin.
                await self._wait_change(local_changed, changed)
        if unreachable is not None:
            raise unreachable
        if found_any:
            raise NoFreeStream(agent_id, wait)
        raise AgentNotConnected(agent_id, wait)

    #: ``Router.open_stream``: ``route`` with nothing elsewhere (the same function: no extra call on
    #: every request's path)
    open_stream = route

    def look(self, agent_id: int, metadata: Metadata, *, skip: frozenset[Session]) -> MuxStream | LocalLook:
        """A stream on the session ``TunnelRegistry.pick`` chooses outside ``skip``, if it has
        room now, else what was found instead; never waits. A session that turns out unusable is
        passed over (added to ``skip``) and the next one picked."""
        found = False
        while (session := self.registry.pick(agent_id, now=trio.current_time(), avoid=skip)) is not None:
            found = True
            try:
                return session.open_stream_nowait(metadata)
            except trio.WouldBlock:
                return LocalLook(full=session, skip=skip, found=True)
            except _SESSION_UNUSABLE as exc:
                skip = self._pass_over(agent_id, session, skip, exc)
        return LocalLook(skip=skip, found=found)

    async def _wait_change(self, local_changed: trio.Event, elsewhere_changed: trio.Event | None) -> None:
        """Until the local registry (or ``elsewhere``) says something changed for this agent."""
        if elsewhere_changed is None:
            await self.registry.wait_for_session(local_changed)
            return
        async with trio.open_nursery() as nursery:

            async def local() -> None:
                await self.registry.wait_for_session(local_changed)
                nursery.cancel_scope.cancel()

            async def remote() -> None:
                await elsewhere_changed.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(local)
            nursery.start_soon(remote)

    def _pass_over(self, agent_id: int, session: Session, skip: frozenset[Session],
                   exc: BaseException) -> frozenset[Session]:
        # It began draining or died between the pick and the open; or it cannot open streams at all
        # while still looking usable (its stream ids ran out): this request asks another one.
        self._unusable_log.info(agent_id, "session unusable, trying another agent_id=%d error=%s", agent_id, exc)
        return skip | {session}

    def report(self, stream: MuxStream, refusal: StreamRefusedError | None) -> None:
        if refusal is None:
            self.registry.took_stream(stream.session)
        elif refusal.code == TunnelCode.UPSTREAM_UNREACHABLE:
            self.registry.upstream_unreachable(stream.session, now=trio.current_time(), cause=refusal.message)
