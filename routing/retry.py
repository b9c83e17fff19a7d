"""When a request the agent did not take goes to another session: the retry policy, in one place.

Only a request the agent never passed on goes again, and only one kasd still holds whole — a
bodiless one (its FIN left with its OPEN):

- refused as not processed (``REFUSED_STREAM``: a GOAWAY crossed it, a full backlog), or because
  that agent cannot reach its API server (``UPSTREAM_UNREACHABLE``; the router also holds that
  session back for a while: ``routing.local``'s breaker);
- for a method safe to repeat (``SAFE_METHODS``), its session ended before any answer (never a
  reset: that is the agent's, or the client's, word).

It goes to at most ``RETRIES`` further sessions, never back to one it tried while another is usable
(the router's ``avoid``). If the agent has no other, the agent's own refusal stands for an
unreachable API server (asking the same agent again would only repeat it); otherwise the one it
tried is asked once more. Without this, every agentd restart would fail the requests in flight at
that instant — even with a replacement already connected.

The holder side of the kasd-to-kasd hop (``routing.peers``) applies the same rule
(``repeatable``): a forwarded request whose agent session ended before it answered is refused as
not processed, so the side that got it may try elsewhere.

The pipeline (``kasd.k8sproxy.pipeline``) calls ``take_or_retry`` with its router; it turns what
comes out (a refusal, a lost stream, a ``RouteError``) into the client's answer.

May import: ``routing.errors``, ``wire``, ``tunnelhttp``, trio, the standard library.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from routing.errors import NoOtherSession
from tunnelhttp.head import TunnelCode
from wire.errors import ErrorCode
from wire.frames import Metadata
from wire.session import (
    MuxStream,
    Session,
    SessionClosedError,
    StreamRefusedError,
    StreamResetError,
)

#: methods a request may be repeated with when its session died before the agent answered
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: further sessions a bodiless request tries after one that did not take it
RETRIES = 2
#: refusals that say the agent never passed the request on, so a bodiless one may go elsewhere:
#: not processed (a GOAWAY crossed it, a full backlog) and its API server unreachable
RETRIED_REFUSALS = frozenset({ErrorCode.REFUSED_STREAM, TunnelCode.UPSTREAM_UNREACHABLE})
#: how a stream ends before its answer other than by a refusal
LOST = (StreamResetError, SessionClosedError, trio.BrokenResourceError)

#: ``Router.open_stream`` (``kasd.seams``)
OpenStream = Callable[..., Awaitable[MuxStream]]
#: ``Router.report``
Report = Callable[[MuxStream, StreamRefusedError | None], None]


def repeatable(method: str, lost: BaseException) -> bool:
    """Whether a request whose stream ended with ``lost`` before any answer may be sent again:
    its session ended (a reset is somebody's word, not a loss) and its method is safe to repeat."""
    return method in SAFE_METHODS and not isinstance(lost, StreamResetError)


async def take_or_retry(stream: MuxStream, *, agent_id: int, metadata: Metadata, method: str, bodiless: bool,
                        open_stream: OpenStream, report: Report,
                        on_retry: Callable[[Exception], object] = lambda reason: None) -> tuple[MuxStream, Metadata]:
    """The stream the agent took and its ACCEPT metadata: ``stream``, or a retry's (see the module's
    docstring; ``on_retry(reason)`` before each). Otherwise raises the last refusal
    (``StreamRefusedError``), the last loss (one of ``LOST``), or what the router raised (a
    ``RouteError``, ``UnsendableFrameError``). Each answer is ``report``ed to the router.

    ``stream`` stays the caller's to close; a retry's stream is closed here unless returned."""
    first = stream
    tried: set[Session] = set()
    try:
        for attempt in range(RETRIES + 1):
            try:
                accepted = await stream.wait_accepted()
            except StreamRefusedError as exc:
                report(stream, exc)
                if not (bodiless and exc.code in RETRIED_REFUSALS and attempt < RETRIES):
                    raise
                reason: Exception = exc
            except LOST as exc:
                if not (bodiless and repeatable(method, exc) and attempt < RETRIES):
                    raise
                reason = exc
            else:
                report(stream, None)
                return stream, accepted
            on_retry(reason)
            tried.add(stream.session)
            await stream.aclose()
            stream = await _reroute(open_stream, agent_id, metadata, frozenset(tried), reason)
            await stream.send_eof()
    except BaseException:
        if stream is not first:  # a retry's stream is ours to close; the caller closes the first
            with trio.CancelScope(shield=True):
                await stream.aclose()
        raise
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _reroute(open_stream: OpenStream, agent_id: int, metadata: Metadata, tried: frozenset[Session],
                   reason: Exception) -> MuxStream:
    """A stream for the retry on a session it has not tried; if the agent has no other usable
    one, the agent's own answer (a refusal for an unreachable API server: asking the same agent
    again would only repeat it), or else the one it tried, once more."""
    try:
        return await open_stream(agent_id, metadata, avoid=tried)
    except NoOtherSession:
        if isinstance(reason, StreamRefusedError) and reason.code == TunnelCode.UPSTREAM_UNREACHABLE:
            raise reason from None
    return await open_stream(agent_id, metadata)


__all__ = ["LOST", "RETRIED_REFUSALS", "RETRIES", "SAFE_METHODS", "repeatable", "take_or_retry"]
