"""The private hop between kasd replicas: ``PeerPool`` (the side that got the request keeps one
HTTP/2 carrier session per peer) and ``PeerForwarder`` (the holder side: it serves those sessions on
the private listener and passes each stream on to its own agent tunnel).

A forwarded request is a logical stream on a peer session, opened with the request's OPEN metadata
plus ``{"forward": {"agent_id": N, "from": <replica>}}``. The holder strips that key, opens a stream
to the agent on a local tunnel only (``LocalRouter``: a forwarded request is never forwarded again,
so there is at most one hop), and then the two streams are one: the agent's ACCEPT metadata or its
REFUSE code and message go back as they are, bytes are spliced both ways with half-close, and a
reset on either side resets the other with the same code (the client's disconnect reaches the
agent). Memory stays bounded by the mux credits of the two sessions: a chunk is taken from one
stream only once the other took the previous one.

May import: ``wire``, ``tunnelhttp``, ``daemonkit``, ``netio``, ``routing.local``/``errors``/``retry``, trio,
attrs, the standard library. Never ``kasd``.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

from daemonkit.logs import BurstLimitedLog, UnexpectedErrors, logfmt, request_context
from netio.fastio import is_loopback_host
from routing.errors import RouteError
from routing.local import LocalRouter
from routing.retry import repeatable
from tunnelhttp.drain import Drain, answer_boundary
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode
from tunnelhttp.requestid import received_request_id
from tunnelhttp.watchbounds import EventBoundary, is_endless
from wire.carrier import TunnelRejectedError
from wire.errors import ErrorCode, RemoteProtocolError, UnsendableFrameError
from wire.frames import Metadata
from wire.h2carrier import dial_h2_tunnel
from wire.ids import InvalidNumber, check_id
from wire.session import (
    MuxStream,
    Session,
    SessionClosedError,
    StreamRefusedError,
    StreamResetError,
    connect_session,
)
from wire.settings import KiB, Limits

log = logging.getLogger("routing.peers")

#: the tunnel path of the private listener
PEER_PATH = "/peer"
#: the OPEN metadata key that marks a forwarded request (the holder strips it)
FORWARD_KEY = "forward"
#: a peer session carries an agent stream's OPEN plus the forward key: a little more room than
#: ``tunnelhttp.head.TUNNEL_LIMITS`` for control frames, so every head that fits a tunnel fits the hop
PEER_LIMITS = Limits(max_control_frame=64 * KiB + 1 * KiB)
_CHUNK = 256 * 1024
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
#: how long a holder waits for a local session of the agent (it had one a moment ago; the request
#: is bounded on the side that got it too)
HOLDER_WAIT = 2.0


def forward_metadata(metadata: Metadata, *, agent_id: int, origin: str) -> Metadata:
    """The OPEN metadata of a forwarded request."""
    return {**metadata, FORWARD_KEY: {"agent_id": agent_id, "from": origin}}


def forwarded_request(metadata: Metadata) -> tuple[int, str, Metadata]:
    """(agent id, origin replica, the metadata the agent gets) of a forwarded request's OPEN;
    ``RemoteProtocolError`` for one that is not."""
    forward = metadata.get(FORWARD_KEY)
    if not isinstance(forward, dict):
        raise RemoteProtocolError(f"a stream on the private port needs the {FORWARD_KEY!r} map")
    agent_id = forward.get("agent_id")
    try:
        agent_id = check_id(agent_id, f"{FORWARD_KEY}.agent_id")
    except InvalidNumber as exc:
        raise RemoteProtocolError(exc.message) from None
    origin = forward.get("from", "")
    return agent_id, origin if isinstance(origin, str) else "", {k: v for k, v in metadata.items() if k != FORWARD_KEY}


def plaintext_crosses_network(url: str) -> bool:
    """Whether dialling ``url`` sends bytes in clear over a network: ``http://`` to another host."""
    parts = urlsplit(url)
    return parts.scheme != "https" and not is_loopback_host(parts.hostname or "")


def peer_tunnel_url(private_url: str) -> str:
    """The URL a peer dials: ``private_url`` with the peer path when it names none."""
    parts = urlsplit(private_url)
    return private_url if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}{PEER_PATH}"


# --------------------------------------------------------------------------- the dialing side


class PeerDialError(Exception):
    """A peer could not be reached (connection refused, TLS or authentication failed, timeout)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"kasd {name}: {detail}")
        self.name = name
        self.detail = detail


@attrs.define(eq=False)
class _Peer:
    name: str
    url: str
    session: Session | None = None
    error: PeerDialError | None = None
    ready: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.frozen(kw_only=True)
class PeerPoolStatistics:
    #: peers with a live session
    sessions: int
    #: dials that failed since start
    dial_failures: int


class PeerPool:
    """One kept session per peer replica, dialled on first use; run ``run`` in a task first.

    Concurrent requests to a peer share one dial. A peer that refuses the connection fails at once
    (``PeerDialError``), so a router passes over it without waiting; the next request dials again.
    A session whose peer sent GOAWAY (it drains) takes no new streams: the next request dials anew.
    """

    def __init__(self, *, token: str, ssl_context: ssl.SSLContext | None = None, dial_timeout: float = 5.0,
                 keepalive_interval: float = 15.0, keepalive_timeout: float = 45.0, origin: str = "",
                 insecure_plaintext: bool = False, wind_down_timeout: float = 60.0) -> None:
        self._token = token
        #: how long a peer that left keeps its session for the streams in flight (it ends them
        #: itself as it drains; this bounds one that never does)
        self.wind_down_timeout = wind_down_timeout
        #: whether ``token`` may be sent over plain ``http://`` to another host (it is a secret)
        self._insecure_plaintext = insecure_plaintext
        self._ssl_context = ssl_context
        self.dial_timeout = dial_timeout
        self._session_kwargs: dict[str, Any] = {
            "limits": PEER_LIMITS, "keepalive_interval": keepalive_interval, "keepalive_timeout": keepalive_timeout,
            "metadata": {"kasd": origin}, "name": f"peer-of-{origin}" if origin else "peer",
        }
        self._peers: dict[str, _Peer] = {}
        self._sessions: set[Session] = set()
        self._nursery: trio.Nursery | None = None
        self._dial_failures = 0
        self._failures_log = BurstLimitedLog(log, interval=10.0)

    async def run(self, *, task_status: trio.TaskStatus[PeerPool] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the peer sessions until cancelled (they close with it)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def owns(self, session: Session) -> bool:
        return session in self._sessions

    async def session(self, name: str, url: str) -> Session:
        """The session to the peer ``name`` (dialling ``url`` if there is none); ``PeerDialError``."""
        peer = self._peers.get(name)
        if peer is not None and peer.ready.is_set() and not _usable(peer.session):
            self._drop(peer)
            peer = None
        if peer is None:
            if self._nursery is None:
                raise RuntimeError("PeerPool.run is not running")
            peer = self._peers[name] = _Peer(name, url)
            self._nursery.start_soon(self._keep, peer)
        await peer.ready.wait()
        if peer.session is None or peer.session.closed:
            raise peer.error or PeerDialError(name, "session closed")
        return peer.session

    def forget(self, name: str) -> None:
        """The peer left: no new streams to it; those in flight finish (it ends them as it drains)."""
        peer = self._peers.pop(name, None)
        if peer is not None and peer.session is not None and not peer.session.closed:
            self._nursery_start(self._wind_down, peer)

    def known(self) -> frozenset[str]:
        return frozenset(self._peers)

    def statistics(self) -> PeerPoolStatistics:
        return PeerPoolStatistics(sessions=sum(1 for p in self._peers.values() if _usable(p.session)),
                              dial_failures=self._dial_failures)

    def _drop(self, peer: _Peer) -> None:
        if self._peers.get(peer.name) is peer:
            del self._peers[peer.name]

    def _nursery_start(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    async def _wind_down(self, peer: _Peer) -> None:
        session = peer.session
        assert session is not None
        with trio.move_on_after(self.wind_down_timeout):
            await session.drain("member left")
        peer.scope.cancel()

    async def _keep(self, peer: _Peer) -> None:
        """Dial ``peer`` and hold its session until it ends (or the pool stops)."""
        url = peer_tunnel_url(peer.url)
        with peer.scope:
            try:
                if plaintext_crosses_network(url) and not self._insecure_plaintext:
                    # A member's URL comes from Redis: whoever can write there must not be able to
                    # make this replica hand its peer secret over in clear.
                    raise PeerDialError(peer.name, f"refusing to send the peer secret to {url} in clear "
                                                   "(http:// to another host; listeners.private.insecure_plaintext allows it)")
                if urlsplit(url).scheme == "https" and self._ssl_context is None:
                    # Nor to whoever holds a certificate the system's CAs accept (any public one for
                    # a name they own): over https a peer is one the replicas' own CA vouches for.
                    raise PeerDialError(peer.name, f"refusing to send the peer secret to {url}: no CA is configured "
                                                   "for peers' certificates (routing.peer_ca_file), and the system's "
                                                   "CAs would accept any host's")
                try:
                    with trio.fail_after(self.dial_timeout):
                        transport = await dial_h2_tunnel(url, token=self._token, ssl_context=self._ssl_context)
                except trio.TooSlowError:
                    raise PeerDialError(peer.name, f"no answer from {url} within {self.dial_timeout:g}s") from None
                except (OSError, ssl.SSLError) as exc:
                    raise PeerDialError(peer.name, f"cannot connect to {url}: {getattr(exc, 'strerror', None) or exc}") from None
                except TunnelRejectedError as exc:
                    raise PeerDialError(peer.name, f"{url} refused the peer session: HTTP {exc.status} {exc.message}") from None
                except trio.BrokenResourceError as exc:
                    raise PeerDialError(peer.name, f"connection to {url} broke: {exc}") from None
                async with trio.open_nursery() as nursery:
                    try:
                        with trio.fail_after(self.dial_timeout):
                            session = await connect_session(nursery, transport, client=True, **self._session_kwargs)
                    except (SessionClosedError, trio.TooSlowError) as exc:
                        nursery.cancel_scope.cancel()
                        raise PeerDialError(peer.name, f"no session with {url}: {exc}") from None
                    peer.session = session
                    self._sessions.add(session)
                    peer.ready.set()
                    log.info("peer session up peer=%s url=%s", peer.name, url)
                    try:
                        await session.wait_closed()
                    finally:
                        self._sessions.discard(session)
                        self._drop(peer)
                        nursery.cancel_scope.cancel()
                    reason = session.close_reason.reason if session.close_reason else "closed"
                    log.info("peer session ended peer=%s reason=%r", peer.name, reason)
            except PeerDialError as exc:
                self._dial_failures += 1
                peer.error = exc
                self._drop(peer)  # the next request dials again
                self._failures_log.warning(peer.name, "peer unreachable peer=%s error=%s", peer.name, exc.detail)
            finally:
                peer.ready.set()


def _usable(session: Session | None) -> bool:
    return session is not None and not session.closed and not session.draining


# --------------------------------------------------------------------------- the holder side


def peer_authenticator(secret: str | None) -> Callable[[str, dict[str, str]], Any]:
    """The ``authenticate`` of the private listener: the shared secret as bearer token, compared in
    constant time; with ``secret`` None (mutual TLS: the handshake proved the peer already), any."""
    import hmac

    expected = secret.encode() if secret is not None else None
    failures = BurstLimitedLog(log, interval=10.0)

    async def authenticate(token: str, headers: dict[str, str]) -> object | None:
        await trio.lowlevel.checkpoint()
        if expected is None:
            return "mtls-peer"
        if hmac.compare_digest(token.encode(), expected):
            return "peer"
        failures.warning("bad-secret", "peer authentication failed reason=wrong-secret")
        return None

    return authenticate


def _reset_of(error: BaseException) -> tuple[int, str]:
    """The code and message a reset passes on from the stream that broke to the other one."""
    if isinstance(error, StreamResetError):
        return error.code, error.message
    if isinstance(error, SessionClosedError):
        return ErrorCode.CANCEL, f"session ended: {error.reason}"[:200]
    return ErrorCode.CANCEL, str(error)[:200]


class PeerForwarder:
    """The ``handler`` of ``serve_h2_tunnels`` on the private listener: each stream a peer opens
    is passed on to a local tunnel of its agent (see the module docstring)."""

    def __init__(self, local: LocalRouter, *, drain: Drain, name: str = "", wait: float = HOLDER_WAIT,
                 on_forward: Callable[[], object] | None = None, unexpected: UnexpectedErrors | None = None) -> None:
        self.local = local
        self.drain = drain
        self.name = name
        self.wait = wait
        self._on_forward = on_forward
        #: live peer sessions (the drain sends each a GOAWAY)
        self.sessions: set[Session] = set()
        #: forwarded streams in flight
        self.active = 0
        self._idle = trio.Event()
        self._log = BurstLimitedLog(log, interval=10.0)
        #: a forwarded request that fails unexpectedly (a bug): one rate-limited line, its stream reset
        self.unexpected = unexpected if unexpected is not None else UnexpectedErrors(log)

    async def __call__(self, session: Session, principal: object) -> None:
        self.sessions.add(session)
        try:
            async with trio.open_nursery() as nursery:
                def serve(stream: MuxStream) -> None:
                    nursery.start_soon(self._serve, stream)

                session.hand_streams_to(serve)
                await session.wait_closed()
                nursery.cancel_scope.cancel()
        finally:
            self.sessions.discard(session)

    async def drain_sessions(self, message: str = "kasd is shutting down") -> None:
        """GOAWAY every peer session and wait until their streams finished (bound it)."""
        async with trio.open_nursery() as nursery:
            for session in list(self.sessions):
                nursery.start_soon(session.drain, message)

    async def _serve(self, peer: MuxStream) -> None:
        self.active += 1
        try:
            await self._forward(peer)
        finally:
            self.active -= 1

    async def _forward(self, peer: MuxStream) -> None:
        try:
            agent_id, origin, metadata = forwarded_request(peer.metadata)
        except RemoteProtocolError as exc:
            await _quietly(peer.refuse(TunnelCode.BAD_REQUEST, exc.message))
            return
        if self._on_forward is not None:
            self._on_forward()
        # The id the peer gave the request (an authenticated peer; an unsafe id is none): every line
        # about it names it, and the holder's own line says what became of it.
        request_id = received_request_id(metadata.get("request_id"))
        started = trio.current_time()
        fate = _Forwarded()
        try:
            with request_context(request_id):
                await self._forward_to_agent(peer, agent_id, origin, metadata, fate)
        finally:
            log.info("forwarded request request_id=%s agent_id=%d from=%s status=%s outcome=%s duration=%.3f",
                     request_id or "-", agent_id, logfmt(origin[:256]) if origin else "-", fate.status, fate.outcome,
                     trio.current_time() - started)

    async def _forward_to_agent(self, peer: MuxStream, agent_id: int, origin: str, metadata: Metadata,
                                fate: _Forwarded) -> None:
        agent: MuxStream | None = None
        try:
            with trio.CancelScope() as waiting:
                peer.cancel_when_broken(waiting)  # the client left while the agent was being asked
                try:
                    # Local tunnels only (never forwarded again), waiting less than the side that got it.
                    agent = await self.local.route(agent_id, metadata, wait=min(self.wait, self.local.agent_wait_timeout))
                except RouteError as exc:
                    # Not processed: the side that got the request may try another holder.
                    fate.outcome = "no-tunnel"
                    await _quietly(peer.refuse(ErrorCode.REFUSED_STREAM, f"kasd {self.name}: {exc.message}"))
                    return
                except UnsendableFrameError as exc:
                    fate.outcome = "bad-request"
                    await _quietly(peer.refuse(TunnelCode.BAD_REQUEST, exc.message))
                    return
            if waiting.cancelled_caught:
                fate.outcome = "client-gone"
                if agent is not None:
                    code, message = _reset_of(await peer.wait_broken())
                    await agent.reset(code, message)
                return
            assert agent is not None
            await self._relay(peer, agent, metadata, fate)
        except Exception as exc:
            fate.outcome = "internal-error"
            self.unexpected.report(exc, "forwarded request failed unexpectedly agent_id=%d from=%s", agent_id, origin)
            with trio.CancelScope(shield=True):
                await peer.reset(ErrorCode.INTERNAL_ERROR, "kasd failed to forward the request")
        finally:
            with trio.CancelScope(shield=True):
                if agent is not None:
                    await agent.aclose()
                await peer.aclose()

    async def _relay(self, peer: MuxStream, agent: MuxStream, metadata: Metadata, fate: _Forwarded) -> None:
        """The two streams as one, until both directions ended or one side broke (``fate``: what
        became of the request, and the agent's status).

        A splice, in the task that opened the agent stream: a bodiless request's end goes with the
        agent stream's OPEN, in one write; the agent's head and what of its answer is here go back
        in one write; a task of its own carries the client's bytes only while more may come (a
        body, an upgraded stream: never waited on by the answer, whatever the agent reads). A reset
        on either side resets the other with the same code: each stream cancels the splice when it
        breaks, no task waits for it. The client's bytes go to the agent from the start, before its
        answer: an agent that reads the whole body before it answers (an apply, an upload) must
        get it, and the EOF too."""
        with trio.CancelScope() as client_gone:
            peer.cancel_when_broken(client_gone)  # the client's disconnect reaches the agent
            try:
                first = peer.receive_nowait(_CHUNK)
            except (trio.WouldBlock, *_MUX_ERRORS):  # (a broken stream: its scope is cancelled)
                first = None
            if first == b"":  # a bodiless request: its end goes with the OPEN, in the same write
                try:
                    await agent.send_eof()
                except _MUX_ERRORS:
                    pass  # the agent's stream broke: waiting for its answer says how
                await self._splice(peer, agent, metadata, fate, None)
            else:  # a body or an upgraded stream: its bytes in a task of their own, never waited on here
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pass_up, peer, agent, first)
                    await self._splice(peer, agent, metadata, fate, nursery)
        if client_gone.cancel_called:
            code, message = _reset_of(await peer.wait_broken())
            await agent.reset(code, message)

    async def _splice(self, peer: MuxStream, agent: MuxStream, metadata: Metadata, fate: _Forwarded,
                      up: trio.Nursery | None) -> None:
        """The agent's answer to the client; ``up`` (the client's bytes still coming) is stopped
        when the exchange stops before both ends (refused, lost, broken, drained)."""
        ended = False
        try:
            accepted = await agent.wait_accepted()
        except StreamRefusedError as exc:
            fate.outcome = "refused"
            self.local.report(agent, exc)
            await _quietly(peer.refuse(exc.code, exc.message))
        except _MUX_ERRORS as exc:
            fate.outcome = "agent-lost"
            code, message = _reset_of(exc)
            if repeatable(_method(metadata), exc):  # refused as not processed: the other side may retry
                await _quietly(peer.refuse(ErrorCode.REFUSED_STREAM, f"agent session ended: {message}"))
            else:
                await _quietly(peer.reset(code, message))
        else:
            self.local.report(agent, None)
            status = accepted.get("status")
            fate.outcome, fate.status = "ok", str(status) if isinstance(status, int) else "-"
            with trio.CancelScope() as agent_gone:
                agent.cancel_when_broken(agent_gone)
                try:
                    ended = await self._answer(peer, agent, _boundary(metadata, accepted), accepted, fate)
                except _MUX_ERRORS:
                    pass  # a side broke: its scope says which
            if agent_gone.cancel_called:
                code, message = _reset_of(await agent.wait_broken())
                await peer.reset(code, message)
        if not ended and up is not None:
            up.cancel_scope.cancel()

    async def _answer(self, peer: MuxStream, agent: MuxStream, boundary: EventBoundary | None,
                      accepted: Metadata, fate: _Forwarded) -> bool:
        """The head and body of the agent's answer to the client: True once it ended, False when a
        drain ended it between two events."""
        try:
            await peer.accept(accepted)
        except _MUX_ERRORS:
            fate.outcome = "client-gone"
            raise
        # No wait between the head and the chunks already here: they leave in one write.
        receive = partial(agent.receive_some, _CHUNK)
        while True:
            data = await self.drain.next_chunk(receive, boundary)
            if data is None:  # draining: a watch or logs -f ends between two events
                await peer.send_eof()
                return False
            if not data:
                await peer.send_eof()
                return True
            await peer.send_all(data)


async def _pass_up(peer: MuxStream, agent: MuxStream, first: bytes | None) -> None:
    """The client's bytes (a body, an upgraded stream; ``first``, taken already) to the agent, and
    its end."""
    try:
        if first:
            await agent.send_all(first)
        while data := await peer.receive_some(_CHUNK):
            await agent.send_all(data)
        await agent.send_eof()
    except _MUX_ERRORS:
        return  # the stream that broke cancels the splice (and its reset is passed on)


@attrs.define
class _Forwarded:
    """What became of a forwarded request (the holder's line about it)."""

    #: ok, no-tunnel, bad-request, refused, agent-lost, client-gone, internal-error, cancelled
    outcome: str = "cancelled"
    #: the agent's answer's status ("-": none)
    status: str = "-"


def _method(metadata: Mapping[str, Any]) -> str:
    method = metadata.get("method")
    return method if isinstance(method, str) else ""


def _boundary(request: Metadata, accepted: Metadata) -> EventBoundary | None:
    """Where a drain may cut the answer (``answer_boundary``); the heads are read only for a request
    that asks for an endless answer (a watch, logs -f), not again for every request."""
    target = request.get("target")
    if not isinstance(target, str) or not is_endless(target):
        return None
    try:
        return answer_boundary(RequestHead.from_metadata(request), ResponseHead.from_metadata(accepted))
    except RemoteProtocolError:
        return None  # not an HTTP exchange the holder understands: no cut but the grace's end


async def _quietly(action: Any) -> None:
    """Answer a peer stream whose session may be gone already."""
    try:
        await action
    except _MUX_ERRORS:
        pass


__all__ = [
    "FORWARD_KEY",
    "HOLDER_WAIT",
    "PEER_LIMITS",
    "PEER_PATH",
    "PeerDialError",
    "PeerForwarder",
    "PeerPool",
    "PeerPoolStatistics",
    "forward_metadata",
    "forwarded_request",
    "is_loopback_host",
    "peer_authenticator",
    "peer_tunnel_url",
    "plaintext_crosses_network",
]
