"""Receptive mode (docs/agentd.md, "Receptive agents"): kasd dials agentd, agentd never dials out.

agentd listens (TLS, ``receptive_listen_address``); a connection is kasd only once it has
authenticated, by the receptive hello's JWT (``receptive_jwt_file``: kasd's Ed25519 public key) or by
its TLS client certificate (``receptive_ca_cert_file``), as ``wire.receptive`` describes. Until then
it costs little: at most ``MAX_PENDING`` connections are in their handshake at once (more are closed
at accept), each has ``HANDSHAKE_TIMEOUT`` from accept for TLS and the hello together, and the hello
is read ``MAX_HELLO`` bytes at most and refused at its first wrong byte.

An authenticated connection is handed to a slot of the ordinary ``ConnectionManager`` as if the slot
had dialled it: the slot speaks the client's side of the carrier on it (its tunnel request with the
agent token; kasd authenticates the agent exactly as on its agent port) and serves the session as
any other. Everything above the carrier is unchanged. Only placement NOTICEs are ignored: where a
receptive agent's session lives is kasd's choice (the dialling replica is the agent's home).
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric import ed25519
from joserfc.jwk import OKPKey

from agentd.config import AgentdConfig
from agentd.connection import ConnectionManager
from daemonkit.logs import BurstLimitedLog
from netio.fastio import fast_stream, peer_host, peer_name, tls_stream
from wire.carrier import DEFAULT_PATH
from wire.frames import Metadata
from wire.h2carrier import request_h2_tunnel, run_h2_reader
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

#: connections in their handshake (TLS and hello, not yet authenticated) at once; more are closed
MAX_PENDING = 16
#: from accept to an authenticated hello, whatever the peer sends meanwhile
HANDSHAKE_TIMEOUT = 10.0
#: the longest a slot pauses between one session's end and waiting for kasd's next connection
MAX_PAUSE = 1.0
#: the scheme of the URL a receptive tunnel is logged under (it is not dialled)
SCHEME = "receptive"


class ReceptiveKeyError(Exception):
    """The JWT public key file cannot be used; the message names the file (never its bytes)."""


def load_public_key(path: Path) -> OKPKey:
    """kasd's Ed25519 public key: PEM (SubjectPublicKeyInfo) or GitLab's form, base64 of the 32 raw
    bytes (what its URL configuration API returns as ``public_key``)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReceptiveKeyError(f"cannot read the JWT public key file {path}: {exc.strerror or exc}") from None
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            key = OKPKey.import_key(text)
        except Exception:
            raise ReceptiveKeyError(f"JWT public key file {path} holds no Ed25519 public key") from None
        if key.is_private or key.curve_name != "Ed25519":
            raise ReceptiveKeyError(f"JWT public key file {path} must hold an Ed25519 public key only")
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ReceptiveKeyError(f"JWT public key file {path} is neither PEM nor the base64 of 32 bytes of an Ed25519 key")
    return OKPKey.import_key(ed25519.Ed25519PublicKey.from_public_bytes(raw))


def listener_ssl_context(config: AgentdConfig) -> ssl.SSLContext:
    """The receptive listener's TLS: its certificate, and kasd's client certificate required when
    mutual TLS authenticates kasd."""
    assert config.receptive_cert_file is not None and config.receptive_key_file is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(config.receptive_cert_file), str(config.receptive_key_file))
    # The hello comes first, then HTTP/2 (kasd's side checks the ALPN as on its agent port).
    context.set_alpn_protocols(["h2"])
    if config.receptive_ca_cert_file is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(config.receptive_ca_cert_file))
    return context


def receptive_settings_problem(config: AgentdConfig, where: Callable[[str], str]) -> str | None:
    """What is wrong with the receptive settings as a whole (the listen address is set), or None."""
    for key in ("receptive_cert_file", "receptive_key_file"):
        if getattr(config, key) is None:
            return f"{where(key)} is needed with {where('receptive_listen_address')}: kasd dials agentd over TLS"
    if (config.receptive_jwt_file is None) == (config.receptive_ca_cert_file is None):
        return (f"receptive mode authenticates kasd one way: set either {where('receptive_jwt_file')} (JWT) "
                f"or {where('receptive_ca_cert_file')} (mutual TLS)")
    if config.receptive_jwt_file is not None:
        try:
            load_public_key(config.receptive_jwt_file)
        except ReceptiveKeyError as exc:
            return f"{where('receptive_jwt_file')}: {exc}"
    try:
        listener_ssl_context(config)
    except (OSError, ssl.SSLError) as exc:
        return (f"{where('receptive_cert_file')} / {where('receptive_key_file')}: cannot load the certificate "
                f"and key: {getattr(exc, 'strerror', None) or exc}")
    return None


class KasdAuthenticator:
    """Whether a hello's credential is kasd's: the JWT against the public key, or (mutual TLS) the
    client certificate the TLS handshake already verified."""

    def __init__(self, *, public_key: OKPKey | None, agent_id: str, clock: Callable[[], float]) -> None:
        self.public_key = public_key
        self.agent_id = agent_id
        self.clock = clock

    def check(self, credential: str) -> None:
        """Raise ``HandshakeRefused`` unless ``credential`` authenticates kasd."""
        if self.public_key is None:
            if credential != MTLS_CREDENTIAL:
                raise HandshakeRefused("this agentd authenticates kasd by its client certificate")
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
                                      clock=clock or _wall_clock)
        self.session_kwargs = session_kwargs or {}
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](0)
        self._pending = 0
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

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One connection: budget, handshake, then handed to a slot (which then owns it)."""
        stream = fast_stream(stream)
        peer = peer_name(stream)
        if self._pending >= MAX_PENDING:
            self._refuse(peer, "too many connections in their handshake")
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            return
        self._pending += 1
        handed = False
        try:
            with trio.move_on_after(self.handshake_timeout) as deadline:
                tls = tls_stream(stream, self.ssl_context, server_side=True)
                await tls.do_handshake()
                stream = tls
                try:
                    self.auth.check(await read_hello(tls))
                except HandshakeRefused as exc:
                    self._refuse(peer, exc.reason)
                    await tls.send_all(refusal(exc.reason))
                    return
                await tls.send_all(OK)
                self._pending -= 1
                handed = True  # from here the bytes come from kasd: no more handshake budget
                self.accepted += 1
                log.info("kasd dialled in peer=%s", peer)
            if deadline.cancelled_caught and not handed:
                self._refuse(peer, "handshake timed out")
                return
            # A slot takes it (it may be draining the last session a moment): kasd waits meanwhile.
            with trio.move_on_after(self.handshake_timeout):
                await self._send.send(stream)
                stream = None  # type: ignore[assignment]
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
            self._refuse(peer, f"TLS or connection failed: {type(exc).__name__}")
        finally:
            if not handed:
                self._pending -= 1
            if stream is not None:
                with trio.move_on_after(1, shield=True):
                    await stream.aclose()

    def _refuse(self, peer: str, reason: str) -> None:
        self.refused += 1
        _refusals.warning((peer_host(peer), reason), "receptive connection refused peer=%s reason=%r", peer, reason)

    @asynccontextmanager
    async def dial(self, url: str, token: str, metadata: Metadata) -> AsyncIterator[Session]:
        """A slot's "dial": the next connection kasd made, with the carrier's client side on it."""
        stream = await self._receive.receive()
        try:
            transport = await request_h2_tunnel(stream, scheme="https", authority="kasd", path=DEFAULT_PATH,
                                                token=token)
        except BaseException:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            raise
        async with open_session(transport, client=True, transport_task=partial(run_h2_reader, transport),
                                metadata=metadata, **self.session_kwargs) as session:
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
