"""The one byte relay after ``101 Switching Protocols``: two Trio streams become one pipe both ways.

Both daemons hold such a pipe once an upgrade (exec, attach, port-forward, cp; WebSocket or SPDY)
succeeded: kasd between kubectl's connection and the logical stream to agentd, agentd between that
logical stream and the API server's connection. The sides are named for their roles, which decide
how the pipe ends:

- the **client** asked for the upgrade; when its data ends, the end is passed on to the server as a
  half-close where the server's stream can carry one (``trio.abc.HalfCloseableStream``), and
  otherwise the relay waits for the server to finish;
- the **server** answered ``101``; when its data ends, that is passed on to the client as a
  half-close where the client's stream can carry one, and otherwise it ends the relay (a TLS
  connection to a client cannot say "no more from me" and still listen).

The relay returns once both directions are done, or at once when a stream fails (receiving from
it, sending to it, or passing it the half-close): the ``RelayResult`` says which side broke first
and whether the server had already finished, which is what tells "the exchange was over and the
pipe wound down" from "a side went away in the middle". The caller closes both streams.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs
import trio

__all__ = ["RelayResult", "relay"]

_CHUNK = 256 * 1024  # per-chunk Python work dominates bulk transfers: fewer, larger chunks
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

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


async def relay(
    client: trio.abc.Stream,
    server: trio.abc.Stream,
    *,
    early_to_server: bytes = b"",
    early_to_client: bytes = b"",
    on_to_server: Callable[[int], object] | None = None,
    on_to_client: Callable[[int], object] | None = None,
    server_receive_error_is_eof: bool = False,
    chunk: int = _CHUNK,
) -> RelayResult:
    """Pipe bytes both ways between ``client`` and ``server`` (see the module docstring).

    ``early_to_server``/``early_to_client``: bytes that already arrived from one side with the
    upgrade (after the request head, after the ``101`` head), sent on first. ``on_to_server``/
    ``on_to_client`` are called with each relayed chunk's size, as it is relayed (counters that must
    survive the caller cancelling the relay). ``server_receive_error_is_eof``: a server whose
    connection may end without a clean close (TLS without close_notify) has ended, not broken.
    """
    to_server = to_client = 0
    broken: Side | None = None
    server_finished = False

    def broke(side: Side, scope: trio.CancelScope) -> None:
        nonlocal broken
        if broken is None:
            broken = side
        scope.cancel()

    async def client_to_server(scope: trio.CancelScope) -> None:
        nonlocal to_server
        data: bytes | bytearray = early_to_server
        while True:
            if data:
                try:
                    await server.send_all(data)
                except _STREAM_ERRORS:
                    return broke("server", scope)
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
        # Otherwise the server cannot be told: it ends the exchange when it is done.

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
            scope.cancel()  # the client cannot be told "no more" and still listen: the pipe is over

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_to_server, nursery.cancel_scope)
        nursery.start_soon(server_to_client, nursery.cancel_scope)
    return RelayResult(to_server=to_server, to_client=to_client, broken=broken, server_finished=server_finished)
