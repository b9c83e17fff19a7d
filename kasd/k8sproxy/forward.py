"""What HTTP/1.1 and HTTP/2 share: authorize, clean the head, find a session, open the stream,
and turn the agent's answer (or refusal) into a response head or a ``ProxyError``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import attrs
import trio
from prometheus_client import Counter

from kasd.access import AccessDenied, Grant, StaticAccess
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.status import ProxyError
from kasd.tunnels import TunnelRegistry
from netio.fastio import cancel_point
from tunnelhttp.drain import Drain
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode, strip_hop_by_hop
from tunnelhttp.watchbounds import EventBoundary
from wire.errors import ErrorCode, RemoteProtocolError
from wire.session import MuxStream, SessionClosedError, StreamRefusedError, StreamResetError

log = logging.getLogger("kasd.k8sproxy")

#: request headers that never leave kasd, besides the hop-by-hop ones
_DROPPED = frozenset({"authorization", "cookie", "host", "expect"})
_DROPPED_PREFIXES = ("impersonate-",)
#: a session picked for a request that began draining or died before the stream opened
_SESSION_UNUSABLE = (StreamRefusedError, SessionClosedError, trio.BrokenResourceError)
#: methods a request may be repeated with when its session died before the agent answered
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: further sessions a bodiless request tries after one that did not take it
_RETRIES = 2


@attrs.frozen(kw_only=True)
class Plan:
    grant: Grant
    head: RequestHead


def clean_request_headers(headers: Sequence[tuple[str, str]], *, upgrade: bool) -> tuple[tuple[str, str], ...]:
    """The client's headers minus its credentials, cookies, Impersonate-* and hop-by-hop headers."""
    kept = strip_hop_by_hop(headers, keep_upgrade=upgrade)
    return tuple((k, v) for k, v in kept if k not in _DROPPED and not k.startswith(_DROPPED_PREFIXES))


def clean_response_headers(headers: Sequence[tuple[str, str]], *, switching: bool = False) -> list[tuple[str, str]]:
    return list(strip_hop_by_hop(headers, keep_upgrade=switching))


class Forwarder:
    def __init__(self, access: StaticAccess, registry: TunnelRegistry, *, agent_wait_timeout: float) -> None:
        self.access = access
        self.registry = registry
        self.agent_wait_timeout = agent_wait_timeout

    def plan(
        self, *, method: str, target: str, headers: Sequence[tuple[str, str]], request_id: str, upgrade: bool
    ) -> Plan:
        """Authorize and build the request head; ProxyError 401/403/400 otherwise."""
        auth = [v for k, v in headers if k == "authorization"]
        try:
            if len(auth) > 1:
                raise AccessDenied(401, "bad token: more than one Authorization header")
            grant = self.access.authorize(auth[0] if auth else None)
        except AccessDenied as exc:
            extra = (("www-authenticate", 'Bearer realm="kasd"'),) if exc.status == 401 else ()
            raise ProxyError(exc.status, exc.message, extra) from None
        if not target.startswith("/"):
            raise ProxyError(400, f"request target must be a path, got {target[:100]!r}")
        head = RequestHead(
            method=method,
            target=target,
            headers=clean_request_headers(headers, upgrade=upgrade),
            impersonate=grant.impersonate,
            request_id=request_id,
        )
        return Plan(grant=grant, head=head)

    async def open(self, plan: Plan) -> MuxStream:
        """A logical stream to the agent, opened on its least-loaded session; 503 after the wait."""
        agent_id = plan.grant.agent_id
        metadata = plan.head.to_metadata()
        await cancel_point()
        # The common case — a session is up and has room — needs no timer.
        session = self.registry.pick(agent_id)
        if session is not None:
            try:
                return session.open_stream_nowait(metadata)
            except (trio.WouldBlock, *_SESSION_UNUSABLE):
                pass  # full, draining or dead: wait below, within the bound
        found_any = False
        with trio.move_on_after(self.agent_wait_timeout):
            while True:
                session = await self.registry.acquire(agent_id)
                found_any = True
                try:
                    return await session.open_stream(metadata)
                except _SESSION_UNUSABLE as exc:
                    # It began draining or died between the pick and the open: try another one.
                    log.info("session unusable, retrying agent_id=%d error=%s", agent_id, exc)
                    await trio.lowlevel.checkpoint()
        wait = f"{self.agent_wait_timeout:g}s"
        if found_any:
            raise ProxyError(503, f"agent {agent_id} is connected but has no free tunnel stream (waited {wait})")
        raise ProxyError(503, f"agent {agent_id} is not connected (waited {wait})")

    async def response(self, stream: MuxStream, plan: Plan, *, bodiless: bool) -> tuple[MuxStream, ResponseHead]:
        """The agent's response head, and the stream it came on; ProxyError otherwise.

        A bodiless request that the agent never took goes to another session (waiting for one, as
        ``open`` does): one refused by a session that began draining (``REFUSED_STREAM``: a GOAWAY
        crossed the request), or, for a method that is safe to repeat, one whose session ended
        before any answer. Without this, every agentd restart would fail the requests in flight at
        that instant — even with a replacement already connected.
        """
        agent_id = plan.grant.agent_id
        first = stream
        try:
            for attempt in range(_RETRIES + 1):
                try:
                    metadata = await stream.wait_accepted()
                except StreamRefusedError as exc:
                    if not (bodiless and exc.code == ErrorCode.REFUSED_STREAM and attempt < _RETRIES):
                        raise _refusal(exc, agent_id) from None
                    reason: Exception = exc
                except (StreamResetError, SessionClosedError, trio.BrokenResourceError) as exc:
                    retry = bodiless and plan.head.method in _SAFE_METHODS and not isinstance(exc, StreamResetError)
                    if not (retry and attempt < _RETRIES):
                        raise ProxyError(502, f"tunnel to agent {agent_id} failed before the response: {exc}") from None
                    reason = exc
                else:
                    try:
                        return stream, ResponseHead.from_metadata(metadata)
                    except RemoteProtocolError as exc:
                        raise ProxyError(502, f"agent {agent_id} sent an invalid response head: {exc}") from None
                log.info("agent did not take the request, retrying request_id=%s agent_id=%d error=%s",
                         plan.head.request_id, agent_id, reason)
                await stream.aclose()
                stream = await self.open(plan)
                await stream.send_eof()
        except BaseException:
            if stream is not first:  # a retry's stream is ours to close; the caller closes the first
                with trio.CancelScope(shield=True):
                    await stream.aclose()
            raise
        raise AssertionError("unreachable: the last attempt returns or raises")


async def relay_answer(stream: MuxStream, record: RequestRecord, from_agent: Counter,
                       send: Callable[[bytes], Awaitable[object]], *, chunk: int,
                       drain: Drain, boundary: EventBoundary | None) -> bool:
    """Pass the rest of the agent's answer to ``send``, chunk by chunk, counting it. True once it
    has ended, or once kasd drains and an endless answer (``boundary``) reached the end of an
    event; False if the agent's stream broke first (logged, ``record.outcome`` set): too late
    for a Status, so the caller must show the client a truncated body."""
    receive = partial(stream.receive_some, chunk)
    while True:
        try:
            data = await drain.next_chunk(receive, boundary)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.warning("agent stream broke mid-response request_id=%s error=%s", record.request_id, exc)
            record.outcome = "upstream-broken"
            return False
        if data is None:
            record.outcome = "drained"  # a watch or logs -f, ended between two events
            return True
        if not data:
            return True
        await send(data)
        record.bytes_out += len(data)
        from_agent.inc(len(data))


def answer_boundary(plan: Plan, head: ResponseHead) -> EventBoundary | None:
    """Where a watch or followed log may end when kasd drains; None for an answer that ends."""
    content_type = next((value for name, value in head.headers if name.lower() == "content-type"), None)
    return EventBoundary.for_response(plan.head.target, content_type)


def _refusal(exc: StreamRefusedError, agent_id: int) -> ProxyError:
    detail = exc.message or "no detail"
    if exc.code == TunnelCode.UPSTREAM_UNREACHABLE:
        return ProxyError(502, f"cluster API unreachable from agent {agent_id}: {detail}")
    if exc.code == TunnelCode.BAD_REQUEST:
        return ProxyError(400, f"agent {agent_id} rejected the request: {detail}")
    if exc.code == TunnelCode.UNKNOWN_TARGET:
        return ProxyError(404, f"agent {agent_id} cannot serve this request: {detail}")
    return ProxyError(503, f"agent {agent_id} refused the request: {exc}")
