"""One logical stream from kasd → one exchange with the Kubernetes API server (``KubeApiProxy``) or,
through the same machinery (``StreamProxy``), with an in-cluster service (``agentd.serviceproxy``).

The stream's OPEN metadata is a ``RequestHead``; the request body follows on the stream. agentd
answers ACCEPT with the ``ResponseHead`` and streams the body back, or REFUSEs with a ``TunnelCode``
when it cannot get an answer. An API server that took the request but sent no response head in time
gets the client a 504 Status of agentd's own (it may have acted on the request: an answer, so kasd
retries it nowhere else). A ``101`` makes the stream a raw byte pipe both ways. When kasd resets the
stream (the client went away) the upstream exchange is cancelled and its connection closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from agentd.upstream import (
    InvalidRequest,
    RequestAborted,
    UpstreamLost,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from daemonkit.logs import request_context
from netio.fastio import cancel_point
from netio.relay import relay
from tunnelhttp.drain import Drain
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode
from tunnelhttp.kinds import KIND_K8S_API
from tunnelhttp.watchbounds import EventBoundary
from wire.errors import RemoteProtocolError
from wire.session import MuxStream

log = logging.getLogger("agentd.proxy")

_CHUNK = 256 * 1024  # per-chunk Python work dominates bulk transfers: fewer, larger chunks


@attrs.frozen(kw_only=True)
class UpstreamRequestRecord:
    """What one request did (the log line, and a hook for tests)."""

    method: str
    path: str
    status: int | None
    #: ok, drained, refused, client-gone, upstream-lost, upstream-timeout; for a service also
    #: forbidden (403) and bad-target (400)
    outcome: str
    bytes_in: int
    bytes_out: int
    duration: float
    request_id: str
    #: for a stream of kind ``service``: the service it named
    service: str | None = None
    #: seconds from sending the request upstream to its response head (None: no response head came)
    upstream_latency: float | None = None


@attrs.define(eq=False)
class ExchangeCounters:
    """What one exchange has done so far (for its record)."""

    bytes_in: int = 0
    bytes_out: int = 0
    status: int | None = None
    outcome: str = "ok"
    upstream_latency: float | None = None


class StreamProxy:
    """One logical stream from kasd → one HTTP exchange through an ``UpstreamPool``: the machinery
    every kind of HTTP stream shares (the exchange, the relay after 101, the drain, the record and
    its log line). A subclass says which kind it serves and, in ``route``, which pool takes a head
    (or answers it itself)."""

    kind = KIND_K8S_API
    #: before the message of a Status agentd answers itself (a service's answers say who spoke)
    status_prefix = ""

    def __init__(self, *, on_done: Callable[[UpstreamRequestRecord], None] | None = None,
                 drain: Drain | None = None) -> None:
        self.on_done = on_done
        self.active = 0
        #: begun when agentd starts to shut down: watches and followed logs end between two events
        self.drain = drain if drain is not None else Drain()

    async def route(self, stream: MuxStream, head: RequestHead,
                    counters: ExchangeCounters) -> tuple[UpstreamPool, RequestHead] | None:
        """The pool that serves ``head`` and the head to send it (its headers cleaned as this kind
        needs), or None when this answered (or refused) the stream itself."""
        raise NotImplementedError

    async def bad_head(self, stream: MuxStream, problem: RemoteProtocolError, counters: ExchangeCounters) -> None:
        """The OPEN's metadata is not a request head: refused with ``BAD_REQUEST``."""
        counters.outcome = "refused"
        await refuse(stream, TunnelCode.BAD_REQUEST, f"bad request head: {problem}")

    async def handle(self, stream: MuxStream) -> None:
        started = trio.current_time()
        counters = ExchangeCounters()
        head: RequestHead | None = None
        self.active += 1
        try:
            try:
                head = RequestHead.from_metadata(stream.metadata)
            except RemoteProtocolError as exc:
                await self.bad_head(stream, exc, counters)
                return
            with request_context(head.request_id):  # every line about the request names kasd's id
                if head.kind != self.kind:
                    counters.outcome = "refused"
                    await refuse(stream, TunnelCode.UNKNOWN_TARGET, f"agentd has no handler for kind {head.kind!r}")
                    return
                with trio.CancelScope() as scope:
                    stream.cancel_when_broken(scope)  # kasd reset the stream: its client went away
                    routed = await self.route(stream, head, counters)
                    if routed is not None:
                        await self._exchange(stream, routed[1], routed[0], counters)
                if scope.cancelled_caught:
                    counters.outcome = "client-gone"
        finally:
            self.active -= 1
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            self._finish(head, stream, counters, trio.current_time() - started)

    async def _exchange(self, stream: MuxStream, head: RequestHead, pool: UpstreamPool, counters: ExchangeCounters) -> None:
        body = None if head.wants_upgrade else _CountingReceive(stream, counters)
        sent = trio.current_time()
        try:
            async with pool.request(head, body) as response:
                counters.status = response.status
                counters.upstream_latency = trio.current_time() - sent
                try:
                    boundary = None
                    early = b""
                    early_error: Exception | None = None
                    if response.raw is None:
                        boundary = EventBoundary.for_response(head.target, _content_type(response.headers))
                        if boundary is None and (length := _small_length(response.headers)) is not None:
                            # A small answer of known length (most API answers) goes to kasd with its
                            # head: ACCEPT, DATA and the end in one write, where an answer whose body
                            # came in a later read than its head went out in two, and kasd took its
                            # slow path (a task to watch its client) for it. An error reading it is
                            # raised after the head went out, where it would have been met before.
                            early, early_error = await _read_small_body(response, length)
                    await stream.accept(ResponseHead(status=response.status, headers=response.headers).to_metadata())
                    if response.raw is not None:
                        await _relay(stream, response.raw, response.trailing, counters)
                        return
                    if early:
                        counters.bytes_out += len(early)
                        await stream.send_all(early)
                    if early_error is not None:
                        raise early_error
                    while chunk := await self.drain.next_chunk(response.receive_some, boundary):
                        counters.bytes_out += len(chunk)
                        await stream.send_all(chunk)
                    if chunk is None:
                        counters.outcome = "drained"  # a watch or log -f, ended between two events
                    await stream.send_eof()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    counters.outcome = "client-gone"
        except UpstreamUnreachable as exc:
            counters.outcome = "refused"
            await refuse(stream, TunnelCode.UPSTREAM_UNREACHABLE, str(exc))
        except UpstreamTimeout as exc:
            counters.outcome = "upstream-timeout"
            counters.status = 504
            await answer_status(stream, 504, "Timeout", f"{self.status_prefix}{exc}", counters)
        except InvalidRequest as exc:
            counters.outcome = "refused"
            await refuse(stream, TunnelCode.BAD_REQUEST, str(exc))
        except UpstreamLost as exc:
            counters.outcome = "upstream-lost"
            await _reset(stream, TunnelCode.UPSTREAM_UNREACHABLE, str(exc))
        except RequestAborted as exc:
            counters.outcome = "client-gone"
            await _reset(stream, TunnelCode.CLIENT_GONE, str(exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # Reading the body to choose its framing failed: the kasd side is gone.
            counters.outcome = "client-gone"

    def _finish(self, head: RequestHead | None, stream: MuxStream, counters: ExchangeCounters, duration: float) -> None:
        record = UpstreamRequestRecord(
            method=head.method if head else "?",
            path=head.target.split("?", 1)[0] if head else "?",
            status=counters.status,
            outcome=counters.outcome,
            bytes_in=counters.bytes_in,
            bytes_out=counters.bytes_out,
            duration=duration,
            request_id=head.request_id if head else "",
            service=head.service if head and head.kind != KIND_K8S_API else None,
            upstream_latency=counters.upstream_latency,
        )
        # kasd writes the audit line for every request; agentd speaks up at INFO only when one fails.
        level = logging.DEBUG if record.outcome == "ok" else logging.INFO
        log.log(
            level,
            "request %smethod=%s path=%s status=%s outcome=%s bytes_in=%d bytes_out=%d duration=%.3f request_id=%s stream=%d",
            f"service={record.service} " if record.service is not None else "",
            record.method, record.path, record.status if record.status is not None else "-", record.outcome,
            record.bytes_in, record.bytes_out, record.duration, record.request_id or "-", stream.stream_id,
        )
        if self.on_done is not None:
            self.on_done(record)


class KubeApiProxy(StreamProxy):
    """Handles logical streams of kind ``k8s-api`` against one UpstreamPool (the API server's)."""

    kind = KIND_K8S_API

    def __init__(self, pool: UpstreamPool, *, on_done: Callable[[UpstreamRequestRecord], None] | None = None) -> None:
        super().__init__(on_done=on_done)
        self.pool = pool

    async def route(self, stream: MuxStream, head: RequestHead,
                    counters: ExchangeCounters) -> tuple[UpstreamPool, RequestHead] | None:
        await cancel_point()  # a cancel point, yielding only every so often: no scheduler trip per request
        return self.pool, head


class _CountingReceive(trio.abc.ReceiveStream):
    def __init__(self, stream: MuxStream, counters: ExchangeCounters) -> None:
        self._stream = stream
        self._counters = counters

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        chunk = await self._stream.receive_some(max_bytes)
        self._counters.bytes_in += len(chunk)
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def _relay(stream: MuxStream, raw: trio.abc.Stream, trailing: bytes, counters: ExchangeCounters) -> None:
    """After 101: bytes both ways until both sides are done; half-closes pass through. kasd's
    half-close means its client went away: the API server gets ``netio.relay``'s grace to finish
    (over TLS it cannot be told of a half-close at all), then its connection is closed.

    The upstream closing its side is the normal end of an exec or attach: what breaks after that
    (kubectl's reply to a WebSocket close frame meeting a closed connection, kasd resetting the
    stream once its client hangs up) is the pipe winding down, not a failure. Before that, the side
    that broke names the outcome: ``client-gone`` or ``upstream-lost``.
    """

    def counted_in(size: int) -> None:
        counters.bytes_in += size

    def counted_out(size: int) -> None:
        counters.bytes_out += size

    result = await relay(
        stream,
        raw,
        early_to_client=trailing,
        on_to_server=counted_in,
        on_to_client=counted_out,
        chunk=_CHUNK,
        server_receive_error_is_eof=True,  # TLS without close_notify: the upstream's end
    )
    if result.cut and counters.outcome == "ok":
        counters.outcome = "client-gone"  # kasd's end came; the API server did not finish in the grace
    elif result.broken is not None and not result.server_finished and counters.outcome == "ok":
        counters.outcome = "client-gone" if result.broken == "client" else "upstream-lost"


#: an answer up to this long (its Content-Length) is read whole before its head goes to kasd
_SMALL_ANSWER = 64 * 1024


def _small_length(headers: Sequence[tuple[str, str]]) -> int | None:
    """The answer's Content-Length if it is at most ``_SMALL_ANSWER``; None otherwise (or none)."""
    for name, value in headers:
        if name == "content-length":
            return int(value) if value.isdigit() and len(value) <= 6 and int(value) <= _SMALL_ANSWER else None
    return None


async def _read_small_body(response: UpstreamResponse, length: int) -> tuple[bytes, Exception | None]:
    """``response``'s body of at most ``length`` bytes, as one piece (however many reads it took: a
    list of the reads would cost a Python object per read, ~40 times the body for one trickled a byte
    at a time); and the error that stopped it, if one did (for the caller to raise once the head went
    out)."""
    buffer: bytearray | None = None
    try:
        first = await response.receive_some()
        if not first or len(first) >= length:
            return first, None  # the usual answer: its body in one read, kept as it came
        buffer = bytearray(first)
        while len(buffer) < length:
            chunk = await response.receive_some()
            if not chunk:
                break
            buffer += chunk
    except Exception as exc:
        return bytes(buffer or b""), exc
    return bytes(buffer), None


def _content_type(headers: Sequence[tuple[str, str]]) -> str | None:
    for name, value in headers:  # a loop, not next(generator): no Python call per header
        if name.lower() == "content-type":
            return value
    return None


async def answer_status(stream: MuxStream, status: int, reason: str, message: str, counters: ExchangeCounters) -> None:
    """Answer with a Kubernetes ``Status`` (the error body kubectl shows its user), as the API server
    itself would have: ``Error from server (Timeout): cluster API sent no response head within 90s``."""
    log.warning("answering stream=%d status=%d reason=%r", stream.stream_id, status, message)
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": status}).encode()
    headers = (("content-type", "application/json"), ("content-length", str(len(body))), ("cache-control", "no-store"))
    try:
        await stream.accept(ResponseHead(status=status, headers=headers).to_metadata())
        await stream.send_all(body)
        counters.bytes_out += len(body)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        counters.outcome = "client-gone"


async def refuse(stream: MuxStream, code: int, message: str) -> None:
    log.warning("refusing stream stream=%d code=%s reason=%r", stream.stream_id, TunnelCode(code).name, message)
    try:
        await stream.refuse(code, message)
    except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
        pass
    except Exception as exc:  # LocalProtocolError: already accepted or gone — nothing left to tell
        log.debug("refuse failed stream=%d error=%r", stream.stream_id, exc)


async def _reset(stream: MuxStream, code: int, message: str) -> None:
    log.warning("resetting stream stream=%d code=%s reason=%r", stream.stream_id, TunnelCode(code).name, message)
    await stream.reset(code, message)
