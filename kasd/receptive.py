"""Receptive agents (docs/kasd.md, "Receptive agents"; docs/routing.md, "Who dials a receptive
agent"): kasd dials agentd for the agents whose ``agents[].receptive`` says where it listens.

Exactly one replica dials each receptive agent: its home on the ring (over the live replicas that
are not draining), recomputed at every membership change. A replica that stops being the home
drains its session (GOAWAY: what is in flight finishes) and the new home dials; when the home dies,
its key expires from the membership (``routing.heartbeat_interval`` × 2) and the next replica on the
ring dials at the change it sees. Alone, kasd dials every receptive agent.

One dial: TCP, TLS (agentd's certificate verified against ``ca_cert_file`` for ``tls_host``; kasd's
client certificate for mutual TLS), the receptive hello (``wire.receptive``: a fresh short-lived JWT,
or ``-``), agentd's ``OK``; then the carrier's server side, as on the agent port
(``wire.h2carrier.serve_h2_connection``): agentd's tunnel request is authenticated by its agent token
(``kasd.agents.AgentAuthenticator``) and must be the agent kasd dialled; the session goes to the
same ``AgentSessions`` as every other. An unreachable agentd is redialled at most 2 s apart for
the first minute (full jitter), then exponentially longer up to a minute; one log line per agent
per 10 s, never a credential.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio
from joserfc.jwk import OKPKey

from daemonkit.logs import BurstLimitedLog
from daemonkit.settings import Problem
from kasd.config.directory import AgentEntry
from kasd.config.receptive import ReceptiveEntry, load_private_key
from netio.fastio import fast_stream, tls_stream
from netio.tlsreload import (
    CHECK_INTERVAL,
    ReloadingContext,
    TLSFiles,
    TLSLoadError,
    file_identity,
    reload_all,
)
from wire.carrier import DEFAULT_PATH, Authenticate, TunnelRejectedError
from wire.h2carrier import SessionHandler, serve_h2_connection
from wire.receptive import (
    MTLS_CREDENTIAL,
    HandshakeRefused,
    hello,
    mint_token,
    parse_reply,
)
from wire.session import Session

if TYPE_CHECKING:  # (it pulls in coredis: a lone kasd never loads it)
    from routing.membership import Membership

log = logging.getLogger("kasd.receptive")

#: the first minute of an outage is redialled at most this far apart (full jitter) ...
QUICK_DELAY = 2.0
QUICK_WINDOW = 60.0
#: ... then exponentially longer, up to this
MAX_DELAY = 60.0
#: a session that lasted this long ends an outage (the next failure starts a new quick window)
STABLE_AFTER = 10.0
#: how long a session kasd no longer should hold (another replica is home now) may drain
HANDOVER_DRAIN = 30.0


class ReceptiveRefusedError(Exception):
    """agentd answered the hello with a refusal (its reason, fixed text)."""


def client_ssl_context(entry: ReceptiveEntry, *, name: str = "receptive",
                       check_interval: float = CHECK_INTERVAL) -> ReloadingContext:
    """kasd's TLS to one agentd: its certificate verified against ``ca_cert_file`` (or the system's
    CAs); kasd's client certificate for mutual TLS. The files are read again when they change (at
    most every ``check_interval`` seconds, and on SIGHUP): the next dial uses them. ``TLSLoadError``
    if they do not load."""
    files = TLSFiles(server=False, ca=entry.ca_cert_file, cert=entry.client_cert_file, key=entry.client_key_file)
    context = ReloadingContext(files, name=name, check_interval=check_interval)
    context.set_alpn_protocols(["h2"])
    return context


class ReceptiveCredentials:
    """What kasd proves itself with to one receptive agent, read again when its files change: the
    TLS context (``client_ssl_context``) and the JWT signing key (``private_key_file``, looked at at
    every dial: a stat; read only when it changed). Files that do not load keep the previous ones
    (one ERROR line, never the key's bytes); at the start they are the dial's error, tried again at
    the next dial."""

    def __init__(self, agent_id: int, entry: ReceptiveEntry) -> None:
        self.agent_id = agent_id
        self.entry = entry
        self._tls: ReloadingContext | None = None
        self._key: OKPKey | None = None
        self._key_seen: object = None
        #: JWT signing keys read since the start (the first one included)
        self.key_loads = 0

    @property
    def tls(self) -> ReloadingContext | None:
        """The TLS context, once it loaded (None before: nothing to reload on SIGHUP)."""
        return self._tls

    def context(self) -> ReloadingContext:
        if self._tls is None:
            self._tls = client_ssl_context(self.entry, name=f"receptive agent_id={self.agent_id}")
        return self._tls

    def key(self) -> OKPKey | None:
        """The JWT signing key (None: mutual TLS); ``Problem`` if it never loaded."""
        path = self.entry.private_key_file
        if path is None:
            return None
        seen = file_identity(path)
        if self._key is not None and seen == self._key_seen:
            return self._key
        self._key_seen = seen  # a broken key is reported once, then again only when the file changes
        try:
            key = load_private_key(path)
        except Problem as exc:
            if self._key is None:
                raise
            log.error("receptive JWT key not reloaded agent_id=%d: %s; kasd signs with the previous key",
                      self.agent_id, exc.text)
            return self._key
        if self._key is not None:
            log.info("receptive JWT key reloaded agent_id=%d file=%s", self.agent_id, path)
        self._key = key
        self.key_loads += 1
        return key


async def read_reply(stream: trio.abc.Stream) -> str:
    """agentd's answer to the hello: ``""`` for OK, else its refusal's reason. Read a byte at a
    time (at most ``MAX_REPLY``, once per dial): agentd's HTTP/2 preface follows ``OK`` at once and
    must stay in the stream for the carrier."""
    buffer = bytearray()
    while True:
        chunk = await stream.receive_some(1)
        if not chunk:
            raise ReceptiveRefusedError("agentd closed the connection before answering the hello")
        buffer += chunk
        try:
            reason = parse_reply(buffer)
        except HandshakeRefused as exc:
            raise ReceptiveRefusedError(exc.reason) from None
        if reason is not None:
            return reason


class ReceptiveDialer:
    """Keeps a session up to every receptive agent this replica is home for."""

    def __init__(
        self,
        agents: Sequence[AgentEntry],
        *,
        sessions: SessionHandler,
        authenticate: Authenticate,
        membership: Membership | None,
        stop: trio.Event,
        handshake_timeout: float = 10.0,
        session_kwargs: dict[str, Any] | None = None,
        rand: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.agents = [agent for agent in agents if agent.receptive is not None]
        #: agent id → its credentials (read again when their files change)
        self.credentials = {agent.id: ReceptiveCredentials(agent.id, agent.receptive) for agent in self.agents
                            if agent.receptive is not None}
        self.sessions = sessions
        self.authenticate = authenticate
        self.membership = membership
        self.stop = stop
        self.handshake_timeout = handshake_timeout
        self.session_kwargs = session_kwargs or {}
        self._rand = rand or random.Random()
        self._clock = clock
        self._failures_log = BurstLimitedLog(log, interval=10.0)
        #: agent id → its session, while one is up from here
        self.up: dict[int, Session] = {}
        #: dials made, and dials that ended in no session
        self.dials = 0
        self.failures = 0

    def reload(self) -> None:
        """Look at every TLS file now (SIGHUP); the JWT keys are looked at at every dial anyway."""
        reload_all(credentials.tls for credentials in self.credentials.values())

    # ---- who dials

    def is_home(self, agent_id: int) -> bool:
        if self.membership is None:
            return True
        return self.membership.ring.home(str(agent_id)) == self.membership.self_name

    def _changes(self) -> trio.Event:
        return self.membership.changes() if self.membership is not None else trio.Event()

    # ---- lifetime

    async def run(self) -> None:
        if not self.agents:
            return
        # At ``stop`` (kasd drains) no agent is dialled again; the sessions up are drained with
        # every other (``kasd.drain``), so they are not cancelled here.
        async with trio.open_nursery() as nursery:
            for agent in self.agents:
                nursery.start_soon(self._keep, agent)

    async def _keep(self, agent: AgentEntry) -> None:
        entry = agent.receptive
        assert entry is not None
        outage_began: float | None = None
        failures = 0
        while not self.stop.is_set():
            changed = self._changes()  # taken before reading the ring: no change is missed
            if not self.is_home(agent.id):
                await _first(changed, self.stop)
                continue
            self.dials += 1
            began = trio.current_time()
            try:
                # (files read again when they changed; a file that never loaded is this agent's problem only)
                credentials = self.credentials[agent.id]
                error = await self._dial_and_serve(agent, entry, credentials.context(), credentials.key())
            except (OSError, ssl.SSLError, Problem, TLSLoadError) as exc:
                error = f"cannot load kasd's credentials for this agent: {getattr(exc, 'text', None) or exc}"
            except Exception as exc:  # a bug must not take kasd (or the other agents) down
                log.exception("receptive dial failed unexpectedly agent_id=%d", agent.id)
                error = f"unexpected {type(exc).__name__}"
            now = trio.current_time()
            if error is None:
                if now - began >= STABLE_AFTER:
                    outage_began, failures = None, 0
                else:  # up and soon down again: paced like a failure, so a flapping agent is no storm
                    failures += 1
                    outage_began = now if outage_began is None else outage_began
                self._failures_log.flush(agent.id)
                delay = self._rand.uniform(0.0, 0.2) if failures == 0 else self._delay(now, outage_began, failures)
            else:
                self.failures += 1
                failures += 1
                outage_began = now if outage_began is None else outage_began
                delay = self._delay(now, outage_began, failures)
                self._failures_log.warning(
                    agent.id, "receptive agent unreachable agent_id=%d url=%s error=%s retry_in=%.2fs",
                    agent.id, entry.url, error, delay)
            with trio.move_on_after(delay):
                await _first(self._changes(), self.stop)  # a new ring: reconsider at once

    def _delay(self, now: float, outage_began: float | None, failures: int) -> float:
        if outage_began is None or now - outage_began < QUICK_WINDOW:
            return self._rand.uniform(0.0, QUICK_DELAY)
        return self._rand.uniform(0.0, min(MAX_DELAY, QUICK_DELAY * 2 ** min(failures, 16)))

    async def _dial_and_serve(self, agent: AgentEntry, entry: ReceptiveEntry, context: ssl.SSLContext,
                              key: OKPKey | None) -> str | None:
        """One dial and the session on it, until it ends (or this replica stops being the home and
        drained it). None when a session came up; else why not, in words (no credential)."""
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(self.handshake_timeout):
                stream = fast_stream(await trio.open_tcp_stream(entry.host, entry.port))
                tls = tls_stream(stream, context, server_hostname=entry.tls_host or entry.host)
                await tls.do_handshake()
                stream = tls
                credential = MTLS_CREDENTIAL if key is None else mint_token(key, agent_id=agent.id, now=self._clock())
                await tls.send_all(hello(credential))
                reason = await read_reply(tls)
            if reason:
                raise ReceptiveRefusedError(f"agentd refused kasd: {reason}")
        except (OSError, ssl.SSLError, trio.BrokenResourceError, trio.TooSlowError, ReceptiveRefusedError) as exc:
            if stream is not None:
                with trio.move_on_after(1, shield=True):
                    await stream.aclose()
            return _why(exc, self.handshake_timeout)
        came_up = trio.Event()
        async with trio.open_nursery() as nursery:

            async def handler(session: Session, principal: Any) -> None:
                self.up[agent.id] = session
                came_up.set()
                nursery.start_soon(self._hand_over_when_not_home, agent.id, session)
                log.info("receptive agent connected agent_id=%d url=%s", agent.id, entry.url)
                try:
                    await self.sessions(session, principal)
                finally:
                    self.up.pop(agent.id, None)
                    log.info("receptive agent session ended agent_id=%d", agent.id)

            await serve_h2_connection(
                stream, handler, authenticate=only_the_dialled_agent(self.authenticate, agent.id), path=DEFAULT_PATH,
                handshake_timeout=self.handshake_timeout, session_kwargs=self.session_kwargs)
            nursery.cancel_scope.cancel()
        return None if came_up.is_set() else "agentd's tunnel request was refused or never came (see the tunnel lines)"

    async def _hand_over_when_not_home(self, agent_id: int, session: Session) -> None:
        while True:
            changed = self._changes()
            if not self.is_home(agent_id):
                break
            await changed.wait()
        log.info("receptive agent handed over agent_id=%d reason=another replica is its home", agent_id)
        with trio.move_on_after(HANDOVER_DRAIN):
            await session.drain("another kasd replica is this receptive agent's home")
        await session.aclose()


async def _first(*events: trio.Event) -> None:
    """Return once any of ``events`` is set."""
    async with trio.open_nursery() as nursery:
        for event in events:

            async def wait(event: trio.Event = event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)


def only_the_dialled_agent(authenticate: Authenticate, agent_id: int) -> Authenticate:
    """The agent port's authentication, and the agent must be the one kasd dialled (GitLab: "provided
    agent token belongs to a different agent id")."""

    async def check(token: str, headers: dict[str, str]) -> Any:
        principal = await authenticate(token, headers)
        if principal is not None and getattr(principal, "id", None) != agent_id:
            raise TunnelRejectedError(403, "provided agent token belongs to a different agent id")
        return principal

    return check


def _why(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, trio.TooSlowError):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, ReceptiveRefusedError):
        return str(exc)
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc}"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)[:200] or type(exc).__name__
    return type(exc).__name__


__all__: list[str] = ["ReceptiveCredentials", "ReceptiveDialer", "ReceptiveRefusedError", "client_ssl_context"]
