"""The one byte relay after ``101 Switching Protocols``: two Trio streams become one pipe both ways.

Both daemons hold such a pipe once an upgrade (exec, attach, port-forward, cp; WebSocket or SPDY)
succeeded: kasd between kubectl's connection and the logical stream to agentd, agentd between that
logical stream and the API server's connection (``kasctl proxy`` between kubectl and kasd). The
sides are named for their roles, which decide how the pipe ends:

- the **client** asked for the upgrade. When its data ends (a TCP FIN, a TLS close_notify — which a
  proxy such as nginx sends when its own client went away — or a half-close of a logical stream),
  the end is passed on to the server as a half-close where the server's stream can carry one
  (``trio.abc.HalfCloseableStream``), and the server then has ``client_end_grace`` seconds to finish
  sending; past that the relay ends and the caller closes both streams. WebSocket and SPDY say "no
  more input" inside their own framing (a close frame, a stream's FIN), so an end of the transport
  itself means the client is gone: the grace only lets the last bytes already on their way (a close
  frame's answer) through, as the API server's own proxy closes both halves when one ends;
- the **server** answered ``101``. When its data ends, that is passed on to the client as a
  half-close where the client's stream can carry one, and otherwise it ends the relay (a TLS
  connection to a client cannot say "no more from me" and still listen).

A stream that fails ends the relay at once (receiving from it, sending to it, or passing it the
half-close) — except that a server which stops taking bytes still has its bytes already on their
way delivered to the client (within the same grace): what the far end sent before it went away is
never cut off by the other direction's failure. The ``RelayResult`` says which side broke first,
whether the server had already finished and whether the grace ran out, which is what tells "the
exchange was over and the pipe wound down" from "a side went away in the middle". The caller
closes both streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import attrs
import trio

__all__ = ["CLIENT_END_GRACE", "RelayResult", "relay"]

_CHUNK = 256 * 1024  # per-chunk Python work dominates bulk transfers: fewer, larger chunks
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
#: seconds the server has to finish once the client's data ended (docs/protocol.md §12, "The end
#: of an upgraded stream"): long enough for the answer to a close frame on any link, short enough
#: that a client that went away holds nothing for long
CLIENT_END_GRACE = 2.0

Side = Literal["client", "server"]


@attrs.frozen(kw_only=True)
class RelayResult:
    """How a relay ended."""

    #: bytes relayed from the client to the server (early bytes included), and back
    to_server: int
    to_client: int
    #: the side whose stream failed first, or None when neither did
    broken: Side | None
    #: the server's data ended and the client was told so (half-close, or the relay ended) before
    #: anything broke: whatever broke afterwards is the pipe winding down, not a failure
    server_finished: bool
    #: the client's data ended (or the server stopped taking bytes) and the server did not finish
    #: within the grace: the relay was cut short (the caller resets what is left)
    cut: bool = False


async def relay(
    client: trio.abc.Stream,
    server: trio.abc.Stream,
    *,
    early_to_server: bytes = b"",
    early_to_client: bytes = b"",
    on_to_server: Callable[[int], object] | None = None,
    on_to_client: Callable[[int], object] | None = None,
    server_receive_error_is_eof: bool = False,
    client_end_grace: float | None = None,
    chunk: int = _CHUNK,
) -> RelayResult:
    """Pipe bytes both ways between ``client`` and ``server`` (see the module docstring).

    ``early_to_server``/``early_to_client``: bytes that already arrived from one side with the
    upgrade (after the request head, after the ``101`` head), sent on first. ``on_to_server``/
    ``on_to_client`` are called with each relayed chunk's size, as it is relayed (counters that must
    survive the caller cancelling the relay). ``server_receive_error_is_eof``: a server whose
    connection may end without a clean close (TLS without close_notify) has ended, not broken.
    ``client_end_grace``: seconds the server has to finish after the client's end (default
    ``CLIENT_END_GRACE``, read at each call; ``math.inf`` waits for the server however long).
    """
    grace = CLIENT_END_GRACE if client_end_grace is None else client_end_grace
    to_server = to_client = 0
    broken: Side | None = None
    server_finished = False
    ended = False  # the relay was ended on purpose (not by the grace running out)

    def end(scope: trio.CancelScope) -> None:
        nonlocal ended
        ended = True
        scope.cancel()

    def broke(side: Side, scope: trio.CancelScope) -> None:
        nonlocal broken
        if broken is None:
            broken = side
        end(scope)

    def start_grace(scope: trio.CancelScope) -> None:
        if grace != math.inf:
            scope.deadline = min(scope.deadline, trio.current_time() + grace)

    async def client_to_server(scope: trio.CancelScope) -> None:
        nonlocal to_server, broken
        data: bytes | bytearray = early_to_server
        while True:
            if data:
                try:
                    await server.send_all(data)
                except _STREAM_ERRORS:
                    # The server stopped listening; what it already sent still goes to the client
                    # (its receive side reports its end or its error soon), within the grace.
                    if broken is None:
                        broken = "server"
                    start_grace(scope)
                    return
                to_server += len(data)
                if on_to_server is not None:
                    on_to_server(len(data))
            try:
                data = await client.receive_some(chunk)
            except _STREAM_ERRORS:
                return broke("client", scope)
            if not data:
                break
        if isinstance(server, trio.abc.HalfCloseableStream):
            try:
                await server.send_eof()
            except _STREAM_ERRORS:
                return broke("server", scope)
        # The client is gone (see the module docstring): the server gets a bounded time to finish.
        start_grace(scope)

    async def server_to_client(scope: trio.CancelScope) -> None:
        nonlocal to_client, server_finished
        data: bytes | bytearray = early_to_client
        while True:
            if data:
                try:
                    await client.send_all(data)
                except _STREAM_ERRORS:
                    return broke("client", scope)
                to_client += len(data)
                if on_to_client is not None:
                    on_to_client(len(data))
            try:
                data = await server.receive_some(chunk)
            except _STREAM_ERRORS:
                if not server_receive_error_is_eof:
                    return broke("server", scope)
                data = b""
            if not data:
                break
        if isinstance(client, trio.abc.HalfCloseableStream):
            try:
                await client.send_eof()
            except _STREAM_ERRORS:
                return broke("client", scope)
            server_finished = broken is None
        else:
            server_finished = broken is None
            end(scope)  # the client cannot be told "no more" and still listen: the pipe is over

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_to_server, nursery.cancel_scope)
        nursery.start_soon(server_to_client, nursery.cancel_scope)
    cut = nursery.cancel_scope.cancelled_caught and not ended
    return RelayResult(to_server=to_server, to_client=to_client, broken=broken,
                       server_finished=server_finished, cut=cut)
