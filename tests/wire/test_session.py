"""The Trio session adapter over in-memory streams (with the autojump clock) and real TLS sockets."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import trio
import trio.testing
import trustme
import wsproto
import wsproto.connection

from netio.fastio import every_call_yields
from wire.codec import FrameDecoder, encode
from wire.errors import ErrorCode
from wire.frames import GoAway, Hello
from wire.mux import MuxConnection
from wire.session import (
    MAX_EARLY_NOTICES,
    MuxStream,
    Session,
    SessionClosedError,
    StreamRefusedError,
    StreamResetError,
    connect_session,
    open_session,
)
from wire.settings import KiB, MiB, Settings
from wire.wscarrier import WebSocketTransport


@pytest.fixture(params=["bytes", "ws"])
def carrier(request: pytest.FixtureRequest) -> str:
    """What the session pair runs over: a bare byte stream, or the WebSocket carrier's transport
    (binary messages over that stream). HTTP/2's runs on real sockets in test_h2carrier.py."""
    return str(request.param)


def _carried(carrier: str, left: trio.abc.Stream, right: trio.abc.Stream) -> tuple[trio.abc.Stream, trio.abc.Stream]:
    if carrier == "bytes":
        return left, right
    return (WebSocketTransport(left, wsproto.connection.Connection(wsproto.ConnectionType.CLIENT)),
            WebSocketTransport(right, wsproto.connection.Connection(wsproto.ConnectionType.SERVER)))


async def _session_pair(nursery: trio.Nursery, carrier: str = "bytes", **kwargs: object) -> tuple[Session, Session]:
    left, right = _carried(carrier, *trio.testing.memory_stream_pair())
    results: dict[str, Session] = {}

    async def start(name: str, transport: trio.abc.Stream, client: bool) -> None:
        results[name] = await connect_session(nursery, transport, client=client, name=name, **kwargs)  # type: ignore[arg-type]

    async with trio.open_nursery() as starter:
        starter.start_soon(start, "client", left, True)
        starter.start_soon(start, "server", right, False)
    return results["client"], results["server"]


async def _stream_pair(client: Session, server: Session) -> tuple[MuxStream, MuxStream]:
    opened = await client.open_stream({"purpose": "test"})
    accepted = await server.accept_stream()
    return opened, accepted


async def test_check_half_closeable_stream(nursery: trio.Nursery, carrier: str) -> None:
    async def make() -> tuple[MuxStream, MuxStream]:
        client, server = await _session_pair(nursery, carrier)
        return await _stream_pair(client, server)

    async def make_clogged() -> tuple[MuxStream, MuxStream]:
        # A tiny window and no reader: the sender blocks after 1 KiB.
        client, server = await _session_pair(
            nursery, settings=Settings(initial_window=1 * KiB, max_window=1 * KiB)
        )
        sender, receiver = await _stream_pair(client, server)
        # Fill both directions' windows (the check flips the pair too).
        await sender.send_all(b"\0" * KiB)
        await receiver.send_all(b"\0" * KiB)
        return sender, receiver

    with every_call_yields():
        await trio.testing.check_half_closeable_stream(make, make_clogged)


async def test_metadata_round_trip_and_accept_answer(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    assert client.peer_metadata == {} and server.peer_metadata == {}
    opened = await client.open_stream({"method": "GET", "path": "/api/v1/pods", "headers": [["accept", "json"]]})
    incoming = await server.accept_stream()
    assert incoming.metadata == {"method": "GET", "path": "/api/v1/pods", "headers": [["accept", "json"]]}
    await incoming.accept({"status": 200})
    assert await opened.wait_accepted() == {"status": 200}


async def test_refused_stream_raises_for_the_opener(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    opened = await client.open_stream({})
    incoming = await server.accept_stream()
    await incoming.refuse(0x101, "agent not allowed")
    with pytest.raises(StreamRefusedError) as info:
        await opened.wait_accepted()
    assert info.value.code == 0x101 and "agent not allowed" in str(info.value)
    with pytest.raises(StreamRefusedError):
        await opened.receive_some()


async def test_reset_reaches_the_peer_with_its_code(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    opened, incoming = await _stream_pair(client, server)
    await incoming.send_all(b"partial")
    await incoming.reset(0x102, "cluster unreachable")
    assert await opened.receive_some() == b"partial"
    with pytest.raises(StreamResetError) as info:
        await opened.receive_some()
    assert info.value.code == 0x102 and info.value.remote


async def test_cancel_when_broken_cancels_work_once_the_peer_resets(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    opened, incoming = await _stream_pair(client, server)
    await opened.send_eof()  # the request is complete; the peer now waits on something else
    with trio.CancelScope() as scope:
        incoming.cancel_when_broken(scope)
        nursery.start_soon(opened.reset, 0x104, "client gone")
        await trio.sleep_forever()  # the upstream exchange, say
    assert scope.cancelled_caught
    late = trio.CancelScope()
    incoming.cancel_when_broken(late)  # already broken: cancelled at once
    assert late.cancel_called


async def test_both_sides_open_streams_concurrently(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    a = await client.open_stream({"from": "client"})
    b = await server.open_stream({"from": "server"})
    assert a.stream_id % 2 == 1 and b.stream_id % 2 == 0
    b_in = await client.accept_stream()
    a_in = await server.accept_stream()
    assert a_in.metadata == {"from": "client"} and b_in.metadata == {"from": "server"}
    await a.send_all(b"to server")
    await b.send_all(b"to client")
    assert await a_in.receive_some() == b"to server"
    assert await b_in.receive_some() == b"to client"


async def test_thousand_concurrent_streams(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    count = 1000
    received: dict[int, bytes] = {}

    async def serve_one(stream: MuxStream) -> None:
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
        await stream.send_all(data[::-1])
        await stream.aclose()

    async def acceptor() -> None:
        async with trio.open_nursery() as handlers:
            for _ in range(count):
                handlers.start_soon(serve_one, await server.accept_stream())

    async def call(i: int) -> None:
        stream = await client.open_stream({"i": i})
        await stream.send_all(f"request {i}".encode())
        await stream.send_eof()
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
        received[i] = data
        await stream.aclose()

    async with trio.open_nursery() as calls:
        calls.start_soon(acceptor)
        for i in range(count):
            calls.start_soon(call, i)
        await trio.testing.wait_all_tasks_blocked()
        # All 1000 are open at once on one session before any finishes its exchange.
        assert client.statistics().local_streams + len(received) == count
    assert received == {i: f"request {i}".encode()[::-1] for i in range(count)}
    assert client.statistics().open_streams == 0
    assert server.statistics().open_streams == 0


async def test_stalled_reader_does_not_stop_other_streams(nursery: trio.Nursery, carrier: str) -> None:
    """One stream's consumer stops reading; another stream still moves 64 MiB on the same session."""
    client, server = await _session_pair(nursery, carrier)
    stalled_out, stalled_in = await _stream_pair(client, server)
    busy_out, busy_in = await _stream_pair(client, server)

    stalled_sender_blocked = trio.Event()

    async def fill_stalled() -> None:
        # Sends until flow control stops it: nobody ever reads stalled_in.
        with trio.CancelScope() as scope:
            fill_stalled.scope = scope  # type: ignore[attr-defined]
            while True:
                await stalled_out.send_all(b"s" * 64 * KiB)
                if client.connection.send_window(stalled_out.stream_id) == 0:
                    stalled_sender_blocked.set()

    total = 64 * MiB
    block = b"b" * (256 * KiB)

    async def send_bulk() -> None:
        await stalled_sender_blocked.wait()
        for _ in range(total // len(block)):
            await busy_out.send_all(block)
        await busy_out.send_eof()

    moved = 0
    async with trio.open_nursery() as inner:
        inner.start_soon(fill_stalled)
        inner.start_soon(send_bulk)
        while chunk := await busy_in.receive_some():
            moved += len(chunk)
        fill_stalled.scope.cancel()  # type: ignore[attr-defined]
    assert moved == total
    # The stalled stream holds exactly its window — bounded — and is still healthy.
    info = server.connection.stream_info(stalled_in.stream_id)
    assert info is not None and 0 < info.buffered <= info.recv_window <= Settings().max_window
    assert (await stalled_in.receive_some(5)) == b"sssss"


async def test_max_concurrent_streams_makes_open_wait(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier, settings=Settings(max_concurrent_streams=2))
    first, _ = await _stream_pair(client, server)
    await _stream_pair(client, server)
    third_opened = trio.Event()

    async def open_third() -> None:
        await client.open_stream({})
        third_opened.set()

    nursery.start_soon(open_third)
    await trio.testing.wait_all_tasks_blocked()
    assert not third_opened.is_set()
    with pytest.raises(trio.WouldBlock):
        client.open_stream_nowait({})  # the same limit, without the wait
    await first.reset()
    await third_opened.wait()


async def test_open_stream_nowait_opens_at_once_and_refuses_when_draining(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    stream = client.open_stream_nowait({"n": 1})
    await stream.send_all(b"hi")
    incoming = await server.accept_stream()
    assert incoming.metadata == {"n": 1}
    assert await incoming.receive_some() == b"hi"
    nursery.start_soon(server.drain)  # GOAWAY: no new streams (drain waits for the open one)
    with trio.fail_after(5):
        await client.wait_goaway()
    with pytest.raises(StreamRefusedError):
        client.open_stream_nowait({})


async def test_keepalive_timeout_tears_down_a_dead_session(autojump_clock: trio.abc.Clock) -> None:
    left, right = trio.testing.memory_stream_pair()
    # A peer that says HELLO and then freezes: never reads, never writes, never closes.
    frozen = MuxConnection(client=False)
    frozen.initiate()
    await right.send_all(frozen.data_to_send())
    async with trio.open_nursery() as nursery:
        client = await connect_session(nursery, left, client=True, keepalive_interval=5, keepalive_timeout=15)
        stream = await client.open_stream({})
        other = await client.open_stream({})
        with pytest.raises(SessionClosedError) as info:
            await stream.receive_some()
        assert info.value.code == ErrorCode.KEEPALIVE_TIMEOUT
        assert "keepalive" in str(info.value)
        assert 15 <= trio.current_time() < 16
        # Every stream on the dead session sees the same clear error.
        with pytest.raises(SessionClosedError):
            await other.send_all(b"x")
        assert client.closed


async def test_idle_session_with_live_peer_stays_up(nursery: trio.Nursery, autojump_clock: trio.abc.Clock, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier, keepalive_interval=5, keepalive_timeout=15)
    await trio.sleep(120)  # virtual time: many keepalive periods with no application traffic
    assert not client.closed and not server.closed
    stream, incoming = await _stream_pair(client, server)
    await stream.send_all(b"still here")
    assert await incoming.receive_some() == b"still here"


async def test_goaway_drains_in_flight_and_refuses_new(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    in_flight, incoming = await _stream_pair(client, server)
    drained = trio.Event()

    async def drain() -> None:
        await server.drain("shutting down")
        drained.set()

    nursery.start_soon(drain)
    await client.wait_goaway()
    with pytest.raises(StreamRefusedError):
        await client.open_stream({})
    # The in-flight stream still completes both ways.
    await in_flight.send_all(b"request")
    await in_flight.send_eof()
    assert await incoming.receive_some() == b"request"
    await incoming.send_all(b"response")
    await incoming.aclose()
    assert await in_flight.receive_some() == b"response"
    assert await in_flight.receive_some() == b""
    await in_flight.aclose()
    await drained.wait()


async def test_garbage_from_peer_ends_session_with_goaway(nursery: trio.Nursery) -> None:
    left, right = trio.testing.memory_stream_pair()
    client = await _start_client_against_raw(nursery, left, right)
    stream = await client.open_stream({})
    await right.send_all(b"\xc1 this is not msgpack")
    with pytest.raises(SessionClosedError) as info:
        await stream.receive_some()
    assert info.value.code == ErrorCode.PROTOCOL_ERROR
    # The client told the peer why before hanging up: a GOAWAY frame with PROTOCOL_ERROR.
    decoder = FrameDecoder()
    frames = []
    while chunk := await right.receive_some():
        try:
            frames += decoder.feed(chunk)
        except Exception:
            break
    goaways = [f for f in frames if isinstance(f, GoAway)]
    assert goaways and goaways[-1].code == ErrorCode.PROTOCOL_ERROR


async def test_unknown_major_version_is_refused_clearly(nursery: trio.Nursery) -> None:
    left, right = trio.testing.memory_stream_pair()
    await right.send_all(encode(Hello(major=9, minor=0, settings={}, metadata={})))
    with pytest.raises(SessionClosedError) as info:
        await connect_session(nursery, left, client=True)
    assert info.value.code == ErrorCode.UNSUPPORTED_VERSION
    assert "9.0" in str(info.value) and "speaks 1." in str(info.value)


async def _start_client_against_raw(nursery: trio.Nursery, left: trio.abc.Stream, right: trio.abc.Stream) -> Session:
    peer = MuxConnection(client=False)
    peer.initiate()
    await right.send_all(peer.data_to_send())
    return await connect_session(nursery, left, client=True)


async def test_tls_sockets_on_loopback(nursery: trio.Nursery) -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    accepted: trio.MemorySendChannel[Session]
    accepted, sessions = trio.open_memory_channel[Session](1)

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        async with open_session(stream, client=False, metadata={"role": "kasd"}) as session:
            await accepted.send(session)
            incoming = await session.accept_stream()
            while chunk := await incoming.receive_some():
                await incoming.send_all(chunk.upper())
            await incoming.aclose()
            await session.wait_closed()

    listeners = await nursery.start(_serve_tls, handler, server_ctx)
    port = listeners[0].transport_listener.socket.getsockname()[1]
    transport = await trio.open_ssl_over_tcp_stream("localhost", port, ssl_context=client_ctx)
    async with open_session(transport, client=True, metadata={"agent_id": 7}) as session:
        server_session = await sessions.receive()
        assert server_session.peer_metadata == {"agent_id": 7}
        assert session.peer_metadata == {"role": "kasd"}
        stream = await session.open_stream({})
        payload = b"hello over tls " * 10000
        async with trio.open_nursery() as inner:
            inner.start_soon(_send_and_eof, stream, payload)
            got = b""
            while chunk := await stream.receive_some():
                got += chunk
        assert got == payload.upper()
        assert session.statistics().rtt is not None


async def _send_and_eof(stream: MuxStream, payload: bytes) -> None:
    await stream.send_all(payload)
    await stream.send_eof()


async def _serve_tls(handler, ctx, *, task_status=trio.TASK_STATUS_IGNORED):  # type: ignore[no-untyped-def]
    listeners = await trio.open_ssl_over_tcp_listeners(0, ctx, host="127.0.0.1")
    await trio.serve_listeners(handler, listeners, task_status=task_status)


async def test_wait_broken_reports_a_reset_after_the_peer_half_closed(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    opened, incoming = await _stream_pair(client, server)
    await opened.send_eof()  # a GET: the request is complete, the response is long (a watch)
    assert await incoming.receive_some() == b""
    broken = trio.Event()

    async def watch() -> None:
        error = await incoming.wait_broken()
        assert isinstance(error, StreamResetError) and error.code == 0x104
        broken.set()

    nursery.start_soon(watch)
    await incoming.send_all(b"event 1")
    assert await opened.receive_some() == b"event 1"
    await trio.testing.wait_all_tasks_blocked()
    assert not broken.is_set()
    await opened.reset(0x104, "client gone")
    await broken.wait()


async def test_accept_alone_reaches_the_peer_at_once(nursery: trio.Nursery, carrier: str) -> None:
    # An acceptor that answers and then only listens (a 101 upgrade waiting for the client's first
    # bytes) must not leave its ACCEPT queued until some later frame happens to flush it.
    client, server = await _session_pair(nursery, carrier)
    opened = await client.open_stream({"upgrade": True})
    incoming = await server.accept_stream()
    await incoming.accept({"status": 101})
    with trio.fail_after(5):  # far below the 15 s keepalive that would otherwise flush it
        assert await opened.wait_accepted() == {"status": 101}


async def test_open_session_raises_a_failed_handshake_plainly() -> None:
    left, right = trio.testing.memory_stream_pair()
    await right.send_all(encode(Hello(major=9, minor=0, settings={}, metadata={})))
    with pytest.raises(SessionClosedError) as info:  # not an ExceptionGroup around it
        async with open_session(left, client=True):
            pass  # pragma: no cover
    assert info.value.code == ErrorCode.UNSUPPORTED_VERSION


async def test_streams_handed_to_a_callback_as_they_open(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    early = await client.open_stream({"n": 0})
    await early.send_all(b"queued before the callback")
    await trio.testing.wait_all_tasks_blocked()
    handed: list[MuxStream] = []
    arrived = trio.Event()

    def on_stream(stream: MuxStream) -> None:
        handed.append(stream)
        if len(handed) == 3:
            arrived.set()

    server.hand_streams_to(on_stream)
    assert [s.metadata for s in handed] == [{"n": 0}]  # the queued one first, at once
    later = [await client.open_stream({"n": n}) for n in (1, 2)]
    await later[1].send_all(b"data in the OPEN's batch")
    await arrived.wait()
    assert [s.metadata for s in handed] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert await handed[0].receive_some() == b"queued before the callback"
    assert await handed[2].receive_some() == b"data in the OPEN's batch"
    await handed[1].accept({"status": 200})
    assert await later[0].wait_accepted() == {"status": 200}


async def test_a_stream_the_callback_cannot_take_is_refused_and_the_session_goes_on(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    taken: list[MuxStream] = []

    def on_stream(stream: MuxStream) -> None:
        if stream.metadata.get("poison"):
            raise RuntimeError("Nursery is closed to new arrivals")
        taken.append(stream)

    server.hand_streams_to(on_stream)
    refused = await client.open_stream({"poison": True})
    with pytest.raises(StreamRefusedError) as info:
        await refused.wait_accepted()
    assert info.value.code == ErrorCode.REFUSED_STREAM
    fine = await client.open_stream({})
    await trio.testing.wait_all_tasks_blocked()
    assert len(taken) == 1 and not server.closed
    await taken[0].accept()
    assert await fine.wait_accepted() == {}


async def test_only_the_dialling_side_keeps_an_idle_session_alive(nursery: trio.Nursery,
                                                                  autojump_clock: trio.abc.Clock, carrier: str) -> None:
    """One PING/PONG per interval, not two: the accepting side hears the dialler's PINGs and never
    pings itself (both timers used to fire together after each exchange)."""
    client, server = await _session_pair(nursery, carrier, keepalive_interval=5, keepalive_timeout=15)
    await trio.sleep(0.5)  # the handshake's rtt PINGs are done
    # Counted by each connection's PING counter (its next opaque), not by patching ping(): the mux
    # may run compiled (mypyc), where a method cannot be replaced on an instance.
    started = {"client": client.connection._next_ping, "server": server.connection._next_ping}
    await trio.sleep(60)
    pings = {"client": client.connection._next_ping - started["client"],
             "server": server.connection._next_ping - started["server"]}
    assert 10 <= pings["client"] <= 13 and pings["server"] == 0, pings
    assert not client.closed and not server.closed


async def test_a_notice_read_before_its_receiver_is_set_is_handed_over_when_it_is(nursery: trio.Nursery, carrier: str) -> None:
    # kasd sends its placement right after the handshake; agentd sets on_notice only once its dial
    # returned the session. A NOTICE read in between must not be lost (it was: agentd then never
    # learned its home replica until the ring changed).
    client, server = await _session_pair(nursery, carrier)
    assert await server.send_notice({"type": "placement", "n": 1})
    assert await server.send_notice({"type": "placement", "n": 2})
    await client.ping()  # the ping's answer follows both NOTICEs: they were read, with no receiver
    seen: list[dict[str, Any]] = []
    client.on_notice = lambda metadata: seen.append(dict(metadata))
    assert [m["n"] for m in seen] == [1, 2]
    assert await server.send_notice({"type": "placement", "n": 3})
    await client.ping()
    assert [m["n"] for m in seen] == [1, 2, 3]  # and later ones as they come


async def test_early_notices_are_bounded_the_newest_kept(nursery: trio.Nursery, carrier: str) -> None:
    client, server = await _session_pair(nursery, carrier)
    for n in range(MAX_EARLY_NOTICES + 5):
        assert await server.send_notice({"type": "placement", "n": n})
    await client.ping()
    seen: list[int] = []
    client.on_notice = lambda metadata: seen.append(int(metadata["n"]))
    assert seen == list(range(5, MAX_EARLY_NOTICES + 5))


class _HeldTransport(trio.abc.Stream):
    """A transport whose writes wait while ``hold`` is set (a busy socket, a writer not yet run)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.hold: trio.Event | None = None

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.hold is not None:
            await self.hold.wait()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _held_pair(nursery: trio.Nursery, server_scope: trio.CancelScope) -> tuple[Session, Session, _HeldTransport]:
    """A session pair whose server side writes through a _HeldTransport and runs in ``server_scope``."""
    left, right = trio.testing.memory_stream_pair()
    held = _HeldTransport(right)
    sessions: dict[str, Session] = {}

    async def run_server(task_status: trio.TaskStatus[None]) -> None:
        with server_scope:
            async with trio.open_nursery() as own:
                sessions["server"] = await connect_session(own, held, client=False)
                task_status.started()

    async def start_client() -> None:
        sessions["client"] = await connect_session(nursery, left, client=True)

    async with trio.open_nursery() as starter:
        starter.start_soon(start_client)
        await nursery.start(run_server)
    return sessions["client"], sessions["server"], held


_CLOSE_FRAME = b"\x88\x02\x03\xe8"  # a WebSocket close 1000: the last bytes of an exec


async def _last_bytes(stream: MuxStream) -> bytes:
    got = b""
    while data := await stream.receive_some():
        got += data
    return got


async def test_drain_returns_only_once_the_last_bytes_of_finished_streams_are_written(nursery: trio.Nursery) -> None:
    """A daemon closes its sessions as soon as their drain returned: a stream that ended just
    before (its last DATA and END_STREAM queued, not yet written) must not lose them."""
    server_scope = trio.CancelScope()
    client, server, held = await _held_pair(nursery, server_scope)
    opened, incoming = await _stream_pair(client, server)
    await incoming.accept()
    await opened.send_eof()  # the far side of the hop is done sending
    assert await incoming.receive_some() == b""
    held.hold = trio.Event()  # the server's writes wait from here on
    drained = trio.Event()

    async def shut_down_once_drained() -> None:
        await server.drain("shutting down")
        drained.set()
        server_scope.cancel()  # what kasd does next

    nursery.start_soon(shut_down_once_drained)
    await incoming.send_all(_CLOSE_FRAME)
    await incoming.send_eof()  # the stream is over on this side: its frames are queued
    await trio.testing.wait_all_tasks_blocked()
    assert not drained.is_set()  # its frames are not written yet
    held.hold.set()
    with trio.fail_after(5):
        assert await _last_bytes(opened) == _CLOSE_FRAME
        await drained.wait()


async def test_a_session_torn_down_mid_write_still_writes_what_its_streams_sent(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    """The drain's deadline (or any cancellation) that hits while the writer waits on the transport:
    the frames it holds still go out within the close timeout, rather than being dropped."""
    server_scope = trio.CancelScope()
    client, server, held = await _held_pair(nursery, server_scope)
    opened, incoming = await _stream_pair(client, server)
    await incoming.accept()
    await trio.testing.wait_all_tasks_blocked()
    held.hold = trio.Event()
    await incoming.send_all(_CLOSE_FRAME)
    await incoming.send_eof()
    await trio.testing.wait_all_tasks_blocked()  # the writer took them and waits on the transport
    server_scope.cancel()
    await trio.sleep(1)  # (virtual time) well within the close timeout
    held.hold.set()
    with trio.fail_after(5):
        assert await _last_bytes(opened) == _CLOSE_FRAME


class _WritesFail(_HeldTransport):
    """A transport that takes no more writes once ``broken`` is set (the peer closed as we wrote)
    while what the peer sent before is still there to read."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        super().__init__(inner)
        self.broken = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError("peer sent HTTP/2 GOAWAY (code 0)")
        await super().send_all(data)


async def test_a_write_that_fails_as_the_peer_closes_loses_nothing_the_peer_sent_before(
        nursery: trio.Nursery) -> None:
    """agentd moving a tunnel drains it and closes; kasd, writing at that moment (a new stream, a
    window update), finds the transport gone. The end of a response agentd sent before closing is
    still in kasd's buffers: it must reach kasd's client whole (a cut body is an "unexpected EOF"
    in kubectl), and no new stream may start on that session."""
    left, right = trio.testing.memory_stream_pair()
    writes = _WritesFail(left)
    sessions: dict[str, Session] = {}

    async def start(name: str, transport: trio.abc.Stream, client: bool) -> None:
        sessions[name] = await connect_session(nursery, transport, client=client, name=name)

    async with trio.open_nursery() as starter:
        starter.start_soon(start, "kasd", writes, True)
        starter.start_soon(start, "agentd", right, False)
    kasd, agentd = sessions["kasd"], sessions["agentd"]
    opened, incoming = await _stream_pair(kasd, agentd)
    await incoming.accept()
    await opened.send_eof()
    assert await incoming.receive_some() == b""
    writes.broken = True
    crossed = await kasd.open_stream({"purpose": "a request that crossed the close"})
    await trio.testing.wait_all_tasks_blocked()  # its OPEN met the closed transport
    assert kasd.draining and not kasd.closed
    with pytest.raises(trio.BrokenResourceError):
        await kasd.open_stream({"purpose": "one more"})
    body = b"".join(bytes([n]) * 16 * KiB for n in range(4))
    await incoming.send_all(body)
    await incoming.send_eof()
    with trio.fail_after(5):
        assert await _last_bytes(opened) == body
        with pytest.raises(trio.BrokenResourceError):  # never taken: its opener may retry elsewhere
            await crossed.wait_accepted()


def _tasks_of(session: Session) -> list[str]:
    """The names of the running tasks whose code is the session's own (its methods)."""
    found: list[str] = []

    def walk(task: trio.lowlevel.Task) -> None:
        frame = getattr(task.coro, "cr_frame", None)
        if frame is not None and frame.f_locals.get("self") is session:
            found.append(task.coro.__qualname__)
        for child in task.child_nurseries:
            for sub in child.child_tasks:
                walk(sub)

    walk(trio.lowlevel.current_root_task())
    return sorted(found)


async def test_an_idle_session_runs_one_task_and_it_answers_pings(
        nursery: trio.Nursery, carrier: str, autojump_clock: trio.abc.Clock) -> None:
    """10,000 idle agents are 10,000 sessions on kasd: each runs one task, its reader, which keeps
    the keepalive timer too; a PING is answered by the reader itself, without waking a writer task,
    and the keepalive PING is written by it (the dialler's, every interval)."""
    client, server = await _session_pair(nursery, carrier)
    await trio.testing.wait_all_tasks_blocked()
    received = client.statistics().bytes_received
    await trio.sleep(client.keepalive_interval + 1)  # (virtual time) the dialler's keepalive PING, answered
    assert client.statistics().bytes_received > received and not client.closed
    assert _tasks_of(client) == ["Session.run"]
    for _ in range(3):
        await client.ping()  # (``ping()`` itself leaves its PING to the client's writer task)
    await trio.testing.wait_all_tasks_blocked()
    assert _tasks_of(server) == ["Session.run"]


@pytest.mark.parametrize("peer_pings", [False, True], ids=["silent-peer", "peer-pings-but-never-reads"])
async def test_keepalive_timeout_ends_a_session_stuck_in_a_write_the_peer_never_takes(
        autojump_clock: trio.abc.Clock, peer_pings: bool) -> None:
    """An idle session's one task is its keepalive timer and its reader, and writes its PING and its
    answers (PONGs) itself: a write the peer never takes must not keep it from ending the session at
    the keepalive timeout, whether the peer is silent or sends PINGs and never reads (as when the
    timer ran in a task of its own)."""
    left, right = trio.testing.memory_stream_pair()
    held = _HeldTransport(left)
    frozen = MuxConnection(client=False)
    frozen.initiate()
    await right.send_all(frozen.data_to_send())
    async with trio.open_nursery() as nursery:
        client = await connect_session(nursery, held, client=True, keepalive_interval=5, keepalive_timeout=15)
        if peer_pings:
            await trio.testing.wait_all_tasks_blocked()
        held.hold = trio.Event()  # from here on no write completes
        if peer_pings:
            frozen.ping(0.0)
            await right.send_all(frozen.data_to_send())  # a PING: its PONG is written by the reader
        try:
            with trio.fail_after(60):
                await client.wait_closed()
        finally:
            held.hold.set()  # (a failed test must not hang on the write it checks)
        assert client.close_reason is not None
        assert client.close_reason.code == ErrorCode.KEEPALIVE_TIMEOUT
        # the silent peer: at the keepalive timeout; the PINGing one: its PING counted as heard
        assert trio.current_time() < (35 if peer_pings else 17)


async def test_a_large_send_reaches_the_transport_in_writes_of_a_few_frames(nursery: trio.Nursery) -> None:
    # One write of all that was queued (a MiB and more) cost more per byte than several writes of a
    # few frames each (issue 30); the peer receives the same bytes, in order.
    left, right = trio.testing.memory_stream_pair()
    writes: list[int] = []
    real_send_all = left.send_all

    async def recording_send_all(data: bytes | bytearray | memoryview) -> None:
        writes.append(len(data))
        await real_send_all(data)

    left.send_all = recording_send_all  # type: ignore[method-assign]
    sessions: dict[str, Session] = {}

    async def start(name: str, transport: trio.abc.Stream, client: bool) -> None:
        # the receiver grants credit for all of it at once, so the sender queues it all at once
        settings = None if client else Settings(initial_window=4 * MiB, max_window=16 * MiB)
        sessions[name] = await connect_session(nursery, transport, client=client, settings=settings)

    async with trio.open_nursery() as starter:
        starter.start_soon(start, "client", left, True)
        starter.start_soon(start, "server", right, False)
    sender, receiver = await _stream_pair(sessions["client"], sessions["server"])
    payload = bytes(range(256)) * (8 * 1024)  # 2 MiB
    writes.clear()
    received = bytearray()

    async def read() -> None:
        while chunk := await receiver.receive_some():
            received.extend(chunk)

    async with trio.open_nursery() as both:
        both.start_soon(read)
        await sender.send_all(payload)
        await sender.send_eof()
    assert received == payload
    assert len(writes) >= 8
    assert max(writes) <= 256 * KiB, writes
