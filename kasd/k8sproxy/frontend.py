"""What the proxy's listener gives each protocol front end: the limits a connection lives under,
the drain state, where rejected requests are counted, where exchanges go — and the one
``ConnectionClock`` both front ends keep, so an HTTP/1.1 and an HTTP/2 client meet the same rules.

``server`` builds one ``FrontEndContext`` per port; ``http1``/``http2`` read it and never import
``server`` or the pipeline, so the import arrows point one way (server → front ends → this).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from daemonkit.logs import UnexpectedErrors
from h2trio.budget import ResetBucket, ResetBuckets, ResetLimit
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import Exchange
from kasd.k8sproxy.status import ProxyError
from netio.admission import source_of
from netio.fastio import peer_host

#: requests answered without authorization (401, 403…) a connection that never had one authorized
#: may have before it is closed: kubectl with a bad token sends one or two before it gives up
UNAUTHORIZED_ANSWERS = 4


class ConnectionLimits(Protocol):
    """The bounds of one connection (``kasd.config.KubernetesAPIListener`` has them)."""

    @property
    def max_header_bytes(self) -> int: ...
    @property
    def header_timeout(self) -> float: ...
    @property
    def idle_timeout(self) -> float: ...
    @property
    def http2(self) -> Http2ClientLimits: ...


class Http2ClientLimits(Protocol):
    """What an HTTP/2 client may cost: the part of ``kasd.config.Http2Limits`` the front ends read
    (they never import the config)."""

    @property
    def reset_limit(self) -> ResetLimit: ...


class ServeExchange(Protocol):
    def __call__(
        self,
        ex: Exchange,
        *,
        refusal: ProxyError | None = None,
        log_dropped: bool = True,
        done: Callable[[RequestRecord], object] | None = None,
        proven: Callable[[], object] | None = None,
    ) -> Awaitable[None]: ...


@attrs.define(eq=False, kw_only=True)
class FrontEndContext:
    limits: ConnectionLimits
    #: answers one exchange (the request pipeline)
    serve: ServeExchange
    #: counts a request answered before it became an exchange (unparseable, too slow)
    count_rejected: Callable[[int], None]
    #: no new requests: idle connections close, busy ones after their current requests
    draining: bool = False
    #: cancel scopes of connections waiting idle for a request; cancelled when draining starts
    idle_scopes: set[trio.CancelScope] = attrs.field(factory=set)
    #: the HTTP/2 reset budget of each source address, shared by its connections (None: each
    #: connection has its own)
    reset_buckets: ResetBuckets | None = None
    #: where an exception nobody expected is reported (one rate-limited line): the request it hit
    #: ends, its connection's other requests go on
    unexpected: UnexpectedErrors = attrs.field(factory=lambda: UnexpectedErrors(logging.getLogger("kasd.k8sproxy")))
    #: ``serve`` tells through ``done(record)`` whether each request was authorized (``agent_id``),
    #: and a connection none of whose requests was is held to the head deadline and closed after
    #: ``UNAUTHORIZED_ANSWERS`` answers (the proxy port). False: the port's requests carry no such
    #: verdict (the REST API port, whose app checks a job token on every call): its connections
    #: live under the head and idle clocks alone.
    authorizes: bool = True

    def clock(self, head_deadline: float, now: float) -> ConnectionClock:
        """The clock of a connection accepted at ``now`` whose first head is due at ``head_deadline``."""
        return ConnectionClock(
            head_deadline=head_deadline,
            header_timeout=self.limits.header_timeout,
            idle_timeout=self.limits.idle_timeout,
            gated=self.authorizes,
            idle_since=now,
        )

    def reset_bucket(self, peer: str) -> ResetBucket | None:
        """The reset budget of ``peer``'s (``host:port``) source, shared with its other connections."""
        if self.reset_buckets is None:
            return None
        return self.reset_buckets.bucket(source_of(peer_host(peer).strip("[]")), trio.current_time())


@attrs.define(kw_only=True)
class ConnectionClock:
    """The clocks of one client connection, the same for HTTP/1.1 and HTTP/2: when to stop waiting
    for the client's next request (head, idle), when a head in progress is due, how long an answer
    on an unproven connection may take, and when the connection is over (the drain, the count of
    answers without authorization). Sans-I/O: every time is an argument (the front end reads
    trio's clock); the front end only reports what happened.

    The clocks count requests, not bytes or frames: PING, SETTINGS, WINDOW_UPDATE reset nothing.

    - Until one of its requests was authorized (``gated`` ports), ``head_deadline`` (``header_timeout``
      from accept) is a hard deadline for the whole connection: it closes then once no request
      runs, and an answer sent on it must be taken by then. After ``UNAUTHORIZED_ANSWERS``
      requests answered without authorization it takes no new request and closes as soon as
      none runs.
    - Once authorized (or on a port that is not ``gated``, after its first request), the
      connection waits ``idle_timeout`` from the end of its last request for the next one, and a
      head begun then (HTTP/1.1: its first byte) has ``header_timeout`` to be whole.
    - Draining, it takes no new request and closes as soon as none runs.
    """

    #: the first head is due (``header_timeout`` from accept, the TLS handshake included)
    head_deadline: float
    header_timeout: float
    idle_timeout: float
    #: held to the authorization rules (``FrontEndContext.authorizes``)
    gated: bool = True
    #: when the last request ended (or the connection was accepted): the idle clock's start
    idle_since: float
    #: a request on this connection was authorized
    authenticated: bool = False
    #: requests taken (heads whole and well-formed)
    requests_seen: int = 0
    #: requests taken and not yet over
    running: int = 0
    #: requests answered without authorization while the connection never had one authorized
    unauthorized: int = 0
    #: the connection takes no new request and closes once none runs
    closing: bool = False

    @property
    def unproven(self) -> bool:
        """Held to the head deadline: none of its requests was authorized yet."""
        return self.gated and not self.authenticated

    # ------------------------------------------------------------------ what the front end reports

    def request_started(self) -> None:
        self.requests_seen += 1
        self.running += 1

    def request_proved(self) -> None:
        """A request of this connection was just authorized (before its answer: one that waits for
        its agent is then not held to the head deadline)."""
        self.authenticated = True

    def request_ended(self, record: RequestRecord | None, now: float) -> None:
        """A request is over; ``record`` says how it went (None: nothing reached the pipeline)."""
        self.running -= 1
        if record is not None:
            if record.agent_id is not None:
                self.authenticated = True
            elif self.unproven and not record.dropped:
                self.unauthorized += 1
                if self.unauthorized >= UNAUTHORIZED_ANSWERS:
                    self.closing = True
        if not self.running:
            self.idle_since = now

    # ------------------------------------------------------------------ what the front end asks

    def next_request_deadline(self) -> float:
        """Until when to wait for the next request (none of it received yet): the head deadline
        for the first one and on an unproven connection, else the idle clock; no deadline while a
        request runs."""
        if self.running:
            return math.inf
        if not self.requests_seen or self.unproven:
            return self.head_deadline  # hard: authorized by then, or closed
        return self.idle_since + self.idle_timeout

    def head_due(self, now: float) -> float:
        """When a head whose first byte came at ``now`` must be whole (HTTP/1.1)."""
        if not self.requests_seen or self.unproven:
            return self.head_deadline
        return now + self.header_timeout

    def answer_deadline(self) -> float:
        """By when an answer kasd composed (a Status) must be taken: a connection none of whose
        requests was authorized does not outlive its head deadline by not reading one."""
        return self.head_deadline if self.unproven else math.inf

    def past_head_deadline(self, now: float) -> bool:
        """The connection is unproven and its head deadline passed: it closes."""
        return self.unproven and now >= self.head_deadline

    def expiry(self) -> str:
        """What an unproven connection closed at its head deadline did (for its log line)."""
        return "sent no authorized request in time" if self.requests_seen else "sent no request in time"

    @property
    def answer_may_be_last(self) -> bool:
        """One more answer without authorization closes the connection. HTTP/1.1 says
        ``Connection: close`` on a Status kasd composes now: whether its request was authorized is
        known only once it is over (``done(record)``), and a client told so dials again instead of
        losing its next request to the close."""
        return self.unproven and self.unauthorized + 1 >= UNAUTHORIZED_ANSWERS

    def takes_requests(self, draining: bool) -> bool:
        """A new request may start."""
        return not (draining or self.closing)

    def over(self, draining: bool) -> bool:
        """The connection is done: no request runs and it takes no new one."""
        return not self.running and not self.takes_requests(draining)
