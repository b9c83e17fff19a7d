"""Receptive mode (docs/agentd.md, "Receptive agents"): kasd dials agentd, agentd never dials out.

agentd listens (TLS, ``receptive_listen_address``); a connection is kasd only once it has
authenticated, by the receptive hello's JWT (``receptive_jwt_file``: kasd's Ed25519 public key) or by
its TLS client certificate (``receptive_ca_cert_file``), as ``wire.receptive`` describes. Every file
is read again when it changes, without a restart: the TLS files every ``tls_reload_interval`` (and
on SIGHUP) for the next handshake, the public key at the next hello. Until then
it costs little: at most ``MAX_PENDING`` connections are in their handshake at once (one more
displaces the oldest, so peers that hold connections open and say nothing cannot keep kasd, whose
handshake takes milliseconds, out) and ``MAX_PENDING_PER_SOURCE`` from one source (more from it are
closed at accept, so one stranger cannot fill the table alone), each has ``HANDSHAKE_TIMEOUT`` from
accept for TLS and the hello together, and the hello is read ``MAX_HELLO`` bytes at most and refused
at its first wrong byte.

An authenticated connection is handed to a slot of the ordinary ``ConnectionManager`` as if the slot
had dialled it: the slot speaks the client's side of the carrier on it (its tunnel request with the
agent token; kasd authenticates the agent exactly as on its agent port) and serves the session as
any other. Everything above the carrier is unchanged. Only placement NOTICEs are ignored: where a
receptive agent's session lives is kasd's choice (the dialling replica is the agent's home).
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from joserfc.jwk import OKPKey

from agentd.config import AgentdConfig
from agentd.connection import ConnectionManager
from agentd.receptivefiles import ReceptiveKeyError, listener_files, load_public_key
from daemonkit.logs import BurstLimitedLog
from netio.admission import source_of
from netio.fastio import fast_stream, peer_host, peer_name, tls_stream
from netio.tlsreload import ReloadingContext, file_identity
from wire.carrier import DEFAULT_PATH
from wire.frames import Metadata
from wire.h2carrier import request_h2_tunnel
from wire.notices import parse_placement
from wire.receptive import (
    MAX_HELLO,
    MTLS_CREDENTIAL,
    OK,
    HandshakeRefused,
    parse_hello,
    refusal,
    verify_token,
)
from wire.session import Session, open_session

log = logging.getLogger("agentd.receptive")
#: refusals a stranger can repeat at will: one line per source address per 10 s, with a count
_refusals = BurstLimitedLog(log, interval=10.0)

#: connections in their handshake (TLS and hello, not yet authenticated) at once; one more displaces
#: the oldest (closed: the one that had the most time)
MAX_PENDING = 16
#: ... and from one source (an IPv4 address, an IPv6 /64): one stranger cannot take every handshake
#: slot and so keep kasd (another source) out
MAX_PENDING_PER_SOURCE = 4
#: from accept to an authenticated hello, whatever the peer sends meanwhile
HANDSHAKE_TIMEOUT = 10.0
#: the longest a slot pauses between one session's end and waiting for kasd's next connection
MAX_PAUSE = 1.0
#: the scheme of the URL a receptive tunnel is logged under (it is not dialled)
SCHEME = "receptive"


def listener_ssl_context(config: AgentdConfig) -> ReloadingContext:
    """The receptive listener's TLS: its certificate, and kasd's client certificate required when
    mutual TLS authenticates kasd. The files are read again when they change (every
    ``tls_reload_interval``, and on SIGHUP): the next handshake uses them, connections up keep theirs."""
    context = ReloadingContext(listener_files(config), name="receptive", check_interval=config.tls_reload_interval)
    # The hello comes first, then HTTP/2 (kasd's side checks the ALPN as on its agent port).
    context.set_alpn_protocols(["h2"])
    return context


class KasdAuthenticator:
    """Whether a hello's credential is kasd's: the JWT against the public key, or (mutual TLS) the
    client certificate the TLS handshake already verified."""

    def __init__(self, *, public_key: OKPKey | None, agent_id: str, clock: Callable[[], float],
                 public_key_file: Path | None = None, client_name: str = "") -> None:
        self.public_key = public_key
        self.agent_id = agent_id
        self.clock = clock
        #: mutual TLS: the subject alternative name (DNS or URI) kasd's client certificate must carry
        self.client_name = client_name
        #: the file ``public_key`` came from: looked at at each hello (a stat), read again when it
        #: changed (kasd's key rotated); one that does not load keeps the previous key, with one ERROR
        self.public_key_file = public_key_file
        self._seen = file_identity(public_key_file) if public_key_file is not None else None

    def _reloaded(self) -> None:
        path = self.public_key_file
        if path is None:
            return
        seen = file_identity(path)
        if seen == self._seen:
            return
        self._seen = seen  # a broken file is reported once, then again only when it changes
        try:
            key = load_public_key(path)
        except ReceptiveKeyError as exc:
            log.error("receptive JWT public key not reloaded: %s; the previous key verifies kasd", exc)
            return
        self.public_key = key
        log.info("receptive JWT public key reloaded file=%s", path)

    def check(self, credential: str, peer_certificate: object = None) -> None:
        """Raise ``HandshakeRefused`` unless ``credential`` (and, under mutual TLS, the client
        certificate the TLS handshake verified: ``getpeercert()``) authenticates kasd."""
        self._reloaded()
        if self.public_key is None:
            if credential != MTLS_CREDENTIAL:
                raise HandshakeRefused("this agentd authenticates kasd by its client certificate")
            # The CA signs more than kasd's certificate (an agentd's own serving certificate, say):
            # only the one with kasd's name is kasd.
            sans = peer_certificate.get("subjectAltName", ()) if isinstance(peer_certificate, dict) else ()
            names = {(kind, value.lower() if kind == "DNS" else value) for kind, value in sans if kind in ("DNS", "URI")}
            want = self.client_name
            if not want or not ({("DNS", want.lower()), ("URI", want)} & names):
                raise HandshakeRefused("the client certificate is not kasd's")
            return
        if credential == MTLS_CREDENTIAL:
            raise HandshakeRefused("this agentd authenticates kasd by JWT")
        verify_token(credential, self.public_key, now=self.clock(), agent_id=self.agent_id)


async def read_hello(stream: trio.abc.Stream) -> str:
    """The hello's credential; ``HandshakeRefused`` at the first wrong byte, at ``MAX_HELLO``, or
    when the peer closes first."""
    buffer = bytearray()
    while True:
        chunk = await stream.receive_some(MAX_HELLO - len(buffer))
        if not chunk:
            raise HandshakeRefused("closed before the hello")
        buffer += chunk
        credential = parse_hello(buffer)
        if credential is not None:
            return credential


class ReceptiveListener:
    """Accepts kasd's connections, authenticates them, and hands each to a slot that waits in
    ``dial`` (``ConnectionManager``'s dial callable)."""

    def __init__(self, config: AgentdConfig, *, clock: Callable[[], float] | None = None,
                 session_kwargs: dict[str, Any] | None = None) -> None:
        assert config.receptive_listen_address is not None
        self.address = config.receptive_listen_address
        self.ssl_context = listener_ssl_context(config)
        public_key = load_public_key(config.receptive_jwt_file) if config.receptive_jwt_file is not None else None
        self.auth = KasdAuthenticator(public_key=public_key, agent_id=config.agent_id,
                                      clock=clock or _wall_clock, public_key_file=config.receptive_jwt_file,
                                      client_name=config.receptive_client_name or "")
        self.session_kwargs = session_kwargs or {}
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        #: an authenticated connection, and the event its slot sets once done with it (the handler
        #: lives until then: trio.serve_listeners closes a handler's stream when it returns, and
        #: under KASD_SAFE_MODE that stream is the very socket the slot speaks on)
        self._send, self._receive = trio.open_memory_channel[tuple[trio.abc.Stream, trio.Event]](0)
        #: the connections in their handshake, oldest first (each one's deadline scope)
        self._handshakes: dict[object, trio.CancelScope] = {}
        #: the connections in their handshake, per source (only sources with one)
        self._pending_from: dict[str, int] = {}
        #: where it listens (``host:port``), once it does
        self.bound = ""
        #: connections kasd authenticated on, and refused ones
        self.accepted = 0
        self.refused = 0

    @property
    def url(self) -> str:
        return f"{SCHEME}://{self.address}"

    async def serve(self, *, task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.address.port, host=self.address.host)
        self.bound = _bound(listeners)
        log.info("receptive listener up address=%s auth=%s", self.bound,
                 "jwt" if self.auth.public_key is not None else "mtls")
        await trio.serve_listeners(self.handle, listeners, task_status=task_status)

    @property
    def pending(self) -> int:
        """Connections in their handshake now."""
        return len(self._handshakes)

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One connection: budget, handshake, then handed to a slot (which then owns it)."""
        stream = fast_stream(stream)
        peer = peer_name(stream)
        source = source_of(peer_host(peer))
        if self._pending_from.get(source, 0) >= MAX_PENDING_PER_SOURCE:
            self._refuse(peer, "too many connections in their handshake from this source")
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            return
        if len(self._handshakes) >= MAX_PENDING:
            # Full: the oldest goes, not the newcomer. Refusing newcomers would let anyone who holds
            # MAX_PENDING idle connections (renewed as each times out) keep kasd out for good.
            oldest = next(iter(self._handshakes))
            self._handshakes.pop(oldest).cancel()
        key = object()
        self._hold(source)
        held = True
        handed = False
        try:
            with trio.move_on_after(self.handshake_timeout) as deadline:
                self._handshakes[key] = deadline
                tls = tls_stream(stream, self.ssl_context, server_side=True)
                await tls.do_handshake()
                stream = tls
                try:
                    self.auth.check(await read_hello(tls), tls.getpeercert())
                except HandshakeRefused as exc:
                    self._refuse(peer, exc.reason)
                    await tls.send_all(refusal(exc.reason))
                    return
                await tls.send_all(OK)
                self._handshakes.pop(key, None)
                self._release(source)
                held = False
                handed = True  # from here the bytes come from kasd: no more handshake budget
                self.accepted += 1
                log.info("kasd dialled in peer=%s", peer)
            if deadline.cancelled_caught and not handed:
                displaced = key not in self._handshakes
                self._refuse(peer, f"{MAX_PENDING} newer connections in their handshake" if displaced
                             else "handshake timed out")
                return
            # A slot takes it (it may be draining the last session a moment): kasd waits meanwhile.
            done = trio.Event()
            with trio.move_on_after(self.handshake_timeout):
                await self._send.send((stream, done))
                stream = None  # type: ignore[assignment]
            if stream is None:
                await done.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
            self._refuse(peer, f"TLS or connection failed: {type(exc).__name__}")
        finally:
            self._handshakes.pop(key, None)
            if held:
                self._release(source)
            if stream is not None:
                with trio.move_on_after(1, shield=True):
                    await stream.aclose()

    def _hold(self, source: str) -> None:
        self._pending_from[source] = self._pending_from.get(source, 0) + 1

    def _release(self, source: str) -> None:
        left = self._pending_from[source] - 1
        if left:
            self._pending_from[source] = left
        else:
            del self._pending_from[source]

    def _refuse(self, peer: str, reason: str) -> None:
        self.refused += 1
        _refusals.warning((peer_host(peer), reason), "receptive connection refused peer=%s reason=%r", peer, reason)

    @asynccontextmanager
    async def dial(self, url: str, token: str, metadata: Metadata) -> AsyncIterator[Session]:
        """A slot's "dial": the next connection kasd made, with the carrier's client side on it."""
        stream, done = await self._receive.receive()
        try:
            async with self._speak(stream, token, metadata) as session:
                yield session
        finally:
            done.set()

    @asynccontextmanager
    async def _speak(self, stream: trio.abc.Stream, token: str, metadata: Metadata) -> AsyncIterator[Session]:
        try:
            # The slot waits for kasd without limit, but not for kasd's answer once it said its hello:
            # a replica whose host vanished then (no FIN) would hold the slot for good, and with every
            # slot held, agentd could take no replica's dial again.
            with trio.move_on_after(self.handshake_timeout) as waited:
                transport = await request_h2_tunnel(stream, scheme="https", authority="kasd", path=DEFAULT_PATH,
                                                    token=token)
            if waited.cancelled_caught:
                raise TimeoutError(f"kasd did not answer the tunnel request within {self.handshake_timeout:g}s")
        except BaseException:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            raise
        async with open_session(transport, client=True, metadata=metadata, **self.session_kwargs) as session:
            yield session


class ReceptiveManager(ConnectionManager):
    """The connection manager of a receptive agentd: its slots wait for kasd instead of dialling,
    never back off (kasd paces its own dials) and ignore placement."""

    def on_notice(self, metadata: Metadata) -> None:
        if parse_placement(metadata) is not None:
            return  # kasd's home replica dials a receptive agent: nothing for agentd to move
        super().on_notice(metadata)


def receptive_manager(listener: ReceptiveListener, **kwargs: Any) -> ReceptiveManager:
    """``ConnectionManager(**kwargs)`` with its slots waiting on ``listener``."""
    kwargs.pop("kas_ssl_context", None)
    return ReceptiveManager([listener.url], dial=listener.dial, dial_timeout=math.inf,
                            sleep=_short_pause, **kwargs)


async def _short_pause(delay: float) -> None:
    # A slot waits for kasd's next connection at once (kasd paces its dials); the pause only keeps
    # a slot that fails before waiting (an unreadable token file) from spinning.
    await trio.sleep(min(delay, MAX_PAUSE))


def _wall_clock() -> float:
    import time

    return time.time()


def _bound(listeners: list[trio.SocketListener]) -> str:
    host, port = listeners[0].socket.getsockname()[:2]
    return f"{host}:{port}"
