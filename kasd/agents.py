"""Agent tunnels: authenticating agentd's token on 8150 and keeping each session in the registry."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from daemonkit.logs import BurstLimitedLog
from kasd.config import AgentEntry
from kasd.tokens import digest_matches, hash_token
from routing.local import AgentTunnel, TunnelRegistry
from routing.placement import PlacementHook
from tunnelhttp.dispatch import refuse_unknown_kind
from tunnelhttp.head import TunnelCode
from wire.session import MuxStream, Session

if TYPE_CHECKING:  # (routing.directory pulls in coredis: only a kasd with routing.redis.url loads it)
    from routing.directory import TunnelDirectory

log = logging.getLogger("kasd.agents")


class AgentAuthenticator:
    """The ``authenticate`` callback of ``serve_h2_tunnels``: token → the agent record, or None (401)."""

    def __init__(self, agents: Sequence[AgentEntry] | Callable[[], Sequence[AgentEntry]]) -> None:
        # a callable: the agents of the configuration in force now (a reload may add or drop one;
        # sessions already authenticated stay)
        self._agents = agents if callable(agents) else (lambda held=tuple(agents): held)
        self._failures = BurstLimitedLog(log, interval=10.0)

    async def __call__(self, token: str, headers: dict[str, str]) -> AgentEntry | None:
        await trio.lowlevel.checkpoint()
        found: AgentEntry | None = None
        digest = hash_token(token)
        for agent in self._agents():  # every one, so timing does not tell which matched
            if digest_matches(digest, agent.token_sha256) and found is None:
                found = agent
        if found is None:
            # A stranger repeats this at will: one line per 10 s with a count (the carrier's rejection
            # line, burst-limited per source address, says from where).
            self._failures.warning(
                "unknown-token", "agent authentication failed reason=unknown-token user_agent=%r",
                headers.get("user-agent", "")[:256],
            )
        return found


class PodRecords(Protocol):
    """Where each tunnel's record goes for every replica to list (``kasd.discovery.AgentPods``)."""

    async def up(self, tunnel: AgentTunnel) -> None: ...

    async def down(self, tunnel: AgentTunnel) -> None: ...


#: serves one stream an agent opened (``tunnelhttp.kinds``: agentd → kasd), for the tunnel it came on
IncomingHandler = Callable[[MuxStream, AgentTunnel], Awaitable[None]]

#: streams one session's agent may have open to kasd at once (more wait in the session's backlog)
MAX_INCOMING_PER_SESSION = 4


def _hello_text(hello: dict[str, Any], key: str) -> str:
    value = hello.get(key, "")
    return value[:256] if isinstance(value, str) else str(value)[:256]


#: namespaces kept from a HELLO (each at most 253 characters); beyond, the list is cut
MAX_HELLO_NAMESPACES = 256


def hello_namespaces(hello: dict[str, Any]) -> tuple[str, ...]:
    """The HELLO's ``namespaces``: strings only (others dropped), each cut to 253 characters, no
    repeats, at most ``MAX_HELLO_NAMESPACES`` (an agent is authenticated, not trusted to be sane)."""
    value = hello.get("namespaces")
    if not isinstance(value, list):
        return ()
    out: list[str] = []
    for item in value:
        if isinstance(item, str) and item and item[:253] not in out:
            out.append(item[:253])
            if len(out) == MAX_HELLO_NAMESPACES:
                break
    return tuple(out)


class AgentSessions:
    """The ``handler`` of ``serve_h2_tunnels``: registers the session for as long as it lives (and,
    among replicas, tells the directory when this replica's first one of an agent comes (0 → 1) and
    its last one goes (1 → 0); ``placement`` runs beside each session)."""

    def __init__(self, registry: TunnelRegistry, *, directory: TunnelDirectory | None = None,
                 placement: PlacementHook | None = None,
                 incoming: Mapping[str, IncomingHandler] | None = None,
                 pods: PodRecords | None = None) -> None:
        self.registry = registry
        #: the per-tunnel records every replica can list (``kasd.discovery.AgentPods``)
        self.pods = pods
        self.directory = directory
        self.placement = placement
        #: the handler of each kind of stream an agent may open to kasd; any other kind is refused
        self.incoming: dict[str, IncomingHandler] = dict(incoming or {})

    def _held(self, agent_id: int) -> int:
        return sum(1 for _ in self.registry.tunnels(agent_id))

    async def __call__(self, session: Session, agent: AgentEntry) -> None:
        hello = dict(session.connection.peer_metadata)
        # agentd sends its configured id as a string, empty when unset; an int is fine too.
        claimed = hello.get("agent_id")
        if claimed not in (None, "") and str(claimed).strip() != str(agent.id):
            log.error(
                "agent session rejected agent_id=%d claimed_agent_id=%r reason=hello-contradicts-token pod=%s",
                agent.id,
                claimed,
                _hello_text(hello, "pod_name"),
            )
            return  # serve_h2_tunnels closes the session (GOAWAY) when the handler returns
        tunnel = AgentTunnel(
            agent_id=agent.id,
            session=session,
            pod_name=_hello_text(hello, "pod_name"),
            pod_uid=_hello_text(hello, "pod_uid"),
            pod_namespace=_hello_text(hello, "pod_namespace"),
            node_name=_hello_text(hello, "node_name"),
            namespaces=hello_namespaces(hello),
            version=_hello_text(hello, "version"),
            connected_at=trio.current_time(),
        )
        self.registry.register(tunnel)
        if self.directory is not None and self._held(agent.id) == 1:
            self.directory.tunnels_up(agent.id)
        log.info(
            "agent connected agent_id=%d agent=%s project=%s pod=%s pod_uid=%s namespace=%s node=%s version=%s",
            agent.id,
            agent.name,
            agent.config_project,
            tunnel.pod_name,
            tunnel.pod_uid,
            tunnel.pod_namespace or "-",
            tunnel.node_name or "-",
            tunnel.version,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._serve_incoming, session, tunnel)
                if self.pods is not None:
                    nursery.start_soon(self.pods.up, tunnel)
                if self.placement is not None:
                    nursery.start_soon(self.placement.serve, session, agent.id)
                await session.wait_closed()
                nursery.cancel_scope.cancel()
        finally:
            self.registry.unregister(tunnel)
            if self.directory is not None and self._held(agent.id) == 0:
                self.directory.tunnels_down(agent.id)
            reason = session.close_reason.reason if session.close_reason else "closed by kasd"
            log.info("agent disconnected agent_id=%d pod=%s reason=%r", agent.id, tunnel.pod_name, reason)
            if self.pods is not None:  # (last: a slow store delays nothing above)
                with trio.move_on_after(3, shield=True):
                    await self.pods.down(tunnel)

    async def _serve_incoming(self, session: Session, tunnel: AgentTunnel) -> None:
        """Each stream the agent opens goes to the handler of its kind; an unknown kind is refused
        (``UNKNOWN_TARGET``, naming it). At most ``MAX_INCOMING_PER_SESSION`` are served at once."""
        slots = trio.Semaphore(MAX_INCOMING_PER_SESSION)
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    stream = await session.accept_stream()
                except trio.BrokenResourceError:
                    return
                kind = stream.metadata.get("kind")
                handler = self.incoming.get(kind) if isinstance(kind, str) else None
                if handler is None:
                    await refuse_unknown_kind(stream, "kasd")
                    continue
                await slots.acquire()
                nursery.start_soon(self._serve_one, handler, stream, tunnel, slots)

    async def _serve_one(self, handler: IncomingHandler, stream: MuxStream, tunnel: AgentTunnel,
                         slots: trio.Semaphore) -> None:
        try:
            await handler(stream, tunnel)
        except Exception as exc:  # one stream's failure (a bug) never takes the session down
            log.error("agent stream handler failed agent_id=%d stream=%d error=%s", tunnel.agent_id,
                      stream.stream_id, type(exc).__name__)
            with trio.move_on_after(1, shield=True):
                await stream.reset(TunnelCode.UNKNOWN_TARGET, "kasd failed to serve the stream")
        finally:
            slots.release()
