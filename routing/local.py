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
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import attrs
import trio

from daemonkit.logs import BurstLimitedLog
from netio.fastio import cancel_point
from routing.errors import AgentNotConnected, NoFreeStream, NoOtherSession
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
class Tunnel:
    """One connected agentd replica: its session and what it said about itself in HELLO."""

    agent_id: int
    session: Session
    pod_name: str = ""
    pod_uid: str = ""
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
        self._tunnels: dict[int, list[Tunnel]] = {}
        self._by_session: dict[Session, Tunnel] = {}
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

    def register(self, tunnel: Tunnel) -> None:
        self._tunnels.setdefault(tunnel.agent_id, []).append(tunnel)
        self._by_session[tunnel.session] = tunnel
        self._notify()

    def unregister(self, tunnel: Tunnel) -> None:
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

    def tunnels(self, agent_id: int | None = None) -> Iterator[Tunnel]:
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
        ready: list[tuple[int, Tunnel]] = []
        held: list[tuple[int, Tunnel]] = []
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

    async def wait_for_session(self) -> None:
        """Return at the next register/unregister, counted in ``waiting``; bound it with a cancel scope."""
        self.waiting += 1
        self._notify(sessions=False)
        try:
            await self._sessions_changed.wait()
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


class LocalRouter:
    """Streams to agents connected to this kasd: the session ``TunnelRegistry.pick`` chooses, else
    the next one to connect, waiting at most ``agent_wait_timeout``."""

    def __init__(self, registry: TunnelRegistry, *, agent_wait_timeout: float) -> None:
        self.registry = registry
        self.agent_wait_timeout = agent_wait_timeout
        self._unusable_log = BurstLimitedLog(log, interval=10.0)

    async def open_stream(self, agent_id: int, metadata: Metadata, *,
                          avoid: frozenset[Session] = _NO_SESSIONS) -> MuxStream:
        await cancel_point()
        registry = self.registry
        skip = avoid
        # The common case — a session is up and has room — needs no timer.
        session = registry.pick(agent_id, now=trio.current_time(), avoid=skip)
        if session is not None:
            try:
                return session.open_stream_nowait(metadata)
            except trio.WouldBlock:
                pass  # full: wait below for room, within the bound
            except _SESSION_UNUSABLE as exc:
                skip = self._pass_over(agent_id, session, skip, exc)
        found_any = session is not None
        with trio.move_on_after(self.agent_wait_timeout):
            while True:
                session = registry.pick(agent_id, now=trio.current_time(), avoid=skip)
                if session is None:
                    if avoid and registry.has_usable(agent_id, avoid):
                        raise NoOtherSession(agent_id)
                    # Nobody (else) to ask: wait for a session to come or go, never spin.
                    await registry.wait_for_session()
                    continue
                found_any = True
                try:
                    return await session.open_stream(metadata)
                except _SESSION_UNUSABLE as exc:
                    skip = self._pass_over(agent_id, session, skip, exc)
        if found_any:
            raise NoFreeStream(agent_id, self.agent_wait_timeout)
        raise AgentNotConnected(agent_id, self.agent_wait_timeout)

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
