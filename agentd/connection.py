"""The connection manager: keeps ``connections`` tunnels to kasd up and serves the streams on them.

Each slot dials (round-robin over the kasd addresses), serves the session until it ends, and dials
again, waiting as its ``agentd.redial.RedialSchedule`` says: for the first minute of any outage at
most 2 s between dials (full jitter), so the slot is back within about 2 s of kasd, however soon
the outage follows the last one; then exponentially longer, up to a minute. A kasd that refuses the
token, or keeps dropping tunnels soon after they come up, is backed off from exponentially instead.
On GOAWAY the slot dials a replacement at once while the old session drains its in-flight streams
in the background.

Among kasd replicas, kasd sends a ``placement`` NOTICE (docs/routing.md, "Home placement"): the
replicas in ring order from the agent's home. Slot ``i`` then belongs on ``replicas[i % n]`` (slot 0
on the home). A slot whose tunnel is elsewhere dials its replica first and only then drains the old
tunnel (make-before-break); a replica it cannot reach, or whose tunnel broke, is passed over for
``PLACEMENT_SKIP`` seconds or until the next placement, and the slot fails over to the next replica
within ``FAILOVER_JITTER`` instead of backing off (the configured addresses remain the fallback). A placement never moves a tunnel from https to http,
and an https one is verified with the same CA as the configured addresses. An agentd with a ``ws://`` or ``wss://``
address dials placements over a WebSocket (kasd names them by their HTTP/2 URLs; both carriers share port and path).
"""

from __future__ import annotations

import logging
import math
import random
import ssl
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

from agentd.neterrors import failure_reason
from agentd.redial import Backoff, RedialSchedule
from daemonkit.logs import BurstLimitedLog, UnexpectedErrors
from wire.carrier import TunnelRejectedError
from wire.frames import Metadata
from wire.h2carrier import open_h2_session
from wire.notices import parse_placement
from wire.session import MuxStream, Session, SessionClosedError
from wire.wscarrier import open_ws_session

log = logging.getLogger("agentd.connection")
#: a stream whose handler failed unexpectedly (a bug a request reached): one line per kind a minute
_unexpected = UnexpectedErrors(log)

Dial = Callable[[str, str, Metadata], AbstractAsyncContextManager[Session]]
StreamHandler = Callable[[MuxStream], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]

#: a placement URL's scheme as an agentd that dials kasd over a WebSocket dials it
_WEBSOCKET_SCHEMES = {"https": "wss", "http": "ws"}
#: seconds a placement's replica that could not be reached is passed over (or until a new placement)
PLACEMENT_SKIP = 30.0

#: a tunnel on a replica that broke (a crash, not a drain) or a dial it refused is replaced on the
#: placement's next replica within this many seconds (spread: its other agents do the same), not
#: after the backoff meant for kasd being away as a whole
FAILOVER_JITTER = 0.2

#: what a failed dial is expected to raise (anything else is logged with its traceback, then retried)
_DIAL_ERRORS = (OSError, TunnelRejectedError, SessionClosedError, trio.BrokenResourceError, ssl.SSLError, ValueError)


@attrs.frozen(kw_only=True)
class ManagerStatistics:
    tunnels_up: int
    tunnels_draining: int
    dials: int
    failures: int
    rejected: int
    goaways: int
    streams_active: int
    streams_handled: int
    #: tunnels that ended (GOAWAY or broken) and were dialled again
    reconnects: int = 0


@attrs.define(eq=False)
class Tunnel:
    url: str
    session: Session
    slot: int
    started_at: float
    goaway: bool = False
    draining: bool = False
    active: int = 0
    idle: trio.Event = attrs.field(factory=trio.Event)
    #: set to retire the tunnel (its slot moved elsewhere): it drains and ends
    retire: trio.Event = attrs.field(factory=trio.Event)


class ConnectionManager:
    def __init__(
        self,
        urls: Sequence[str],
        *,
        token_file: Path,
        handler: StreamHandler,
        metadata: Metadata,
        connections: int = 2,
        backoff: Backoff | None = None,
        stable_after: float = 30.0,
        quick_window: float = 60.0,
        dial_timeout: float = 10.0,
        shutdown_grace: float = 10.0,
        kas_ssl_context: ssl.SSLContext | None = None,
        rand: random.Random | None = None,
        sleep: Sleep = trio.sleep,
        dial: Dial | None = None,
        session_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one kasd address is needed")
        self.urls = tuple(urls)
        self.token_file = token_file
        self.handler = handler
        self.metadata = dict(metadata)
        self.connections = connections
        self.backoff = backoff or Backoff()
        self.stable_after = stable_after
        self.quick_window = quick_window
        self.dial_timeout = dial_timeout
        self.shutdown_grace = shutdown_grace
        self._kas_ssl = kas_ssl_context
        self._rand = rand or random.Random()
        self._sleep = sleep
        self._dial = dial or self._dial_h2
        self._session_kwargs = session_kwargs or {}
        self._next = 0
        self._tunnels: set[Tunnel] = set()
        self._dial_scope: trio.CancelScope | None = None
        self._stopping = False
        self._dials = 0
        self._failures = 0
        self._rejected = 0
        self._goaways = 0
        self._handled = 0
        self._reconnects = 0
        # A dial fails about once a second per slot in an outage's first minute: one
        # warning per slot every 10 s, with the count of those held back.
        self._dial_failures_log = BurstLimitedLog(log, interval=10.0, clock=trio.current_time)
        #: set once the first tunnel is up (readiness, the ready file, sd_notify)
        self.first_up = trio.Event()
        #: kasd's latest placement: agent URLs in ring order from the home (None: none received)
        self.placement: tuple[str, ...] | None = None
        self._placement_changed = trio.Event()
        self._skip_until: dict[str, float] = {}
        #: set (and replaced) at every tunnel up or down
        self._tunnels_changed = trio.Event()
        schemes = {urlsplit(u).scheme for u in self.urls}
        #: kasd names its replicas by their HTTP/2 URLs; an agentd configured with a WebSocket address
        #: (ws:// or wss://, any of its addresses) dials them over a WebSocket (the same port and path)
        self._placement_carrier = _WEBSOCKET_SCHEMES if schemes & {"ws", "wss"} else {}
        schemes = {self._placement_carrier.get(s, s) for s in schemes}
        tls = "wss" if self._placement_carrier else "https"
        #: a placement may name only these schemes (never plaintext when TLS is configured)
        self._placement_schemes = {tls} if tls in schemes else schemes

    # ---- introspection

    @property
    def tunnels_up(self) -> int:
        return sum(1 for t in self._tunnels if not t.draining)

    def statistics(self) -> ManagerStatistics:
        return ManagerStatistics(
            tunnels_up=self.tunnels_up,
            tunnels_draining=sum(1 for t in self._tunnels if t.draining),
            dials=self._dials,
            failures=self._failures,
            rejected=self._rejected,
            goaways=self._goaways,
            streams_active=sum(t.active for t in self._tunnels),
            streams_handled=self._handled,
            reconnects=self._reconnects,
        )

    def sessions(self) -> list[Session]:
        return [t.session for t in self._tunnels]

    def up_sessions(self) -> list[Session]:
        """The sessions of tunnels that are up and not draining, oldest first: where agentd may open
        a stream of its own to kasd (``open_stream``)."""
        return [t.session for t in sorted(self._tunnels, key=lambda t: t.started_at)
                if not t.draining and not t.session.closed and not t.session.draining]

    async def wait_tunnels_changed(self) -> None:
        """Return at the next tunnel up or down (or beginning to drain)."""
        await self._tunnels_changed.wait()

    def _notify_tunnels(self) -> None:
        self._tunnels_changed.set()
        self._tunnels_changed = trio.Event()

    async def open_stream(self, metadata: Metadata) -> MuxStream:
        """A stream agentd opens to kasd (``tunnelhttp.kinds``: agentd → kasd) on one of the tunnels
        that are up (the oldest that takes it); ``SessionClosedError`` when none does. The caller
        bounds the time (``trio.fail_after``)."""
        last: BaseException | None = None
        for session in self.up_sessions():
            try:
                return await session.open_stream(metadata)
            except (SessionClosedError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                last = exc
        raise SessionClosedError(f"no tunnel to kasd is up{f' ({last})' if last else ''}")

    # ---- lifetime

    async def run(self, *, task_status: trio.TaskStatus[ConnectionManager] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep tunnels up until ``stop()``; then drain in-flight streams (bounded) and return."""
        async with trio.open_nursery() as tunnels:
            with trio.CancelScope() as self._dial_scope:
                if self._stopping:
                    self._dial_scope.cancel()
                async with trio.open_nursery() as slots:
                    for index in range(self.connections):
                        slots.start_soon(self._slot, index, tunnels)
                    task_status.started(self)
            await self._drain_all()
            tunnels.cancel_scope.cancel()

    def stop(self) -> None:
        """Stop dialing; ``run`` then drains the tunnels and returns."""
        self._stopping = True
        if self._dial_scope is not None:
            self._dial_scope.cancel()

    async def _drain_all(self) -> None:
        live = list(self._tunnels)
        if not live:
            return
        log.info("draining tunnels=%d grace=%.1fs", len(live), self.shutdown_grace)
        with trio.move_on_after(self.shutdown_grace) as scope:
            async with trio.open_nursery() as nursery:
                for tunnel in live:
                    tunnel.draining = True
                    nursery.start_soon(tunnel.session.drain, "agentd shutting down")
        if scope.cancelled_caught:
            log.warning("drain grace ran out streams_left=%d", sum(t.active for t in live))

    # ---- one slot: dial, serve, dial again

    # ---- placement (kasd replicas)

    def on_notice(self, metadata: Metadata) -> None:
        """A NOTICE from kasd (runs in the session's reader: no blocking)."""
        replicas = parse_placement(metadata)
        if replicas is None:
            return  # not a placement, or not one this agentd understands
        urls = []
        for _name, given in replicas:
            parts = urlsplit(given)
            url = parts._replace(scheme=self._placement_carrier.get(parts.scheme, parts.scheme)).geturl()
            if urlsplit(url).scheme not in self._placement_schemes:
                log.warning("ignored a placement URL with another scheme than the configured addresses url=%s", url)
                continue
            urls.append(url)
        placement = tuple(urls) or None
        if placement != self.placement:
            self.placement = placement
            # A new table is news about the replicas (one left, one came back): try them afresh.
            self._skip_until.clear()
            log.info("placement home=%s replicas=%d", placement[0] if placement else None, len(urls))
            self._placement_changed.set()
            self._placement_changed = trio.Event()

    def _placement_target(self, index: int, *, afresh_but: str | None = None) -> str | None:
        """Where slot ``index`` belongs by kasd's placement (replicas found unreachable passed over).

        ``afresh_but``: when every replica is passed over, try all but this one again (a tunnel on
        it just broke; the replicas that broke earlier ones were probably restarted since)."""
        if self.placement is None:
            return None
        now = trio.current_time()
        usable = [u for u in self.placement if self._skip_until.get(u, -math.inf) <= now]
        if not usable and afresh_but is not None:
            self._skip_until = {u: t for u, t in self._skip_until.items() if u == afresh_but}
            usable = [u for u in self.placement if u != afresh_but]
        return usable[index % len(usable)] if usable else None

    def _skip(self, url: str) -> None:
        if self.placement is not None and url in self.placement:
            self._skip_until[url] = trio.current_time() + PLACEMENT_SKIP

    def _elsewhere(self, index: int, url: str, *, broke: bool = False) -> bool:
        """Passing over ``url``, slot ``index`` has another replica of the placement to go to.

        ``broke``: a tunnel on ``url`` broke (rather than a dial to it failing): replicas passed
        over earlier are tried afresh if none is left. A failed dial never does that, so a fleet
        that is down as a whole gets at most one quick dial per replica, then the backoff."""
        self._skip(url)
        return self._placement_target(index, afresh_but=url if broke else None) is not None

    def _next_skip_expiry(self) -> float:
        now = trio.current_time()
        return min((t for t in self._skip_until.values() if t > now), default=math.inf)

    async def _until_ended_or_moved(self, tunnel: Tunnel, ended: trio.Event) -> bool:
        """Wait until the tunnel ended (False) or its slot belongs on another replica (True)."""
        while True:
            changed = self._placement_changed
            target = self._placement_target(tunnel.slot)
            if ended.is_set():
                return False
            if target is not None and target != tunnel.url:
                return True
            async with trio.open_nursery() as nursery:
                # ... or until a replica passed over may be tried again (its slot's home, say)
                nursery.cancel_scope.deadline = self._next_skip_expiry()

                async def wait(event: trio.Event) -> None:
                    await event.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(wait, ended)
                nursery.start_soon(wait, changed)

    async def _move(self, tunnel: Tunnel, tunnels: trio.Nursery) -> tuple[Tunnel, trio.Event] | None:
        """Make-before-break: a tunnel to the slot's placement target, then retire the old one.
        None (the old one stays) when the target cannot be reached."""
        target = self._placement_target(tunnel.slot)
        assert target is not None
        ended = trio.Event()
        self._dials += 1
        try:
            with trio.fail_after(self.dial_timeout):
                new: Tunnel = await tunnels.start(self._run_tunnel, target, tunnel.slot, ended)
        except Exception as exc:
            self._failures += 1
            self._skip(target)
            log.warning("placement: replica unreachable, staying put url=%s slot=%d error=%r skip=%gs",
                        target, tunnel.slot, failure_reason(exc, host=urlsplit(target).hostname), PLACEMENT_SKIP)
            return None
        log.info("tunnel moved url=%s to=%s slot=%d reason=placement", tunnel.url, target, tunnel.slot)
        tunnel.retire.set()
        return new, ended

    def _next_url(self) -> str:
        url = self.urls[self._next % len(self.urls)]
        self._next += 1
        return url

    def schedule(self) -> RedialSchedule:
        """A new slot's reconnect schedule, with this manager's numbers."""
        return RedialSchedule(backoff=self.backoff, stable_after=self.stable_after, quick_window=self.quick_window)

    async def _slot(self, index: int, tunnels: trio.Nursery) -> None:
        schedule = self.schedule()
        failed_dials = 0  # in a row, for the log
        while True:
            url = self._placement_target(index) or self._next_url()
            self._dials += 1
            ended = trio.Event()
            try:
                with trio.fail_after(self.dial_timeout):
                    tunnel: Tunnel = await tunnels.start(self._run_tunnel, url, index, ended)
            except Exception as exc:  # a daemon keeps trying; only the unexpected gets a traceback
                if isinstance(exc, trio.TooSlowError):
                    exc = TimeoutError(f"no tunnel within {self.dial_timeout:g}s")
                elif not isinstance(exc, _DIAL_ERRORS):
                    log.exception("unexpected dial failure url=%s slot=%d", url, index)
                self._failures += 1
                failed_dials += 1
                # kasd answering and refusing the token is no outage: retrying every second would
                # not change its mind
                refused = isinstance(exc, TunnelRejectedError) and exc.status in (401, 403)
                delay = schedule.after_failure(trio.current_time(), self._rand, refused=refused)
                if self._elsewhere(index, url):
                    delay = self._rand.uniform(0.0, FAILOVER_JITTER)  # the next replica, not a backoff
                self._log_dial_failure(url, index, exc, failed_dials, delay)
                await self._sleep(delay)
                continue
            failed_dials = 0
            schedule.tunnel_up()
            self._dial_failures_log.flush(index)
            while await self._until_ended_or_moved(tunnel, ended):
                moved = await self._move(tunnel, tunnels)
                if moved is None:
                    # Unreachable: skipped for a while; wait for the tunnel's end or the next change.
                    continue
                tunnel, ended = moved
            now = trio.current_time()
            up_for = now - tunnel.started_at
            # GOAWAY: replaced at once (the old session drains meanwhile) unless this slot's tunnels
            # keep ending soon after they start; then it is backed off from like any failure.
            delay = schedule.after_drop(now, up_for, self._rand, goaway=tunnel.goaway)
            if not tunnel.goaway:
                self._failures += 1
                if self._elsewhere(index, tunnel.url, broke=True):
                    # The replica broke the tunnel (crashed, most likely) and others are placed: fail
                    # over to the next one now; its requests are waiting for a tunnel anywhere.
                    delay = self._rand.uniform(0.0, FAILOVER_JITTER)
            self._reconnects += 1
            log.info("redialing slot=%d after=%.2fs up_for=%.1fs reason=%s%s", index, delay, up_for,
                     "goaway" if tunnel.goaway else "closed", " flapping=1" if schedule.flapping else "")
            await self._sleep(delay)

    def _log_dial_failure(self, url: str, index: int, exc: BaseException, failures: int, delay: float) -> None:
        if isinstance(exc, TunnelRejectedError) and exc.status in (401, 403):
            self._rejected += 1
            log.error(
                "kasd rejected the agent token url=%s slot=%d status=%d reason=%r hint=%r retry_in=%.2fs",
                url, index, exc.status, exc.message.strip(), "check --token-file / AGENTD_TOKEN_FILE", delay,
            )
        else:
            self._dial_failures_log.warning(index, "dial failed url=%s slot=%d failures=%d error=%r retry_in=%.2fs",
                                            url, index, failures, failure_reason(exc, host=urlsplit(url).hostname), delay)

    def _dial_h2(self, url: str, token: str, metadata: Metadata) -> AbstractAsyncContextManager[Session]:
        ctx = self._kas_ssl if url.startswith(("https://", "wss://")) else None
        # The scheme picks the carrier: ws:// and wss:// a WebSocket, http:// and https:// HTTP/2.
        open_carrier = open_ws_session if url.startswith(("ws://", "wss://")) else open_h2_session
        return open_carrier(url, token=token, ssl_context=ctx, metadata=metadata, **self._session_kwargs)

    async def _run_tunnel(self, url: str, index: int, ended: trio.Event, *,
                          task_status: trio.TaskStatus[Tunnel] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise OSError(f"cannot read token file {self.token_file}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"token file {self.token_file} is empty")
        tunnel: Tunnel | None = None
        try:
            async with self._dial(url, token, self.metadata) as session:
                tunnel = Tunnel(url=url, session=session, slot=index, started_at=trio.current_time())
                self._tunnels.add(tunnel)
                self.first_up.set()
                self._notify_tunnels()
                log.info("tunnel up url=%s slot=%d tunnels_up=%d", url, index, self.tunnels_up)
                task_status.started(tunnel)
                async with trio.open_nursery() as handlers:

                    def serve(stream: MuxStream) -> None:
                        # Runs in the session's reader, as each OPEN arrives; a task per stream.
                        handlers.start_soon(self._serve_stream, tunnel, stream)
                        tunnel.active += 1

                    session.hand_streams_to(serve)
                    session.on_notice = self.on_notice
                    async with trio.open_nursery() as until:

                        async def goaway() -> None:
                            await session.wait_goaway()
                            until.cancel_scope.cancel()

                        async def retired() -> None:
                            await tunnel.retire.wait()
                            tunnel.draining = True
                            # Our own GOAWAY: kasd opens nothing new here; what is in flight finishes.
                            await session.drain("agentd moves this tunnel to its placement")
                            until.cancel_scope.cancel()

                        until.start_soon(goaway)
                        until.start_soon(retired)
                    tunnel.goaway = session.statistics().goaway_received and not session.closed
                    tunnel.draining = True
                    self._notify_tunnels()
                    if tunnel.goaway:
                        self._goaways += 1
                        log.info("tunnel draining after GOAWAY url=%s slot=%d streams=%d", url, index, tunnel.active)
                    ended.set()
                    if tunnel.active == 0:
                        tunnel.idle.set()
                    await tunnel.idle.wait()
                    handlers.cancel_scope.cancel()
        finally:
            if tunnel is not None:
                self._tunnels.discard(tunnel)
                self._notify_tunnels()
                reason = tunnel.session.close_reason
                log.info("tunnel down url=%s slot=%d reason=%r tunnels_up=%d", url, index,
                         reason.reason if reason else "drained", self.tunnels_up)
            ended.set()

    async def _serve_stream(self, tunnel: Tunnel, stream: MuxStream) -> None:
        try:
            await self.handler(stream)
        except Exception as exc:  # one stream's failure never takes the tunnel down
            _unexpected.report(exc, "stream handler failed unexpectedly stream=%d", stream.stream_id)
            with trio.move_on_after(1, shield=True):
                await stream.reset()
        finally:
            tunnel.active -= 1
            self._handled += 1
            if tunnel.draining and tunnel.active == 0:
                tunnel.idle.set()
