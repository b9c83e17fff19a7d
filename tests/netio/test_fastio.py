"""The lean socket and TLS streams: Trio's stream conformance checks, plus what makes them lean."""

from __future__ import annotations

import socket
import ssl

import pytest
import trio
import trio.testing
import trustme

from netio import fastio
from netio.fastio import FastSocketStream, FastTLSStream, every_call_yields


def _clog(sock: socket.socket) -> None:
    """Fill the kernel buffers so the next send must wait."""
    sock.setblocking(False)
    try:
        while True:
            sock.send(b"\0" * 65536)
    except BlockingIOError:
        pass


def _clog_tls(stream: FastTLSStream) -> None:
    """Fill the socket with TLS records nobody reads. What does not fit is dropped: the peer can
    read every whole record that got in and then waits, which is all the clogged checks need."""
    sock = stream.transport_stream.socket  # type: ignore[attr-defined]
    for _ in range(64):
        stream._ssl.write(b"\0" * 16384)  # 1 MiB: more than a Unix socket pair buffers
    pending = stream._outgoing.read()
    sent = 0
    try:
        while sent < len(pending):
            sent += sock.send(pending[sent:])
    except BlockingIOError:
        pass


async def _socket_pair() -> tuple[FastSocketStream, FastSocketStream]:
    a, b = socket.socketpair()
    return FastSocketStream(a), FastSocketStream(b)


async def _clogged_socket_pair() -> tuple[FastSocketStream, FastSocketStream]:
    a, b = await _socket_pair()
    _clog(a.socket)
    _clog(b.socket)
    return a, b


async def test_socket_stream_passes_trio_conformance() -> None:
    with every_call_yields():
        await trio.testing.check_half_closeable_stream(_socket_pair, _clogged_socket_pair)


@pytest.fixture(scope="module")
def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


async def _loopback_pair() -> tuple[FastSocketStream, FastSocketStream]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return FastSocketStream(client), FastSocketStream(server)


def _tls_pair_maker(contexts: tuple[ssl.SSLContext, ssl.SSLContext], *, clogged: bool):  # type: ignore[no-untyped-def]
    server_ctx, client_ctx = contexts

    async def make() -> tuple[FastTLSStream, FastTLSStream]:
        # A Unix socket pair: its buffers free space only when the peer reads, so a clog stays put.
        raw_client, raw_server = await _socket_pair()
        client = FastTLSStream(raw_client, client_ctx, server_hostname="localhost")
        server = FastTLSStream(raw_server, server_ctx, server_side=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.do_handshake)
            nursery.start_soon(server.do_handshake)
        if clogged:
            _clog_tls(client)
            _clog_tls(server)
        return client, server

    return make


async def test_tls_stream_passes_trio_conformance(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    with every_call_yields():
        await trio.testing.check_two_way_stream(
            _tls_pair_maker(tls_contexts, clogged=False),
            _tls_pair_maker(tls_contexts, clogged=True),
        )


async def test_operations_that_need_not_wait_do_not_yield() -> None:
    # The point of these streams: a send that the kernel takes at once is not a trip through the
    # scheduler (except every so often, so a busy loop cannot starve other tasks). A task that
    # counts its turns shows how often the sender gave the scheduler a go.
    a, b = await _socket_pair()
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(count_turns)
        with every_call_yields():
            await a.send_all(b"x")  # resets the budget (and gives the counter its first turn)
        before = turns
        for _ in range(fastio._YIELD_EVERY - 1):
            await a.send_all(b"x")
        assert turns == before
        with trio.testing.assert_checkpoints():
            await a.send_all(b"x")  # the budget is spent: this one yields
        nursery.cancel_scope.cancel()
    await b.aclose()
    await a.aclose()


async def test_tls_receive_gathers_every_record_already_received(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    client, server = await _tls_pair_maker(tls_contexts, clogged=False)()
    payload = bytes(range(256)) * 1024  # 256 KiB: sixteen or more TLS records
    received = b""
    calls = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send_all, payload)
        await trio.testing.wait_all_tasks_blocked()  # the sender filled the socket (or finished)
        while len(received) < len(payload):
            received += await server.receive_some(len(payload))
            calls += 1
    assert received == payload
    assert calls < 8  # one 16 KiB record per call would take 16
    await client.aclose()
    assert await server.receive_some() == b""  # close_notify reads as a clean end
    await server.aclose()


async def test_tls_data_read_is_returned_without_waiting_to_flush_the_replies_the_read_made(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """Replies a read makes (a TLS 1.3 KeyUpdate's answer) go out with the next send or before the
    next wait for bytes, not before the data read is returned: a caller whose deadline cuts its
    read (a session's keepalive timer) would otherwise cut that flush and lose the data with it."""
    client, server = await _tls_pair_maker(tls_contexts, clogged=False)()
    await client.send_all(b"hello")
    await server._read_transport()  # the record is in (a read decrypts it) ...
    server._outgoing.write(b"\x15")  # ... with a reply it made (Python cannot ask for a KeyUpdate)
    _clog(server.transport_stream.socket)  # type: ignore[attr-defined]  # the server's next send waits
    with trio.move_on_after(2) as waited:
        data = await server.receive_some()
    assert not waited.cancelled_caught, "the read waited to flush a reply before returning its data"
    assert data == b"hello"
    assert server._outgoing.pending  # still to go, with the next send or before the next wait


async def test_tls_handshake_with_a_plain_text_peer_is_a_broken_stream(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, _ = tls_contexts
    raw_client, raw_server = await _loopback_pair()
    server = FastTLSStream(raw_server, server_ctx, server_side=True)
    await raw_client.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    with pytest.raises(trio.BrokenResourceError) as info:
        await server.do_handshake()
    assert isinstance(info.value.__cause__, ssl.SSLError)
    await server.aclose()
    await raw_client.aclose()


@pytest.mark.parametrize("https_compatible", [True, False])
async def test_tls_eof_without_close_notify(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext], https_compatible: bool
) -> None:
    server_ctx, client_ctx = tls_contexts
    raw_client, raw_server = await _loopback_pair()
    client = FastTLSStream(
        raw_client, client_ctx, server_hostname="localhost", https_compatible=https_compatible
    )
    server = FastTLSStream(raw_server, server_ctx, server_side=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        nursery.start_soon(server.do_handshake)
    await server.send_all(b"hello")
    await raw_server.aclose()  # TCP close, no close_notify
    assert await client.receive_some() == b"hello"
    if https_compatible:
        assert await client.receive_some() == b""
    else:
        with pytest.raises(trio.BrokenResourceError):
            await client.receive_some()
    await client.aclose()


async def test_aclose_wakes_a_task_blocked_in_receive() -> None:
    a, b = await _socket_pair()
    async with trio.open_nursery() as nursery:

        async def reader() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await a.receive_some()

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        await a.aclose()
    await b.aclose()


async def test_send_many_delivers_every_buffer_in_order_across_partial_sends() -> None:
    # 2,000 buffers (more than one sendmsg takes) and 8 MiB (more than the socket buffers): sendmsg
    # stops mid-buffer and mid-list, and the rest must follow in order.
    a, b = await _socket_pair()
    buffers = [bytes([i % 251]) * (i * 7 % 8191 + 1) for i in range(2000)]
    buffers.append(b"\1" * (8 << 20))
    expected = b"".join(buffers)
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(expected):
            received.extend(await b.receive_some(1 << 20))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await a.send_many(buffers)
    assert bytes(received) == expected
    await a.aclose()
    await b.aclose()


async def test_tls_handshake_on_first_use_by_a_reader_and_a_writer_at_once(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    # A relay pumps each direction in its own task, so the first receive and the first send both
    # find the handshake undone. Both must wait for one handshake, not race over the transport.
    server_ctx, client_ctx = tls_contexts
    raw_client, raw_server = await _socket_pair()
    client = FastTLSStream(raw_client, client_ctx, server_hostname="localhost")
    server = FastTLSStream(raw_server, server_ctx, server_side=True)
    received: dict[str, bytes] = {}

    async def send(stream: FastTLSStream, data: bytes) -> None:
        await stream.send_all(data)

    async def receive(stream: FastTLSStream, name: str) -> None:
        received[name] = await stream.receive_some()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive, client, "client")
            nursery.start_soon(send, client, b"from client")
            nursery.start_soon(receive, server, "server")
            nursery.start_soon(send, server, b"from server")
    assert received == {"client": b"from server", "server": b"from client"}


async def test_a_failed_handshake_fails_every_task_waiting_for_it(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    _, client_ctx = tls_contexts
    raw_client, raw_server = await _socket_pair()
    client = FastTLSStream(raw_client, client_ctx, server_hostname="localhost")
    failures: list[BaseException] = []

    async def use(operation: str) -> None:
        try:
            if operation == "send":
                await client.send_all(b"x")
            else:
                await client.receive_some()
        except trio.BrokenResourceError as exc:
            failures.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, "send")
            nursery.start_soon(use, "receive")
            await trio.testing.wait_all_tasks_blocked()
            await raw_server.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # not TLS
    assert len(failures) == 2


# ---- the fence: what the fast paths assume of Trio (netio.fastio's docstring), and the switch


async def test_assumption_notify_closing_wakes_a_waiting_task_with_closed_resource_error() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    failed: list[BaseException] = []

    async def wait() -> None:
        try:
            await trio.lowlevel.wait_readable(a)
        except trio.ClosedResourceError as exc:
            failed.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.notify_closing(a)
    a.close()
    b.close()
    assert failed, "netio.fastio assumes trio.lowlevel.notify_closing makes wait_readable raise ClosedResourceError"


async def test_assumption_a_trio_socket_stream_socket_can_be_taken_over() -> None:
    a, b = trio.socket.socketpair()
    trio_stream = trio.SocketStream(a)
    assert hasattr(trio_stream.socket, "detach"), (
        "netio.fastio assumes trio.SocketStream.socket is a trio socket whose descriptor can be detached"
    )
    fast = FastSocketStream.from_trio(trio_stream)
    await fast.send_all(b"ping")
    assert await trio.SocketStream(b).receive_some(4) == b"ping", "netio.fastio: a detached socket must stay usable"
    await fast.aclose()
    b.close()


async def test_assumption_fairness_a_busy_loop_still_lets_others_run() -> None:
    # Assumption 1: Trio stays fair when a task yields only every _YIELD_EVERY-th call. A task that
    # sends without ever waiting must still let another task run about as often as it yields.
    a, b = await _socket_pair()
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        for _ in range(10 * fastio._YIELD_EVERY):
            await a.send_all(b"x")
        assert turns >= 8, (
            f"netio.fastio assumes a schedule point every _YIELD_EVERY calls lets other tasks run (got {turns} turns in 10)"
        )
        nursery.cancel_scope.cancel()
    await a.aclose()
    await b.aclose()


async def test_the_switch_hands_out_trio_streams(tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    from netio import safemode

    a, b = trio.socket.socketpair()
    stream = fastio.fast_stream(trio.SocketStream(a))
    tls = fastio.tls_stream(stream, tls_contexts[1], server_hostname="localhost")
    if safemode.SAFE_MODE:
        assert type(stream) is trio.SocketStream and type(tls) is trio.SSLStream
        assert fastio._YIELD_EVERY == 1  # a FastSocketStream made directly yields every time
    else:
        assert type(stream) is FastSocketStream and type(tls) is FastTLSStream
    await stream.aclose()
    b.close()
