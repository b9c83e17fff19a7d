"""The Trio SPDY session driver: a client `spdy.Connection` against `serve_spdy` over memory
streams, the byte stream cut anywhere (hypothesis), plus the ASGI transports."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubesim import spdy
from kubesim.spdy_session import (
    AsgiRawTransport,
    AsgiWebSocketTransport,
    SpdySession,
    SpdyStream,
    serve_spdy,
)

pytestmark = pytest.mark.timeout(60)


class Chunked:
    """A transport that hands the server its bytes in the given chunk sizes (cycled)."""

    def __init__(self, stream: trio.abc.Stream, sizes: list[int]) -> None:
        self._stream = stream
        self._sizes = sizes or [1 << 16]
        self._turn = 0
        self._pending = b""
        self.closed = False

    async def receive_some(self) -> bytes:
        if not self._pending:
            self._pending = bytes(await self._stream.receive_some())
            if not self._pending:
                return b""
        size = self._sizes[self._turn % len(self._sizes)]
        self._turn += 1
        data, self._pending = self._pending[:size], self._pending[size:]
        return data

    async def send_all(self, data: bytes) -> None:
        await self._stream.send_all(data)

    async def aclose(self) -> None:
        self.closed = True
        await self._stream.aclose()


class Client:
    """kubectl's side: a client Connection over a trio stream, events collected."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = spdy.Connection(client=True)
        self.events: list[spdy.Event] = []
        self.eof = False

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.stream.send_all(data)

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            data = await self.stream.receive_some()
            if not data:
                self.eof = True
                return
            self.events += self.conn.receive_data(bytes(data))
            await self.flush()

    def data(self, stream_id: int) -> bytes:
        return b"".join(
            e.data for e in self.events if isinstance(e, spdy.DataReceived) and e.stream_id == stream_id
        )

    def finished(self, stream_id: int) -> bool:
        return any(
            isinstance(e, spdy.DataReceived | spdy.StreamReset) and e.stream_id == stream_id
            and (getattr(e, "fin", True))
            for e in self.events
        )


async def run_pair(
    handler: Callable[[SpdySession], Awaitable[None]],
    client_side: Callable[[Client], Awaitable[None]],
    *,
    sizes: list[int] | None = None,
    stream_buffer: int = 256 << 10,
) -> tuple[SpdySession | None, Chunked]:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    transport = Chunked(server_stream, sizes or [])
    result: list[SpdySession] = []

    async def server() -> None:
        result.append(await serve_spdy(transport, handler, stream_buffer=stream_buffer))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            await client_side(Client(client_stream))
    return (result[0] if result else None), transport


async def echo_handler(session: SpdySession) -> None:
    """Each stream: reply with its streamtype, send back what it received, then FIN."""

    async def echo(stream: SpdyStream) -> None:
        await stream.reply((("streamtype", stream.header("streamtype") or ""),))
        while data := await stream.receive_some():
            await stream.send_all(data)
        await stream.send_eof()

    async with trio.open_nursery() as nursery:
        while (stream := await session.accept()) is not None:
            nursery.start_soon(echo, stream)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(st.binary(min_size=0, max_size=70_000), min_size=1, max_size=3),
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=6),
)
def test_streams_echo_under_any_chunking(payloads: list[bytes], sizes: list[int]) -> None:
    async def client_side(c: Client) -> None:
        ids = []
        for n, payload in enumerate(payloads):
            sid = c.conn.open_stream((("streamtype", f"s{n}"),))
            ids.append(sid)
            c.conn.send_data(sid, payload, fin=True)
        await c.flush()
        await c.until(lambda: all(c.finished(sid) for sid in ids))
        for n, sid in enumerate(ids):
            replies = [e for e in c.events if isinstance(e, spdy.StreamReplied) and e.stream_id == sid]
            assert replies and replies[0].headers == (("streamtype", f"s{n}"),)
            assert c.data(sid) == payloads[n]
        c.conn.close()
        await c.flush()
        await c.stream.aclose()

    trio.run(functools.partial(run_pair, echo_handler, client_side, sizes=sizes))


async def test_garbage_gets_a_goaway_and_the_session_ends() -> None:
    handler_cancelled = trio.Event()

    async def handler(session: SpdySession) -> None:
        try:
            await trio.sleep_forever()
        finally:
            handler_cancelled.set()

    async def client_side(c: Client) -> None:
        await c.stream.send_all(b"GET / HTTP/1.1\r\n\r\n" * 4)
        frames = b""
        while data := await c.stream.receive_some():
            frames += data
        decoded = list(spdy.FrameDecoder(spdy.Limits()).receive(frames))
        assert decoded == [spdy.GoAwayFrame(last_good_stream_id=0, status=spdy.GOAWAY_PROTOCOL_ERROR)]

    session, transport = await run_pair(handler, client_side)
    assert handler_cancelled.is_set() and transport.closed
    assert session is not None and session.error is not None


async def test_an_oversized_frame_is_refused_from_its_head() -> None:
    async def client_side(c: Client) -> None:
        # a DATA head claiming 2 MiB: refused before any of it is buffered
        await c.stream.send_all((1).to_bytes(4, "big") + bytes([0]) + (2 << 20).to_bytes(3, "big"))
        frames = b""
        while data := await c.stream.receive_some():
            frames += data
        assert list(spdy.FrameDecoder(spdy.Limits()).receive(frames)) == [
            spdy.GoAwayFrame(last_good_stream_id=0, status=spdy.GOAWAY_PROTOCOL_ERROR)]

    session, _ = await run_pair(echo_handler, client_side)
    assert session is not None and "frame" in str(session.error)


async def test_the_peer_going_away_cancels_the_handler() -> None:
    accepted = trio.Event()
    cancelled = trio.Event()

    async def handler(session: SpdySession) -> None:
        stream = await session.accept()
        assert stream is not None
        await stream.reply()
        accepted.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async def client_side(c: Client) -> None:
        c.conn.open_stream((("streamtype", "stdin"),))
        await c.flush()
        await accepted.wait()
        await c.stream.aclose()

    await run_pair(handler, client_side)
    assert cancelled.is_set()


async def test_a_reset_stream_reads_eof_and_refuses_writes() -> None:
    results: dict[str, Any] = {}
    results_ready = trio.Event()

    async def handler(session: SpdySession) -> None:
        stream = await session.accept()
        assert stream is not None
        await stream.reply()
        results["read"] = await stream.receive_some()
        results["status"] = stream.reset_status
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(b"late")
        results_ready.set()
        results["next"] = await session.accept()

    async def client_side(c: Client) -> None:
        sid = c.conn.open_stream((("streamtype", "stdout"),))
        await c.flush()
        await c.until(lambda: any(isinstance(e, spdy.StreamReplied) for e in c.events))
        c.conn.reset_stream(sid, spdy.CANCEL)
        await c.flush()
        await results_ready.wait()
        await c.stream.aclose()

    await run_pair(handler, client_side)
    assert results == {"read": b"", "status": spdy.CANCEL, "next": None}


async def test_a_stream_nobody_reads_buffers_a_bounded_amount() -> None:
    buffer = 64 << 10
    seen: list[SpdyStream] = []
    drained = trio.Event()

    async def handler(session: SpdySession) -> None:
        stream = await session.accept()
        assert stream is not None
        await stream.reply()
        seen.append(stream)
        await drained.wait()
        total = 0
        while data := await stream.receive_some():
            total += len(data)
        assert total == 1 << 20

    async def client_side(c: Client) -> None:
        sid = c.conn.open_stream((("streamtype", "stdin"),))
        c.conn.send_data(sid, b"x" * (1 << 20), fin=True)
        await c.flush()
        await trio.testing.wait_all_tasks_blocked()
        # The reader stopped at the limit (plus at most the frame in hand): the rest waits in
        # the transport, where TCP would push back on kubectl.
        assert seen and len(seen[0]._buffer) <= buffer + spdy.OUTBOUND_DATA_CHUNK
        drained.set()
        c.conn.close()
        await c.flush()
        await c.until(lambda: c.eof)

    await run_pair(handler, client_side, stream_buffer=buffer, sizes=[1 << 16])


async def test_pings_are_answered() -> None:
    async def client_side(c: Client) -> None:
        ping = c.conn.ping()
        await c.flush()
        await c.until(lambda: any(isinstance(e, spdy.PingAcknowledged) for e in c.events))
        assert next(e for e in c.events if isinstance(e, spdy.PingAcknowledged)).ping_id == ping
        await c.stream.aclose()

    await run_pair(echo_handler, client_side)


# -- ASGI transports ------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(1, 200), min_size=1, max_size=8))
def test_spdy_inside_websocket_messages_with_arbitrary_boundaries(cuts: list[int]) -> None:
    async def main() -> None:
        to_app_send, to_app = trio.open_memory_channel[dict[str, Any]](100)
        from_app, from_app_receive = trio.open_memory_channel[dict[str, Any]](100)
        transport = AsgiWebSocketTransport(to_app.receive, from_app.send)
        client = spdy.Connection(client=True)
        sid = client.open_stream((("streamtype", "data"), ("port", "80")))
        client.send_data(sid, b"hello through a websocket", fin=True)
        wire = client.data_to_send()
        n = 0
        while wire:
            size = cuts[n % len(cuts)]
            n += 1
            piece, wire = wire[:size], wire[size:]
            await to_app_send.send({"type": "websocket.receive", "bytes": piece})
        answered = trio.Event()

        async def handler(session: SpdySession) -> None:
            stream = await session.accept()
            assert stream is not None and stream.header("port") == "80"
            await stream.reply()
            assert await stream.receive_some() == b"hello through a websocket"
            await stream.send_all(b"ok")
            answered.set()
            await trio.sleep_forever()  # the disconnect ends it

        async def disconnect_when_answered() -> None:
            await answered.wait()
            await to_app_send.send({"type": "websocket.disconnect", "code": 1000})

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(disconnect_when_answered)
                await serve_spdy(transport, handler)
        from_app.close()
        sent = [m async for m in from_app_receive]
        assert sent[-1] == {"type": "websocket.close", "code": 1000}
        got = b"".join(m["bytes"] for m in sent[:-1])
        events = client.receive_data(got)
        assert spdy.DataReceived(stream_id=sid, data=b"ok", fin=False) in events

    trio.run(main)


async def test_raw_transport_speaks_the_raw_upgrade_messages() -> None:
    to_app_send, to_app = trio.open_memory_channel[dict[str, Any]](10)
    from_app, from_app_receive = trio.open_memory_channel[dict[str, Any]](10)
    transport = AsgiRawTransport(to_app.receive, from_app.send)
    await to_app_send.send({"type": "kubesim.raw_upgrade.receive", "bytes": b"abc"})
    await to_app_send.send({"type": "http.disconnect"})
    assert await transport.receive_some() == b"abc"
    assert await transport.receive_some() == b""
    await transport.send_all(b"xyz")
    await transport.aclose()
    await transport.aclose()
    assert from_app_receive.receive_nowait() == {"type": "kubesim.raw_upgrade.send", "bytes": b"xyz"}
    assert from_app_receive.receive_nowait() == {"type": "kubesim.raw_upgrade.close"}
    with pytest.raises(trio.WouldBlock):
        from_app_receive.receive_nowait()
