"""A SPDY/3.1 session on Trio: `spdy.Connection` (server side) driven over any byte transport.

The transport is small (`Transport`: `receive_some() -> bytes`, b"" at EOF; `send_all(bytes)`;
`aclose()`), so one driver serves both ways kubectl reaches kubesim with SPDY: the raw bytes of
an upgraded HTTP/1.1 connection (`hyperraw`, `AsgiRawTransport`) and a WebSocket whose binary
messages carry the SPDY byte stream with arbitrary boundaries (kubectl's WebSocket port-forward,
subprotocol `SPDY/3.1+portforward.k8s.io`: `AsgiWebSocketTransport`).

    async def handler(session: SpdySession) -> None:
        while (stream := await session.accept()) is not None:
            await stream.reply()
            ...

    await serve_spdy(transport, handler)

One reader task turns the peer's bytes into events; every write goes through the connection's
output buffer and one flush lock, so frames leave in the order they were made and a writer
waits for its own bytes to be sent (backpressure). What a peer can make kubesim hold is bounded:
`spdy.Limits` bounds frames, header blocks and open streams; each stream buffers at most
`stream_buffer` bytes of received data, after which the reader waits for the handler to read
(spdystream honours no flow-control window, so waiting is the only backpressure there is).

A protocol error ends the session cleanly: a GOAWAY naming the fault, the transport closed, the
handler cancelled. So does the transport's EOF: the peer is gone, nothing it started can finish.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

import trio

from kubesim import spdy

log = logging.getLogger(__name__)

#: Received bytes one stream holds before the reader waits for its handler.
STREAM_BUFFER = 256 << 10
#: Streams the peer opened that the handler has not accepted yet (past `Limits.max_streams`
#: the connection refuses them itself).
ACCEPT_BACKLOG = 16


class Transport(Protocol):
    """A byte stream in both directions."""

    async def receive_some(self) -> bytes:
        """The next bytes from the peer; b"" once it is done sending."""
        ...

    async def send_all(self, data: bytes) -> None: ...

    async def aclose(self) -> None:
        """Close; must return even when cancelled."""
        ...


class SpdyStream:
    """One stream the peer opened: its headers, what it sends, and what this side answers."""

    def __init__(self, session: SpdySession, event: spdy.StreamOpened) -> None:
        self.stream_id = event.stream_id
        self.headers = event.headers
        self.reset_status: int | None = None  # set once the stream was reset (either side)
        self._session = session
        self._buffer = bytearray()
        self._eof = event.fin
        self._changed = trio.Event()  # data arrived, EOF, or the buffer was drained

    def header(self, name: str) -> str | None:
        """The first value of header `name` (lowercase), as Go's `Header.Get` gives it."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    # -- receiving ------------------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Received bytes (at most `max_bytes`); b"" once the peer closed or reset the stream."""
        while not self._buffer and not self._eof:
            await self._wait_change()
        await trio.lowlevel.checkpoint()
        size = len(self._buffer) if max_bytes is None else min(max_bytes, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        if data:
            self._notify()
        return data

    async def _wait_change(self) -> None:
        self._changed = trio.Event() if self._changed.is_set() else self._changed
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()

    async def _deliver(self, data: bytes, fin: bool) -> None:
        """Reader side: queue `data`, waiting while the buffer is full."""
        while len(self._buffer) >= self._session.stream_buffer and not self._eof:
            await self._wait_change()
        if not self._eof:
            self._buffer += data
        self._eof = self._eof or fin
        self._notify()

    def _end(self, status: int | None = None) -> None:
        self._eof = True
        if status is not None and self.reset_status is None:
            self.reset_status = status
        self._notify()

    # -- sending --------------------------------------------------------------------------------

    async def reply(self, headers: spdy.Headers = (), *, fin: bool = False) -> None:
        """SYN_REPLY: accept the stream (`fin`: and send nothing on it)."""
        await self._session._call(lambda c: c.reply(self.stream_id, headers, fin=fin))

    async def send_all(self, data: bytes) -> None:
        """DATA; `trio.BrokenResourceError` once the stream cannot carry it (reset, ended)."""
        await self._session._call(lambda c: c.send_data(self.stream_id, data))

    async def send_eof(self) -> None:
        """FIN: this side will send nothing more."""
        await self._session._call(lambda c: c.end_stream(self.stream_id))

    async def reset(self, status: int = spdy.CANCEL) -> None:
        """RST_STREAM (nothing if the stream is already gone)."""
        if self.stream_id not in self._session.connection.open_streams:
            await trio.lowlevel.checkpoint()
            return
        self._end(status)
        await self._session._call(lambda c: c.reset_stream(self.stream_id, status))


class SpdySession:
    """The server side of one SPDY connection. Made by `serve_spdy`; handlers use `accept`."""

    def __init__(
        self,
        transport: Transport,
        *,
        limits: spdy.Limits | None = None,
        stream_buffer: int = STREAM_BUFFER,
    ) -> None:
        self.connection = spdy.Connection(client=False, limits=limits)
        self.stream_buffer = stream_buffer
        self.error: spdy.RemoteProtocolError | None = None
        self._transport = transport
        self._streams: dict[int, SpdyStream] = {}
        self._incoming_send, self._incoming = trio.open_memory_channel[SpdyStream](ACCEPT_BACKLOG)
        self._flush_lock = trio.StrictFIFOLock()
        self._broken = False
        self._closed = False

    async def accept(self) -> SpdyStream | None:
        """The next stream the peer opens; None once it can open no more."""
        try:
            return await self._incoming.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return None

    async def close(self, status: int = spdy.GOAWAY_OK) -> None:
        """GOAWAY, then close the transport. Always returns, even when cancelled."""
        if self._closed:
            return
        self._closed = True
        self._incoming_send.close()
        with trio.move_on_after(5, shield=True):
            if not self._broken and self.error is None:
                self.connection.close(status)
                try:
                    await self._flush()
                except trio.BrokenResourceError:
                    pass  # the peer is gone: nothing to say goodbye to
            await self._transport.aclose()

    # -- internals ------------------------------------------------------------------------------

    async def _call(self, action: Callable[[spdy.Connection], None]) -> None:
        try:
            action(self.connection)
        except spdy.LocalProtocolError as exc:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError(str(exc)) from None
        await self._flush()

    async def _flush(self) -> None:
        # Whoever holds the lock sends everything queued so far, in order; a caller returns only
        # once its own frames are out (a later holder sends them if an earlier one did not).
        async with self._flush_lock:
            data = self.connection.data_to_send()
            if not data:
                return
            if self._broken:
                raise trio.BrokenResourceError("the SPDY connection is closed")
            try:
                await self._transport.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._broken = True
                raise trio.BrokenResourceError("the SPDY connection is closed") from exc

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._transport.receive_some()
                if not data:
                    return
                try:
                    events = self.connection.receive_data(data)
                except spdy.RemoteProtocolError as exc:
                    log.warning("SPDY peer broke the protocol: %s", exc)
                    self.error = exc
                    with trio.move_on_after(5, shield=True):
                        async with self._flush_lock:  # the GOAWAY naming the fault
                            goaway = self.connection.data_to_send()
                            if goaway and not self._broken:
                                await self._transport.send_all(goaway)
                    return
                await self._flush()  # PING echoes, resets of unknown streams
                for event in events:
                    await self._dispatch(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._broken = True
        finally:
            self._incoming_send.close()
            for stream in self._streams.values():
                stream._end()

    async def _dispatch(self, event: spdy.Event) -> None:
        match event:
            case spdy.StreamOpened():
                stream = SpdyStream(self, event)
                self._streams[event.stream_id] = stream
                try:
                    await self._incoming_send.send(stream)
                except trio.ClosedResourceError:
                    pass
            case spdy.DataReceived(stream_id=sid, data=data, fin=fin):
                found = self._streams.get(sid)
                if found is not None:
                    await found._deliver(data, fin)
            case spdy.HeadersReceived(stream_id=sid, fin=True):
                found = self._streams.get(sid)
                if found is not None:
                    found._end()
            case spdy.StreamReset(stream_id=sid, status=status):
                found = self._streams.pop(sid, None)
                if found is not None:
                    found._end(status)
            case _:
                pass  # settings, pings (answered), GOAWAY, window updates: nothing to do
        self._forget_closed()

    def _forget_closed(self) -> None:
        open_ids = self.connection.open_streams
        for sid in [s for s, st in self._streams.items() if s not in open_ids and st._eof]:
            del self._streams[sid]


SessionHandler = Callable[[SpdySession], Awaitable[None]]


async def serve_spdy(
    transport: Transport,
    handler: SessionHandler,
    *,
    limits: spdy.Limits | None = None,
    stream_buffer: int = STREAM_BUFFER,
) -> SpdySession:
    """Run one SPDY session over `transport` until `handler` returns, the peer goes away or
    breaks the protocol; then GOAWAY and close. Returns the session (its `error`, if any)."""
    session = SpdySession(transport, limits=limits, stream_buffer=stream_buffer)
    try:
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                await session._read_loop()
                nursery.cancel_scope.cancel()  # peer gone or broken: the handler cannot finish

            nursery.start_soon(read)
            await handler(session)
            nursery.cancel_scope.cancel()
    finally:
        await session.close()
    return session


# -- transports over ASGI -----------------------------------------------------------------------

AsgiReceive = Callable[[], Awaitable[MutableMapping[str, Any]]]
AsgiSend = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class AsgiWebSocketTransport:
    """An accepted ASGI WebSocket as a byte stream: binary messages carry the bytes, in any
    boundaries (text messages too, UTF-8 encoded); a close or disconnect is EOF."""

    def __init__(self, receive: AsgiReceive, send: AsgiSend) -> None:
        self._receive = receive
        self._send = send
        self._eof = False
        self._closed = False

    async def receive_some(self) -> bytes:
        while not self._eof:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self._eof = True
                break
            if kind != "websocket.receive":
                continue
            data = message.get("bytes")
            if data is None:
                data = (message.get("text") or "").encode("utf-8")
            if data:
                return bytes(data)
        await trio.lowlevel.checkpoint()
        return b""

    async def send_all(self, data: bytes) -> None:
        if self._closed or self._eof:
            raise trio.BrokenResourceError("the WebSocket is closed")
        await self._send({"type": "websocket.send", "bytes": data})

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            try:
                await self._send({"type": "websocket.close", "code": 1000})
            except Exception:  # already gone: nothing to close
                log.debug("closing the WebSocket failed", exc_info=True)


#: The ASGI messages of hyperraw's raw upgrade (see `hyperraw`), for a request that carries
#: `Upgrade: SPDY/3.1`: the extension marks such a request's scope.
RAW_UPGRADE_EXTENSION = "kubesim.raw_upgrade"
RAW_ACCEPT = "kubesim.raw_upgrade.accept"  # app → server: send 101, then pass bytes through
RAW_RECEIVE = "kubesim.raw_upgrade.receive"  # server → app: {"bytes": ...}
RAW_SEND = "kubesim.raw_upgrade.send"  # app → server: {"bytes": ...}
RAW_CLOSE = "kubesim.raw_upgrade.close"  # app → server: close the connection


class AsgiRawTransport:
    """The bytes of an upgraded connection, after `RAW_ACCEPT`, as a transport."""

    def __init__(self, receive: AsgiReceive, send: AsgiSend) -> None:
        self._receive = receive
        self._send = send
        self._eof = False
        self._closed = False

    async def receive_some(self) -> bytes:
        while not self._eof:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._eof = True
                break
            if message["type"] == RAW_RECEIVE and message.get("bytes"):
                return bytes(message["bytes"])
        await trio.lowlevel.checkpoint()
        return b""

    async def send_all(self, data: bytes) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the connection is closed")
        await self._send({"type": RAW_SEND, "bytes": data})

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            await self._send({"type": RAW_CLOSE})


async def accept_raw_upgrade(
    send: AsgiSend, headers: list[tuple[bytes, bytes]]
) -> None:
    """Answer a raw-upgrade request with 101 (plus `headers`); its bytes flow from now on."""
    await send({"type": RAW_ACCEPT, "headers": headers})
